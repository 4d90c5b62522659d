"""Decoded tables, the shared SQL macros, and the staged build every table swaps in by.

A decoded table (``Decoded``) is one raw table's payloads parsed once, for the several core
tables that read them: it is brought up to date with its raw table before a table reading it
builds (``refresh_decoded``, or ``share_decoded`` for one a run's steps share outside the lake).
The macros of ``sql/<name>.sql`` (``SHARED_MACROS``) are created on a connection before a query
calling them runs (``create_macros``). ``build_table`` runs a query into a staging table and
swaps it in: a failed query leaves the previous table in place.
"""

import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import duckdb

from fieldsales_dagster.assets.columns import PACKAGE_SQL
from fieldsales_dagster.assets.follow import (
    WHOLE_ABOVE,
    failing_as,
    fingerprint,
    rows_missing,
    same_row,
)
from fieldsales_dagster.pause import pause_at
from fieldsales_dagster.warehouse.lake import drop_table, run_transaction
from fieldsales_dagster.warehouse.quoting import qualified, quote_ident, sql_literal
from fieldsales_dagster.warehouse.rows import one_row
from fieldsales_dagster.warehouse.warehouse import FieldSalesWarehouse, replace_table, staging_table


@dataclass(frozen=True)
class Decoded:
    """A pipeline-internal table: one raw table's payloads parsed once, for several core tables.

    Not part of the contract. It keeps the raw table's ``id`` and ``loaded_at``: every load stamps
    the rows it writes with its own ``loaded_at`` and keeps the others as they were, so the rows
    the decode lacks, and those it holds in vain, are told apart without parsing anything. After
    an incremental raw load only the re-fetched rows are parsed (``refresh_decoded``).

    A ``temp.<name>`` table is not kept (``kept``): the run's steps share one decode, outside
    the lake (``share_decoded``), each reading it as ``temp.<name>``.
    """

    #: ``meta.<name>`` (a lake table) or ``temp.<name>`` (not kept).
    table: str
    source: str
    description: str

    @property
    def kept(self) -> bool:
        """False for a ``temp.*`` table: it holds personal values, which core.* hashes or drops
        as ``pii`` says, so it is never written to the lake (as a lake table, a failed step left
        its Parquet files in the data path until the upkeep deleted orphans)."""
        return self.table.partition(".")[0] != "temp"


#: Every raw.transactions payload parsed once: core.transactions and core.custom_report_results
#: read it instead of parsing the ~5 KB payloads once each.
TRANSACTIONS_DECODED = Decoded(
    "meta.transactions_decoded",
    "raw.transactions",
    "Pipeline-internal, not for analysis (use core.transactions and "
    "core.custom_report_results): raw.transactions' payloads parsed once for the core tables.",
)


#: Every raw.events payload parsed once: the eight tables that read events read it instead of
#: parsing the payloads (up to ~14 KB each) once each; see temp_events_decoded.sql. Not kept:
#: it holds the events' personal values (names, emails, IPs).
EVENTS_DECODED = Decoded(
    "temp.events_decoded",
    "raw.events",
    "Pipeline-internal, not for analysis (use core.events and the other core tables): "
    "raw.events' payloads parsed once for the core tables.",
)


#: Every decoded table, in the order a table reading several brings them up to date.
DECODED_TABLES: tuple[Decoded, ...] = (TRANSACTIONS_DECODED, EVENTS_DECODED)


def decoded_query(decoded: Decoded) -> str:
    """The SQL that parses ``decoded``'s rows to decode, as shipped in the package."""
    return (PACKAGE_SQL / f"{decoded.table.replace('.', '_')}.sql").read_text("utf-8")


@dataclass(frozen=True)
class DecodeRefresh:
    """What ``refresh_decoded`` did: ``mode`` (current, incremental or full), rows parsed."""

    mode: str
    parsed: int


def decode_metadata(refreshed: Sequence[tuple[Decoded, DecodeRefresh]]) -> dict[str, Any]:
    """What bringing a table's decoded tables up to date did (nothing when it reads none)."""
    if not refreshed:
        return {}
    done = [f"{d.table}: {r.mode} ({r.parsed:,} payloads parsed)" for d, r in refreshed]
    return {
        "fieldsales/decode": "; ".join(done),
        "fieldsales/decode_payloads_parsed": sum(r.parsed for _, r in refreshed),
    }


