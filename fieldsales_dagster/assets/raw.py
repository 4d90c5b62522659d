"""Raw assets: every item of each list endpoint, as received, in ``raw.*``.

Each asset reads like the sentence it is: page the list into a staging table, check it against the
server's total, swap it in, report what it cost.
"""

from typing import Any

import dagster as dg
from pydantic import Field, field_validator

from fieldsales_dagster.assets.columns import column_schema, prepare_raw_table, table_doc
from fieldsales_dagster.assets.metadata import previous_row_count, table_metadata
from fieldsales_dagster.client.endpoints import EVENTS, LIST_ENDPOINTS, TRANSACTIONS, ListEndpoint
from fieldsales_dagster.loading.incremental import (
    RefreshPolicy,
    RefreshReport,
    refresh_raw_list,
)
from fieldsales_dagster.loading.raw_load import LoadReport, ShrinkGuard
from fieldsales_dagster.loading.refresh_mode import validate_refresh_mode
from fieldsales_dagster.names import InstanceNames

ROW_COUNT_CHECK = "row_count_near_previous_load"
#: A load whose row count moved by more than this fraction of the previous load's warns. (The
#: loader itself refuses a load that would shrink a table by half or empty it.)
ROW_COUNT_TOLERANCE = 0.2


def raw_asset_name(endpoint: ListEndpoint) -> str:
    return f"raw_{endpoint.name}"


class RawRefreshConfig(dg.Config):
    """Run config of a raw asset: force the refresh mode of one run, or allow a large shrink."""

    refresh_mode: str | None = Field(
        default=None,
        description=(
            "auto | full | incremental for this run (raw_transactions; events and event groups "
            "are always fetched whole). Empty: the warehouse's refresh_mode."
        ),
    )

    allow_shrink: bool = Field(
        default=False,
        description=(
            "Let this run replace a raw table with one that is empty or more than "
            "max_shrink_fraction smaller (a tenant whose data was really deleted)."
        ),
    )

    @field_validator("refresh_mode", mode="before")
    @classmethod
    def _check(cls, value: object) -> object:
        return validate_refresh_mode(value)


def _load_metadata(report: LoadReport) -> dict[str, Any]:
    return {
        "api_total": dg.MetadataValue.int(report.api_total)
        if report.api_total is not None
        else dg.MetadataValue.text("not reported by the server"),
        "pages": report.pages,
        "requests": report.requests,
        "retries": report.retries,
        "passes": report.passes,
        "duplicates_dropped": report.duplicates_dropped,
        "surrogates_replaced": report.surrogates_replaced,
        "megabytes": round(report.bytes / 1e6, 1),
        "seconds": round(report.seconds, 2),
        "rows_per_second": round(report.rows_per_second),
    }


def row_count_check(rows: int, previous: int | None, tolerance: float) -> dg.AssetCheckResult:
    """Warn when a load's row count moved by more than ``tolerance`` against the previous load."""
    if previous is None:
        return dg.AssetCheckResult(
            check_name=ROW_COUNT_CHECK,
            passed=True,
            metadata={"rows": rows, "note": "first load: nothing to compare with"},
        )
    change = (rows - previous) / previous if previous else (0.0 if rows == 0 else 1.0)
    return dg.AssetCheckResult(
        check_name=ROW_COUNT_CHECK,
        passed=abs(change) <= tolerance,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={
            "rows": rows,
            "previous_rows": previous,
            "change": dg.MetadataValue.float(round(change, 4)),
            "tolerance": tolerance,
        },
    )


def build_raw_asset(
    names: InstanceNames,
    endpoint: ListEndpoint,
    owners: list[str],
    io_manager_key: str | None = None,
) -> dg.AssetsDefinition:
    """``io_manager_key``: what loads the table as a downstream asset's input (the component's
    ``fieldsales_io_manager``); the asset itself stores nothing through it."""
    key = names.asset_key(raw_asset_name(endpoint))

    @dg.asset(
        key=key,
        io_manager_key=io_manager_key,
        group_name=names.group("raw"),
        kinds={"duckdb"},
        pool=names.pool_for(raw_asset_name(endpoint)),
        owners=owners,
        description=(
            f"Every {endpoint.name.replace('_', ' ')} item (GET {endpoint.path}) as received: "
            f"{endpoint.raw_table}(id, payload, loaded_at"
            f"{''.join(', ' + column for column, _ in endpoint.extra_columns)})."
        ),
        metadata={"endpoint": endpoint.path, "table": endpoint.raw_table},
        required_resource_keys={names.api.key, names.warehouse.key},
        # An incremental transaction refresh compares the event list just loaded with the last.
        deps=[names.asset_key(raw_asset_name(EVENTS))] if endpoint is TRANSACTIONS else None,
        check_specs=[
            dg.AssetCheckSpec(
                ROW_COUNT_CHECK,
                asset=key,
                description=(
                    "The row count moved by at most "
                    f"{ROW_COUNT_TOLERANCE:.0%} against the previous load (a server answering "
                    "short lists, or a tenant's data wiped, shows here)."
                ),
            )
        ],
    )
    def _raw_asset(
        context: dg.AssetExecutionContext, config: RawRefreshConfig
    ) -> dg.MaterializeResult:
        api, warehouse = names.api.of(context), names.warehouse.of(context)
        name = raw_asset_name(endpoint)
        policy = RefreshPolicy.of(warehouse, config.refresh_mode)
        redacted: list[int] = []
        # Two instances can run in one code location: every line names whose lake it writes.
        tenant = f"[{names.tenant}: {warehouse.lake.catalog}] "
        with warehouse.get_connection() as conn:

            def load() -> RefreshReport:
                redacted.clear()  # a lake's write that lost a conflict runs again
                return refresh_raw_list(
                    api,
                    conn,
                    endpoint,
                    policy,
                    log=lambda message: context.log.info(tenant + message),
                    warn=lambda message: context.log.warning(tenant + message),
                    shrink=ShrinkGuard(warehouse.max_shrink_fraction, config.allow_shrink),
                    before_swap=lambda staged: redacted.append(
                        prepare_raw_table(conn, staged, name, warehouse)
                    ),
                )

            refresh = warehouse.one_commit(conn, endpoint.raw_table, load)
            schema = column_schema(conn, endpoint.raw_table, table_doc(name), warehouse.pii)
            metadata = table_metadata(
                conn, warehouse.name, endpoint.raw_table, schema=schema, preview=False
            )
        return dg.MaterializeResult(
            metadata={
                **metadata,
                **_load_metadata(refresh.load),
                **refresh.metadata(),
                "pii_redacted_rows": sum(redacted) if warehouse.redact_pii_in_raw else "not asked",
            },
            check_results=[
                row_count_check(refresh.load.rows, previous_row_count(context), ROW_COUNT_TOLERANCE)
            ],
        )

    return _raw_asset


def build_raw_assets(
    names: InstanceNames, owners: list[str], io_manager_key: str | None = None
) -> list[dg.AssetsDefinition]:
    return [build_raw_asset(names, endpoint, owners, io_manager_key) for endpoint in LIST_ENDPOINTS]
