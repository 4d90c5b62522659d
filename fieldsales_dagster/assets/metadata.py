"""Metadata every table asset reports, in the conventions the Dagster UI understands."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg
import duckdb

from fieldsales_dagster.assets.columns import TableDoc, column_schema
from fieldsales_dagster.warehouse.quoting import qualified, quote_ident
from fieldsales_dagster.warehouse.rows import one_row
from fieldsales_dagster.warehouse.warehouse import FieldSalesWarehouse

STORAGE_KIND = "ducklake"
PREVIEW_ROWS = 5
PREVIEW_CELL_CHARS = 40


def table_name(database: str, table: str) -> str:
    """``<catalog>.<schema>.<table>``: DuckDB names a file's catalog after the file's stem."""
    return f"{Path(database).stem}.{table}"


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
) -> dict[str, Any]:
    """Row count, name, column schema and storage of ``table``; a preview without the personal
    columns if asked."""
    (row_count,) = one_row(conn, f"SELECT count(*) FROM {qualified(table)}")
    metadata: dict[str, Any] = {
        "dagster/row_count": int(row_count),
        "dagster/table_name": table_name(warehouse.name, table),
        "dagster/column_schema": column_schema(conn, table, doc, pii_policy or warehouse.pii),
        **storage_metadata(warehouse, table),
    }
    if preview:
        metadata["preview"] = dg.MetadataValue.md(markdown_preview(conn, table, doc.pii_columns))
    return metadata


def storage_metadata(warehouse: FieldSalesWarehouse, table: str) -> dict[str, str]:
    """``dagster/uri``: ``ducklake:<catalog>?table=core.events``; the catalog setting never
    holds a password (a variable does)."""
    lake = warehouse.lake
    catalog = f"sqlite:{lake.catalog_file.resolve()}" if lake.catalog_file else lake.catalog
    schema = f"&metadata_schema={lake.schema}" if lake.schema else ""
    return {
        "dagster/storage_kind": STORAGE_KIND,
        "dagster/uri": f"ducklake:{catalog}?table={table}{schema}",
    }


def previous_row_count(context: dg.AssetExecutionContext) -> int | None:
    event = context.instance.get_latest_materialization_event(context.asset_key)
    materialization = event.asset_materialization if event else None
    value = materialization.metadata.get("dagster/row_count") if materialization else None
    return int(value.value) if value is not None else None
