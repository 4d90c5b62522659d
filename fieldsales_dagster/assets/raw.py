"""Raw assets: every item of each list endpoint, as received, in ``raw.*``."""

from datetime import UTC, datetime
from typing import Any

import dagster as dg
import duckdb
from pydantic import Field, field_validator, model_validator

from fieldsales_dagster.assets.columns import prepare_raw_table, table_doc
from fieldsales_dagster.assets.metadata import (
    STORAGE_KIND,
    last_metadata,
    previous_row_count,
    schema_change,
    schema_change_spec,
    table_metadata,
)
from fieldsales_dagster.assets.resync_config import ResyncConfig
from fieldsales_dagster.client.endpoints import EVENTS, LIST_ENDPOINTS, TRANSACTIONS, ListEndpoint
from fieldsales_dagster.loading.incremental import RefreshReport, refresh_raw_list
from fieldsales_dagster.loading.resync import resync_transactions
from fieldsales_dagster.names import InstanceNames
from fieldsales_dagster.settings import validate_refresh_mode
from fieldsales_dagster.warehouse.lake import ensure_table
from fieldsales_dagster.warehouse.quoting import qualified

ROW_COUNT_CHECK = "row_count_near_previous_load"
#: A load whose row count moved by more than this share of the previous one's warns.
ROW_COUNT_TOLERANCE = 0.2


def raw_asset_name(endpoint: ListEndpoint) -> str:
    return f"raw_{endpoint.name}"


class RawRefreshConfig(dg.Config):
    """Run config of a raw asset: force the refresh mode of one run, or allow a large shrink."""

    refresh_mode: str | None = Field(
        default=None,
        description="auto | full | incremental for this run (raw_transactions; the other lists "
        "are always fetched whole). Empty: the warehouse's refresh_mode.",
    )
    allow_shrink: bool = Field(
        default=False,
        description="Let this run replace a raw table with one that is empty or more than "
        "max_shrink_fraction smaller (a tenant whose data was really deleted).",
    )

    @field_validator("refresh_mode", mode="before")
    @classmethod
    def _check(cls, value: object) -> object:
        return validate_refresh_mode(value)


class TransactionsRefreshConfig(RawRefreshConfig):
    """Run config of ``raw_transactions``: the raw assets' own, or a re-sync on demand."""

    resync: ResyncConfig | None = Field(
        default=None,
        description="Instead of a refresh, re-fetch the transactions of the events event_ids "
        "names, or whose status changed between changed_from and changed_to (docs/refresh.md).",
    )

    @model_validator(mode="after")
    def _resync_alone(self) -> "TransactionsRefreshConfig":
        if self.resync is not None and self.refresh_mode is not None:
            raise ValueError(
                f"refresh_mode ({self.refresh_mode}) and resync exclude each other: a re-sync "
                "re-fetches only the events it names; leave refresh_mode empty"
            )
        return self


#: Per raw load, in its commit, the run that wrote rows stamped with its loaded_at (dlt's load id).
LOAD_RUNS = "meta.load_runs"


def record_load_run(
    conn: duckdb.DuckDBPyConnection, table: str, run_id: str, asset_key: str
) -> None:
    """Record that run ``run_id`` (asset ``asset_key``) wrote ``table``'s newest load."""
    columns = "loaded_at TIMESTAMP, run_id VARCHAR, asset_key VARCHAR, recorded_at TIMESTAMP"
    ensure_table(conn, LOAD_RUNS, f"table_name VARCHAR, {columns}")
    # An empty table has no row to trace; a load that wrote no row (nothing changed) leaves the
    # newest stamp to its earlier run.
    conn.execute(
        f"INSERT INTO {LOAD_RUNS} SELECT $1, stamp, $2, $3, $4 FROM (SELECT max(loaded_at) AS "
        f"stamp FROM {qualified(table)}) WHERE stamp IS NOT NULL AND NOT EXISTS "
        f"(SELECT 1 FROM {LOAD_RUNS} WHERE table_name = $1 AND loaded_at = stamp)",
        [table, run_id, asset_key, datetime.now(UTC).replace(tzinfo=None)],
    )


def row_count_check(rows: int, previous: int | None, tolerance: float) -> dg.AssetCheckResult:
    if previous is None:
        first: dict[str, Any] = {"rows": rows, "note": "first load: nothing to compare with"}
        return dg.AssetCheckResult(check_name=ROW_COUNT_CHECK, passed=True, metadata=first)
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


#: What a load cost, and what it dropped or repaired, each as metadata.
LOAD_COSTS = ("pages", "requests", "retries", "passes", "duplicates_dropped", "surrogates_replaced")


def raw_columns(endpoint: ListEndpoint) -> tuple[str, ...]:
    return ("id", "payload", "loaded_at", *(column for column, _ in endpoint.extra_columns))


