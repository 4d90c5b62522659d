"""Building a core or mart table: its query, as stored for analysts, swapped in with its comments.

An asset runs its table's query into a staging table (empty strings stored as NULL, personal
columns as ``FieldSalesWarehouse.pii`` says, see ``columns.py``), writes the descriptions as
DuckDB comments, swaps it in for the previous table (a failed query leaves the previous table in
place), and reports the table's described schema, row count and a few rows. A table reading a
decoded table brings it up to date first (``decode.py``); one that follows it adds only what
changed (``follow.py``).
"""

from typing import Any

import duckdb

from fieldsales_dagster.assets.columns import column_schema, comment_table, publishing_query
from fieldsales_dagster.assets.decode import (
    Decoded,
    DecodeRefresh,
    build_table,
    decode_metadata,
    read_shared,
    refresh_decoded,
    share_decoded,
    shared_macros_sql,
)
from fieldsales_dagster.assets.follow import build_following, define_decoded_rows
from fieldsales_dagster.assets.metadata import storage_metadata, table_metadata
from fieldsales_dagster.assets.tables import CoreTable, core_query
from fieldsales_dagster.warehouse.lake import cleanup
from fieldsales_dagster.warehouse.quoting import quote_ident
from fieldsales_dagster.warehouse.warehouse import FieldSalesWarehouse


def share_decoded_of(
    conn: duckdb.DuckDBPyConnection, warehouse: FieldSalesWarehouse, table: CoreTable
) -> dict[Decoded, DecodeRefresh]:
    """``share_decoded`` for each not-kept decoded table ``table`` reads (before its
    transaction)."""
    shared: dict[Decoded, DecodeRefresh] = {}
    for decoded in table.decoded:
        if decoded.kept:
            continue
        try:
            shared[decoded] = share_decoded(conn, warehouse, decoded)
        except RuntimeError as exc:
            raise RuntimeError(
                f"Building {table.table} failed; the previous {table.table} is left as it was. "
                f"It reads {decoded.table}: {exc}"
            ) from exc
    return shared


def build_described_table(
    conn: duckdb.DuckDBPyConnection,
    table: CoreTable,
    warehouse: FieldSalesWarehouse,
    shared: dict[Decoded, DecodeRefresh] | None = None,
) -> dict[str, Any]:
    """Build ``table`` from its query as stored for analysts, with its comments, and swap it in.

    A table reading a decoded table first brings it up to date with its raw table, so the table
    never reads a decode older than the raw data; the returned metadata says how. ``shared``:
    what ``share_decoded_of`` did for the table before its transaction (called here without it).
    Outside a run, the shared decoded tables are dropped after the build.
    """
    own = shared is None
    if shared is None:
        shared = share_decoded_of(conn, warehouse, table)
    try:
        return _build_described(conn, table, warehouse, shared)
    finally:
        if own and not warehouse.in_run:
            warehouse.drop_shared(conn)


def _build_described(
    conn: duckdb.DuckDBPyConnection,
    table: CoreTable,
    warehouse: FieldSalesWarehouse,
    shared: dict[Decoded, DecodeRefresh],
) -> dict[str, Any]:
    refreshed: list[tuple[Decoded, DecodeRefresh]] = []
    for decoded in table.decoded:
        if not decoded.kept:
            read_shared(conn, warehouse, decoded)
            refreshed.append((decoded, shared[decoded]))
            continue
        try:
            refreshed.append((decoded, refresh_decoded(conn, decoded)))
        except RuntimeError as exc:
            raise RuntimeError(
                f"Building {table.table} failed; the previous {table.table} is left as it was. "
                f"It reads {decoded.table}: {exc}"
            ) from exc
    metadata = decode_metadata(refreshed)
    query = core_query(table)
    macros = shared_macros_sql(query)
    try:
        if macros:
            conn.execute(macros)
        if table.follows is not None:
            define_decoded_rows(conn, table.follows)
        published, params = publishing_query(conn, table.table, query, table.doc, warehouse)
    except duckdb.Error as exc:
        raise RuntimeError(
            f"Building {table.table} failed; the previous {table.table} is left as it was. "
            f"DuckDB: {exc}"
        ) from exc

    def describe(staged: str) -> None:
        comment_table(conn, staged, table.description, table.doc, warehouse.pii)

    def build_whole() -> None:
        build_table(conn, table.table, published, params, before_swap=describe)

    try:
        if table.follows is None:
            build_whole()
            return metadata
        followed = build_following(
            conn, table.table, table.follows, published, params, build_whole, macros=macros
        )
        return {**metadata, **followed.metadata()}
    finally:
        with cleanup(conn):
            for decoded in table.decoded:
                if not decoded.kept:
                    name = decoded.table.partition(".")[2]
                    conn.execute(f"DROP VIEW IF EXISTS temp.{quote_ident(name)}")


def materialize_core_table(
    conn: duckdb.DuckDBPyConnection, warehouse: FieldSalesWarehouse, table: CoreTable
) -> dict[str, Any]:
    """Build ``table`` on ``conn`` (on a lake: one commit) and return its metadata (schema, row
    count, preview)."""
    shared = share_decoded_of(conn, warehouse, table)
    try:
        decode = warehouse.one_commit(
            conn, table.table, lambda: build_described_table(conn, table, warehouse, shared)
        )
    finally:
        if not warehouse.in_run:
            warehouse.drop_shared(conn)
    schema = column_schema(conn, table.table, table.doc, warehouse.pii)
    return {
        **table_metadata(
            conn, warehouse.name, table.table, schema=schema, hidden=table.doc.pii_columns
        ),
        **storage_metadata(warehouse, table.table),
        **decode,
    }
