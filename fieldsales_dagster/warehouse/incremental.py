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

import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import msgspec

from fieldsales_dagster.client.endpoints import EVENTS, TRANSACTIONS, ListEndpoint
from fieldsales_dagster.client.errors import FieldSalesAPIError
from fieldsales_dagster.client.pager import ListStats
from fieldsales_dagster.client.resource import FieldSalesAPI
from fieldsales_dagster.warehouse.raw_load import (
    LoadReport,
    StagingWriter,
    load_list,
    raw_table_ddl,
)
from fieldsales_dagster.warehouse.refresh_mode import (
    IncrementalRefreshError,
    ModeDecision,
    PreviousLoad,
    choose_mode,
    validate_refresh_mode,
)
from fieldsales_dagster.warehouse.resource import qualified, staging_table

STATE_SCHEMA = "meta"
STATE_TABLE = "meta.refresh_state"
FINGERPRINTS_TABLE = "meta.event_fingerprints"
STAGE_TABLE = staging_table(TRANSACTIONS.raw_table, "_by_event")

#: In ``auto``, re-fetching more than this share of the events by ``eventId`` costs more
#: requests than paging the whole list: a full refresh is chosen instead.
MAX_REFETCH_SHARE = 0.5


class _FallBack(Exception):
    """The incremental attempt is abandoned; ``auto`` (or any mode, if ``always``) goes full."""

    always = False

    def __init__(self, message: str, bytes_fetched: int = 0):
        super().__init__(message)
        self.bytes_fetched = bytes_fetched


class EventFilterIgnored(_FallBack):
    always = True


class CountMismatch(_FallBack):
    pass


class EventListMoved(_FallBack):
    pass


class TooManyEvents(_FallBack):
    pass


@dataclass(frozen=True)
class RefreshPolicy:
    mode: str = "auto"
    full_refresh_every_days: float = 7.0
    lookback_days: float = 30.0

    @classmethod
    def of(cls, settings: object, override: str | None = None) -> RefreshPolicy:
        """The policy of a resource holding the three fields, ``override`` (run config) first."""
        mode = override or getattr(settings, "refresh_mode", "auto")
        return cls(
            mode=str(validate_refresh_mode(mode)),
            full_refresh_every_days=float(getattr(settings, "full_refresh_every_days", 7.0)),
            lookback_days=float(getattr(settings, "lookback_days", 30.0)),
        )


# --- state ------------------------------------------------------------------------------------


def _table_exists(conn: duckdb.DuckDBPyConnection, table: str) -> bool:
    schema, _, name = table.partition(".")
    return bool(
        conn.execute(
            "SELECT count(*) FROM duckdb_tables() WHERE schema_name = ? AND table_name = ?",
            [schema, name],
        ).fetchone()[0]
    )


def read_previous_load(conn: duckdb.DuckDBPyConnection) -> PreviousLoad | None:
    if not (_table_exists(conn, STATE_TABLE) and _table_exists(conn, FINGERPRINTS_TABLE)):
        return None
    row = conn.execute(
        f"SELECT last_full_at, last_load_at, rows, events_loaded_at FROM {STATE_TABLE} "
        "WHERE table_name = ?",
        [TRANSACTIONS.raw_table],
    ).fetchone()
    if row is None:
        return None
    rows_stored = (
        conn.execute(f"SELECT count(*) FROM {qualified(TRANSACTIONS.raw_table)}").fetchone()[0]
        if _table_exists(conn, TRANSACTIONS.raw_table)
        else None
    )
    return PreviousLoad(
        last_full_at=row[0].replace(tzinfo=UTC),
        last_load_at=row[1].replace(tzinfo=UTC),
        rows_recorded=row[2],
        rows_stored=rows_stored,
        events_loaded_at_recorded=row[3].replace(tzinfo=UTC) if row[3] else None,
        events_loaded_at_now=_events_loaded_at(conn),
    )


def _events_loaded_at(conn: duckdb.DuckDBPyConnection) -> datetime | None:
    if not _table_exists(conn, EVENTS.raw_table):
        return None
    value = conn.execute(f"SELECT max(loaded_at) FROM {qualified(EVENTS.raw_table)}").fetchone()[0]
    return value.replace(tzinfo=UTC) if value else None


