"""Refresh modes of ``raw.transactions``: a full reload, or an incremental one by event.

The API has no "updated since" filter, but the transaction list takes ``eventId`` and events
carry their whole status history. An incremental refresh therefore

1. compares the event list just loaded (``raw.events``) with the fingerprints recorded at the
   last transaction load (``meta.event_fingerprints``: ``eventState``, ``eventStateHistory`` and
   ``eventStateTimestamps`` per event) and re-fetches, by ``eventId``, the transactions of every
   event that is new, whose state or history changed, or whose last state change lies within
   ``lookback_days``;
2. keeps the stored transactions of every other event, drops those of events that disappeared,
   and replaces the re-fetched events' transactions with what the server returns now;
3. trusts the result only if every transaction fetched for ``eventId=X`` carries ``eventId == X``
   (else the server ignores the filter: full refresh), each event's pages are complete, and the
   merged table holds exactly the server's global ``count`` (one request with ``limit=1``).

The merge (delete, insert, count check, new state) is one DuckDB transaction: a failed run leaves
the previous table and state untouched. ``choose_mode`` is the pure decision between the two modes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from importlib import resources
from typing import Any

import duckdb

from fieldsales_dagster.client.api import FieldSalesAPI
from fieldsales_dagster.client.endpoints import EVENTS, TRANSACTIONS, ListEndpoint
from fieldsales_dagster.client.envelope import ListStats
from fieldsales_dagster.loading.deletions import record_deletions
from fieldsales_dagster.loading.lists import (
    FilterIgnoredError,
    IncompleteListError,
    ListPasses,
    PagingError,
    Stream,
)
from fieldsales_dagster.loading.raw_load import (
    LoadReport,
    ShrinkGuard,
    Staging,
    load_list,
    page_executor,
)
from fieldsales_dagster.loading.refresh_mode import (
    IncrementalRefreshError,
    ModeDecision,
    PreviousLoad,
    choose_mode,
)
from fieldsales_dagster.pause import pause_at
from fieldsales_dagster.warehouse.lake import drop_table, run_transaction
from fieldsales_dagster.warehouse.quoting import qualified
from fieldsales_dagster.warehouse.rows import one_row
from fieldsales_dagster.warehouse.warehouse import (
    FieldSalesWarehouse,
    same_database_cursor,
    staging_table,
    table_exists,
)

STATE_SCHEMA = "meta"
STATE_TABLE = "meta.refresh_state"
FINGERPRINTS_TABLE = "meta.event_fingerprints"
#: The re-fetched transactions wait in a temporary table: it lives in this connection's memory
#: (spilling to DuckDB's temp_directory past memory_limit), so they are compressed and written to
#: the database once, when the merge inserts them, not a second time as a staging table.
STAGE_TABLE = "temp." + staging_table(TRANSACTIONS.raw_table, "_by_event").partition(".")[2]

#: Temporary tables of one refresh (this connection only): the current events' fingerprints, and
#: an incremental refresh's events to re-fetch and events that disappeared (see ``RefetchPlan``).
FINGERPRINTS_NOW = "_fs_fingerprints"
REFETCH_TABLE = "_fs_refetch"
REMOVED_TABLE = "_fs_removed"
#: A query of the events whose stored transactions a merge replaces.
REPLACED_EVENTS = (
    f"SELECT event_id FROM {REFETCH_TABLE} UNION ALL SELECT event_id FROM {REMOVED_TABLE}"
)

#: In ``auto``, re-fetching more than this share of the events by ``eventId`` costs more
#: requests than paging the whole list: a full refresh is chosen instead.
MAX_REFETCH_SHARE = 0.5


class FallBack(Exception):
    """The incremental attempt is abandoned: ``auto`` goes full, ``incremental`` fails, except
    when ``filter_ignored`` (the server ignores ``eventId``): then every mode goes full."""

    def __init__(self, message: str, bytes_fetched: int, filter_ignored: bool = False):
        super().__init__(message)
        self.bytes_fetched = bytes_fetched
        self.filter_ignored = filter_ignored


@dataclass(frozen=True)
class Merging:
    """One merge of re-fetched transactions into ``raw.transactions`` (an incremental refresh's,
    or a re-sync's): the client and connection, the run's hooks, and when it started."""

    api: FieldSalesAPI
    conn: duckdb.DuckDBPyConnection
    log: Callable[[str], None]
    before_swap: Callable[[str], None] | None
    run_id: str | None
    now: datetime = field(default_factory=lambda: datetime.now(UTC))
    started: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class RefreshPolicy:
    """The warehouse's refresh settings (validated there; defaults in ``settings.py``)."""

    mode: str
    full_refresh_every_days: float
    lookback_days: float

    @classmethod
    def of(cls, warehouse: FieldSalesWarehouse, override: str | None = None) -> RefreshPolicy:
        """The warehouse's policy, ``override`` (the run config's mode) first."""
        mode = override or warehouse.refresh_mode  # validated by the run config
        return cls(mode, warehouse.full_refresh_every_days, warehouse.lookback_days)


# --- state ------------------------------------------------------------------------------------


def read_previous_load(conn: duckdb.DuckDBPyConnection) -> PreviousLoad | None:
    if not (table_exists(conn, STATE_TABLE) and table_exists(conn, FINGERPRINTS_TABLE)):
        return None
    row = conn.execute(
        f"SELECT last_full_at, rows, events_loaded_at FROM {STATE_TABLE} WHERE table_name = ?",
        [TRANSACTIONS.raw_table],
    ).fetchone()
    if row is None:
        return None
    rows_stored = (
        one_row(conn, f"SELECT count(*) FROM {qualified(TRANSACTIONS.raw_table)}")[0]
        if table_exists(conn, TRANSACTIONS.raw_table)
        else None
    )
    last_full_at, recorded = row[0].replace(tzinfo=UTC), row[2] and row[2].replace(tzinfo=UTC)
    return PreviousLoad(last_full_at, row[1], rows_stored, recorded, _events_loaded_at(conn))


def _events_loaded_at(conn: duckdb.DuckDBPyConnection) -> datetime | None:
    if not table_exists(conn, EVENTS.raw_table):
        return None
    value = one_row(conn, f"SELECT max(loaded_at) FROM {qualified(EVENTS.raw_table)}")[0]
    return value.replace(tzinfo=UTC) if value else None


def _fingerprint_current_events(conn: duckdb.DuckDBPyConnection, now: datetime) -> None:
    """Fill ``FINGERPRINTS_NOW``: per event of ``raw.events``, its state fingerprint, last dated
    change, and since when this lake has seen it in that state (``state_since``: kept from the
    last load while the fingerprint holds, else ``now``). An event whose history has no date
    changed state at or before ``state_since``, so that time stands in for its last change.

    Each payload is parsed once (``json_extract`` with a list of paths): three separate
    extractions of ~3 KB documents ran out of DuckDB's 192 MB at 25,000 events. The table is read
    in slices (``sql/raw_events_in_slices.sql``): a whole vector of ~14 KB documents parsed at
    once needs ~75 MB per thread.
    """
    if table_exists(conn, EVENTS.raw_table):
        macro = resources.files("fieldsales_dagster") / "sql" / "raw_events_in_slices.sql"
        conn.execute(macro.read_text("utf-8"))
        source = "raw_events_in_slices()"
    else:
        source = "(SELECT NULL::VARCHAR AS id, NULL::JSON AS payload WHERE false)"
    known = FINGERPRINTS_TABLE
    if not table_exists(conn, FINGERPRINTS_TABLE):
        known = "(SELECT NULL::VARCHAR event_id, NULL fingerprint, NULL::TIMESTAMPTZ state_since)"
        # (one row, whose NULL event_id joins none)
    conn.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE {FINGERPRINTS_NOW} AS
        SELECT n.*, CASE WHEN o.fingerprint = n.fingerprint THEN o.state_since
                         ELSE $now::TIMESTAMPTZ END AS state_since
        FROM (SELECT event_id,
               md5(concat_ws(chr(1), coalesce(state[1]::VARCHAR, 'null'),
                   coalesce(state[2]::VARCHAR, 'null'), coalesce(state[3]::VARCHAR, 'null')))
                 AS fingerprint,
               list_max(list_transform(
                   coalesce(json_extract_string(state[2], '$[*].date'), []),
                   lambda d: try_cast(d AS TIMESTAMPTZ))) AS last_state_change
        FROM (SELECT id AS event_id,
                     json_extract(payload, ['$.eventState', '$.eventStateHistory',
                                            '$.eventStateTimestamps']) AS state
              FROM {source})) n
        LEFT JOIN {known} o USING (event_id)
        """,
        {"now": now},
    )


def _write_state(conn: duckdb.DuckDBPyConnection, *, mode: str, at: datetime, rows: int) -> None:
    """Record a complete load and the fingerprints of the events it saw (``FINGERPRINTS_NOW``),
    in the caller's transaction. A re-sync moves only its events' fingerprints (``REFETCH_TABLE``;
    one no longer listed loses its own); the others' and the events' load time stay, so the next
    incremental refresh still re-fetches the events that changed."""
    naive, resync = at.astimezone(UTC).replace(tzinfo=None), mode == "resync"
    conn.execute(f"CREATE SCHEMA IF NOT EXISTS {STATE_SCHEMA}")
    # One row per table, kept by delete-then-insert: a DuckLake has no PRIMARY KEY (files made
    # before it keep theirs, which the same statements respect).
    conn.execute(
        f"CREATE TABLE IF NOT EXISTS {STATE_TABLE} (table_name VARCHAR, "
        "last_full_at TIMESTAMP, last_load_at TIMESTAMP, last_mode VARCHAR, rows BIGINT, "
        "events_loaded_at TIMESTAMP)"
    )
    last_full_at, events_loaded_at = one_row(
        conn,
        f"SELECT max(last_full_at), max(events_loaded_at) FROM {STATE_TABLE} WHERE table_name = ?",
        [TRANSACTIONS.raw_table],
    )
    if not resync:
        events_now = _events_loaded_at(conn)
        events_loaded_at = events_now.replace(tzinfo=None) if events_now else None
    conn.execute(f"DELETE FROM {STATE_TABLE} WHERE table_name = ?", [TRANSACTIONS.raw_table])
    last_full_at = naive if mode == "full" else last_full_at
    conn.execute(
        f"INSERT INTO {STATE_TABLE} VALUES (?, ?, ?, ?, ?, ?)",
        [TRANSACTIONS.raw_table, last_full_at, naive, mode, rows, events_loaded_at],
    )
    if not resync:
        conn.execute(f"CREATE OR REPLACE TABLE {FINGERPRINTS_TABLE} AS FROM {FINGERPRINTS_NOW}")
        return
    events = f"SELECT event_id FROM {REFETCH_TABLE}"
    conn.execute(f"DELETE FROM {FINGERPRINTS_TABLE} WHERE event_id IN ({events})")
    conn.execute(
        f"INSERT INTO {FINGERPRINTS_TABLE} BY NAME SELECT * FROM {FINGERPRINTS_NOW} "
        f"WHERE event_id IN ({events})"
    )


# --- the refresh ------------------------------------------------------------------------------


@dataclass
class RefreshReport:
    """A raw load and how it was done; ``metadata()`` becomes asset metadata, with ``counts``
    (of a merge: ``events_refetched``, ``transactions_added``, ...)."""

    load: LoadReport
    mode: str
    reason: str
    bytes_fetched: int
    counts: dict[str, int] = field(default_factory=dict)

    def metadata(self) -> dict[str, Any]:
        return {
            "refresh_mode": self.mode,
            "refresh_reason": self.reason,
            "bytes_fetched": self.bytes_fetched,
            **self.counts,
        }


def refresh_raw_list(
    api: FieldSalesAPI,
    conn: duckdb.DuckDBPyConnection,
    endpoint: ListEndpoint,
    policy: RefreshPolicy,
    *,
    log: Callable[[str], None] = lambda message: None,
    warn: Callable[[str], None] = lambda message: None,
    before_swap: Callable[[str], None] | None = None,
    shrink: ShrinkGuard,
    run_id: str | None = None,
) -> RefreshReport:
    """Load one list into its raw table in the mode the policy calls for. ``before_swap(stage)``
    runs on the rows about to be stored (the whole new table, or an incremental run's re-fetched
    rows: redaction, comments); rows removed go to the deletion audit, by run ``run_id``."""
    reason = f"{endpoint.name} are always fetched whole (they are small next to transactions)"
    spent, after_swap = 0, None
    if endpoint.raw_table == TRANSACTIONS.raw_table:
        run = Merging(api, conn, log, before_swap, run_id)
        now = run.now
        decision = choose_mode(
            policy.mode,
            read_previous_load(conn),
            now=now,
            full_refresh_every_days=policy.full_refresh_every_days,
        )
        log(f"transactions: {decision.mode} refresh: {decision.reason}")
        reason = decision.reason
        if decision.mode == "incremental":
            try:
                return _incremental(run, policy, decision)
            except FallBack as exc:
                if policy.mode == "incremental" and not exc.filter_ignored:
                    raise IncrementalRefreshError(
                        f"raw_transactions: incremental refresh failed its guard: {exc}; nothing "
                        "was changed. Run a full refresh (refresh_mode=full) to reconcile."
                    ) from None
                warn(f"transactions: incremental refresh abandoned, running a full one: {exc}")
                reason, spent = f"fell back from incremental: {exc}", exc.bytes_fetched
        _fingerprint_current_events(conn, now)

        def after_swap(rows: int) -> None:
            # In the swap's transaction: never a new table with old state.
            _write_state(conn, mode="full", at=now, rows=rows)

    report = load_list(
        api,
        conn,
        endpoint,
        log=log,
        before_swap=before_swap,
        after_swap=after_swap,
        max_shrink_fraction=shrink.max_fraction,
        allow_shrink=shrink.allow,
        run_id=run_id,
    )
    return RefreshReport(report, "full", reason, report.bytes + spent)


@dataclass(frozen=True)
class RefetchPlan:
    """Which events' transactions are re-fetched (``REFETCH_TABLE``, each with ``why``, counted
    in ``why``), which events disappeared since the last load (``REMOVED_TABLE``), and how many
    events are listed now (``FINGERPRINTS_NOW``)."""

    event_ids: list[str]
    removed_ids: list[str]
    events: int
    why: dict[str, int]


def read_plan(conn: duckdb.DuckDBPyConnection) -> RefetchPlan:
    """The plan that ``REFETCH_TABLE`` and ``REMOVED_TABLE`` hold (filled by ``_plan``, or by a
    re-sync)."""

    def ids(table: str) -> list[str]:
        return [
            row[0] for row in conn.execute(f"SELECT event_id FROM {table} ORDER BY 1").fetchall()
        ]

    events = one_row(conn, f"SELECT count(*) FROM {FINGERPRINTS_NOW}")[0]
    why = conn.execute(f"SELECT why, count(*) FROM {REFETCH_TABLE} GROUP BY why").fetchall()
    return RefetchPlan(ids(REFETCH_TABLE), ids(REMOVED_TABLE), events, dict(why))


def _plan(conn: duckdb.DuckDBPyConnection, lookback_days: float, now: datetime) -> RefetchPlan:
    """Which events to re-fetch (new, changed, or changed within ``lookback_days``) and which
    disappeared, against the fingerprints recorded at the last load."""
    _fingerprint_current_events(conn, now)
    conn.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE {REFETCH_TABLE} AS
        SELECT n.event_id,
               CASE WHEN o.event_id IS NULL THEN 'new'
                    WHEN o.fingerprint IS DISTINCT FROM n.fingerprint THEN 'changed'
                    ELSE 'recent' END AS why
        FROM {FINGERPRINTS_NOW} n LEFT JOIN {FINGERPRINTS_TABLE} o USING (event_id)
        WHERE o.event_id IS NULL
           OR o.fingerprint IS DISTINCT FROM n.fingerprint
           -- no history to date it: recent while first seen in this state within the window
           OR coalesce(n.last_state_change, n.state_since) >= $since
        """,
        {"since": now - timedelta(days=lookback_days)},
    )
    conn.execute(
        f"CREATE OR REPLACE TEMP TABLE {REMOVED_TABLE} AS SELECT event_id FROM "
        f"{FINGERPRINTS_TABLE} EXCEPT SELECT event_id FROM {FINGERPRINTS_NOW}"
    )
    return read_plan(conn)


