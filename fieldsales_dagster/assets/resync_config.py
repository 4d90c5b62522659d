"""The typed run config of a re-sync on demand (docs/refresh.md), checked by the launchpad."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import dagster as dg
from pydantic import Field, field_validator, model_validator

from fieldsales_dagster.loading.resync import ResyncRequest


def _moment(field: str, value: str) -> tuple[datetime, bool]:
    """``value`` in UTC (UTC if no offset), and whether it was a day alone."""
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError:
        raise ValueError(
            f"resync.{field} is {value!r}, which is not a date: give a day (YYYY-MM-DD) or an "
            "ISO 8601 time (2026-11-01T08:00:00Z; UTC where it has no offset)"
        ) from None
    # A day alone (2026-11-01, 20261101, 2026-W44-7) has at most 10 characters, a time more.
    return moment.replace(tzinfo=moment.tzinfo or UTC).astimezone(UTC), len(value.strip()) <= 10


class ResyncConfig(dg.Config):
    """Re-fetch the transactions of chosen events, merged exactly as an incremental refresh
    merges: give ``event_ids``, or a window (``changed_from``, optionally ``changed_to``)."""

    event_ids: list[str] = Field(
        default=[],
        description="Re-fetch the transactions of these events (core.events.event_id). One the "
        "server no longer lists is a deleted event (its rows are audited); one never seen fails.",
    )
    changed_from: str | None = Field(
        default=None,
        description="Instead of event_ids: the events with a status change (eventStateHistory, "
        "eventStateTimestamps) at or after this day (YYYY-MM-DD, UTC) or time (ISO 8601).",
    )
    changed_to: str | None = Field(
        default=None,
        description="End of the window: a day (YYYY-MM-DD, included) or a time (ISO 8601, "
        "excluded). Empty: now.",
    )

    @field_validator("event_ids")
    @classmethod
    def _check_ids(cls, ids: list[str]) -> list[str]:
        if blank := [at for at, event_id in enumerate(ids) if not event_id.strip()]:
            raise ValueError(f"resync.event_ids holds an empty id at position {blank[0]}: drop it")
        return list(dict.fromkeys(ids))  # ids exactly as given (they may hold spaces), once each

    @model_validator(mode="after")
    def _one_way(self) -> ResyncConfig:
        if bool(self.event_ids) == (self.changed_from is not None):
            both = "both" if self.event_ids else "neither"
            raise ValueError(f"resync needs either event_ids or changed_from, not {both}")
        if self.changed_to is not None and self.changed_from is None:
            raise ValueError("resync.changed_to needs resync.changed_from: give the window's start")
        if self.changed_from is not None:  # parses both ends: a bad date fails here, naming it
            start, end = self.window(datetime.now(UTC))
            if end <= start:
                raise ValueError(
                    f"resync.changed_to ({self.changed_to or 'now'}) is not after "
                    f"resync.changed_from ({self.changed_from}): the window is empty"
                )
        return self

    def window(self, now: datetime) -> tuple[datetime, datetime]:
        """The window in UTC, the end excluded (a day as the end counts whole)."""
        assert self.changed_from is not None
        start, _ = _moment("changed_from", self.changed_from)
        if self.changed_to is None:
            return start, now
        end, whole_day = _moment("changed_to", self.changed_to)
        return start, end + timedelta(days=1) if whole_day else end

    def request(self, now: datetime) -> ResyncRequest:
        if self.event_ids:
            return ResyncRequest(event_ids=tuple(self.event_ids))
        start, end = self.window(now)
        return ResyncRequest(changed_from=start, changed_to=end)
