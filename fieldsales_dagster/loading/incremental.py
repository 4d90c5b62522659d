"""Refresh modes of ``raw.transactions``: a full reload, or an incremental one by event
(docs/refresh.md): the transactions of events that are new, changed (``meta.event_fingerprints``)
or changed within ``lookback_days`` are re-fetched by ``eventId`` and merged in one transaction,
trusted only if the filter held, each event's pages are complete and the server's ``count`` matches.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import duckdb

from fieldsales_dagster.client.api import FieldSalesAPI
from fieldsales_dagster.client.endpoints import EVENTS, TRANSACTIONS, ListEndpoint
from fieldsales_dagster.client.envelope import ListStats
from fieldsales_dagster.loading.deletions import OF_EVENTS, record_deletions
from fieldsales_dagster.loading.lists import (
    FilterIgnoredError,
    IncompleteListError,
    ListPasses,
    PagingError,
    Stream,
)
from fieldsales_dagster.loading.raw_load import (
    CHANGES,
    STAGED_DIGESTS,
    LoadReport,
    Staging,
    compare_digests,
    digest_key,
    digests_table,
    event_states,
    load_list,
    page_executor,
    record_load,
    recorded_load,
    write_rows,
)
from fieldsales_dagster.loading.refresh_mode import (
    IncrementalRefreshError,
    PreviousLoad,
    choose_mode,
)
from fieldsales_dagster.pause import pause_at
from fieldsales_dagster.warehouse.lake import drop_table, run_transaction
from fieldsales_dagster.warehouse.quoting import qualified
from fieldsales_dagster.warehouse.rows import one_row
from fieldsales_dagster.warehouse.warehouse import FieldSalesWarehouse, staging_table, table_exists

FINGERPRINTS_TABLE = "meta.event_fingerprints"
#: The stored transactions' digests (raw_load.digests_table), which a merge compares and keeps.
DIGESTS_TABLE = digests_table(TRANSACTIONS.raw_table)
#: A temporary table (memory, spilling to temp_directory): the re-fetched rows are written to the
#: lake once, by the merge, not a second time as a staging table.
STAGE_TABLE = "temp." + staging_table(TRANSACTIONS.raw_table, "_by_event").partition(".")[2]

#: Temporary tables of one refresh (see ``RefetchPlan``).
FINGERPRINTS_NOW = "_fs_fingerprints"
REFETCH_TABLE = "_fs_refetch"
REMOVED_TABLE = "_fs_removed"
REPLACED_TABLE = "_fs_replaced"  # the stored digests a merge compares the re-fetched rows with
#: The events of the rows a merge finds gone: every such row is one of its events' stored rows.
GONE_EVENTS = (
    f"SELECT DISTINCT event_id FROM {REPLACED_TABLE} "
    f"WHERE id IN (SELECT id FROM {CHANGES} WHERE NOT staged)"
)

MAX_REFETCH_SHARE = 0.5  # of the events: past it, re-fetching costs more than a full refresh


class FallBack(Exception):
    """The incremental attempt is abandoned: ``auto`` goes full, ``incremental`` fails, except
    when ``filter_ignored`` (the server ignores ``eventId``): then every mode goes full."""

    def __init__(self, message: str, bytes_fetched: int, filter_ignored: bool = False):
        super().__init__(message)
        self.bytes_fetched = bytes_fetched
        self.filter_ignored = filter_ignored


@dataclass(frozen=True)
class Merging:
    """One merge of re-fetched transactions into ``raw.transactions`` (incremental or re-sync)."""

    api: FieldSalesAPI
    conn: duckdb.DuckDBPyConnection
    log: Callable[[str], None]
    before_swap: Callable[[str], None]
    run_id: str | None
    digest_key: int  # of the stored rows' digests (raw_load.digest_key)
    now: datetime = field(default_factory=lambda: datetime.now(UTC))
    started: float = field(default_factory=time.monotonic)


def read_previous_load(conn: duckdb.DuckDBPyConnection) -> PreviousLoad | None:
    """The last complete load, if one recorded its state and its rows' digests (a lake from
    before digests were stored takes one full refresh to record them)."""
    row = recorded_load(conn, TRANSACTIONS.raw_table)
    if row[1] is None or not all(
        table_exists(conn, t) for t in (FINGERPRINTS_TABLE, DIGESTS_TABLE)
    ):
        return None
    last_full_at, recorded, events_now = (
        moment and moment.replace(tzinfo=UTC) for moment in (*row[::2], _events_loaded_at(conn))
    )
    rows_stored = _if_exists(conn, TRANSACTIONS.raw_table, "count(*)")
    return PreviousLoad(last_full_at, row[1], rows_stored, recorded, events_now)


def _if_exists(conn: duckdb.DuckDBPyConnection, table: str, value: str) -> Any:
    """``SELECT value FROM table``, or ``None`` without the table."""
    if table_exists(conn, table):
        return one_row(conn, f"SELECT {value} FROM {qualified(table)}")[0]
    return None


def _events_loaded_at(conn: duckdb.DuckDBPyConnection) -> datetime | None:
    """When ``raw.events`` was last loaded whole (naive, UTC): as ``record_load`` recorded it, or
    on a lake from before that record, its newest ``loaded_at``."""
    loaded = _if_exists(conn, EVENTS.raw_table, "max(loaded_at)")
    listed = recorded_load(conn, EVENTS.raw_table)[0]
    return loaded and max(loaded, listed or loaded)


def _fingerprint_current_events(conn: duckdb.DuckDBPyConnection, now: datetime) -> None:
    """Fill ``FINGERPRINTS_NOW``: per listed event, its state fingerprint, last dated change, and
    ``state_since`` (kept while the fingerprint holds, else ``now``; it stands in for an undated
    change). Reads ``event_states``, written with ``raw.events`` (none before its first load):
    no payload is parsed here."""
    known = FINGERPRINTS_TABLE
    if not table_exists(conn, FINGERPRINTS_TABLE):
        known = "(SELECT NULL::VARCHAR event_id, NULL fingerprint, NULL::TIMESTAMPTZ state_since)"
    conn.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE {FINGERPRINTS_NOW} AS
        SELECT n.event_id, n.fingerprint, list_max(n.state_changes) AS last_state_change,
               CASE WHEN o.fingerprint = n.fingerprint THEN o.state_since
                    ELSE $now::TIMESTAMPTZ END AS state_since
        FROM {event_states(conn)} n LEFT JOIN {known} o USING (event_id)
        """,
        {"now": now},
    )


