"""The choice between a full and an incremental refresh of ``raw.transactions``: pure logic."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from fieldsales_dagster.client.errors import FieldSalesAPIError
from fieldsales_dagster.clock import from_the_future


class IncrementalRefreshError(FieldSalesAPIError):
    """An incremental refresh was asked for and cannot be done safely."""


@dataclass(frozen=True)
class PreviousLoad:
    """What the state tables say about the last complete load of ``raw.transactions``."""

    last_full_at: datetime
    rows_recorded: int
    rows_stored: int | None  # ``count(*)`` now; ``None``: no table
    events_loaded_at_recorded: datetime | None  # of the ``raw.events`` the last load saw
    events_loaded_at_now: datetime | None


@dataclass(frozen=True)
class ModeDecision:
    mode: Literal["full", "incremental"]
    reason: str


def choose_mode(
    requested: str,
    previous: PreviousLoad | None,
    *,
    now: datetime,
    full_refresh_every_days: float,
) -> ModeDecision:
    """Full or incremental, and why. Raises ``IncrementalRefreshError`` where ``incremental``
    was asked for and running it would load the wrong data."""
    if requested == "full":
        return ModeDecision("full", "refresh_mode=full was asked for")
    if previous is None:
        return ModeDecision("full", "no complete load of raw.transactions is recorded (first load)")
    if previous.rows_stored != previous.rows_recorded:
        rows = f"{previous.rows_stored} rows, the last load recorded {previous.rows_recorded}"
        return ModeDecision("full", f"raw.transactions was changed outside this loader ({rows})")
    if previous.events_loaded_at_recorded is None:
        return ModeDecision("full", "the last load had no raw.events to fingerprint")
    events_now = previous.events_loaded_at_now
    if events_now is None or events_now <= previous.events_loaded_at_recorded:
        why = "raw.events was not reloaded since the last transaction load: no telling what changed"
        if requested == "incremental":
            raise IncrementalRefreshError(
                f"raw_transactions: refresh_mode=incremental, but {why}. Materialize raw_events "
                "with raw_transactions, or ask for refresh_mode=full."
            )
        return ModeDecision("full", why)
    age = now - previous.last_full_at
    why = f"the last full refresh was {age.total_seconds() / 86400:.1f} days ago"
    if requested == "incremental":
        return ModeDecision("incremental", f"refresh_mode=incremental was asked for ({why})")
    if future := from_the_future(previous.last_full_at, now, "the last full refresh"):
        return ModeDecision("full", future)
    every = f"full_refresh_every_days={full_refresh_every_days:g}"
    if age >= timedelta(days=full_refresh_every_days):
        return ModeDecision("full", f"{why}, {every}")
    return ModeDecision("incremental", f"a complete load exists and {why} (< {every})")
