"""A core table that follows its decoded table's changes instead of being rebuilt whole.

After an incremental raw load, ``meta.transactions_decoded`` changed in a few rows (the
transactions of re-fetched events), and ``core.custom_report_results`` need only change in the
rows those transactions give. A table that declares ``Follows`` is brought up to date so:

- the decoded rows (``id``, ``loaded_at``) the table reflects are kept in ``Follows.inputs``;
- the decoded rows added since, and those gone, are told apart by two anti joins on those keys;
- the table's rows from the gone and the added decoded rows are deleted, its other rows (those
  not from decoded rows, such as event results) too, and the table's query is run over the added
  decoded rows only: it returns their rows and all the others again; all in one transaction.

That equals a whole rebuild only while everything else a decoded row's table rows depend on is
unchanged. ``Follows.resolved_against`` names those tables and the columns those rows read
(``core.custom_report_fields``' field definitions), and their content, the query text and its
macros are fingerprinted in ``STATE_TABLE``: any
difference, a missing state, hashed personal columns (whose key is never stored, not even
hashed), or more than ``WHOLE_ABOVE`` of the decoded rows changed, and the table is rebuilt
whole. A whole rebuild forgets the state first, so a crash between the swap and the new state
leaves no state, and the next build is whole again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import duckdb
import msgspec

from fieldsales_dagster.warehouse.lake import cleanup, run_transaction
from fieldsales_dagster.warehouse.quoting import qualified
from fieldsales_dagster.warehouse.rows import one_row
from fieldsales_dagster.warehouse.warehouse import table_exists

STATE_TABLE = "meta.core_follow_state"

#: Above this share of its source's rows to add, a table is rebuilt whole rather than updated:
#: deleting and inserting most of a table costs more than writing it anew.
WHOLE_ABOVE = 0.2


def same_row(a: str, b: str) -> str:
    """SQL: rows ``a`` and ``b`` are the same load of the same item (``id``, ``loaded_at``)."""
    return f"{a}.id = {b}.id AND {a}.loaded_at IS NOT DISTINCT FROM {b}.loaded_at"


def fingerprint(
    conn: duckdb.DuckDBPyConnection, table: str, columns: str = "id, loaded_at"
) -> tuple | None:
    """Row count and a hash of every row's ``columns``; ``None`` without the table.

    Every load stamps the rows it writes with its own ``loaded_at``, so a decode holds exactly the
    rows (ids and loads) its raw table holds when their fingerprints are equal, and a raw table
    refreshed since differs in its count or the hash.
    """
    try:  # one query: a missing table has no fingerprint
        return one_row(conn, f"SELECT count(*), bit_xor(hash({columns})) FROM {qualified(table)}")
    except duckdb.CatalogException:
        return None


@contextmanager
def failing_as(target: str, doing: str = "Building", reads: str = "") -> Iterator[None]:
    """A DuckDB error in the block (with ``reads``: the failure to bring that decoded table up to
    date) fails naming ``target``, which is left as it was."""
    caught: type[Exception] = RuntimeError if reads else duckdb.Error
    try:
        yield
    except caught as exc:
        cause = f"It reads {reads}" if reads else "DuckDB"
        raise RuntimeError(
            f"{doing} {target} failed; the previous {target} is left as it was. {cause}: {exc}"
        ) from exc


def rows_missing(
    conn: duckdb.DuckDBPyConnection, source: str, target: str, keys: str, slices: int = 1
) -> tuple[int, str]:
    """How many rows of ``source`` ``target`` lacks by (``id``, ``loaded_at``), and SQL selecting
    them, every column.

    Their keys go into the temporary table ``keys`` first: the anti join reads narrow columns
    only. The returned SELECT reads the rows themselves within those keys' ``loaded_at`` range:
    the rows a load wrote are its newest, so DuckDB skips older row groups by their min/max
    without reading their wide columns. ``slices`` > 1 reads them in that many slices by rowid,
    to bound the JSON parser's memory as ``raw_transactions_in_slices`` does.
    """
    conn.execute(
        f"CREATE OR REPLACE TEMP TABLE {keys} AS SELECT s.id, s.loaded_at "
        f"FROM {qualified(source)} AS s ANTI JOIN {qualified(target)} AS t ON {same_row('s', 't')}"
    )
    count, first, last, undated = one_row(
        conn,
        f"SELECT count(*), min(loaded_at), max(loaded_at), count(*) - count(loaded_at) FROM {keys}",
    )
    within = "false"
    if first is not None:
        within = f"s.loaded_at BETWEEN TIMESTAMP '{first}' AND TIMESTAMP '{last}'"
    if undated:
        within = f"({within} OR s.loaded_at IS NULL)"
    rows = f"SELECT s.* FROM {qualified(source)} AS s SEMI JOIN {keys} AS k ON {same_row('s', 'k')}"
    if slices > 1:
        within += f" AND s.rowid % {slices} = "
        return count, "\nUNION ALL\n".join(f"{rows} WHERE {within}{i}" for i in range(slices))
    return count, f"{rows} WHERE {within}"


class Follows(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """How a core table follows a decoded table: ``follows:`` of its YAML (see the module
    docstring)."""

    #: The decoded table whose rows the query reads through ``decoded_rows()``.
    decoded: str
    #: The table's column holding the decoded row's ``id`` its row comes from.
    key: str
    #: Where the decoded rows the table reflects are kept.
    inputs: str
    #: SQL predicate: the table's rows that come from decoded rows (the others are rebuilt).
    from_decoded: str = "true"
    #: What the decoded rows' table rows read of other tables: table -> its columns read. Any
    #: change there, and the table is rebuilt whole. Only the rows from decoded rows are kept
    #: across builds, so only the columns those rows read count.
    resolved_against: dict[str, str] = msgspec.field(default_factory=dict)


def define_decoded_rows(conn: duckdb.DuckDBPyConnection, follows: Follows, rows: str = "") -> None:
    """``decoded_rows()``: all of the decoded table, or the rows ``rows`` selects."""
    rows = rows or f"SELECT * FROM {qualified(follows.decoded)}"
    conn.execute(f"CREATE OR REPLACE TEMP MACRO decoded_rows() AS TABLE {rows}")


def build_following(
    conn: duckdb.DuckDBPyConnection,
    table: str,
    follows: Follows,
    query: str,
    params: dict[str, object],
    build_whole: Callable[[], None],
    macros: str = "",
) -> dict[str, Any]:
    """Bring ``table`` up to date: incrementally when it is safe, else ``build_whole()``; returns
    how, as metadata.

    ``query`` is the table's SQL as stored, reading its decoded rows from ``decoded_rows()``;
    ``params`` are its parameters, ``macros`` the text of the shared macros it calls (a change
    there changes the rows too, so it is fingerprinted with the query).
    """
    conn.execute("CREATE SCHEMA IF NOT EXISTS meta")
    conn.execute(
        f"CREATE TABLE IF NOT EXISTS {STATE_TABLE} (table_name VARCHAR, "
        "query_fingerprint VARCHAR, inputs_fingerprint VARCHAR)"
    )
    #: The fingerprints of the query (and its macros) and of what the rows read elsewhere.
    state = (
        hashlib.sha256(f"{query}\n{macros}".encode()).hexdigest(),
        _content_fingerprint(conn, follows.resolved_against),
    )
    why = _why_whole(conn, table, follows, state, params)
    if why is None:
        result = _incremental(conn, table, follows, query, params, state)
        if result is not None:
            return result
        why = f"more than {WHOLE_ABOVE:.0%} of {follows.decoded} is new"
    conn.execute(f"DELETE FROM {STATE_TABLE} WHERE table_name = ?", [table])
    define_decoded_rows(conn, follows)
    build_whole()

    def record() -> None:
        conn.execute(
            f"CREATE OR REPLACE TABLE {qualified(follows.inputs)} AS "
            f"SELECT id, loaded_at FROM {qualified(follows.decoded)}"
        )
        _write_state(conn, table, state)

    run_transaction(conn, follows.inputs, record)
    return {"fieldsales/build": f"full: {why}"}


def _why_whole(
    conn: duckdb.DuckDBPyConnection,
    table: str,
    follows: Follows,
    state: tuple[str, str],
    params: dict[str, object],
) -> str | None:
    if params:
        return "personal columns are hashed (the key is never stored, so nothing compares)"
    if not (table_exists(conn, table) and table_exists(conn, follows.inputs)):
        return "no previous build"
    found = conn.execute(
        f"SELECT query_fingerprint, inputs_fingerprint FROM {STATE_TABLE} WHERE table_name = ?",
        [table],
    ).fetchone()
    if found is None:
        return "no record of the previous build"
    if found[0] != state[0]:
        return "the query changed"
    if found[1] != state[1]:
        changed = " or ".join(f"{t} ({columns})" for t, columns in follows.resolved_against.items())
        return f"{changed} changed"
    (unkeyed,) = one_row(
        conn,
        f"SELECT count(*) FROM {qualified(table)} WHERE ({follows.from_decoded}) "
        f"AND {follows.key} IS NULL",
    )
    if unkeyed:
        return f"{unkeyed} rows have no {follows.key}"
    return None


def _incremental(
    conn: duckdb.DuckDBPyConnection,
    table: str,
    follows: Follows,
    query: str,
    params: dict[str, object],
    state: tuple[str, str],
) -> dict[str, Any] | None:
    decoded, inputs = qualified(follows.decoded), qualified(follows.inputs)
    added, added_rows = rows_missing(conn, follows.decoded, follows.inputs, "_fs_follow_added")
    gone, _ = rows_missing(conn, follows.inputs, follows.decoded, "_fs_follow_gone")
    (rows,) = one_row(conn, f"SELECT count(*) FROM {decoded}")
    if added > WHOLE_ABOVE * rows:
        return None
    define_decoded_rows(conn, follows, added_rows)
    target = qualified(table)

    def update() -> None:
        conn.execute(f"DELETE FROM {target} WHERE ({follows.from_decoded}) IS NOT TRUE")
        conn.execute(
            f"DELETE FROM {target} AS t USING _fs_follow_keys AS k WHERE t.{follows.key} = k.id"
        )
        conn.execute(f"INSERT INTO {target} BY NAME SELECT * FROM _fs_follow_rows")
        conn.execute(
            f"DELETE FROM {inputs} AS i USING _fs_follow_gone AS g WHERE {same_row('i', 'g')}"
        )
        conn.execute(f"INSERT INTO {inputs} SELECT id, loaded_at FROM _fs_follow_added")
        _write_state(conn, table, state)

    try:
        with failing_as(table, "Updating"):
            # The new rows are computed before the transaction: inside it, after the deletes,
            # the query's memory and the transaction's would have to fit DuckDB's memory_limit.
            conn.execute(f"CREATE OR REPLACE TEMP TABLE _fs_follow_rows AS\n{query}", params or {})
            conn.execute(
                "CREATE OR REPLACE TEMP TABLE _fs_follow_keys AS SELECT DISTINCT id FROM "
                "(SELECT id FROM _fs_follow_added UNION ALL SELECT id FROM _fs_follow_gone)"
            )
            run_transaction(conn, table, update)
    finally:
        with cleanup(conn):
            define_decoded_rows(conn, follows)
            conn.execute("DROP TABLE IF EXISTS _fs_follow_rows")
    why = (
        f"only {follows.decoded} changed since the previous build; replaced the rows of its "
        f"{added:,} new and {gone:,} gone rows"
    )
    if follows.from_decoded != "true":
        why += " and rebuilt the rows that come from elsewhere"
    return {"fieldsales/build": f"incremental: {why}"}


def _content_fingerprint(conn: duckdb.DuckDBPyConnection, tables: dict[str, str]) -> str:
    parts = [
        f"{table} ({columns}): {fingerprint(conn, table, columns) or 'missing'}"
        for table, columns in tables.items()
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _write_state(conn: duckdb.DuckDBPyConnection, table: str, state: tuple[str, str]) -> None:
    # Delete-then-insert: a DuckLake has no PRIMARY KEY (files made before keep theirs).
    conn.execute(f"DELETE FROM {STATE_TABLE} WHERE table_name = ?", [table])
    conn.execute(f"INSERT INTO {STATE_TABLE} VALUES (?, ?, ?)", [table, *state])