def _materialize(
    names: InstanceNames,
    endpoint: ListEndpoint,
    context: dg.AssetExecutionContext,
    config: RawRefreshConfig,
) -> dg.MaterializeResult:
    api, warehouse = names.api.of(context), names.warehouse.of(context)
    name, table = raw_asset_name(endpoint), endpoint.raw_table
    # Two instances can run in one code location: every line names whose lake it writes.
    tenant = f"[{names.tenant}: {warehouse.lake.catalog}] "
    redacted: list[int] = []
    with warehouse.get_connection(builds=table) as conn:

        def before_swap(staged: str) -> None:
            redacted.append(prepare_raw_table(conn, staged, name, warehouse))

        def refresh() -> RefreshReport:
            redacted.clear()  # a lake's write that lost a conflict runs again
            resync = config.resync if isinstance(config, TransactionsRefreshConfig) else None
            common: dict[str, Any] = {"before_swap": before_swap, "run_id": context.run_id}
            common["log"] = lambda message: context.log.info(tenant + message)
            if resync is not None:
                request = resync.request(datetime.now(UTC))
                redact = warehouse.redact_pii_in_raw
                report = resync_transactions(api, conn, request, redact_pii_in_raw=redact, **common)
            else:
                report = refresh_raw_list(
                    api,
                    conn,
                    endpoint,
                    warehouse,
                    mode=config.refresh_mode,
                    warn=lambda message: context.log.warning(tenant + message),
                    allow_shrink=config.allow_shrink,
                    **common,
                )
            # In the load's commit: each row's loaded_at leads to this run.
            record_load_run(conn, table, context.run_id, names.asset_key(name).to_user_string())
            return report

        report = warehouse.one_commit(conn, table, refresh, wrote=lambda r: r.load.written)
        last = last_metadata(context, context.asset_key)
        metadata = table_metadata(conn, warehouse, table, table_doc(name), last=last)
    load = report.load
    api_total = "not reported by the server" if load.api_total is None else load.api_total
    if report.mode == "resync":
        api_total = "not asked: a re-sync checks each event's list, not the total"
    return dg.MaterializeResult(
        metadata={
            **metadata,
            "api_total": api_total,
            **{name: getattr(load, name) for name in LOAD_COSTS},
            "megabytes": round(load.bytes / 1e6, 1),
            "table_written": load.written,
            "seconds": round(load.seconds, 2),
            "rows_per_second": round(load.rows / load.seconds) if load.seconds > 0 else 0,
            **report.metadata(),
            "pii_redacted_rows": sum(redacted) if warehouse.redact_pii_in_raw else "not asked",
        },
        check_results=[
            row_count_check(load.rows, previous_row_count(last), ROW_COUNT_TOLERANCE),
            schema_change(context.asset_key, [metadata, last]),
        ],
    )


def build_raw_asset(
    names: InstanceNames,
    endpoint: ListEndpoint,
    owners: list[str],
    io_manager_key: str | None = None,
) -> dg.AssetsDefinition:
    """``io_manager_key`` loads the table for downstream inputs; the asset stores nothing by it."""
    name = raw_asset_name(endpoint)
    key = names.asset_key(name)
    # Dagster reads the run config's type from the annotation: raw_transactions also takes resync.
    config_type = TransactionsRefreshConfig if endpoint is TRANSACTIONS else RawRefreshConfig

    @dg.asset(
        key=key,
        io_manager_key=io_manager_key,
        group_name=names.group("raw"),
        kinds={STORAGE_KIND},
        pool=names.pool_for(name),
        owners=owners,
        description=f"Every {endpoint.name.replace('_', ' ')} item (GET {endpoint.path}) as "
        f"received: {endpoint.raw_table}({', '.join(raw_columns(endpoint))}).",
        metadata={"endpoint": endpoint.path, "table": endpoint.raw_table},
        required_resource_keys={names.api.key, names.warehouse.key},
        # An incremental transaction refresh compares the event list just loaded with the last.
        deps=[names.asset_key(raw_asset_name(EVENTS))] if endpoint is TRANSACTIONS else None,
        check_specs=[
            dg.AssetCheckSpec(
                ROW_COUNT_CHECK,
                asset=key,
                description=f"The row count moved by at most {ROW_COUNT_TOLERANCE:.0%} against "
                "the previous load (short lists from a server, or a wiped tenant, show here).",
            ),
            schema_change_spec(key),
        ],
    )
    def _raw_asset(
        context: dg.AssetExecutionContext,
        config: config_type,  # type: ignore[valid-type]  # a class, chosen above
    ) -> dg.MaterializeResult:
        return _materialize(names, endpoint, context, config)

    return _raw_asset


def build_raw_assets(
    names: InstanceNames, owners: list[str], io_manager_key: str | None = None
) -> list[dg.AssetsDefinition]:
    return [build_raw_asset(names, endpoint, owners, io_manager_key) for endpoint in LIST_ENDPOINTS]
