"""Raw assets: every item of each list endpoint, as received, in ``raw.*``.

Each asset reads like the sentence it is: page the list into a staging table, check it against the
server's total, swap it in, report what it cost.
"""

import dagster as dg

from fieldsales_dagster.client.endpoints import EVENT_GROUPS, EVENTS, TRANSACTIONS, ListEndpoint
from fieldsales_dagster.client.resource import FieldSalesAPI
from fieldsales_dagster.warehouse.raw_load import LoadReport, load_list
from fieldsales_dagster.warehouse.resource import FieldSalesWarehouse

DUCKDB_POOL = "fieldsales_duckdb"
TOTAL_CHECK = "row_count_matches_api_total"


def _metadata(report: LoadReport) -> dict[str, object]:
    return {
        "dagster/row_count": report.rows,
        "table": dg.MetadataValue.text(report.table),
        "api_total": dg.MetadataValue.int(report.api_total)
        if report.api_total is not None
        else dg.MetadataValue.text("not reported by the server"),
        "pages": report.pages,
        "requests": report.requests,
        "retries": report.retries,
        "passes": report.passes,
        "duplicates_dropped": report.duplicates_dropped,
        "megabytes": round(report.bytes / 1e6, 1),
        "seconds": round(report.seconds, 2),
        "rows_per_second": round(report.rows_per_second),
    }


def _total_check(report: LoadReport) -> dg.AssetCheckResult:
    if report.api_total is None:
        return dg.AssetCheckResult(
            check_name=TOTAL_CHECK,
            passed=True,
            metadata={"rows": report.rows, "note": "the server reports no total for this list"},
        )
    return dg.AssetCheckResult(
        check_name=TOTAL_CHECK,
        passed=report.rows == report.api_total,
        metadata={"rows": report.rows, "api_total": report.api_total},
    )


def build_raw_asset(endpoint: ListEndpoint, description: str) -> dg.AssetsDefinition:
    key = f"raw_{endpoint.name}"

    @dg.asset(
        name=key,
        group_name="raw",
        kinds={"duckdb"},
        pool=DUCKDB_POOL,
        description=description,
        metadata={"table": endpoint.raw_table, "endpoint": endpoint.path},
        check_specs=[
            dg.AssetCheckSpec(
                TOTAL_CHECK,
                asset=key,
                blocking=True,
                description="Distinct ids loaded equal the total the API reported.",
            )
        ],
    )
    def raw_asset(
        context: dg.AssetExecutionContext,
        fieldsales_api: FieldSalesAPI,
        warehouse: FieldSalesWarehouse,
    ) -> dg.MaterializeResult:
        with warehouse.get_connection() as conn:
            report = load_list(
                fieldsales_api,
                conn,
                endpoint,
                log=context.log.info,
                max_shrink_fraction=warehouse.max_shrink_fraction,
            )
        return dg.MaterializeResult(
            metadata=_metadata(report), check_results=[_total_check(report)]
        )

    return raw_asset


raw_events = build_raw_asset(
    EVENTS,
    "Every event (GET /public/v1/api/event/all) as received: raw.events(id, payload, loaded_at).",
)
raw_transactions = build_raw_asset(
    TRANSACTIONS,
    "Every transaction (GET /public/v1/api/transaction/all) as received: "
    "raw.transactions(id, event_id, payload, loaded_at).",
)
raw_event_groups = build_raw_asset(
    EVENT_GROUPS,
    "Every event group (GET /public/v1/api/eventgroup/all) as received: "
    "raw.event_groups(id, payload, loaded_at).",
)

raw_assets = [raw_events, raw_transactions, raw_event_groups]
