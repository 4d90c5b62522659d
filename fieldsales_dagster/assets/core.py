"""One asset per core or mart table: it builds the table and evaluates its in-step checks."""

from collections.abc import Callable, Iterator, Sequence

import dagster as dg
import duckdb

from fieldsales_dagster.assets.build import materialize_core_table
from fieldsales_dagster.assets.checks import CoreCheck, check_results
from fieldsales_dagster.assets.metadata import (
    STORAGE_KIND,
    last_metadata,
    last_two_metadata,
    schema_change,
    schema_change_spec,
)
from fieldsales_dagster.assets.tables import (
    CoreTable,
    column_lineage,
    derived_tables,
    lineage_markdown,
    query_code_version,
)
from fieldsales_dagster.names import InstanceNames
from fieldsales_dagster.warehouse.rows import one_row

#: Said in the metadata of a build that ran out of memory on several threads and again on one.
RETRIED = "fieldsales/retried"


def _out_of_memory(exc: BaseException | None) -> bool:
    """Whether DuckDB's memory limit ended ``exc`` (itself, or what it was raised from)."""
    while exc is not None and not isinstance(exc, duckdb.OutOfMemoryException):
        exc = exc.__cause__
    return exc is not None


def _threads(conn: duckdb.DuckDBPyConnection) -> int:
    return int(one_row(conn, "SELECT current_setting('threads')")[0])


def build_core_asset(
    names: InstanceNames,
    table: CoreTable,
    owners: list[str],
    freshness_policy: dg.FreshnessPolicy | None,
    checks: Sequence[CoreCheck] = (),
    io_manager_key: str | None = None,
) -> dg.AssetsDefinition:
    """The asset building ``table``, then evaluating ``checks``; a run may select either."""
    key = names.asset_key(table.asset_name)
    by_key = {check.spec(names).key: check for check in checks}
    schema_check = schema_change_spec(key)
    spec = dg.AssetSpec(
        key=key,
        description=table.description,
        group_name=names.group(table.schema),
        kinds={STORAGE_KIND},
        owners=owners,
        deps=[names.asset_key(dep) for dep in table.deps],
        automation_condition=dg.AutomationCondition.eager(),
        freshness_policy=freshness_policy,
        metadata={"table": table.table, "query": f"sql/{table.query_file}"},
        code_version=query_code_version(table),
    )

    @dg.multi_asset(
        name=key.to_python_identifier(),
        specs=[spec.with_io_manager_key(io_manager_key) if io_manager_key else spec],
        check_specs=[*(check.spec(names) for check in checks), schema_check],
        can_subset=True,
        pool=names.pool_for(table.asset_name),
        required_resource_keys={names.warehouse.key},
    )
    def _core_table(
        context: dg.AssetExecutionContext,
    ) -> Iterator[dg.MaterializeResult | dg.AssetCheckResult]:
        warehouse = names.warehouse.of(context)
        keys = sorted(context.selected_asset_check_keys - {schema_check.key}, key=str)
        selected, results = [by_key[k] for k in keys], list[dg.AssetCheckResult]()
        retried = context.retry_number > 0
        with warehouse.get_connection(builds=table.table) as conn:
            if retried:  # the next connection sets the threads anew
                conn.execute("SET threads = 1")

            def check(built_from: Sequence[str] | None) -> None:  # a conflict runs its commit again
                results[:] = check_results(conn, warehouse, names, selected, built_from)

            try:
                if key in context.selected_asset_keys:
                    last = last_metadata(context, key)
                    metadata = materialize_core_table(conn, warehouse, table, check, last)
                else:
                    check(None)
            except Exception as exc:
                # Hash tables and buffers are per thread: one thread needs about half the memory
                # of two. A 10M demo first run failed so, now and then, in mart_user_activity.
                if retried or not _out_of_memory(exc) or (threads := _threads(conn)) < 2:
                    raise
                context.log.warning(
                    f"{table.table} ran out of DuckDB's memory_limit on {threads} threads; "
                    f"running it once more on one thread ({exc})"
                )
                raise dg.RetryRequested(max_retries=1) from exc
        if key in context.selected_asset_keys:
            if retried:
                metadata[RETRIED] = "out of DuckDB's memory_limit on several threads: on one"
            metadata["dagster/column_lineage"] = lineage = column_lineage(names, table)
            # The open-source UI does not show dagster/column_lineage: the same, as a table.
            metadata["fieldsales/column_lineage"] = dg.MetadataValue.md(lineage_markdown(lineage))
            yield dg.MaterializeResult(asset_key=key, metadata=metadata)
        if schema_check.key in context.selected_asset_check_keys:  # alone: the last two
            built = [metadata, last] if key in context.selected_asset_keys else []
            results.append(schema_change(key, built or last_two_metadata(context, key)))
        yield from results

    return _core_table


def build_core_assets(
    names: InstanceNames,
    owners: list[str],
    freshness_policy: dg.FreshnessPolicy | None,
    checks_for: Callable[[CoreTable], Sequence[CoreCheck]] | None = None,
    io_manager_key: str | None = None,
    tables: Sequence[CoreTable] | None = None,
) -> list[dg.AssetsDefinition]:
    """One asset per table of ``tables`` (default: the package's), in its schema's group."""
    checks_of = checks_for or (lambda table: ())
    return [
        build_core_asset(names, t, owners, freshness_policy, checks_of(t), io_manager_key)
        for t in (derived_tables() if tables is None else tables)
    ]
