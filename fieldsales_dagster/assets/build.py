"""Building a core or mart table: its query, as stored for analysts, swapped in with its comments
(a failed query leaves the previous table); or not, where nothing it is made from changed."""

import functools
import hashlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import dagster as dg
import duckdb

from fieldsales_dagster.assets.columns import PACKAGE_SQL, comment_table, publishing_query
from fieldsales_dagster.assets.decode import (
    Decoded,
    DecodeRefresh,
    build_table,
    create_macros,
    decode_metadata,
    refresh_decoded,
    share_decoded,
)
from fieldsales_dagster.assets.follow import (
    FOLLOW_ROWS,
    build_following,
    define_rows,
    failing_as,
)
from fieldsales_dagster.assets.metadata import table_metadata
from fieldsales_dagster.assets.tables import CoreTable, core_query
from fieldsales_dagster.warehouse.lake import cleanup, still_valid, table_exists
from fieldsales_dagster.warehouse.quoting import qualified, quote_ident
from fieldsales_dagster.warehouse.warehouse import FieldSalesWarehouse

#: The code that shapes a built table beside its query (publishing, decoding, comments, PII), and
#: evaluates its checks.
_MODULES = ("build", "checks", "columns", "decode", "follow")
BUILD_CODE = (
    *(Path(__file__).parent / f"{name}.py" for name in _MODULES),
    Path(__file__).parent.parent / "warehouse" / "pii.py",
)


@functools.cache
def code_digest(folder: Path) -> str:
    """DuckDB's version, the build code, and every query, macro and YAML file it may read."""
    digest = hashlib.sha256(duckdb.__version__.encode())
    files = sorted({*folder.glob("*.sql"), *folder.glob("*.yaml"), *PACKAGE_SQL.glob("*.sql")})
    for path in [*BUILD_CODE, *files]:
        digest.update(f"{path.name}\0".encode() + path.read_bytes())
    return digest.hexdigest()


def build_fingerprint(table: CoreTable, warehouse: FieldSalesWarehouse) -> str | None:
    """What ``table`` is made of besides its inputs' rows: code, queries, the PII policy. ``None``
    where its personal columns are hashed: the key is never stored, so nothing compares."""
    if warehouse.pii == "hash" and table.table.startswith("core.") and table.doc.pii_columns:
        return None
    return f"{code_digest(table.folder)}:{warehouse.pii}"


def inputs_of(table: CoreTable) -> list[str]:
    """The lake tables ``table``'s build reads: a decoded table's raw table among them, not the
    decoded table (which the build's own commit writes)."""
    return [dep.replace("_", ".", 1) for dep in table.deps]


def unchanged(
    conn: duckdb.DuckDBPyConnection, warehouse: FieldSalesWarehouse, table: CoreTable
) -> str | None:
    """Why ``table`` is still what a build would make now, or ``None``: its last build is
    ``still_valid`` (the same ``build_fingerprint``, no input changed since the snapshot it read)
    and the table is there."""
    found = still_valid(conn, warehouse.lake, table.table, build_fingerprint(table, warehouse))
    if found is None or not table_exists(conn, table.table):
        return None
    return f"{', '.join(found.reads)} and its code and settings are as at snapshot {found.read}"


def build_described_table(
    conn: duckdb.DuckDBPyConnection,
    table: CoreTable,
    warehouse: FieldSalesWarehouse,
    commit: bool = False,
    then: Callable[[], object] = lambda: None,
) -> dict[str, Any]:
    """Build and swap in ``table``, its decoded tables brought up to date first, then call
    ``then``; if ``commit``, in one lake transaction recording what it read and its
    ``build_fingerprint`` (``one_commit``), with what ``then`` writes.
    A not-kept decoded table is shared before it (a lake transaction writes one database) and,
    outside a run, dropped after."""
    refreshed: dict[Decoded, DecodeRefresh] = {}
    shared = [decoded for decoded in table.decoded if not decoded.kept]

    def build() -> dict[str, Any]:
        for decoded in [decoded for decoded in table.decoded if decoded.kept]:
            with failing_as(table.table, reads=decoded.table):
                refreshed[decoded] = refresh_decoded(
                    conn, decoded, warehouse.lake if commit else None
                )
        metadata = decode_metadata([(decoded, refreshed[decoded]) for decoded in table.decoded])
        query = core_query(table)
        with failing_as(table.table):
            macros = create_macros(conn, query)
            follows = table.follows
            for source in follows.sources if follows else []:
                define_rows(conn, source.rows, f"SELECT * FROM {qualified(source.decoded)}")
            published, params = publishing_query(conn, table.table, query, table.doc, warehouse)

        def describe(staged: str) -> None:
            comment_table(conn, staged, table.description, table.doc, warehouse.pii)

        def build_whole() -> None:
            build_table(conn, table.table, published, params, before_swap=describe)

        try:
            if follows is None:
                build_whole()
            else:
                lake = warehouse.lake if commit else None
                metadata |= build_following(
                    conn, table.table, follows, published, params, build_whole, macros, lake
                )
            then()
        finally:
            with cleanup(conn):
                conn.execute(f"DROP TABLE IF EXISTS {FOLLOW_ROWS}")
        return metadata

    try:
        for decoded in shared:
            with failing_as(table.table, reads=decoded.table):
                refreshed[decoded] = share_decoded(conn, warehouse, decoded)
            view = quote_ident(decoded.table.partition(".")[2])  # of the run's shared copy
            shared_copy = warehouse.shared_table(decoded.table)
            conn.execute(f"CREATE OR REPLACE TEMP VIEW {view} AS SELECT * FROM {shared_copy}")
        if commit:
            fingerprint = build_fingerprint(table, warehouse)
            return warehouse.one_commit(
                conn, table.table, build, inputs_of(table), fingerprint=fingerprint
            )
        return build()
    finally:
        for decoded in shared:
            conn.execute(f"DROP VIEW IF EXISTS {qualified(decoded.table)}")
        if not warehouse.in_run:
            warehouse.drop_shared(conn)


def materialize_core_table(
    conn: duckdb.DuckDBPyConnection,
    warehouse: FieldSalesWarehouse,
    table: CoreTable,
    check: Callable[[Sequence[str] | None], object],
    last: Mapping[str, dg.MetadataValue] | None = None,
) -> dict[str, Any]:
    """Build ``table`` and ``check`` it in the build's commit, given what the build read; or where
    it is ``unchanged``, say why, write nothing (no input was written since its build was
    recorded, ``FieldSalesWarehouse.one_commit``, so readers still see a complete refresh) and
    ``check`` it, given ``None``. ``last``: the asset's last metadata (``table_metadata``)."""
    built: dict[str, Any] = {
        "fieldsales/build": "full: the table follows no changes (no follows: in its YAML)"
    }
    if why := unchanged(conn, warehouse, table):
        built = {"fieldsales/build": f"unchanged: {why}"}
        check(None)
    else:
        then = functools.partial(check, inputs_of(table))
        built |= build_described_table(conn, table, warehouse, commit=True, then=then)
    described = table_metadata(conn, warehouse, table.table, table.doc, preview=True, last=last)
    return {**described, **built}