def _incremental(run: Merging, policy: RefreshPolicy, decision: ModeDecision) -> RefreshReport:
    plan = _plan(run.conn, policy.lookback_days, run.now)
    new, changed, recent = (plan.why.get(why, 0) for why in ("new", "changed", "recent"))
    refetched = len(plan.event_ids)
    run.log(
        f"transactions: re-fetching {refetched} of {plan.events} events by eventId ({new} new, "
        f"{changed} changed, {recent} within {policy.lookback_days:g} days); "
        f"{len(plan.removed_ids)} events disappeared"
    )
    if policy.mode == "auto" and refetched > MAX_REFETCH_SHARE * max(plan.events, 1):
        why = f"{refetched} of {plan.events} events changed: paging the whole list is cheaper"
        raise FallBack(why, 0)
    report = refetch_and_merge(run, plan, "incremental", decision.reason)
    removed = len(plan.removed_ids)
    report.counts.update(
        events_new=new, events_changed=changed, events_recent=recent, events_removed=removed
    )
    return report


def refetch_and_merge(run: Merging, plan: RefetchPlan, mode: str, reason: str) -> RefreshReport:
    """Re-fetch the transactions of ``plan``'s events by ``eventId`` and merge them (``_merge``):
    the incremental refresh's second half, and a re-sync's (``mode="resync"``, ``resync.py``),
    whose merge is not held to the server's global ``count``."""
    stats, conn = ListStats(), run.conn
    # The stored rows about to be replaced are read while the pages are fetched.
    reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fieldsales-replaced")
    replaced = reader.submit(
        _read_replaced, same_database_cursor(conn), plan.event_ids + plan.removed_ids
    )
    try:
        total = _fetch_by_event(run, plan, stats, count=mode != "resync")
        counts = _merge(run, mode, total, stats.bytes, replaced.result())
    finally:
        reader.shutdown(wait=True)
        drop_table(conn, qualified(STAGE_TABLE))
    load = LoadReport.of(TRANSACTIONS.raw_table, counts["rows"], total, stats, run.started)
    run.log(
        f"transactions: merged {len(plan.event_ids)} events: {counts['added']} added, "
        f"{counts['changed']} changed, {counts['removed']} removed; {counts['rows']} rows "
        f"({stats.requests} requests, {stats.bytes / 1e6:.1f} MB, {load.seconds:.1f} s)"
    )
    changes = {f"transactions_{what}": counts[what] for what in ("added", "changed", "removed")}
    counted = {"events_refetched": len(plan.event_ids), **changes}
    return RefreshReport(load, mode, reason, stats.bytes, counted)


