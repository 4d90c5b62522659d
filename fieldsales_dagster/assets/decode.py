"""Decoded tables, the shared SQL macros, and ``build_table``, the staged build of every table."""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import duckdb

from fieldsales_dagster.assets.columns import PACKAGE_SQL
from fieldsales_dagster.assets.follow import (
    WHOLE_ABOVE,
    changed_rows,
    counted,
    define_rows,
    failing_as,
    fingerprint,
    loaded_between,
)
from fieldsales_dagster.pause import pause_at
from fieldsales_dagster.warehouse.lake import (
    Lake,
    changed_since,
    drop_table,
    record_evaluation,
    run_transaction,
    still_valid,
    table_exists,
)
from fieldsales_dagster.warehouse.quoting import qualified, quote_ident, sql_literal
from fieldsales_dagster.warehouse.rows import one_row
from fieldsales_dagster.warehouse.warehouse import FieldSalesWarehouse, replace_table, staging_table


@dataclass(frozen=True)
class Decoded:
    """Pipeline-internal, not in the contract: raw payloads parsed once for core tables."""

    #: ``meta.<name>`` (a lake table) or ``temp.<name>`` (not kept).
    table: str
    source: str
    description: str = ""  # a kept table's comment

    @property
    def kept(self) -> bool:
        """False for ``temp.*``: it holds personal values, so it never goes to the lake."""
        return self.table.partition(".")[0] != "temp"


#: Every raw.transactions payload (~5 KB each) parsed once for the two tables reading them.
TRANSACTIONS_DECODED = Decoded(
    "meta.transactions_decoded",
    "raw.transactions",
    "Pipeline-internal (analysts: core.transactions): raw.transactions' payloads parsed once.",
)
#: raw.events payloads (up to ~14 KB each), each parsed once per run, when a step first reads it.
EVENTS_DECODED = Decoded("temp.events_decoded", "raw.events")
#: Every decoded table by name, in the order a table reading several brings them up to date.
DECODED_BY_TABLE = {decoded.table: decoded for decoded in (TRANSACTIONS_DECODED, EVENTS_DECODED)}


@dataclass(frozen=True)
class DecodeRefresh:
    """What ``refresh_decoded`` did: ``mode`` (current, incremental or full), rows parsed."""

    mode: str
    parsed: int

    def and_then(self, later: DecodeRefresh) -> DecodeRefresh:
        """This and a ``later`` parse of one build, as one."""
        mode = max(self.mode, later.mode, key=("current", "incremental", "full").index)
        return DecodeRefresh(mode, self.parsed + later.parsed)


def decode_metadata(refreshed: Sequence[tuple[Decoded, DecodeRefresh]]) -> dict[str, Any]:
    if not refreshed:
        return {}
    done = [f"{d.table}: {r.mode} ({r.parsed:,} payloads parsed)" for d, r in refreshed]
    return {
        "fieldsales/decode": "; ".join(done),
        "fieldsales/decode_payloads_parsed": sum(r.parsed for _, r in refreshed),
    }


def build_decoded(conn: duckdb.DuckDBPyConnection, decoded: Decoded) -> DecodeRefresh:
    def describe(staged: str) -> None:
        conn.execute(f"COMMENT ON TABLE {qualified(staged)} IS {sql_literal(decoded.description)}")

    build_table(conn, decoded.table, _decode_query(conn, decoded), before_swap=describe)
    (rows,) = one_row(conn, f"SELECT count(*) FROM {qualified(decoded.table)}")
    return DecodeRefresh("full", rows)


def share_decoded(
    conn: duckdb.DuckDBPyConnection, warehouse: FieldSalesWarehouse, decoded: Decoded
) -> None:
    """Read ``decoded`` in this step (``temp.<name>``, a view) as the run's copy of it, shared by
    the run's steps in the process's DuckDB while its raw table's ``fingerprint`` holds (begun
    again, empty, where it changed), with the rows this step parses (``parse_shared``) until
    ``keep_parsed``. Outside a transaction: the lake's writes one database only."""
    source = qualified(decoded.source)
    empty = functools.partial(_decode_query, conn, decoded, f"SELECT * FROM {source} LIMIT 0")
    shared, here = warehouse.shared_table(decoded.table), qualified(_parsed_here(decoded))
    with failing_as(decoded.table):
        warehouse.share(conn, decoded.table, fingerprint(conn, decoded.source), empty)
        conn.execute(
            f"CREATE OR REPLACE TEMP TABLE {here} AS FROM {shared} LIMIT 0; "
            f"CREATE OR REPLACE TEMP VIEW {quote_ident(decoded.table.partition('.')[2])} AS "
            f"FROM {shared} UNION ALL FROM {here}"
        )