def _write_state(conn: duckdb.DuckDBPyConnection, rows: int, *, mode: str, at: datetime) -> None:
    """Record a complete load and its events' fingerprints, in the caller's transaction. A
    re-sync moves only its events' fingerprints, so the next refresh still sees the others'."""
    table, resync = TRANSACTIONS.raw_table, mode == "resync"
    # A re-sync keeps when raw.events was loaded whole, as the load it re-syncs saw it.
    events_at = recorded_load(conn, table)[2] if resync else _events_loaded_at(conn)
    record_load(conn, table, rows, at, mode, events_at)
    if not resync:
        conn.execute(f"CREATE OR REPLACE TABLE {FINGERPRINTS_TABLE} AS FROM {FINGERPRINTS_NOW}")
        return
    ours = f"event_id IN (SELECT event_id FROM {REFETCH_TABLE})"
    conn.execute(f"DELETE FROM {FINGERPRINTS_TABLE} WHERE {ours}")
    conn.execute(f"INSERT INTO {FINGERPRINTS_TABLE} BY NAME FROM {FINGERPRINTS_NOW} WHERE {ours}")


@dataclass
class RefreshReport:
    """A raw load and how it was done; ``metadata()`` becomes asset metadata."""

    load: LoadReport
    mode: str
    reason: str
    bytes_fetched: int
    counts: dict[str, int] = field(default_factory=dict)

    def metadata(self) -> dict[str, Any]:
        how = {"refresh_mode": self.mode, "refresh_reason": self.reason}
        return how | {"bytes_fetched": self.bytes_fetched, **self.counts}


