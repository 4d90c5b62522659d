"""Re-sync on demand: re-fetch the transactions of chosen events, merged as an incremental refresh.

The events are ``event_ids``, or those of ``raw.events`` (re-fetched whole in the same run: the
API has no endpoint for one event) with an ``eventStateHistory`` date in a window
(docs/refresh.md). Only their fingerprints move, and the server's global count need not match.
An id the lake never knew is refused (a typo); one the server no longer lists is a deleted event.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import duckdb

from fieldsales_dagster.client.api import FieldSalesAPI
from fieldsales_dagster.client.endpoints import EVENTS, TRANSACTIONS
from fieldsales_dagster.client.errors import FieldSalesAPIError
from fieldsales_dagster.loading.deletions import audit_table
from fieldsales_dagster.loading.incremental import (
    FINGERPRINTS_NOW,
    FINGERPRINTS_TABLE,
    REFETCH_TABLE,
    REMOVED_TABLE,
    FallBack,
    Merging,
    RefreshReport,
    _fingerprint_current_events,
    event_ids,
    read_plan,
    read_previous_load,
    refetch_and_merge,
)
from fieldsales_dagster.loading.lists import named
from fieldsales_dagster.loading.raw_load import digest_key, event_states
from fieldsales_dagster.warehouse.quoting import qualified
from fieldsales_dagster.warehouse.warehouse import table_exists

NAMED = 10  # ids named in one message, at most


class ResyncError(FieldSalesAPIError):
    """A re-sync cannot be done as asked; the tables are left as they were."""


@dataclass(frozen=True)
class ResyncRequest:
    """``event_ids``, or the events with a status change in ``changed_from <= date < changed_to``
    (UTC)."""

    event_ids: tuple[str, ...] = ()
    changed_from: datetime | None = None
    changed_to: datetime | None = None

    def describe(self) -> str:
        if self.event_ids:
            return named(len(self.event_ids), self.event_ids[:NAMED], "re-sync of event_ids {1}")
        start, end = (at.isoformat() if at else "?" for at in (self.changed_from, self.changed_to))
        return f"re-sync of the events whose status changed from {start} to {end} (exclusive)"


def _known_ids(conn: duckdb.DuckDBPyConnection) -> str:
    """A query of every event id this lake knows: listed, fingerprinted, stored or audited."""
    tables = {FINGERPRINTS_TABLE: "event_id", TRANSACTIONS.raw_table: "event_id"}
    tables[audit_table(EVENTS)] = "id"
    known = [
        f"SELECT {key} FROM {qualified(t)}" for t, key in tables.items() if table_exists(conn, t)
    ]
    return " UNION ".join([f"SELECT event_id FROM {FINGERPRINTS_NOW}", *known])


def _choose_events(conn: duckdb.DuckDBPyConnection, request: ResyncRequest) -> None:
    """Fill ``REFETCH_TABLE(event_id, why)`` with the events to re-sync; ``REMOVED_TABLE`` empty."""
    if request.event_ids:
        conn.execute(
            f"CREATE OR REPLACE TEMP TABLE {REFETCH_TABLE} AS "
            "SELECT DISTINCT id AS event_id, CASE WHEN id IN (SELECT event_id FROM "
            f"{FINGERPRINTS_NOW}) THEN 'listed' ELSE 'gone' END AS why "
            "FROM (SELECT unnest($ids) AS id)",
            {"ids": list(request.event_ids)},
        )
        unknown = event_ids(conn, f"{REFETCH_TABLE} WHERE event_id NOT IN ({_known_ids(conn)})")
        if unknown:
            raise ResyncError(
                f"raw_transactions: resync.event_ids names event ids the server does not list and "
                f"this lake never loaded: {', '.join(map(repr, unknown[:NAMED]))}. Check the ids "
                "(core.events.event_id); nothing was changed."
            )
    else:
        conn.execute(
            f"CREATE OR REPLACE TEMP TABLE {REFETCH_TABLE} AS SELECT event_id, 'changed in "
            f"window' AS why FROM {event_states(conn)} WHERE len(list_filter(state_changes, "
            "lambda d: d >= $start AND d < $end)) > 0",
            {"start": request.changed_from, "end": request.changed_to},
        )
    conn.execute(f"CREATE OR REPLACE TEMP TABLE {REMOVED_TABLE} (event_id VARCHAR)")


def resync_transactions(
    api: FieldSalesAPI,
    conn: duckdb.DuckDBPyConnection,
    request: ResyncRequest,
    *,
    log: Callable[[str], None] = lambda message: None,
    before_swap: Callable[[str], None],
    redact_pii_in_raw: bool,
    run_id: str | None = None,
) -> RefreshReport:
    """Re-fetch and merge the transactions of the events ``request`` names; ``before_swap``
    redacts as ``redact_pii_in_raw`` says."""
    run = Merging(api, conn, log, before_swap, run_id, digest_key(redact_pii_in_raw))
    if read_previous_load(conn) is None:
        raise ResyncError(
            "raw_transactions: a re-sync merges into a complete load, and none is recorded yet; "
            "run a full refresh first (refresh_mode: full), then re-sync."
        )
    _fingerprint_current_events(conn, run.now)
    _choose_events(conn, request)
    plan = read_plan(conn)
    gone = event_ids(conn, f"{REFETCH_TABLE} WHERE why = 'gone'")
    log(
        f"transactions: {request.describe()}: re-fetching {len(plan.event_ids)} of "
        f"{plan.events} events by eventId; no longer listed: {', '.join(gone[:NAMED]) or 'none'}"
    )
    try:
        report = refetch_and_merge(run, plan, "resync", request.describe())
    except FallBack as exc:
        raise ResyncError(
            f"raw_transactions: the re-sync stopped: {exc}; nothing was changed. Run a full "
            "refresh (refresh_mode: full) to reconcile."
        ) from None
    report.counts["events_removed"] = len(gone)
    return report