def build_decoded(conn: duckdb.DuckDBPyConnection, decoded: Decoded) -> DecodeRefresh:
    """Parse all of ``decoded.source`` into the kept ``decoded.table``, staged and swapped like a
    core table."""

    def describe(staged: str) -> None:
        conn.execute(f"COMMENT ON TABLE {qualified(staged)} IS {sql_literal(decoded.description)}")

    _define_rows_to_decode(conn, decoded)
    build_table(conn, decoded.table, decoded_query(decoded), before_swap=describe)
    (rows,) = one_row(conn, f"SELECT count(*) FROM {qualified(decoded.table)}")
    return DecodeRefresh("full", rows)


def share_decoded(
    conn: duckdb.DuckDBPyConnection, warehouse: FieldSalesWarehouse, decoded: Decoded
) -> DecodeRefresh:
    """Bring the not-kept ``decoded`` up to date for this run's steps; returns what it did.

    Parsed once per run: the first step builds it whole (``"full"``) in the process's DuckDB
    instance (``FieldSalesWarehouse.shared_table``: memory, spilled to the local temp_directory),
    the run's other steps read it (``"current"``) while its raw table holds the same rows
    (``fingerprint``); the run's end drops it (``drop_shared``). Outside a transaction: the
    lake's transaction may write one database only.
    """
    source = fingerprint(conn, decoded.source)
    if source is not None and warehouse.shared_source(decoded.table) == source:
        return DecodeRefresh("current", 0)
    shared = warehouse.shared_table(decoded.table)
    _define_rows_to_decode(conn, decoded)
    with failing_as(decoded.table):
        warehouse.create_shared_schema(conn)
        conn.execute(f"CREATE OR REPLACE TABLE {shared} AS\n{decoded_query(decoded)}")
    warehouse.shared_built(decoded.table, source)
    (rows,) = one_row(conn, f"SELECT count(*) FROM {shared}")
    return DecodeRefresh("full", rows)


def read_shared(
    conn: duckdb.DuckDBPyConnection, warehouse: FieldSalesWarehouse, decoded: Decoded
) -> None:
    """``temp.<name>``: a view of the step's connection on the run's shared ``decoded``."""
    name = decoded.table.partition(".")[2]
    conn.execute(
        f"CREATE OR REPLACE TEMP VIEW {quote_ident(name)} AS "
        f"SELECT * FROM {warehouse.shared_table(decoded.table)}"
    )


def refresh_decoded(conn: duckdb.DuckDBPyConnection, decoded: Decoded) -> DecodeRefresh:
    """Bring ``decoded`` up to date with its raw table; returns what it did.

    ``"current"``: nothing to do. ``"incremental"``: only the source rows the decode lacks (by
    ``id`` and ``loaded_at``) are parsed and inserted, and the rows no longer in the source are
    deleted, in one transaction. ``"full"``: no decode yet, or more than ``WHOLE_ABOVE`` of
    the source to parse (after a full raw load, every row). Either way the result holds exactly
    what a full decode of the source would hold.
    """
    found = fingerprint(conn, decoded.table)
    if found is None or _layout_changed(conn, decoded):
        return build_decoded(conn, decoded)
    raw = fingerprint(conn, decoded.source)
    assert raw is not None, f"{decoded.table} exists without its source {decoded.source}"
    if found == raw:
        return DecodeRefresh("current", 0)
    missing, rows = rows_missing(conn, decoded.source, decoded.table, "_fs_to_decode", slices=4)
    if missing > WHOLE_ABOVE * raw[0]:
        return build_decoded(conn, decoded)
    _define_rows_to_decode(conn, decoded, rows)
    query = decoded_query(decoded)
    create_macros(conn, query)  # the decode types values with typed_values.sql

    def update() -> None:
        conn.execute(
            f"DELETE FROM {qualified(decoded.table)} AS d WHERE NOT EXISTS "
            f"(SELECT 1 FROM {qualified(decoded.source)} AS s WHERE {same_row('s', 'd')})"
        )
        conn.execute(f"INSERT INTO {qualified(decoded.table)} BY NAME\n{query}")

    with failing_as(decoded.table, "Updating"):
        run_transaction(conn, decoded.table, update)
    return DecodeRefresh("incremental", missing)