def refresh_raw_list(
    api: FieldSalesAPI,
    conn: duckdb.DuckDBPyConnection,
    endpoint: ListEndpoint,
    warehouse: FieldSalesWarehouse,
    *,
    mode: str | None,
    log: Callable[[str], None] = lambda message: None,
    warn: Callable[[str], None] = lambda message: None,
    before_swap: Callable[[str], None],
    allow_shrink: bool,
    run_id: str | None = None,
) -> RefreshReport:
    """Load one list into its raw table by the warehouse's refresh settings, in ``mode`` (the run
    config's, validated there) or the warehouse's own. ``before_swap(stage)`` runs on the rows
    about to be stored (the new table, or the re-fetched rows); a full load may shrink the table
    as ``load_list`` allows."""
    mode = mode or warehouse.refresh_mode
    reason = f"{endpoint.name} are always fetched whole (they are small next to transactions)"
    spent, after_swap = 0, None
    if endpoint.raw_table == TRANSACTIONS.raw_table:
        run = Merging(api, conn, log, before_swap, run_id, digest_key(warehouse.redact_pii_in_raw))
        previous, every = read_previous_load(conn), warehouse.full_refresh_every_days
        decision = choose_mode(mode, previous, now=run.now, full_refresh_every_days=every)
        log(f"transactions: {decision.mode} refresh: {decision.reason}")
        reason = decision.reason
        if decision.mode == "incremental":
            try:
                return _incremental(run, mode, warehouse.lookback_days, reason)
            except FallBack as exc:
                if mode == "incremental" and not exc.filter_ignored:
                    raise IncrementalRefreshError(
                        f"raw_transactions: incremental refresh failed its guard: {exc}; nothing "
                        "was changed. Run a full refresh (refresh_mode=full) to reconcile."
                    ) from None
                warn(f"transactions: incremental refresh abandoned, running a full one: {exc}")
                reason, spent = f"fell back from incremental: {exc}", exc.bytes_fetched
        _fingerprint_current_events(conn, run.now)
        # In the swap's transaction: never a new table with old state.
        after_swap = partial(_write_state, conn, mode="full", at=run.now)

    report = load_list(
        api,
        conn,
        endpoint,
        log=log,
        before_swap=before_swap,
        after_swap=after_swap,
        max_shrink_fraction=warehouse.max_shrink_fraction,
        allow_shrink=allow_shrink,
        run_id=run_id,
        redact_pii_in_raw=warehouse.redact_pii_in_raw,
    )
    return RefreshReport(report, "full", reason, report.bytes + spent)


@dataclass(frozen=True)
class RefetchPlan:
    """Events to re-fetch (``REFETCH_TABLE``, counted by ``why``), events that disappeared
    (``REMOVED_TABLE``), and how many are listed now."""

    event_ids: list[str]
    removed_ids: list[str]
    events: int
    why: dict[str, int]

    @property
    def replaced(self) -> dict[str, list[str]]:
        """The events whose stored rows a merge replaces, as ``OF_EVENTS``' parameter."""
        return {"events": self.event_ids + self.removed_ids}


def event_ids(conn: duckdb.DuckDBPyConnection, rows: str) -> list[str]:
    """The ``event_id`` of ``rows`` (a table and condition), sorted."""
    return [row[0] for row in conn.execute(f"SELECT event_id FROM {rows} ORDER BY 1").fetchall()]


