"""Building a core or mart table: its query, as stored for analysts, swapped in with its comments
(a failed query leaves the previous table); or not, where nothing it is made from changed."""

import functools
import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import dagster as dg
import duckdb

from fieldsales_dagster.assets.columns import PACKAGE_SQL, comment_table, publishing_query
from fieldsales_dagster.assets.decode import (
    DecodeRefresh,
    build_table,
    create_macros,
    decode_metadata,
    decoded_digest,
    keep_parsed,
    parse_shared,
    refresh_decoded,
    share_decoded,
)
from fieldsales_dagster.assets.follow import (
    FOLLOW_KEYS,
    FOLLOW_ROWS,
    build_following,
    changed_rows,
    define_followed,
    define_whole,
    failing_as,
    named_keys,
)
from fieldsales_dagster.assets.metadata import table_metadata
from fieldsales_dagster.assets.tables import CoreTable, core_query, derived_tables
from fieldsales_dagster.warehouse.lake import (
    ANY_CODE,
    cleanup,
    run_transaction,
    still_valid,
    table_exists,
)
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


def read_later(
    conn: duckdb.DuckDBPyConnection,
    warehouse: FieldSalesWarehouse,
    table: CoreTable,
    decoded: str,
    since: int,
) -> str | None:
    """SQL of the ids of the ``decoded`` rows that the tables following it by the keys a table
    names (``named_by``) read (``reads``) for the keys named since snapshot ``since``, where each
    table naming them was built from its inputs as they are: a step scanning the payloads anyway
    parses these too, so that later steps find theirs parsed (each still parses what it lacks).
    ``None`` where there are none, or a change feed cannot tell."""
    lake, folder = warehouse.lake, table.folder
    later = [
        source
        for other in derived_tables(folder)
        for source in (other.follows.sources if other.follows else [])
        if source.decoded == decoded and source.reads and source.named_by
    ]
    named: dict[str, dict[str, None]] = {}
    for source in later:
        for read, keys in source.named_by.items():
            named.setdefault(read, {})[keys] = None
    feeds = [f"_fs_later_changed{i}" for i in range(len(named))]
    for (read, lists), feed in zip(named.items(), feeds, strict=True):
        if still_valid(conn, lake, read, ANY_CODE) is None:  # built again later in the run
            return None
        if changed_rows(conn, lake, read, since, f"flatten([{', '.join(lists)}]) AS keys", feed):
            return None
    if not feeds:
        return None
    named_keys(conn, "_fs_later_keys", feeds)  # the current build's followed() stays as it is
    define_followed(conn, "_fs_later_keys", "_fs_later_named")
    reads = [re.sub(r"\bfollowed\(", "_fs_later_named(", source.reads) for source in later]
    create_macros(conn, "\n".join(reads))
    union = " UNION ".join(f"SELECT id FROM ({sql})" for sql in reads)
    conn.execute(f"CREATE OR REPLACE TEMP TABLE _fs_later_ids AS {union}")
    return "SELECT id FROM _fs_later_ids"


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
    A not-kept decoded table is shared (a lake transaction writes one database), its rows parsed
    as the build reads them, and, outside a run, dropped after."""
    refreshed = {decoded: DecodeRefresh("current", 0) for decoded in table.decoded}
    shared = {decoded.table: decoded for decoded in table.decoded if not decoded.kept}

    def parse(name: str, ids: str | None, since: int | None = None) -> None:
        if decoded := shared.get(name):

            def later() -> str | None:
                return None if since is None else read_later(conn, warehouse, table, name, since)

            with failing_as(table.table, reads=decoded.table):
                parsed = parse_shared(conn, decoded, ids, later)
            refreshed[decoded] = refreshed[decoded].and_then(parsed)

    def build() -> dict[str, Any]:
        for decoded in [decoded for decoded in table.decoded if decoded.kept]:
            with failing_as(table.table, reads=decoded.table):
                refreshed[decoded] = refresh_decoded(
                    conn, decoded, warehouse.lake if commit else None
                )
        query = core_query(table)
        follows = table.follows
        with failing_as(table.table):
            sources = follows.sources if follows else []
            named = [sql for s in sources for sql in (s.reads, *s.named_by.values())]
            macros = create_macros(conn, "\n".join([query, *named]))
            define_whole(conn, follows)
            published, params = publishing_query(conn, table.table, query, table.doc, warehouse)

        def describe(staged: str) -> None:
            comment_table(conn, staged, table.description, table.doc, warehouse.pii)

        def build_whole() -> None:
            for name in shared:
                parse(name, None)
            build_table(conn, table.table, published, params, before_swap=describe)

        try:
            if follows is None:
                build_whole()
                built = {}
            else:
                lake = warehouse.lake if commit else None
                built = build_following(
                    conn,
                    table.table,
                    follows,
                    published,
                    params,
                    build_whole,
                    "\n".join([macros, *map(decoded_digest, table.decoded)]),
                    lake,
                    {decoded.table: decoded.source for decoded in table.decoded},
                    parse,
                )
            then()
        finally:
            with cleanup(conn):
                for name in (FOLLOW_ROWS, FOLLOW_KEYS):
                    conn.execute(f"DROP TABLE IF EXISTS {name}")
        return decode_metadata([(d, refreshed[d]) for d in table.decoded]) | built

    try:
        for decoded in shared.values():
            with failing_as(table.table, reads=decoded.table):
                share_decoded(conn, warehouse, decoded)
        if commit:
            fingerprint = build_fingerprint(table, warehouse)
            return warehouse.one_commit(
                conn, table.table, build, inputs_of(table), fingerprint=fingerprint
            )
        return build()
    finally:
        for decoded in shared.values():
            keep_parsed(conn, warehouse, decoded)
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
    ``check`` it, given ``None``, all read at one snapshot, in one transaction (outside one, each
    lake query reads the catalog first: ~3 ms, a dozen times a step). ``last``: the asset's last
    metadata (``table_metadata``)."""

    def describe() -> dict[str, Any]:
        return table_metadata(conn, warehouse, table.table, table.doc, preview=True, last=last)

    def kept() -> dict[str, Any] | None:
        if (why := unchanged(conn, warehouse, table)) is None:
            return None
        check(None)
        return {**describe(), "fieldsales/build": f"unchanged: {why}"}

    if (found := run_transaction(conn, table.table, kept, reading=True)) is not None:
        return found
    built = {"fieldsales/build": "full: the table follows no changes (no follows: in its YAML)"}
    then = functools.partial(check, inputs_of(table))
    built |= build_described_table(conn, table, warehouse, commit=True, then=then)
    return {**describe(), **built}