def parse_shared(
    conn: duckdb.DuckDBPyConnection,
    decoded: Decoded,
    ids: str | None,
    later: Callable[[], str | None] = lambda: None,
) -> DecodeRefresh:
    """Parse the rows of ``ids`` (SQL selecting ``id``; all if ``None``) that ``decoded``, read
    by ``share_decoded``, lacks: into a temp table, which a lake transaction may write. A run
    parses each row when a step first reads it (all: every row, kept where lacking); a step
    finding none to parse reads no payload (the ids are found first). A step that reads payloads
    parses in the same scan the rows of the ids ``later()`` selects, which later steps read. Only
    the files whose ``loaded_at`` range holds those rows' are read: a run's changed rows are in
    files of their own (2.7 MB of the 3M tenant's 258 MB of event payloads)."""
    source = qualified(decoded.source)
    missing = (
        f"SELECT r.id, r.loaded_at FROM {source} AS r "
        f"ANTI JOIN {qualified(decoded.table)} AS d USING (id)"
    )
    here = qualified(_parsed_here(decoded))
    with failing_as(decoded.table):
        among = "" if ids is None else f" WHERE r.id IN ({ids})"
        conn.execute(f"CREATE OR REPLACE TEMP TABLE _fs_to_parse AS {missing}{among}")
        if not one_row(conn, "SELECT count(*) FROM _fs_to_parse")[0]:
            return DecodeRefresh("current", 0)
        if ids is not None and (also := later()) is not None:
            among = f" WHERE r.id IN ({ids}) OR r.id IN ({also})"
            conn.execute(f"CREATE OR REPLACE TEMP TABLE _fs_to_parse AS {missing}{among}")
        if ids is None:
            # Every payload in slices, joined to nothing, then the rows the run's copy has are
            # dropped: the payloads joined to the ids to parse needed more than 64MB on the heavy
            # tenant (test_core_memory.py); these parse ~40MB.
            (parsed,) = one_row(conn, f"INSERT INTO {here} BY NAME\n{_decode_query(conn, decoded)}")
            conn.execute(f"DELETE FROM {here} WHERE id NOT IN (SELECT id FROM _fs_to_parse)")
            return DecodeRefresh("full", parsed)
        within = loaded_between(conn, "_fs_to_parse", "true")
        rows = f"SELECT * FROM {source} SEMI JOIN _fs_to_parse USING (id) WHERE {within}"
        query = _decode_query(conn, decoded, rows)
        (parsed,) = one_row(conn, f"INSERT INTO {here} BY NAME\n{query}")
    return DecodeRefresh("incremental", parsed)


def keep_parsed(
    conn: duckdb.DuckDBPyConnection, warehouse: FieldSalesWarehouse, decoded: Decoded
) -> None:
    """After the step's transaction: the rows it parsed join the run's copy, for the next."""
    conn.execute(f"DROP VIEW IF EXISTS {qualified(decoded.table)}")
    here = _parsed_here(decoded)
    if table_exists(conn, here):  # not where share_decoded failed
        shared = warehouse.shared_table(decoded.table)
        conn.execute(f"INSERT INTO {shared} FROM {qualified(here)}; DROP TABLE {qualified(here)}")


def _parsed_here(decoded: Decoded) -> str:
    return f"temp._fs_parsed_{decoded.table.partition('.')[2]}"


def refresh_decoded(
    conn: duckdb.DuckDBPyConnection, decoded: Decoded, lake: Lake | None = None
) -> DecodeRefresh:
    """Parse only the rows ``decoded`` lacks and drop those gone, unless ``WHOLE_ABOVE`` are new.
    In ``lake``, nothing where no commit wrote the source since the snapshot the last refresh by
    this query read (``record_evaluation``): a run's second table reading it scans no key. One
    transaction (nested in the caller's), so the snapshot recorded is the one read."""
    return run_transaction(conn, decoded.table, lambda: _refresh(conn, decoded, lake))


def decoded_digest(decoded: Decoded) -> str:
    """A hash of ``decoded``'s query and macros: where it changed, the refresh is whole, and so is
    the next build of each table following it (its state, ``follow.build_following``)."""
    query = _decode_sql(decoded)
    return hashlib.sha256(f"{query}\n{shared_macros_sql(query)}".encode()).hexdigest()