def _fingerprint_current_events(conn: duckdb.DuckDBPyConnection) -> None:
    """``_fs_fingerprints``: per event of ``raw.events``, its state fingerprint and last change.

    Each payload is parsed once (``json_extract`` with a list of paths): three separate
    extractions of ~3 KB documents ran out of DuckDB's 192 MB at 25,000 events.
    """
    source = (
        qualified(EVENTS.raw_table)
        if _table_exists(conn, EVENTS.raw_table)
        else "(SELECT NULL::VARCHAR AS id, NULL::JSON AS payload WHERE false)"
    )
    conn.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE _fs_fingerprints AS
        SELECT event_id,
               md5(concat_ws(chr(1),
                   coalesce(state[1]::VARCHAR, 'null'),
                   coalesce(state[2]::VARCHAR, 'null'),
                   coalesce(state[3]::VARCHAR, 'null'))) AS fingerprint,
               list_max(list_transform(
                   coalesce(json_extract_string(state[2], '$[*].date'), []),
                   lambda d: try_cast(d AS TIMESTAMPTZ))) AS last_state_change
        FROM (SELECT id AS event_id,
                     json_extract(payload, ['$.eventState', '$.eventStateHistory',
                                            '$.eventStateTimestamps']) AS state
              FROM {source})
        """
    )


def _write_state(conn: duckdb.DuckDBPyConnection, *, mode: str, at: datetime, rows: int) -> None:
    """Record a complete load (inside the caller's transaction, if any)."""
    naive = at.astimezone(UTC).replace(tzinfo=None)
    events_loaded_at = _events_loaded_at(conn)
    conn.execute(f"CREATE SCHEMA IF NOT EXISTS {STATE_SCHEMA}")
    conn.execute(
        f"CREATE TABLE IF NOT EXISTS {STATE_TABLE} (table_name VARCHAR PRIMARY KEY, "
        "last_full_at TIMESTAMP, last_load_at TIMESTAMP, last_mode VARCHAR, rows BIGINT, "
        "events_loaded_at TIMESTAMP)"
    )
    conn.execute(
        f"INSERT INTO {STATE_TABLE} VALUES ($table, $at, $at, $mode, $rows, $events) "
        "ON CONFLICT (table_name) DO UPDATE SET "
        "last_full_at = CASE WHEN $mode = 'full' THEN $at ELSE last_full_at END, "
        "last_load_at = $at, last_mode = $mode, rows = $rows, events_loaded_at = $events",
        {
            "table": TRANSACTIONS.raw_table,
            "at": naive,
            "mode": mode,
            "rows": rows,
            "events": events_loaded_at.replace(tzinfo=None) if events_loaded_at else None,
        },
    )
    conn.execute(f"CREATE OR REPLACE TABLE {FINGERPRINTS_TABLE} AS SELECT * FROM _fs_fingerprints")


# --- the refresh ------------------------------------------------------------------------------


@dataclass
class RefreshReport:
    """A raw load and how it was done; ``metadata()`` becomes asset metadata."""

    load: LoadReport
    mode: str
    reason: str
    bytes_fetched: int
    events_refetched: int | None = None
    events_new: int | None = None
    events_changed: int | None = None
    events_recent: int | None = None
    events_removed: int | None = None
    transactions_added: int | None = None
    transactions_changed: int | None = None
    transactions_removed: int | None = None

    def metadata(self) -> dict[str, object]:
        out: dict[str, object] = {
            "refresh_mode": self.mode,
            "refresh_reason": self.reason,
            "bytes_fetched": self.bytes_fetched,
        }
        for name in (
            "events_refetched",
            "events_new",
            "events_changed",
            "events_recent",
            "events_removed",
            "transactions_added",
            "transactions_changed",
            "transactions_removed",
        ):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out


def refresh_raw_list(
    api: FieldSalesAPI,
    conn: duckdb.DuckDBPyConnection,
    endpoint: ListEndpoint,
    policy: RefreshPolicy,
    *,
    log: Callable[[str], None] = lambda message: None,
    warn: Callable[[str], None] = lambda message: None,
    before_swap: Callable[[str], None] | None = None,
    max_shrink_fraction: float = 0.5,
    allow_shrink: bool = False,
) -> RefreshReport:
    """Load one list into its raw table in the mode the policy calls for.

    ``before_swap(staging_table)`` runs on the rows about to be stored (the whole new table, or
    an incremental run's re-fetched rows) before they reach the raw table (redaction, comments).
    """
    shrink = {"max_shrink_fraction": max_shrink_fraction, "allow_shrink": allow_shrink}
    if endpoint.raw_table == TRANSACTIONS.raw_table:
        return refresh_transactions(
            api, conn, policy, log=log, warn=warn, before_swap=before_swap, shrink=shrink
        )
    report = load_list(api, conn, endpoint, log=log, before_swap=before_swap, **shrink)
    return RefreshReport(
        load=report,
        mode="full",
        reason=f"{endpoint.name} are always fetched whole (they are small next to transactions)",
        bytes_fetched=report.bytes,
    )


def refresh_transactions(
    api: FieldSalesAPI,
    conn: duckdb.DuckDBPyConnection,
    policy: RefreshPolicy,
    *,
    log: Callable[[str], None] = lambda message: None,
    warn: Callable[[str], None] = lambda message: None,
    now: datetime | None = None,
    before_swap: Callable[[str], None] | None = None,
    shrink: dict[str, object] | None = None,
) -> RefreshReport:
    now = now or datetime.now(UTC)
    decision = choose_mode(
        policy.mode,
        read_previous_load(conn),
        now=now,
        full_refresh_every_days=policy.full_refresh_every_days,
    )
    log(f"transactions: {decision.mode} refresh: {decision.reason}")
    spent = 0
    if decision.mode == "incremental":
        try:
            return _incremental(api, conn, policy, decision, now, log, before_swap)
        except _FallBack as exc:
            if policy.mode == "incremental" and not exc.always:
                raise IncrementalRefreshError(
                    f"raw_transactions: incremental refresh failed its guard: {exc}. "
                    "raw.transactions was left as it was; run a full refresh "
                    "(refresh_mode=full) to reconcile."
                ) from None
            warn(
                f"transactions: incremental refresh abandoned, running a full refresh instead: "
                f"{exc}"
            )
            decision = ModeDecision("full", f"fell back from incremental: {exc}")
            spent = exc.bytes_fetched
    _fingerprint_current_events(conn)
    report = load_list(api, conn, TRANSACTIONS, log=log, before_swap=before_swap, **(shrink or {}))
    _write_state(conn, mode="full", at=now, rows=report.rows)
    return RefreshReport(
        load=report, mode="full", reason=decision.reason, bytes_fetched=report.bytes + spent
    )


@dataclass
class _Fetched:
    stats: ListStats = field(default_factory=ListStats)
    events_done: int = 0


class _TxKeys(msgspec.Struct):
    id: str | int | float | None = msgspec.field(default=None, name="_id")
    event_id: str | int | float | None = msgspec.field(default=None, name="eventId")


_decode_keys = msgspec.json.Decoder(_TxKeys)


def _keys_of(item: msgspec.Raw) -> _TxKeys:
    try:
        return _decode_keys.decode(item)
    except msgspec.ValidationError:  # a key holding an object or a list
        return _TxKeys()


def _plan(conn: duckdb.DuckDBPyConnection, lookback_days: float, now: datetime) -> dict[str, int]:
    """``_fs_refetch(event_id, why)`` and ``_fs_removed(event_id)``; returns their counts."""
    _fingerprint_current_events(conn)
    since = now - timedelta(days=lookback_days)
    conn.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE _fs_refetch AS
        SELECT n.event_id,
               CASE WHEN o.event_id IS NULL THEN 'new'
                    WHEN o.fingerprint IS DISTINCT FROM n.fingerprint THEN 'changed'
                    ELSE 'recent' END AS why
        FROM _fs_fingerprints n LEFT JOIN {FINGERPRINTS_TABLE} o USING (event_id)
        WHERE o.event_id IS NULL
           OR o.fingerprint IS DISTINCT FROM n.fingerprint
           -- no history to date it: treated as recent
           OR n.last_state_change IS NULL
           OR n.last_state_change >= $since
        """,
        {"since": since},
    )
    conn.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE _fs_removed AS
        SELECT event_id FROM {FINGERPRINTS_TABLE}
        EXCEPT SELECT event_id FROM _fs_fingerprints
        """
    )
    counts = dict(conn.execute("SELECT why, count(*) FROM _fs_refetch GROUP BY why").fetchall())
    return {
        "events": conn.execute("SELECT count(*) FROM _fs_fingerprints").fetchone()[0],
        "new": counts.get("new", 0),
        "changed": counts.get("changed", 0),
        "recent": counts.get("recent", 0),
        "removed": conn.execute("SELECT count(*) FROM _fs_removed").fetchone()[0],
    }


