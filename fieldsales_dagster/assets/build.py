"""Building a core or mart table: its query, as stored for analysts, swapped in with its comments
(a failed query leaves the previous table)."""

from typing import Any

import duckdb

from fieldsales_dagster.assets.columns import comment_table, publishing_query
from fieldsales_dagster.assets.decode import (
    Decoded,
    DecodeRefresh,
    build_table,
    create_macros,
    decode_metadata,
    refresh_decoded,
    share_decoded,
)
from fieldsales_dagster.assets.follow import build_following, define_rows, failing_as
from fieldsales_dagster.assets.metadata import table_metadata
from fieldsales_dagster.assets.tables import CoreTable, core_query
from fieldsales_dagster.warehouse.quoting import qualified, quote_ident
from fieldsales_dagster.warehouse.warehouse import FieldSalesWarehouse


def build_described_table(
    conn: duckdb.DuckDBPyConnection,
    table: CoreTable,
    warehouse: FieldSalesWarehouse,
    commit: bool = False,
) -> dict[str, Any]:
    """Build and swap in ``table``, its decoded tables brought up to date first; if ``commit``, in
    one lake transaction recording what it read (``one_commit``). A not-kept decoded table is
    shared before it (a lake transaction writes one database) and, outside a run, dropped after."""
    refreshed: dict[Decoded, DecodeRefresh] = {}
    shared = [decoded for decoded in table.decoded if not decoded.kept]

    def build() -> dict[str, Any]:
        for decoded in [decoded for decoded in table.decoded if decoded.kept]:
            with failing_as(table.table, reads=decoded.table):
                refreshed[decoded] = refresh_decoded(conn, decoded)
        metadata = decode_metadata([(decoded, refreshed[decoded]) for decoded in table.decoded])
        query = core_query(table)
        with failing_as(table.table):
            macros = create_macros(conn, query)
            if follows := table.follows:
                define_rows(conn, "decoded_rows", f"SELECT * FROM {qualified(follows.decoded)}")
            published, params = publishing_query(conn, table.table, query, table.doc, warehouse)

        def describe(staged: str) -> None:
            comment_table(conn, staged, table.description, table.doc, warehouse.pii)

        def build_whole() -> None:
            build_table(conn, table.table, published, params, before_swap=describe)

        if table.follows is None:
            build_whole()
            return metadata
        return metadata | build_following(
            conn, table.table, table.follows, published, params, build_whole, macros=macros
        )

    try:
        for decoded in shared:
            with failing_as(table.table, reads=decoded.table):
                refreshed[decoded] = share_decoded(conn, warehouse, decoded)
            view = quote_ident(decoded.table.partition(".")[2])  # of the run's shared copy
            shared_copy = warehouse.shared_table(decoded.table)
            conn.execute(f"CREATE OR REPLACE TEMP VIEW {view} AS SELECT * FROM {shared_copy}")
        reads = [dep.replace("_", ".", 1) for dep in table.deps]
        return warehouse.one_commit(conn, table.table, build, reads) if commit else build()
    finally:
        for decoded in shared:
            conn.execute(f"DROP VIEW IF EXISTS {qualified(decoded.table)}")
        if not warehouse.in_run:
            warehouse.drop_shared(conn)


def materialize_core_table(
    conn: duckdb.DuckDBPyConnection, warehouse: FieldSalesWarehouse, table: CoreTable
) -> dict[str, Any]:
    decode = build_described_table(conn, table, warehouse, commit=True)
    return {**table_metadata(conn, warehouse, table.table, table.doc, preview=True), **decode}