def _fetch_by_event(run: Merging, plan: RefetchPlan, stats: ListStats, count: bool) -> int | None:
    """Page ``transaction/all?eventId=X`` for every X of ``plan`` into ``STAGE_TABLE``, each
    event a stream held to the completeness rule; then, if ``count``, return the server's global
    ``count`` (one page of one item): a server that caps pages and reports each page's size as
    its total loses items the merge's count check catches. A failed guard is a ``FallBack``."""
    api = run.api
    staging = Staging(run.conn, TRANSACTIONS, STAGE_TABLE, datetime.now(UTC), "event_id", True)
    staging.create()
    executor = page_executor(api, label="transactions by eventId", log=run.log, spent=stats)
    try:
        ListPasses(executor, staging).run(
            [Stream(TRANSACTIONS.with_params(eventId=e), e, api.page_size) for e in plan.event_ids]
        )
    except FilterIgnoredError as exc:
        raise FallBack(str(exc), stats.bytes, filter_ignored=True) from None
    except (PagingError, IncompleteListError) as exc:
        raise FallBack(str(exc), stats.bytes) from None
    staging.seal()
    if not count:
        return None
    count_page = api.fetch_page(TRANSACTIONS.with_params(limit=1), 0, stats)
    stats.count(pages=1, bytes=count_page.nbytes)
    if count_page.total is None:
        raise FallBack("the transaction list has no count to check the merge with", stats.bytes)
    return count_page.total