def _incremental(
    api: FieldSalesAPI,
    conn: duckdb.DuckDBPyConnection,
    policy: RefreshPolicy,
    decision: ModeDecision,
    now: datetime,
    log: Callable[[str], None],
    before_swap: Callable[[str], None] | None = None,
) -> RefreshReport:
    started = time.monotonic()
    plan = _plan(conn, policy.lookback_days, now)
    event_ids = [row[0] for row in conn.execute("SELECT event_id FROM _fs_refetch").fetchall()]
    log(
        f"transactions: re-fetching {len(event_ids)} of {plan['events']} events by eventId "
        f"({plan['new']} new, {plan['changed']} changed, {plan['recent']} within "
        f"{policy.lookback_days:g} days); {plan['removed']} events disappeared"
    )
    if policy.mode == "auto" and len(event_ids) > MAX_REFETCH_SHARE * max(plan["events"], 1):
        raise TooManyEvents(
            f"{len(event_ids)} of {plan['events']} events need their transactions re-fetched; "
            "paging the whole list is cheaper"
        )
    fetched = _Fetched()
    planned = time.monotonic()
    conn.execute(raw_table_ddl(TRANSACTIONS, STAGE_TABLE))
    try:
        _fetch_by_event(api, conn, event_ids, fetched, started, log)
        count_page = api.fetch_page(TRANSACTIONS.with_params(limit=1), 0, fetched.stats)
        fetched.stats.count(pages=1, bytes=count_page.nbytes)
        if count_page.total is None:
            raise CountMismatch(
                "the server reported no count for the transaction list, so the merge cannot "
                "be checked",
                fetched.stats.bytes,
            )
        if before_swap is not None:
            before_swap(STAGE_TABLE)
        merging = time.monotonic()
        counts = _merge(conn, count_page.total, now, fetched.stats.bytes)
        phases = (
            f"plan {planned - started:.1f} s, fetch {merging - planned:.1f} s, "
            f"merge {time.monotonic() - merging:.1f} s"
        )
    finally:
        conn.execute(f"DROP TABLE IF EXISTS {qualified(STAGE_TABLE)}")
    stats = fetched.stats
    report = LoadReport(
        table=TRANSACTIONS.raw_table,
        rows=counts["rows"],
        api_total=count_page.total,
        passes=1,
        pages=stats.pages,
        requests=stats.requests,
        retries=stats.retries,
        bytes=stats.bytes,
        duplicates_dropped=0,
        seconds=time.monotonic() - started,
    )
    log(
        f"transactions: merged {len(event_ids)} events: {counts['added']} added, "
        f"{counts['changed']} changed, {counts['removed']} removed; {report.rows} rows "
        f"({stats.requests} requests, {stats.bytes / 1e6:.1f} MB, {report.seconds:.1f} s: "
        f"{phases})"
    )
    return RefreshReport(
        load=report,
        mode="incremental",
        reason=decision.reason,
        bytes_fetched=stats.bytes,
        events_refetched=len(event_ids),
        events_new=plan["new"],
        events_changed=plan["changed"],
        events_recent=plan["recent"],
        events_removed=plan["removed"],
        transactions_added=counts["added"],
        transactions_changed=counts["changed"],
        transactions_removed=counts["removed"],
    )


