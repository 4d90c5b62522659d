"""A core or mart table that follows the changes of what it reads instead of being rebuilt whole
(docs/refresh.md), while the query, its macros and ``resolved_against`` keep the fingerprints its
build recorded (``FOLLOWED``): the rows changed since the snapshot its last build read, from
DuckLake's change feed (``changed_rows``)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import duckdb
import msgspec

from fieldsales_dagster.warehouse.lake import (
    ANY_CODE,
    Lake,
    changed_since,
    record_evaluation,
    run_transaction,
    still_valid,
)
from fieldsales_dagster.warehouse.quoting import qualified, sql_literal
from fieldsales_dagster.warehouse.rows import one_row
from fieldsales_dagster.warehouse.warehouse import table_exists

#: A following table's state, recorded as a check's evaluation is (``record_evaluation``): its
#: query's hash as the fingerprint, that of what it resolves against as the result (none: no state).
FOLLOWED = "(follows its decoded table)"

#: A state is recorded only where the table holds no row without a key (``unkeyed``).
STATE_RULES = "unkeyed rows: none where recorded"

#: The rows an incremental update inserted, until its builder drops them (its checks read them).
FOLLOW_ROWS = "_fs_follow_rows"
#: The keys whose rows an incremental build replaced, where every row of the table is of one
#: source (``from_decoded`` true, no ``also``): a row it inserted shares no key with one it kept.
FOLLOW_KEYS = "_fs_follow_replaced"

#: Above this share of rows to add, rebuilding whole costs less than deleting and inserting.
WHOLE_ABOVE = 0.2


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


def changed_rows(
    conn: duckdb.DuckDBPyConnection, lake: Lake, table: str, since: int, columns: str, into: str
) -> str | None:
    """Into the temp table ``into``: ``columns`` (which may name the feed's row ``changed``) and
    ``inserted`` (else deleted; an update is both) of each row of ``table`` that a commit after
    snapshot ``since`` inserted or deleted, from DuckLake's change feed; or why the feed cannot
    tell, so a build must be whole: the table made again since (its feed shows the new table's
    rows, and no row deleted), or a snapshot since expired (the upkeep)."""
    if changed_since(conn, lake, since, [table], created=True):
        return f"{table} was made again, or a snapshot since {since} expired, since the last build"
    (now,) = one_row(conn, "SELECT id FROM current_snapshot()")
    schema, _, name = table.partition(".")
    names = ", ".join(sql_literal(part) for part in (lake.alias, schema, name))
    start, where = (since + 1, "") if now > since else (since, "WHERE false")  # none since
    # Not ducklake_table_changes: it joins the two to pair an update's halves, reading each twice.
    rows = [
        f"SELECT {columns}, {inserted} AS inserted FROM ducklake_table_{feed}"
        f"({names}, {start}, {now}) AS changed {where}"
        for feed, inserted in (("insertions", "true"), ("deletions", "false"))
    ]
    conn.execute(f"CREATE OR REPLACE TEMP TABLE {into} AS {' UNION ALL '.join(rows)}")
    return None


def counted(conn: duckdb.DuckDBPyConnection, changed: str) -> tuple[int, int, str]:
    """How many rows ``changed`` (``changed_rows``, with ``loaded_at``) holds inserted and
    deleted, and SQL selecting the rows of their ids by ``loaded_at``: every row of those ids a
    table holds now was inserted since, within their range, so DuckDB skips older row groups by
    min/max (reading a decoded row's columns by ``id`` alone read every row group)."""
    query = f"SELECT count(*) FILTER (inserted), count(*) FILTER (NOT inserted) FROM {changed}"
    new, gone = one_row(conn, query)
    return new, gone, f"id IN (SELECT id FROM {changed}) AND {loaded_between(conn, changed)}"


def loaded_between(conn: duckdb.DuckDBPyConnection, rows: str, which: str = "inserted") -> str:
    """SQL predicate: ``loaded_at`` within the range of the ``rows`` (a table with ``loaded_at``)
    ``which`` holds for, so that DuckDB skips the files outside it by their min/max (a run's
    changed rows sit in files of their own); ``true`` where one has none, ``false`` for no row."""
    first, last, undated, found = one_row(
        conn,
        f"SELECT min(loaded_at) FILTER ({which}), max(loaded_at) FILTER ({which}), count(*) "
        f"FILTER ({which} AND loaded_at IS NULL), count(*) FILTER ({which}) FROM {rows}",
    )
    if undated or not found:
        return "true" if undated else "false"
    return f"loaded_at BETWEEN TIMESTAMP '{first}' AND TIMESTAMP '{last}'"


def named_keys(conn: duckdb.DuckDBPyConnection, keyed: str, feeds: Sequence[str]) -> None:
    """Into the temp table ``keyed``: each key the ``keys`` lists of ``feeds`` (``changed_rows``
    of the tables ``named_by`` names) name, once."""
    each = " UNION ALL ".join(f"SELECT unnest(keys) AS id FROM {feed}" for feed in feeds)
    conn.execute(
        f"CREATE OR REPLACE TEMP TABLE {keyed} AS SELECT DISTINCT id FROM ({each}) "
        "WHERE id IS NOT NULL"
    )


class Follows(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    #: SQL over the table's row: the key its row comes from (a decoded row's ``id``, or one of
    #: the keys ``named_by`` names).
    key: str
    #: The decoded table the query reads by ``rows``; none for a table made of core tables alone
    #: (a mart), which follows the tables ``named_by`` names.
    decoded: str = ""
    #: SQL predicate: the table's rows that come from these decoded rows (every row of the table
    #: comes from one of its sources: ``also``).
    from_decoded: str = "true"
    #: Table -> the columns the rows from decoded rows read there: any change rebuilds whole.
    resolved_against: dict[str, str] = msgspec.field(default_factory=dict)
    #: Tables following ``decoded`` whose rows of a decoded row the query reads: the last build of
    #: each must have read ``decoded``'s raw table as it is now, else the build is whole and
    #: records no state.
    reads_current: list[str] = msgspec.field(default_factory=list)
    #: The table function the query reads the decoded rows by: all, or those a build lacks.
    rows: str = "decoded_rows"
    #: SQL predicate on a decoded row: its table rows carry its ``id`` as ``key`` (else a build
    #: could not find them by it: whole, recording no state, as for rows without a key).
    keyed_when: str = "true"
    #: Table -> SQL: the list of ``key`` values a row of it names, where a row of the table reads
    #: several rows (else ``key`` is the decoded row's ``id``): a following table the query reads
    #: (as ``reads_current`` for ``decoded``). A build replaces the rows of the keys named by the
    #: rows of these tables written or deleted since it last read them, before and after the
    #: change (the feed's row is ``changed``; ``AT (VERSION => followed_since())`` reads a table
    #: as the last build did); the query keeps the rows of those keys by ``followed(key)`` (true
    #: for all in a whole build). One source only may set it.
    named_by: dict[str, str] = msgspec.field(default_factory=dict)
    #: SQL of the ``id`` of the decoded rows the query reads (``rows``) for ``followed(key)``
    #: (needed with ``named_by`` and ``decoded``): only those are parsed (else those changed).
    reads: str = ""
    #: Rows of the table that are not ``from_decoded`` and follow another decoded table likewise.
    also: list[Follows] = msgspec.field(default_factory=list)

    @property
    def sources(self) -> list[Follows]:
        return [self, *self.also]


def define_rows(conn: duckdb.DuckDBPyConnection, macro: str, rows: str) -> None:
    """``<macro>()``, the rows a query reads: all of a table, or those a build lacks."""
    conn.execute(f"CREATE OR REPLACE TEMP MACRO {macro}() AS TABLE {rows}")


def define_followed(
    conn: duckdb.DuckDBPyConnection, keys: str = "", name: str = "followed"
) -> None:
    """``followed(key)`` (or ``name``): whether a build makes the rows of ``key``, one of ``keys``
    (SQL of the temp table holding them as ``id``); every key where none are given (whole)."""
    holds = f"key IN (SELECT id FROM {keys})" if keys else "true"
    conn.execute(f"CREATE OR REPLACE TEMP MACRO {name}(key) AS {holds}")


def define_whole(conn: duckdb.DuckDBPyConnection, follows: Follows | None) -> None:
    """The macros a whole build's query reads: every decoded row, every key."""
    if follows:
        define_followed(conn)
    for source in follows.sources if follows else []:
        if source.decoded:
            define_rows(conn, source.rows, f"SELECT * FROM {qualified(source.decoded)}")


def build_following(
    conn: duckdb.DuckDBPyConnection,
    table: str,
    follows: Follows,
    query: str,
    params: dict[str, object],
    build_whole: Callable[[], None],
    macros: str = "",
    lake: Lake | None = None,
    raw: Mapping[str, str] | None = None,
    parse: Callable[[str, str, int], None] = lambda decoded, ids, since: None,
) -> dict[str, Any]:
    """Bring ``table`` up to date, incrementally when safe, else ``build_whole()`` (its query's
    ``decoded_rows()`` all of ``follows.decoded``); says how. Only in ``lake`` is the state
    recorded, so elsewhere every build is whole. ``raw``: each decoded table -> the raw table it
    is parsed from (whose change feed it follows); ``parse(decoded, ids, since)`` parses the rows
    of ``ids`` (SQL) it lacks before a build reads them, following from snapshot ``since``.
    ``macros``: the SQL besides ``query`` that makes its rows (a decoded table's digest among it:
    its rows made otherwise, the build is whole; made again as they were, as a whole refresh
    does, they compare as before)."""
    raw = dict(raw or {})
    resolved = "\n".join(
        f"{t} ({columns}): {fingerprint(conn, t, columns) or 'missing'}"
        for t, columns in follows.resolved_against.items()
    )
    state = (  # STATE_RULES, follows: a state recorded by other rules or sources is not this one's
        hashlib.sha256(f"{STATE_RULES}\n{follows}\n{query}\n{macros}".encode()).hexdigest(),
        hashlib.sha256(resolved.encode()).hexdigest(),
    )
    behind = _behind(conn, lake, follows) if lake else []
    found = _last_read(conn, lake, table, follows, state, params)
    if behind:
        why = f"a table it reads does not reflect {follows.decoded} yet ({', '.join(behind)})"
    elif isinstance(found, str):
        why = found
    else:
        assert lake is not None  # a build read is recorded in a lake only
        result = _incremental(conn, lake, table, follows, query, state, found, raw, parse)
        if not isinstance(result, str):
            return result
        why = result
    build_whole()
    # Where what it read will change with no change to its inputs, the next build is whole.
    missing_key = 0 if behind else unkeyed(conn, qualified(table), follows)
    kept = None if behind or missing_key else state
    run_transaction(conn, table, lambda: write_state(conn, lake, table, kept))
    if missing_key:
        why += f"; {missing_key} rows have no key to find them by, so the next build is whole too"
    return {"fieldsales/build": f"full: {why}"}


def _behind(conn: duckdb.DuckDBPyConnection, lake: Lake, follows: Follows) -> list[str]:
    """The tables a build reads beside its decoded rows (``reads_current``, ``named_by``) whose
    last build, by whatever code, read an input changed since (the raw table of those rows)."""
    found = []
    for source in [source for source in follows.sources if source.decoded]:
        for read in [*source.reads_current, *source.named_by]:
            if still_valid(conn, lake, read, ANY_CODE) is None:
                found.append(read)
    return found


def _last_read(
    conn: duckdb.DuckDBPyConnection,
    lake: Lake | None,
    table: str,
    follows: Follows,
    state: tuple[str, str],
    params: dict[str, object],
) -> int | str:
    """The snapshot ``table``'s last build read, where it recorded ``state``; else why whole."""
    if params:
        return "personal columns are hashed (the key is never stored, so nothing compares)"
    if not table_exists(conn, table):
        return "no previous build"
    found = still_valid(conn, lake, table, state[0], FOLLOWED, judged=False) if lake else None
    if found is None:
        return "no record of a previous build by this query"
    if found.result != state[1]:
        changed = " or ".join(f"{t} ({columns})" for t, columns in follows.resolved_against.items())
        return f"{changed} changed"
    return found.read


def unkeyed(conn: duckdb.DuckDBPyConnection, rows: str, follows: Follows) -> int:
    """How many of ``rows`` (SQL naming a table) come from decoded rows but have no key, and how
    many decoded rows the build reads (each source's ``rows()``) fail ``keyed_when``: no build can
    replace their rows by key, so a table holding any records no state (its next build is whole).
    Counted over what a build writes and reads, as only those can add any."""
    found = 0
    for source in follows.sources:
        where = f"({source.from_decoded}) AND {source.key} IS NULL"
        found += int(one_row(conn, f"SELECT count(*) FROM {rows} WHERE {where}")[0])
        if not source.decoded:
            continue
        where = f"NOT ({source.keyed_when})"
        found += int(one_row(conn, f"SELECT count(*) FROM {source.rows}() WHERE {where}")[0])
    return found


def _incremental(
    conn: duckdb.DuckDBPyConnection,
    lake: Lake,
    table: str,
    follows: Follows,
    query: str,
    state: tuple[str, str],
    since: int,
    raw: Mapping[str, str],
    parse: Callable[[str, str, int], None],
) -> dict[str, Any] | str:
    """Replace the rows of the decoded rows each source's raw table changed since snapshot
    ``since`` (or of the keys the rows of the tables ``named_by`` names changed since name); else
    why whole: more than ``WHOLE_ABOVE`` of a table followed is new, or the change feed cannot
    tell."""
    conn.execute(f"CREATE OR REPLACE TEMP MACRO followed_since() AS {int(since)}")
    whys: list[str] = []
    feeds: list[list[str]] = []  # each source's temp tables of the rows changed
    selected: list[str] = []  # SQL selecting each source's decoded rows changed
    for i, source in enumerate(follows.sources):
        named = source.named_by or {raw[source.decoded]: ""}
        feeds.append([f"_fs_follow_changed{i}_{j}" for j in range(len(named))])
        counts = [0, 0]
        for (read, keys), changed in zip(named.items(), feeds[i], strict=True):
            columns = f"{keys} AS keys, NULL::TIMESTAMP AS loaded_at" if keys else "id, loaded_at"
            if why := changed_rows(conn, lake, read, since, columns, changed):
                return why
            new, gone, within = counted(conn, changed)
            (rows,) = one_row(conn, f"SELECT count(*) FROM {qualified(read)}")
            if new > WHOLE_ABOVE * rows:
                return f"more than {WHOLE_ABOVE:.0%} of {source.decoded or read} is new"
            counts = [counts[0] + new, counts[1] + gone]
        whys.append(f"replaced the rows of its {counts[0]:,} new and {counts[1]:,} gone rows")
        selected.append(within)
    replaced: list[str] = []  # once no source is whole: build_whole reads all
    for i, (source, tables, within) in enumerate(
        zip(follows.sources, feeds, selected, strict=True)
    ):
        keyed = tables[0]
        if source.named_by:
            keyed = f"_fs_follow_keys{i}"
            named_keys(conn, keyed, tables)
            define_followed(conn, keyed)
            (named,) = one_row(conn, f"SELECT count(*) FROM {keyed}")
            whys[i] += f", of the {named:,} keys they name"
        replaced.append(f"({source.from_decoded}) AND {source.key} IN (SELECT id FROM {keyed})")
        if source.decoded:
            parse(source.decoded, source.reads or f"SELECT id FROM {keyed}", since)
            within = f"id IN ({source.reads})" if source.reads else within
            rows = f"SELECT * FROM {qualified(source.decoded)} WHERE {within}"
            define_rows(conn, source.rows, rows)
    target = qualified(table)
    if not follows.also and follows.from_decoded == "true":
        conn.execute(f"CREATE OR REPLACE TEMP TABLE {FOLLOW_KEYS} AS SELECT id FROM {keyed}")

    def update() -> None:
        conn.execute(  # one scan of the table for every kind of row replaced
            f"DELETE FROM {target} WHERE {' OR '.join(replaced)}; "
            f"INSERT INTO {target} BY NAME SELECT * FROM {FOLLOW_ROWS}"
        )
        write_state(conn, lake, table, None if missing_key else state)  # none: the next is whole

    with failing_as(table, "Updating"):
        # Before the transaction: inside it, query and transaction would share memory_limit.
        conn.execute(f"CREATE OR REPLACE TEMP TABLE {FOLLOW_ROWS} AS\n{query}")
        missing_key = unkeyed(conn, FOLLOW_ROWS, follows)
        run_transaction(conn, table, update)
    if follows.also:
        whys = [f"{s.decoded}: {why}" for s, why in zip(follows.sources, whys, strict=True)]
    followed = [source.decoded or ", ".join(source.named_by) for source in follows.sources]
    why = f"only {' and '.join(followed)} changed since the previous build; {'; '.join(whys)}"
    return {"fieldsales/build": f"incremental: {why}"}


def write_state(
    conn: duckdb.DuckDBPyConnection, lake: Lake | None, table: str, state: tuple[str, str] | None
) -> None:
    """Record ``table``'s ``state`` (``FOLLOWED``) in ``lake``; ``None``: forget it."""
    if lake is not None:
        query, inputs = state or (None, None)
        record_evaluation(conn, table, (), query, FOLLOWED, inputs)
