"""Metadata every table asset reports, in the conventions the Dagster UI understands."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import dagster as dg
import duckdb

from fieldsales_dagster.assets.columns import TableDoc, column_schema
from fieldsales_dagster.warehouse.lake import changed_since, snapshot_stamp
from fieldsales_dagster.warehouse.quoting import qualified, quote_ident
from fieldsales_dagster.warehouse.rows import one_row
from fieldsales_dagster.warehouse.warehouse import FieldSalesWarehouse

STORAGE_KIND = "ducklake"
PREVIEW_ROWS = 5
PREVIEW_CELL_CHARS = 40
#: How the metadata described its table, and at which snapshot of the lake:
#: ``<digest> at snapshot <id> of <commit time>`` (another lake may have a snapshot of that id).
DESCRIBED = "fieldsales/described"
_AT = " at snapshot "
#: What a description carries (``preview`` where it has one).
_KEPT = (DESCRIBED, "dagster/row_count", "dagster/column_schema", "preview")


def markdown_preview(
    conn: duckdb.DuckDBPyConnection, table: str, hidden: tuple[str, ...] = ()
) -> str:
    """The first rows of ``table`` as markdown, without ``hidden`` (personal) columns."""
    exclude = f" EXCLUDE ({', '.join(quote_ident(c) for c in hidden)})" if hidden else ""
    cursor = conn.execute(f"SELECT *{exclude} FROM {qualified(table)} LIMIT {PREVIEW_ROWS}")
    header = [column[0] for column in cursor.description]
    rows = [header, ["---"] * len(header), *cursor.fetchall()]
    return "\n".join("| " + " | ".join(map(_markdown_cell, row)) + " |" for row in rows)


def _markdown_cell(value: object) -> str:
    text = "" if value is None else " ".join(str(value).splitlines())
    if len(text) > PREVIEW_CELL_CHARS:
        text = text[: PREVIEW_CELL_CHARS - 1] + "…"
    return text.replace("|", "\\|")


def table_metadata(
    conn: duckdb.DuckDBPyConnection,
    warehouse: FieldSalesWarehouse,
    table: str,
    doc: TableDoc,
    *,
    pii_policy: str | None = None,
    preview: bool = False,
    last: Mapping[str, dg.MetadataValue] | None = None,
) -> dict[str, Any]:
    """Row count, name, column schema and storage of ``table``; a preview without the personal
    columns if asked. Outside a write of it, the row count, schema and preview of ``last`` (the
    asset's last materialization's metadata) where it described ``table`` the same way at a
    snapshot no commit since wrote (a table left unchanged: ~20 ms a step not spent reading it)."""
    pii, last = pii_policy or warehouse.pii, last or {}
    how = repr((doc, pii, preview, PREVIEW_ROWS, PREVIEW_CELL_CHARS))
    digest = hashlib.sha256(how.encode()).hexdigest()[:16]
    metadata: dict[str, Any] = storage_metadata(warehouse, table)
    described, lake = f"{digest}{_AT}", warehouse.lake
    before = str(getattr(last.get(DESCRIBED), "value", ""))
    at = before.removeprefix(described).partition(" ")[0]
    if (
        at.isdigit()
        and before == f"{described}{snapshot_stamp(conn, lake, int(at))}"
        and not changed_since(conn, lake, int(at), [table])
    ):
        return metadata | {key: last[key] for key in _KEPT if key in last}
    metadata[DESCRIBED] = f"{described}{snapshot_stamp(conn, lake)}"  # before the table is read
    (row_count,) = one_row(conn, f"SELECT count(*) FROM {qualified(table)}")
    metadata["dagster/row_count"] = int(row_count)
    metadata["dagster/column_schema"] = column_schema(conn, table, doc, pii)
    if preview:
        metadata["preview"] = dg.MetadataValue.md(markdown_preview(conn, table, doc.pii_columns))
    return metadata


def storage_metadata(warehouse: FieldSalesWarehouse, table: str) -> dict[str, str]:
    """``dagster/table_name`` as analysts name it (``<lake alias>.core.events``), and
    ``dagster/uri``: ``ducklake:<catalog>?table=core.events``; the catalog setting never holds a
    password (a variable does)."""
    lake = warehouse.lake
    catalog = f"sqlite:{lake.catalog_file.resolve()}" if lake.catalog_file else lake.catalog
    schema = f"&metadata_schema={lake.schema}" if lake.schema else ""
    return {
        "dagster/table_name": f"{lake.alias}.{table}",
        "dagster/storage_kind": STORAGE_KIND,
        "dagster/uri": f"ducklake:{catalog}?table={table}{schema}",
    }


#: Of one run (its id), each of its assets' last materialization before it.
_LAST: dict[str, Mapping[dg.AssetKey, dg.EventLogEntry | None]] = {}

Context = dg.AssetExecutionContext | dg.AssetCheckExecutionContext


def _before_run(context: Context) -> Mapping[dg.AssetKey, dg.EventLogEntry | None]:
    """Each asset's last materialization before this run, read by its first step for every asset
    the run materializes in one query of the event log (a query a step was ~5 ms): each asset
    materializes once a run, after reading it."""
    if (run := context.run.run_id) not in _LAST:
        keys = context.run.asset_selection or context.job_def.asset_layer.executable_asset_keys
        _LAST.clear()  # one run at a time in a process (the in-process executor)
        _LAST[run] = context.instance.get_latest_materialization_events(keys)
    return _LAST[run]


def last_metadata(context: Context, key: dg.AssetKey) -> Mapping[str, dg.MetadataValue]:
    """The metadata of ``key``'s last materialization before this run; empty if it has none."""
    found = _before_run(context).get(key)
    return found.asset_materialization.metadata if found and found.asset_materialization else {}