def _fetch_by_event(
    api: FieldSalesAPI,
    conn: duckdb.DuckDBPyConnection,
    event_ids: list[str],
    fetched: _Fetched,
    started: float,
    log: Callable[[str], None],
) -> None:
    """Page ``transaction/all?eventId=X`` for every X, ``api.concurrency`` events in flight,
    into the staging table; raises a ``_FallBack`` when a guard fails."""
    lock = threading.Lock()
    stop = threading.Event()
    last_progress = [time.monotonic()]
    loaded_at = datetime.now(UTC)

    with tempfile.TemporaryDirectory(prefix="fieldsales-spool-") as tmp:
        writer = StagingWriter(conn, TRANSACTIONS, STAGE_TABLE, loaded_at, Path(tmp), 32 << 20)

        def one_event(event_id: str) -> None:
            if stop.is_set():
                return
            stats = ListStats()
            ids: set[bytes] = set()
            items = 0
            pages = api.iter_pages(TRANSACTIONS.with_params(eventId=event_id), stats)
            try:
                for page in pages:
                    for item in page.items:
                        keys = _keys_of(item)
                        if keys.event_id != event_id:
                            raise EventFilterIgnored(
                                f"GET {TRANSACTIONS.path}?eventId={event_id} returned a "
                                f"transaction of event {keys.event_id!r}: the server ignores "
                                "the eventId filter"
                            )
                        ids.add(keys.id if keys.id is not None else bytes(item))
                    items += page.n
                    with lock:
                        writer.add(page)
                    if stop.is_set():
                        return
            finally:
                pages.close()
                with lock:
                    for name in ("requests", "retries", "pages", "bytes"):
                        fetched.stats.count(**{name: getattr(stats, name)})
            moved = len(stats.totals_seen) > 1
            if moved or len(ids) != items or (stats.total is not None and stats.total != items):
                raise EventListMoved(
                    f"the transactions of event {event_id} changed while they were paged "
                    f"({items} items, {len(ids)} distinct, totals seen {stats.totals_seen})"
                )
            with lock:
                fetched.events_done += 1
                now = time.monotonic()
                if now - last_progress[0] >= 5.0:
                    last_progress[0] = now
                    log(
                        f"transactions: {fetched.events_done}/{len(event_ids)} events re-fetched, "
                        f"{fetched.stats.bytes / 1e6:.0f} MB, {now - started:.1f} s"
                    )

        pool = ThreadPoolExecutor(max_workers=api.concurrency, thread_name_prefix="fieldsales-ev")
        try:
            futures = [pool.submit(one_event, event_id) for event_id in event_ids]
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            failed = [f for f in done if f.exception() is not None]
            if failed:
                stop.set()
                for future in futures:
                    future.cancel()
                exc = failed[0].exception()
                if isinstance(exc, _FallBack):
                    exc.bytes_fetched = fetched.stats.bytes
                raise exc
            writer.finish()
        finally:
            stop.set()
            pool.shutdown(wait=True, cancel_futures=True)
            writer.close()
    if writer.rows_inserted != writer.items_written:
        raise FieldSalesAPIError(
            f"transactions: DuckDB read {writer.rows_inserted} items from the pages but the API "
            f"returned {writer.items_written}; raw.transactions was left as it was."
        )