def _read_replaced(cursor: duckdb.DuckDBPyConnection, event_ids: list[str]) -> dict[str, int]:
    """Ids and payload hashes of the stored transactions of ``event_ids``.

    A plain SELECT, on its own cursor, so it can run while the pages are fetched: reading the
    payloads back is most of a merge's cost (DuckDB decompresses each 2,048-row vector that
    holds a matching row: about half of the table for 1% of the events, ~1 s at 1M), and a
    ``DELETE ... RETURNING`` would read the payload of every row. Nothing else writes the table
    meanwhile: the loader holds the warehouse's write lock.
    """
    try:
        return dict(
            cursor.execute(
                f"SELECT id, hash(payload::VARCHAR) FROM {qualified(TRANSACTIONS.raw_table)} "
                "WHERE event_id IN (SELECT unnest($ids))",
                {"ids": event_ids},
            ).fetchall()
        )
    finally:
        cursor.close()


def _merge(
    run: Merging, mode: str, server_count: int | None, spent: int, replaced: dict[str, int]
) -> dict[str, int]:
    """Replace the re-fetched and removed events' transactions, check, record the new state
    (a re-sync's moves only its events' fingerprints): one transaction, with ``before_swap(stage)``
    (redaction, comments), the deletion audit (found by run ``run_id``) and the stage's drop.
    ``replaced``: ids and payload hashes of the stored rows of the re-fetched and removed events
    (``_read_replaced``), for the counts of changed, added and removed transactions."""
    conn, now = run.conn, run.now
    target, stage = qualified(TRANSACTIONS.raw_table), qualified(STAGE_TABLE)
    staged, stored, old = _staged_and_old(conn, replaced, spent)

    def merge() -> tuple[int, dict[str, int]]:
        if run.before_swap is not None:
            run.before_swap(STAGE_TABLE)
        # After before_swap: a redacted payload compares with the redacted one stored.
        new = dict(conn.execute(f"SELECT id, hash(payload::VARCHAR) FROM {stage}").fetchall())
        scope, kept = f"event_id IN ({REPLACED_EVENTS})", f"SELECT id FROM {stage}"
        record_deletions(conn, TRANSACTIONS, kept=kept, scope=scope, run_id=run.run_id, at=now)
        deleted = _delete_replaced(conn, moved=len(old) > len(replaced))
        pause_at("merge")
        conn.execute(f"INSERT INTO {target} BY NAME SELECT * FROM {stage}")
        rows = one_row(conn, f"SELECT count(*) FROM {target}")[0]
        # Every id stays distinct by construction: the stored table was (a full load drops
        # repeats, and so did every merge), the staged ids are, and every stored copy of a
        # staged id was just deleted. So the rows must add up, and match the server's count
        # (when it is checked: a re-sync of some events leaves the others' changes be).
        if (
            deleted != len(old)
            or rows != stored - deleted + staged
            or server_count not in (None, rows)
        ):
            counts = "" if server_count is None else f" but the server counts {server_count}"
            raise FallBack(
                f"after the merge raw.transactions would hold {rows} rows ({stored} stored, "
                f"{deleted} deleted where {len(old)} were expected, {staged} fetched){counts}",
                spent,
            )
        _write_state(conn, mode=mode, at=now, rows=rows)
        conn.execute(f"DROP TABLE {stage}")
        return rows, new

    rows, new = run_transaction(conn, TRANSACTIONS.raw_table, merge)
    return {
        "rows": rows,
        "added": sum(1 for key in new if key not in old),
        "changed": sum(1 for key, digest in new.items() if key in old and old[key] != digest),
        "removed": sum(1 for key in old if key not in new),
    }