#: Each table asset's check of its columns against its previous materialization's, evaluated in
#: the step that materializes it (with the metadata it read before, ``last_metadata``).
SCHEMA_CHECK = "column_schema_change"


def schema_change_spec(key: dg.AssetKey) -> dg.AssetCheckSpec:
    description = "The columns (names and types) are those of the previous materialization."
    return dg.AssetCheckSpec(SCHEMA_CHECK, asset=key, description=description)


def schema_change(key: dg.AssetKey, metadata: Sequence[Mapping[str, Any]]) -> dg.AssetCheckResult:
    """``key``'s columns in ``metadata``, its last two materializations' (the last first; none,
    empty): this step's and the last before the run, or, in a run of the check alone, the last
    two (``last_two_metadata``)."""
    passed, description = _schema_change([m.get("dagster/column_schema") for m in metadata if m])
    severity = dg.AssetCheckSeverity.WARN
    return dg.AssetCheckResult(
        asset_key=key,
        check_name=SCHEMA_CHECK,
        passed=passed,
        severity=severity,
        description=description,
    )


def _schema_change(values: list[Any]) -> tuple[bool, str]:
    if len(values) < 2:
        return True, "The asset has been materialized fewer than 2 times."
    schemas = [v for v in (getattr(v, "value", v) for v in values) if isinstance(v, dg.TableSchema)]
    if len(schemas) < 2:
        return False, "A materialization of the last two has no column schema metadata."
    latest, previous = ({c.name: c.type for c in schema.columns} for schema in schemas)
    changes = [f"added: {name}" for name in latest.keys() - previous.keys()]
    changes += [f"removed: {name}" for name in previous.keys() - latest.keys()]
    changes += [f"{n}: {previous[n]} -> {t}" for n, t in latest.items() if previous.get(n, t) != t]
    if not (changed := "; ".join(sorted(changes))):
        return True, "The columns are those of the previous materialization."
    return False, f"Column schema changed since the previous materialization: {changed}"


def last_two_metadata(context: Context, key: dg.AssetKey) -> list[Mapping[str, Any]]:
    """The metadata of ``key``'s last two materializations, the last first (fewer where it has
    fewer): what a run of its checks alone compares."""
    records = context.instance.fetch_materializations(key, limit=2).records
    return [r.asset_materialization.metadata for r in records if r.asset_materialization]


def previous_row_count(last: Mapping[str, dg.MetadataValue]) -> int | None:
    """The row count ``last`` (a materialization's metadata) reported, if any."""
    value = last.get("dagster/row_count")
    return int(value.value) if value is not None else None  # type: ignore[arg-type]
