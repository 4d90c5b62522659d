"""Raw assets: every item of each list endpoint, as received, in ``raw.*``.

Each asset reads like the sentence it is: page the list into a staging table, check it against the
server's total, swap it in, report what it cost.
"""

import dagster as dg
from pydantic import Field, field_validator

from fieldsales_dagster.client.endpoints import EVENT_GROUPS, EVENTS, TRANSACTIONS, ListEndpoint
from fieldsales_dagster.client.resource import FieldSalesAPI
from fieldsales_dagster.warehouse.incremental import RefreshPolicy, refresh_raw_list
from fieldsales_dagster.warehouse.raw_load import LoadReport
from fieldsales_dagster.warehouse.refresh_mode import validate_refresh_mode
from fieldsales_dagster.warehouse.resource import FieldSalesWarehouse

DUCKDB_POOL = "fieldsales_duckdb"
TOTAL_CHECK = "row_count_matches_api_total"


class RawRefreshConfig(dg.Config):
    """Run config of a raw asset: force the refresh mode of one run."""

    refresh_mode: str | None = Field(
        default=None,
        description=(
            "auto | full | incremental for this run (raw_transactions; events and event groups "
            "are always fetched whole). Empty: the warehouse's refresh_mode."
        ),
    )

    @field_validator("refresh_mode", mode="before")
    @classmethod
    def _check(cls, value: object) -> object:
        return validate_refresh_mode(value)


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
        # An incremental transaction refresh compares the event list just loaded with the last.
        deps=["raw_events"] if endpoint is TRANSACTIONS else None,
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
        config: RawRefreshConfig,
        fieldsales_api: FieldSalesAPI,
        warehouse: FieldSalesWarehouse,
    ) -> dg.MaterializeResult:
        policy = RefreshPolicy.of(warehouse, config.refresh_mode)
        with warehouse.get_connection() as conn:
            refresh = refresh_raw_list(
                fieldsales_api,
                conn,
                endpoint,
                policy,
                log=context.log.info,
                warn=context.log.warning,
            )
        return dg.MaterializeResult(
            metadata={**_metadata(refresh.load), **refresh.metadata()},
            check_results=[_total_check(refresh.load)],
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