def _layout_changed(conn: duckdb.DuckDBPyConnection, decoded: Decoded) -> bool:
    """Whether the stored decode's columns (names, types) differ from its query's: a decode
    written by an earlier release is parsed again whole, not read with a layout it lacks. A query
    that does not bind (a raw table without its payload) is built whole, which names the error."""
    _define_rows_to_decode(conn, decoded, f"SELECT * FROM {qualified(decoded.source)} LIMIT 0")
    query = decoded_query(decoded)
    try:
        create_macros(conn, query)
        wanted = [row[:2] for row in conn.execute(f"DESCRIBE {query}").fetchall()]
    except duckdb.Error:
        return True
    stored = conn.execute(f"DESCRIBE SELECT * FROM {qualified(decoded.table)}").fetchall()
    return wanted != [row[:2] for row in stored]


def _define_rows_to_decode(
    conn: duckdb.DuckDBPyConnection, decoded: Decoded, rows: str = ""
) -> None:
    """``rows_to_decode()``, the rows a decode query parses: ``rows``, or all of the source (in
    slices, to bound the parser's memory)."""
    rows = rows or f"SELECT * FROM {decoded.source.replace('.', '_')}_in_slices()"
    create_macros(conn, rows)
    conn.execute(f"CREATE OR REPLACE TEMP MACRO rows_to_decode() AS TABLE {rows}")


#: Connection-scoped macros the queries and checks share (``sql/<name>.sql``; a file defines
#: the macro it is named after, and may define helpers beside it).
SHARED_MACROS = (
    "raw_transactions_in_slices",
    "raw_events_in_slices",
    "field_type_kinds",
    "known_event_states",
    "typed_values",
)


@functools.cache
def macro_file(name: str) -> tuple[str, tuple[str, ...]]:
    """``sql/<name>.sql`` as one statement list, and the names of the macros it defines."""
    text = (PACKAGE_SQL / f"{name}.sql").read_text("utf-8")
    defined = tuple(re.findall(r"CREATE OR REPLACE TEMP MACRO (\w+)\(", text))
    return text.strip().rstrip(";"), defined


def macro_files_called(query: str) -> list[str]:
    """The names of the macro files ``query`` calls a macro of."""
    return [
        name for name in SHARED_MACROS if any(f"{macro}(" in query for macro in macro_file(name)[1])
    ]


def shared_macros_sql(query: str) -> str:
    """The macro files ``query`` calls a macro of (DuckDB binds a macro's tables when it is
    created)."""
    return ";\n".join(macro_file(name)[0] for name in macro_files_called(query))


def create_macros(conn: duckdb.DuckDBPyConnection, query: str) -> str:
    """Create on ``conn`` the shared macros ``query`` calls; returns their SQL."""
    if macros := shared_macros_sql(query):
        conn.execute(macros)
    return macros


def build_table(
    conn: duckdb.DuckDBPyConnection,
    target: str,
    query: str,
    params: dict[str, object] | None = None,
    before_swap: Callable[[str], None] | None = None,
) -> None:
    """Run ``query`` into a staging table and swap it in for ``target``.

    ``before_swap(staged)`` runs on the staging table (comments, for example), so readers never
    see the new table without it. If either fails, ``target`` keeps its previous contents; the
    error names the table.
    """
    staged = staging_table(target)
    conn.execute(f"CREATE SCHEMA IF NOT EXISTS {quote_ident(target.partition('.')[0])}")
    with failing_as(target):
        try:
            create_macros(conn, query)
            conn.execute(f"CREATE OR REPLACE TABLE {qualified(staged)} AS\n{query}", params or {})
            if before_swap is not None:
                before_swap(staged)
            pause_at("core")
        except duckdb.Error:
            drop_table(conn, qualified(staged))
            raise
    replace_table(conn, staged, target)