def _merge(
    conn: duckdb.DuckDBPyConnection, server_count: int, now: datetime, bytes_fetched: int
) -> dict[str, int]:
    """Replace the re-fetched and removed events' transactions, check, record: one transaction."""
    target, stage = qualified(TRANSACTIONS.raw_table), qualified(STAGE_TABLE)
    staged, distinct_staged = conn.execute(
        f"SELECT count(*), count(DISTINCT id) FROM {stage}"
    ).fetchone()
    if staged != distinct_staged:
        raise EventListMoved(
            f"{staged - distinct_staged} transactions were listed under two events", bytes_fetched
        )
    new = dict(conn.execute(f"SELECT id, hash(payload::VARCHAR) FROM {stage}").fetchall())
    conn.execute("BEGIN TRANSACTION")
    try:
        old = _delete_replaced(conn)
        _insert_staged(conn)
        rows, distinct = conn.execute(
            f"SELECT count(*), count(DISTINCT id) FROM {target}"
        ).fetchone()
        if rows != server_count or rows != distinct:
            raise CountMismatch(
                f"after the merge raw.transactions would hold {rows} rows ({distinct} distinct "
                f"ids) but the server counts {server_count} transactions: something changed "
                "that incremental mode cannot see",
                bytes_fetched,
            )
        _write_state(conn, mode="incremental", at=now, rows=rows)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return {
        "rows": rows,
        "added": sum(1 for key in new if key not in old),
        "changed": sum(1 for key, digest in new.items() if key in old and old[key] != digest),
        "removed": sum(1 for key in old if key not in new),
    }


def _delete_replaced(conn: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """Delete the stored rows that the staged ones replace; returns their ids and payload hashes.

    Those are the rows of re-fetched and disappeared events, and any stored copy of a re-fetched
    id (a transaction that moved to a re-fetched event). Two filters on narrow columns, so the
    payload is read only for the rows deleted.
    """
    target = qualified(TRANSACTIONS.raw_table)
    returning = "RETURNING id, hash(payload::VARCHAR)"
    old = dict(
        conn.execute(
            f"DELETE FROM {target} WHERE event_id IN (SELECT event_id FROM _fs_refetch "
            f"UNION ALL SELECT event_id FROM _fs_removed) {returning}"
        ).fetchall()
    )
    moved = f"WHERE id IN (SELECT id FROM {qualified(STAGE_TABLE)})"
    # Rare, and a DELETE ... RETURNING reads the payload column whole: count first.
    if conn.execute(f"SELECT count(*) FROM {target} {moved}").fetchone()[0]:
        old.update(conn.execute(f"DELETE FROM {target} {moved} {returning}").fetchall())
    return old


def _insert_staged(conn: duckdb.DuckDBPyConnection) -> None:
    conn.execute(
        f"INSERT INTO {qualified(TRANSACTIONS.raw_table)} BY NAME "
        f"SELECT * FROM {qualified(STAGE_TABLE)}"
    )
