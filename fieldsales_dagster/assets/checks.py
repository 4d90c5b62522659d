"""Asset checks on the core tables: each one queries DuckDB and says what it found.

Blocking checks guard what must hold for a table to be used at all (unique ids). Data-quality
findings that come from the API's data rather than from our decoding (values outside a slider's
range, transactions whose event was not paged yet) are warnings with the offending rows named.
"""

from collections.abc import Callable

import dagster as dg

from fieldsales_dagster.assets.core import CORE_TABLES, CoreTable
from fieldsales_dagster.names import InstanceNames
from fieldsales_dagster.warehouse.resource import FieldSalesWarehouse, qualified, quote_ident

#: How many offending rows a check names in its metadata.
SAMPLE_SIZE = 5

#: ``evaluate(warehouse) -> result``: the body of one check.
Evaluate = Callable[[FieldSalesWarehouse], dg.AssetCheckResult]


def _fetch_one(warehouse: FieldSalesWarehouse, sql: str) -> tuple:
    with warehouse.get_connection() as conn:
        return conn.execute(sql).fetchone()


def _table(name: str) -> CoreTable:
    return next(table for table in CORE_TABLES if table.table == name)


def _bind(
    names: InstanceNames,
    table: CoreTable,
    evaluate: Evaluate,
    *,
    name: str,
    description: str,
    blocking: bool = False,
    also_reads: tuple[CoreTable, ...] = (),
) -> dg.AssetChecksDefinition:
    """One check of ``table``'s asset in this instance, reading through its warehouse resource."""

    @dg.asset_check(
        asset=names.asset_key(table.asset_name),
        name=name,
        description=description,
        blocking=blocking,
        additional_deps=[names.asset_key(other.asset_name) for other in also_reads],
        required_resource_keys={names.warehouse_resource},
    )
    def _check(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
        return evaluate(getattr(context.resources, names.warehouse_resource))

    return _check


def ids_unique(table: CoreTable) -> Evaluate:
    columns = ", ".join(quote_ident(c) for c in table.key)
    any_null = " OR ".join(f"{quote_ident(c)} IS NULL" for c in table.key)
    key_text = " || ' / ' || ".join(
        f"coalesce({quote_ident(c)}::VARCHAR, 'NULL')" for c in table.key
    )
    sql = f"""
        WITH keys AS (
            SELECT {key_text} AS key_text, bool_or({any_null}) AS has_null, count(*) AS n
            FROM {qualified(table.table)}
            GROUP BY {columns}
        )
        SELECT
            coalesce(sum(n) FILTER (WHERE n > 1), 0) AS duplicated_rows,
            coalesce(sum(n) FILTER (WHERE has_null), 0) AS rows_with_null_key,
            coalesce(
                list(key_text ORDER BY n DESC, key_text) FILTER (WHERE n > 1 OR has_null),
                []
            )[1:{SAMPLE_SIZE}] AS sample
        FROM keys
    """
    key_label = ", ".join(table.key)

    def _ids_unique(warehouse: FieldSalesWarehouse) -> dg.AssetCheckResult:
        duplicated, with_null, sample = _fetch_one(warehouse, sql)
        return dg.AssetCheckResult(
            passed=duplicated == 0 and with_null == 0,
            severity=dg.AssetCheckSeverity.ERROR,
            metadata={
                "key": key_label,
                "duplicated_rows": int(duplicated),
                "rows_with_null_key": int(with_null),
                "offending_keys": ", ".join(sample),
            },
        )

    return _ids_unique


def event_ids_known(warehouse: FieldSalesWarehouse) -> dg.AssetCheckResult:
    unknown, sample = _fetch_one(
        warehouse,
        f"""
        SELECT
            count(*),
            coalesce(list(t.transaction_id ORDER BY t.transaction_id), [])[1:{SAMPLE_SIZE}]
        FROM core.transactions AS t
        ANTI JOIN core.events AS e ON e.event_id = t.event_id
        """,
    )
    return dg.AssetCheckResult(
        passed=unknown == 0,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={
            "transactions_with_unknown_event": int(unknown),
            "sample_transaction_ids": ", ".join(sample),
        },
    )


def slider_values_valid(warehouse: FieldSalesWarehouse) -> dg.AssetCheckResult:
    out_of_range, off_step, sample = _fetch_one(
        warehouse,
        f"""
        SELECT
            count(*) FILTER (WHERE NOT in_range),
            count(*) FILTER (WHERE NOT on_step),
            coalesce(
                list(
                    source || ' ' || report_id || ' / ' || field_id || ' = ' || value_raw
                    ORDER BY source, report_id, field_id
                ) FILTER (WHERE NOT in_range OR NOT on_step),
                []
            )[1:{SAMPLE_SIZE}]
        FROM core.custom_report_results
        """,
    )
    return dg.AssetCheckResult(
        passed=out_of_range == 0 and off_step == 0,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={
            "out_of_range": int(out_of_range),
            "off_step": int(off_step),
            "sample_results": ", ".join(sample),
        },
    )


def field_types_resolved(warehouse: FieldSalesWarehouse) -> dg.AssetCheckResult:
    unresolved, by_source, sample = _fetch_one(
        warehouse,
        f"""
        WITH unresolved AS (
            SELECT * FROM core.custom_report_results WHERE field_type IS NULL
        )
        SELECT
            count(*),
            (SELECT coalesce(string_agg(source || ': ' || n, ', ' ORDER BY source), '')
             FROM (SELECT source, count(*) AS n FROM unresolved GROUP BY source)),
            coalesce(list(DISTINCT field_id ORDER BY field_id), [])[1:{SAMPLE_SIZE}]
        FROM unresolved
        """,
    )
    return dg.AssetCheckResult(
        passed=unresolved == 0,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={
            "unresolved": int(unresolved),
            "unresolved_by_source": by_source,
            "sample_field_ids": ", ".join(s for s in sample if s is not None),
        },
    )


def coordinates_in_range(warehouse: FieldSalesWarehouse) -> dg.AssetCheckResult:
    invalid, sample = _fetch_one(
        warehouse,
        f"""
        SELECT count(*), coalesce(list(pos_id ORDER BY pos_id), [])[1:{SAMPLE_SIZE}]
        FROM core.dim_point_of_sale
        WHERE NOT (
            coalesce(longitude BETWEEN -180 AND 180, true)
            AND coalesce(latitude BETWEEN -90 AND 90, true)
            AND coalesce(place_lng BETWEEN -180 AND 180, true)
            AND coalesce(place_lat BETWEEN -90 AND 90, true)
        )
        """,
    )
    return dg.AssetCheckResult(
        passed=invalid == 0,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata={"points_of_sale_out_of_range": int(invalid), "sample_pos_ids": ", ".join(sample)},
    )


def build_core_checks(names: InstanceNames) -> list[dg.AssetChecksDefinition]:
    """Every check of the core tables: uniqueness from each table's key, then the data checks."""
    transactions = _table("core.transactions")
    events = _table("core.events")
    results = _table("core.custom_report_results")
    points_of_sale = _table("core.dim_point_of_sale")
    return [
        *(
            _bind(
                names,
                table,
                ids_unique(table),
                name="ids_unique",
                description=(
                    f"Every row of {table.table} has a distinct, non-NULL ({', '.join(table.key)})."
                ),
                blocking=True,
            )
            for table in CORE_TABLES
        ),
        _bind(
            names,
            transactions,
            event_ids_known,
            name="event_ids_known",
            also_reads=(events,),
            description=(
                "Every transaction's event_id is present in core.events. A warning only: the API "
                "pages transactions and events separately, so an event created meanwhile can be "
                "missing until the next refresh."
            ),
        ),
        _bind(
            names,
            results,
            slider_values_valid,
            name="slider_values_valid",
            description=(
                "Slider values lie within the field's minimum..maximum and on its step grid "
                "(counted from the minimum). Counts values that do not, and names a few."
            ),
        ),
        _bind(
            names,
            results,
            field_types_resolved,
            name="field_types_resolved",
            description=(
                "Every custom report value is resolved to a field definition with a field type. "
                "Counts values whose field no known configuration defines (they keep value_raw "
                "only)."
            ),
        ),
        _bind(
            names,
            points_of_sale,
            coordinates_in_range,
            name="coordinates_in_range",
            description=(
                "Point-of-sale coordinates (location and places-directory) are valid: longitude "
                "within ±180, latitude within ±90. A failure usually means swapped or scaled "
                "coordinates."
            ),
        ),
    ]