def read_plan(conn: duckdb.DuckDBPyConnection) -> RefetchPlan:
    """The plan that ``REFETCH_TABLE`` and ``REMOVED_TABLE`` hold."""
    events = one_row(conn, f"SELECT count(*) FROM {FINGERPRINTS_NOW}")[0]
    why = conn.execute(f"SELECT why, count(*) FROM {REFETCH_TABLE} GROUP BY why").fetchall()
    return RefetchPlan(
        event_ids(conn, REFETCH_TABLE), event_ids(conn, REMOVED_TABLE), events, dict(why)
    )


def _plan(conn: duckdb.DuckDBPyConnection, lookback_days: float, now: datetime) -> RefetchPlan:
    """Which events to re-fetch and which disappeared, against the last load's fingerprints."""
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
           -- nothing dated: recent while first seen in this state within the window
           OR coalesce(n.last_state_change, n.state_since) >= $since
        """,
        {"since": now - timedelta(days=lookback_days)},
    )
    conn.execute(
        f"CREATE OR REPLACE TEMP TABLE {REMOVED_TABLE} AS SELECT event_id FROM "
        f"{FINGERPRINTS_TABLE} EXCEPT SELECT event_id FROM {FINGERPRINTS_NOW}"
    )
    return read_plan(conn)


def _incremental(run: Merging, mode: str, lookback_days: float, reason: str) -> RefreshReport:
    plan = _plan(run.conn, lookback_days, run.now)
    counts = {f"events_{why}": plan.why.get(why, 0) for why in ("new", "changed", "recent")}
    counts["events_removed"], refetched = len(plan.removed_ids), len(plan.event_ids)
    run.log(
        f"transactions: re-fetching {refetched} of {plan.events} events by eventId (recent: "
        f"within {lookback_days:g} days): {counts}"
    )
    if mode == "auto" and refetched > MAX_REFETCH_SHARE * max(plan.events, 1):
        why = f"{refetched} of {plan.events} events changed: paging the whole list is cheaper"
        raise FallBack(why, 0)
    report = refetch_and_merge(run, plan, "incremental", reason)
    report.counts.update(counts)
    return report


def refetch_and_merge(run: Merging, plan: RefetchPlan, mode: str, reason: str) -> RefreshReport:
    """Re-fetch ``plan``'s events' transactions by ``eventId`` and merge them; a re-sync's merge
    (``mode="resync"``) is not held to the server's global ``count``."""
    stats, conn, events = ListStats(), run.conn, plan.replaced
    try:
        total = _fetch_by_event(run, plan, stats, count=mode != "resync")
        rows, counts = _merge(run, mode, total, stats.bytes, events)
    finally:
        for table in (qualified(STAGE_TABLE), STAGED_DIGESTS, REPLACED_TABLE, CHANGES):
            drop_table(conn, table)
    written = any(counts.values())  # else every re-fetched row was stored as it is (``_merge``)
    load = LoadReport.of(TRANSACTIONS.raw_table, rows, total, stats, run.started, written=written)
    run.log(
        f"transactions: merged {len(plan.event_ids)} events, {rows} rows: {counts} "
        f"({stats.requests} requests, {stats.bytes / 1e6:.1f} MB, {load.seconds:.1f} s)"
    )
    counts["events_refetched"] = len(plan.event_ids)
    return RefreshReport(load, mode, reason, stats.bytes, counts)


def _fetch_by_event(run: Merging, plan: RefetchPlan, stats: ListStats, count: bool) -> int | None:
    """Page each event of ``plan`` into ``STAGE_TABLE``, then return the server's global count
    if ``count`` (it catches totals that are page sizes). A failed guard is a ``FallBack``."""
    api = run.api
    staging = Staging(run.conn, TRANSACTIONS, STAGE_TABLE, datetime.now(UTC), "event_id", True)
    staging.create()
    executor = page_executor(
        api, label="transactions by eventId", log=run.log, spent=stats, digest_key=run.digest_key
    )
    try:
        ListPasses(executor, staging).run(
            [Stream(TRANSACTIONS.with_params(eventId=e), e, api.page_size) for e in plan.event_ids]
        )
    except (FilterIgnoredError, PagingError, IncompleteListError) as exc:
        ignored = isinstance(exc, FilterIgnoredError)
        raise FallBack(str(exc), stats.bytes, filter_ignored=ignored) from None
    staging.seal()
    if not count:
        return None
    count_page = api.fetch_page(TRANSACTIONS.with_params(limit=1), 0, stats)
    stats.count(pages=1, bytes=count_page.nbytes)
    if count_page.total is None:
        raise FallBack("the transaction list has no count to check the merge with", stats.bytes)
    return count_page.total