def _staged_and_old(
    conn: duckdb.DuckDBPyConnection, replaced: dict[str, int], spent: int
) -> tuple[int, int, dict[str, int]]:
    """The rows staged (each id once, or the merge is refused), the rows stored, and the ids and
    payload hashes of every stored row the merge replaces: ``replaced``, and any stored copy of a
    staged id under an event that was not re-fetched (the transaction moved; rare)."""
    target, stage = qualified(TRANSACTIONS.raw_table), qualified(STAGE_TABLE)
    staged, distinct_staged = one_row(conn, f"SELECT count(*), count(DISTINCT id) FROM {stage}")
    if staged != distinct_staged:
        raise FallBack(f"{staged - distinct_staged} transactions listed under two events", spent)
    old = dict(replaced)
    # Counted first: a query that returns the payload reads it for every row it scans.
    moved = f"WHERE id IN (SELECT id FROM {stage}) AND NOT event_id IN ({REPLACED_EVENTS})"
    if one_row(conn, f"SELECT count(*) FROM {target} {moved}")[0]:
        old.update(
            conn.execute(f"SELECT id, hash(payload::VARCHAR) FROM {target} {moved}").fetchall()
        )
    return staged, one_row(conn, f"SELECT count(*) FROM {target}")[0], old


def _delete_replaced(conn: duckdb.DuckDBPyConnection, moved: bool) -> int:
    """Delete the stored rows that the staged ones replace; returns how many.

    Those are the rows of re-fetched and disappeared events, and, when ``moved``, the stored
    copies of re-fetched ids under other events (transactions that moved to a re-fetched event).
    Filters on narrow columns only: no payload is read.
    """
    also = f" OR id IN (SELECT id FROM {qualified(STAGE_TABLE)})" if moved else ""
    target = qualified(TRANSACTIONS.raw_table)
    return one_row(conn, f"DELETE FROM {target} WHERE event_id IN ({REPLACED_EVENTS}){also}")[0]
