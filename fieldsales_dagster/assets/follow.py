"""A core table that follows its decoded table's changes instead of being rebuilt whole
(docs/refresh.md), while the query, its macros and ``resolved_against`` keep the fingerprints its
build recorded (``FOLLOWED``)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import duckdb
import msgspec

from fieldsales_dagster.warehouse.lake import Lake, record_evaluation, run_transaction, still_valid
from fieldsales_dagster.warehouse.quoting import qualified, quote_ident
from fieldsales_dagster.warehouse.rows import one_row
from fieldsales_dagster.warehouse.warehouse import table_exists

#: A following table's state, recorded as a check's evaluation is (``record_evaluation``): its
#: query's hash as the fingerprint, that of what it resolves against as the result (none: no state).
FOLLOWED = "(follows its decoded table)"

#: A state is recorded only where the table holds no row without a key (``unkeyed``).
STATE_RULES = "unkeyed rows: none where recorded"

#: The rows an incremental update inserted, until its builder drops them (its checks read them).
FOLLOW_ROWS = "_fs_follow_rows"

#: Above this share of rows to add, rebuilding whole costs less than deleting and inserting.
WHOLE_ABOVE = 0.2

#: The table macro of the keys a build makes rows for, where ``Follows.keys`` is set.
FOLLOWED_KEYS = "followed_keys"


def same_row(a: str, b: str) -> str:
    """SQL: rows ``a`` and ``b`` are the same load of the same item (``id``, ``loaded_at``)."""
    return f"{a}.id = {b}.id AND {a}.loaded_at IS NOT DISTINCT FROM {b}.loaded_at"


def fingerprint(
    conn: duckdb.DuckDBPyConnection, table: str, columns: str = "id, loaded_at"
) -> tuple | None:
    """Row count and a hash of ``columns`` (each load stamps its own ``loaded_at``), or ``None``."""
    # Each row's hash hashed again: DuckDB XORs a row's column hashes together, so rows stamped
    # with one new loaded_at, in an even number, would cancel out of bit_xor(hash(id, loaded_at)).
    try:
        return one_row(
            conn, f"SELECT count(*), bit_xor(hash(hash({columns}))) FROM {qualified(table)}"
        )
    except duckdb.CatalogException:
        return None


@contextmanager
def failing_as(target: str, doing: str = "Building", reads: str = "") -> Iterator[None]:
    """A DuckDB error in the block (or ``reads``' update) fails naming ``target``, left as is."""
    caught: type[Exception] = RuntimeError if reads else duckdb.Error
    try:
        yield
    except caught as exc:
        cause = f"It reads {reads}" if reads else "DuckDB"
        raise RuntimeError(
            f"{doing} {target} failed; the previous {target} is left as it was. {cause}: {exc}"
        ) from exc


def rows_missing(
    conn: duckdb.DuckDBPyConnection,
    source: str,
    target: str,
    keys: str,
    gone: str,
    slices: int = 1,
) -> tuple[int, list[str]]:
    """How many rows of ``source`` ``target`` lacks by (``id``, ``loaded_at``), and SQL selecting
    them within their ``loaded_at`` range (DuckDB skips older row groups by min/max), in
    ``slices`` parts by ``rowid``, each for a statement of its own: parts joined in one statement
    keep every part's join and scan in memory at once (at 10M transactions, 101,483 rows to
    decode in 4 parts ran out of 192MB; one at a time, they passed). ``gone`` gets the rows of
    ``target`` that ``source`` lacks, from the same join."""
    tagged = "SELECT id, loaded_at, true AS here FROM"
    conn.execute(  # a row unmatched has one side only
        f"CREATE OR REPLACE TEMP TABLE {keys} AS SELECT coalesce(s.id, t.id) AS id, "
        "coalesce(s.loaded_at, t.loaded_at) AS loaded_at, t.here IS NOT NULL AS in_target "
        f"FROM ({tagged} {qualified(source)}) AS s FULL JOIN ({tagged} {qualified(target)}) AS t "
        f"ON {same_row('s', 't')} WHERE s.here IS NULL OR t.here IS NULL; "
        f"CREATE OR REPLACE TEMP TABLE {gone} AS SELECT id, loaded_at FROM {keys} WHERE in_target; "
        f"DELETE FROM {keys} WHERE in_target"
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
        return count, [f"{rows} WHERE {within} AND s.rowid % {slices} = {i}" for i in range(slices)]
    return count, [f"{rows} WHERE {within}"]


class Follows(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    decoded: str
    #: The table's column holding the decoded row's ``id`` its row comes from.
    key: str
    #: The decoded rows (``id``, ``loaded_at``) the table reflects.
    inputs: str
    #: SQL predicate: the table's rows that come from these decoded rows (every row of the table
    #: comes from one of its sources: ``also``).
    from_decoded: str = "true"
    #: Table -> the columns the rows from decoded rows read there: any change rebuilds whole.
    resolved_against: dict[str, str] = msgspec.field(default_factory=dict)
    #: The ``inputs`` of tables following ``decoded`` whose rows of a decoded row the query reads:
    #: each must reflect ``decoded`` as it is, else the build is whole and records no state.
    reads_inputs: list[str] = msgspec.field(default_factory=list)
    #: The table function the query reads the decoded rows by: all, or those a build lacks.
    rows: str = "decoded_rows"
    #: SQL predicate on a decoded row: its table rows carry its ``id`` as ``key`` (else a build
    #: could not find them by it: whole, recording no state, as for rows without a key).
    keyed_when: str = "true"
    #: SQL of (``id``, ``key``): the ``key`` values whose rows each decoded row is part of, where
    #: a row of the table reads several decoded rows (else ``key`` is the decoded row's ``id``).
    #: A build replaces the rows of the keys the rows added name and those gone named at the last
    #: build (the inputs record them): ``FOLLOWED_KEYS()``. One source only may set it.
    keys: str = ""
    #: SQL of the ``id`` of the decoded rows the query reads (``rows``) for ``FOLLOWED_KEYS``:
    #: only those are parsed (else the rows added).
    reads: str = ""
    #: Rows of the table that are not ``from_decoded`` and follow another decoded table likewise.
    also: list[Follows] = msgspec.field(default_factory=list)

    @property
    def sources(self) -> list[Follows]:
        return [self, *self.also]


def define_rows(conn: duckdb.DuckDBPyConnection, macro: str, rows: str) -> None:
    """``<macro>()``, the rows a query reads: all of a table, or those a build lacks."""
    conn.execute(f"CREATE OR REPLACE TEMP MACRO {macro}() AS TABLE {rows}")


def define_whole(conn: duckdb.DuckDBPyConnection, follows: Follows | None) -> None:
    """The macros a whole build's query reads: every decoded row, every key."""
    for source in follows.sources if follows else []:
        define_rows(conn, source.rows, f"SELECT * FROM {qualified(source.decoded)}")
        if source.keys:
            define_rows(conn, FOLLOWED_KEYS, f"SELECT DISTINCT key FROM ({source.keys})")


def _inputs_rows(source: Follows, rows: str) -> str:
    """SQL: the (``id``, ``loaded_at``) of ``rows`` (a table) a source's inputs record, with
    the ``keys`` each names where ``source.keys`` is set."""
    if not source.keys:
        return f"SELECT id, loaded_at FROM {rows}"
    named = f"SELECT id, list(key) AS keys FROM ({source.keys}) GROUP BY id"
    return f"SELECT r.id, r.loaded_at, k.keys FROM {rows} AS r LEFT JOIN ({named}) AS k USING (id)"


def _keys_replaced(source: Follows, i: int) -> str:
    """SQL: the keys whose rows a build replaces (as ``id``): those of the decoded rows added
    and gone (``_incremental``'s tables), or those they named (``Follows.keys``)."""
    added, gone = f"_fs_follow_added{i}", f"_fs_follow_gone{i}"
    if not source.keys:
        return f"SELECT id FROM {added} UNION SELECT id FROM {gone}"
    return (
        f"SELECT unnest(i.keys) AS id FROM {qualified(source.inputs)} AS i SEMI JOIN {gone} "
        f"AS g ON {same_row('i', 'g')} UNION SELECT key FROM ({source.keys}) "
        f"WHERE id IN (SELECT id FROM {added})"
    )


def build_following(
    conn: duckdb.DuckDBPyConnection,
    table: str,
    follows: Follows,
    query: str,
    params: dict[str, object],
    build_whole: Callable[[], None],
    macros: str = "",
    lake: Lake | None = None,
    listed: Mapping[str, str] | None = None,
    parse: Callable[[str, str], None] = lambda decoded, ids: None,
) -> dict[str, Any]:
    """Bring ``table`` up to date, incrementally when safe, else ``build_whole()`` (its query's
    ``decoded_rows()`` all of ``follows.decoded``); says how. Only in ``lake`` is the state
    recorded, so elsewhere every build is whole. ``listed``: a decoded table parsed on demand ->
    the table listing its rows (``id``, ``loaded_at``); ``parse(decoded, ids)`` parses the rows of
    ``ids`` (SQL) it lacks before a build reads them."""
    listed = {s.decoded: s.decoded for s in follows.sources} | dict(listed or {})
    resolved = "\n".join(
        f"{t} ({columns}): {fingerprint(conn, t, columns) or 'missing'}"
        for t, columns in follows.resolved_against.items()
    )
    state = (  # STATE_RULES, follows: a state recorded by other rules or sources is not this one's
        hashlib.sha256(f"{STATE_RULES}\n{follows}\n{query}\n{macros}".encode()).hexdigest(),
        hashlib.sha256(resolved.encode()).hexdigest(),
    )
    now = fingerprint(conn, listed[follows.decoded]) if follows.reads_inputs else None
    behind = [inputs for inputs in follows.reads_inputs if fingerprint(conn, inputs) != now]
    why = _why_whole(conn, lake, table, follows, state, params)
    if behind:
        why = f"a table it reads does not reflect {follows.decoded} yet ({', '.join(behind)})"
    elif why is None:
        result = _incremental(conn, lake, table, follows, query, state, listed, parse)
        if not isinstance(result, str):
            return result
        why = f"more than {WHOLE_ABOVE:.0%} of {result} is new"
    build_whole()
    # Where what it read will change with no change to its inputs, the next build is whole.
    missing_key = 0 if behind else unkeyed(conn, qualified(table), follows)

    def record() -> None:
        for source in follows.sources if not (behind or missing_key) else []:
            schema = quote_ident(source.inputs.partition(".")[0])
            conn.execute(
                f"CREATE SCHEMA IF NOT EXISTS {schema}; CREATE OR REPLACE TABLE "
                f"{qualified(source.inputs)} AS "
                f"{_inputs_rows(source, qualified(listed[source.decoded]))}"
            )
        write_state(conn, lake, table, None if behind or missing_key else state)

    run_transaction(conn, follows.inputs, record)
    if missing_key:
        why += f"; {missing_key} rows have no key to find them by, so the next build is whole too"
    return {"fieldsales/build": f"full: {why}"}


def _why_whole(
    conn: duckdb.DuckDBPyConnection,
    lake: Lake | None,
    table: str,
    follows: Follows,
    state: tuple[str, str],
    params: dict[str, object],
) -> str | None:
    if params:
        return "personal columns are hashed (the key is never stored, so nothing compares)"
    if not all(table_exists(conn, t) for t in [table, *(s.inputs for s in follows.sources)]):
        return "no previous build"
    found = still_valid(conn, lake, table, state[0], FOLLOWED, judged=False) if lake else None
    if found is None:
        return "no record of a previous build by this query"
    if found.result != state[1]:
        changed = " or ".join(f"{t} ({columns})" for t, columns in follows.resolved_against.items())
        return f"{changed} changed"
    return None


def unkeyed(conn: duckdb.DuckDBPyConnection, rows: str, follows: Follows) -> int:
    """How many of ``rows`` (SQL naming a table) come from decoded rows but have no key, and how
    many decoded rows the build reads (each source's ``rows()``) fail ``keyed_when``: no build can
    replace their rows by key, so a table holding any records no state (its next build is whole).
    Counted over what a build writes and reads, as only those can add any."""
    found = 0
    for source in follows.sources:
        where = f"({source.from_decoded}) AND {source.key} IS NULL"
        found += int(one_row(conn, f"SELECT count(*) FROM {rows} WHERE {where}")[0])
        where = f"NOT ({source.keyed_when})"
        found += int(one_row(conn, f"SELECT count(*) FROM {source.rows}() WHERE {where}")[0])
    return found


def _incremental(
    conn: duckdb.DuckDBPyConnection,
    lake: Lake | None,
    table: str,
    follows: Follows,
    query: str,
    state: tuple[str, str],
    listed: Mapping[str, str],
    parse: Callable[[str, str], None],
) -> dict[str, Any] | str:
    """Replace the rows of the decoded rows each source lacks or lost (or of the keys they
    named); else the decoded table of which more than ``WHOLE_ABOVE`` is new."""
    replaced: list[str] = []
    changes: list[str] = []
    whys: list[str] = []
    rows_of: list[tuple[int, Follows, str]] = []  # once no source is whole: build_whole reads all
    for i, source in enumerate(follows.sources):
        found = listed[source.decoded]
        added, (added_rows,) = rows_missing(
            conn, found, source.inputs, f"_fs_follow_added{i}", f"_fs_follow_gone{i}"
        )
        (gone,) = one_row(conn, f"SELECT count(*) FROM _fs_follow_gone{i}")
        (rows,) = one_row(conn, f"SELECT count(*) FROM {qualified(found)}")
        if added > WHOLE_ABOVE * rows:
            return source.decoded
        rows_of.append((i, source, added_rows))
        replaced.append(
            f"({source.from_decoded}) AND {source.key} IN (SELECT id FROM _fs_follow_keys{i})"
        )
        inputs = qualified(source.inputs)
        changes.append(
            f"DELETE FROM {inputs} AS i USING _fs_follow_gone{i} AS g WHERE {same_row('i', 'g')}; "
            f"INSERT INTO {inputs} {_inputs_rows(source, f'_fs_follow_added{i}')}"
        )
        whys.append(f"replaced the rows of its {added:,} new and {gone:,} gone rows")
    for i, source, added_rows in rows_of:
        with failing_as(table, "Updating"):
            keys = _keys_replaced(source, i)
            conn.execute(f"CREATE OR REPLACE TEMP TABLE _fs_follow_keys{i} AS {keys}")
            if source.keys:
                define_rows(conn, FOLLOWED_KEYS, f"SELECT id AS key FROM _fs_follow_keys{i}")
                (named,) = one_row(conn, f"SELECT count(*) FROM _fs_follow_keys{i}")
                whys[i] += f", of the {named:,} {source.key} values they name"
        if source.reads or listed[source.decoded] != source.decoded:
            ids = source.reads or f"SELECT id FROM _fs_follow_added{i}"
            parse(source.decoded, ids)
            added_rows = f"SELECT * FROM {qualified(source.decoded)} WHERE id IN ({ids})"
        define_rows(conn, source.rows, added_rows)
    target = qualified(table)

    def update() -> None:
        conn.execute(  # one scan of the table for every kind of row replaced
            f"DELETE FROM {target} WHERE {' OR '.join(replaced)}; "
            f"INSERT INTO {target} BY NAME SELECT * FROM {FOLLOW_ROWS}; {'; '.join(changes)}"
        )
        write_state(conn, lake, table, None if missing_key else state)  # none: the next is whole

    with failing_as(table, "Updating"):
        # Before the transaction: inside it, query and transaction would share memory_limit.
        conn.execute(f"CREATE OR REPLACE TEMP TABLE {FOLLOW_ROWS} AS\n{query}")
        missing_key = unkeyed(conn, FOLLOW_ROWS, follows)
        run_transaction(conn, table, update)
    if follows.also:
        whys = [f"{s.decoded}: {why}" for s, why in zip(follows.sources, whys, strict=True)]
    decoded = " and ".join(source.decoded for source in follows.sources)
    why = f"only {decoded} changed since the previous build; {'; '.join(whys)}"
    return {"fieldsales/build": f"incremental: {why}"}


def write_state(
    conn: duckdb.DuckDBPyConnection, lake: Lake | None, table: str, state: tuple[str, str] | None
) -> None:
    """Record ``table``'s ``state`` (``FOLLOWED``) in ``lake``; ``None``: forget it."""
    if lake is not None:
        query, inputs = state or (None, None)
        record_evaluation(conn, table, (), query, FOLLOWED, inputs)