def _refresh(conn: duckdb.DuckDBPyConnection, decoded: Decoded, lake: Lake | None) -> DecodeRefresh:
    digest = decoded_digest(decoded)
    found = still_valid(conn, lake, decoded.table, digest, judged=False) if lake else None
    stale = not table_exists(conn, decoded.table) or _layout_changed(conn, decoded)
    if lake is None or found is None or stale:
        refreshed = build_decoded(conn, decoded)
    elif not changed_since(conn, lake, found.read, [decoded.source]):
        return DecodeRefresh("current", 0)
    else:
        refreshed = _parse_changed(conn, decoded, lake, found.read)
    if lake:
        record_evaluation(conn, decoded.table, [decoded.source], digest)
    return refreshed


def _parse_changed(
    conn: duckdb.DuckDBPyConnection, decoded: Decoded, lake: Lake, since: int
) -> DecodeRefresh:
    """Replace the rows of the ids its source's commits after snapshot ``since`` inserted or
    deleted (``changed_rows``): the source's rows of those ids, parsed in ``slices`` parts by
    ``rowid``, each for a statement of its own: parts joined in one statement keep every part's
    join and scan in memory at once (at 10M transactions, 101,483 rows to decode in 4 parts ran
    out of 192MB; one at a time, they passed). Whole where more than ``WHOLE_ABOVE`` are new."""
    changed, slices = "_fs_to_decode", 4
    if changed_rows(conn, lake, decoded.source, since, "id, loaded_at", changed):
        return build_decoded(conn, decoded)
    (rows,) = one_row(conn, f"SELECT count(*) FROM {qualified(decoded.source)}")
    new, _, within = counted(conn, changed)
    if new > WHOLE_ABOVE * rows:
        return build_decoded(conn, decoded)
    with failing_as(decoded.table, "Updating"):
        conn.execute(
            f"DELETE FROM {qualified(decoded.table)} WHERE id IN (SELECT id FROM {changed})"
        )
        for i in range(slices):
            part = f"{within} AND rowid % {slices} = {i}"
            query = _decode_query(conn, decoded, f"FROM {qualified(decoded.source)} WHERE {part}")
            conn.execute(f"INSERT INTO {qualified(decoded.table)} BY NAME\n{query}")
    return DecodeRefresh("incremental", new)


def _layout_changed(conn: duckdb.DuckDBPyConnection, decoded: Decoded) -> bool:
    """Whether the stored columns differ from the query's, or it fails to bind (build it whole)."""
    query = _decode_query(conn, decoded, f"SELECT * FROM {qualified(decoded.source)} LIMIT 0")
    try:
        wanted = [row[:2] for row in conn.execute(f"DESCRIBE {query}").fetchall()]
    except duckdb.Error:
        return True
    stored = conn.execute(f"DESCRIBE SELECT * FROM {qualified(decoded.table)}").fetchall()
    return wanted != [row[:2] for row in stored]


def _decode_sql(decoded: Decoded) -> str:
    return (PACKAGE_SQL / f"{decoded.table.replace('.', '_')}.sql").read_text("utf-8")


def _decode_query(conn: duckdb.DuckDBPyConnection, decoded: Decoded, rows: str = "") -> str:
    """``decoded``'s query, its macros created and ``rows_to_decode()`` defined as ``rows``, or
    all of the source in slices (for the parser's memory)."""
    rows = rows or f"SELECT * FROM {decoded.source.replace('.', '_')}_in_slices()"
    query = _decode_sql(decoded)
    create_macros(conn, f"{rows}\n{query}")  # the decode types values with typed_values.sql
    define_rows(conn, "rows_to_decode", rows)
    return query


@functools.cache
def macro_file(name: str) -> tuple[str, tuple[str, ...]]:
    """``sql/<name>.sql`` and the connection-scoped macros it defines (for queries and checks)."""
    text = (PACKAGE_SQL / f"{name}.sql").read_text("utf-8")
    defined = tuple(re.findall(r"CREATE OR REPLACE TEMP MACRO (\w+)\(", text))
    return text.strip().rstrip(";"), defined


def macro_files_called(query: str) -> list[str]:
    names = sorted(path.stem for path in PACKAGE_SQL.glob("*.sql"))
    return [name for name in names if any(f"{m}(" in query for m in macro_file(name)[1])]


def shared_macros_sql(query: str) -> str:
    return ";\n".join(macro_file(name)[0] for name in macro_files_called(query))


def create_macros(conn: duckdb.DuckDBPyConnection, query: str) -> str:
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
    """``query`` into a staging table, ``before_swap(staged)``, then swapped in for ``target``."""
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