def _merge(
    run: Merging,
    mode: str,
    server_count: int | None,
    spent: int,
    events: dict[str, list[str]],
) -> tuple[int, dict[str, int]]:
    """Bring the transactions of ``events`` (re-fetched and removed) and their digests to the
    staged rows, as a list load does (``write_rows``: a row stored as re-fetched is kept,
    ``loaded_at`` and all), check, record the new state: one transaction, with ``before_swap``,
    the deletion audit and the stage's drop. Returns the rows and the transactions added, changed
    and removed: the staged rows' digests (``STAGED_DIGESTS``) compared with the stored digests
    of the events' rows and of staged ids stored under another event (``REPLACED_TABLE``)."""
    conn, target, stage = run.conn, qualified(TRANSACTIONS.raw_table), qualified(STAGE_TABLE)
    staged, distinct_staged = one_row(conn, f"SELECT count(*), count(DISTINCT id) FROM {stage}")
    if staged != distinct_staged:
        raise FallBack(f"{staged - distinct_staged} transactions listed under two events", spent)
    # One scan of the stored digests: the events' rows and staged ids stored elsewhere.
    conn.execute(
        f"CREATE OR REPLACE TEMP TABLE {REPLACED_TABLE} AS SELECT * FROM {DIGESTS_TABLE} "
        f"WHERE {OF_EVENTS} OR id IN (SELECT id FROM {stage})",
        events,
    )
    changed = compare_digests(conn, f"SELECT id, digest FROM {REPLACED_TABLE}")
    counts = one_row(
        conn,
        "SELECT count(*) FILTER (NOT stored), count(*) FILTER (staged AND stored), "
        f"count(*) FILTER (NOT staged) FROM {CHANGES}",
    )

    def merge() -> int:
        run.before_swap(STAGE_TABLE)
        deleted = 0
        if changed:  # else every re-fetched row is stored as returned: nothing is written
            # Payloads are read where the events of the rows gone lie, not all re-fetched ones'.
            gone_in = [e for (e,) in conn.execute(GONE_EVENTS).fetchall()]
            record_deletions(
                conn, TRANSACTIONS, changes=CHANGES, events=gone_in, run_id=run.run_id, at=run.now
            )
            deleted = write_rows(conn, target, stage)
            pause_at("merge")
            write_rows(conn, DIGESTS_TABLE, STAGED_DIGESTS)
        rows = one_row(conn, f"SELECT count(*) FROM {target}")[0]
        # Ids are distinct by construction (staged once each, every stored copy of a changed id
        # deleted): the delete must match what was compared, and rows the server's count.
        if deleted != counts[1] + counts[2] or server_count not in (None, rows):
            also = "" if server_count is None else f" but the server counts {server_count}"
            raise FallBack(
                f"after the merge raw.transactions would hold {rows} rows ({deleted} deleted "
                f"where {counts[1] + counts[2]} were expected){also}",
                spent,
            )
        _write_state(conn, rows, mode=mode, at=run.now)
        conn.execute(f"DROP TABLE {stage}")
        return rows

    names = ("transactions_added", "transactions_changed", "transactions_removed")
    return run_transaction(conn, TRANSACTIONS.raw_table, merge), dict(
        zip(names, counts, strict=True)
    )
