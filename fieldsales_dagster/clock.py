"""Stored times that decide what a run does, held to this host's clock: one ahead of now (a fast
clock, a hand edit) would postpone what it gates by the whole offset, so it is treated as unknown.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

FUTURE_TOLERANCE = timedelta(minutes=5)  # ahead of now, still trusted: two hosts' clocks differ


def from_the_future(moment: datetime | None, now: datetime, what: str) -> str | None:
    """Why ``moment`` (``what``) is unknown: too far ahead of ``now``; ``None`` if trusted."""
    moment = moment and moment.replace(tzinfo=moment.tzinfo or UTC)  # naive: UTC
    if moment is None or (ahead := moment - now) <= FUTURE_TOLERANCE:
        return None
    return (
        f"{what} ({moment.astimezone(UTC):%Y-%m-%d %H:%M} UTC) lies "
        f"{ahead.total_seconds() / 86400:.1f} days ahead of this host's clock (a clock that ran "
        "fast, or a hand edit), so it is treated as unknown"
    )
