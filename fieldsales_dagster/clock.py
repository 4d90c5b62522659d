"""Stored times that decide what a run does, held to this host's clock.

A time read from local state (a token store's ``issued_at``, the last full refresh, a sensor's
last check) that lies ahead of now cannot be an age: it was written by a host whose clock ran
fast, restored from such a host, or edited by hand. Trusted, it postpones whatever it gates by
the whole offset (a token renewed months late, a weekly full refresh never due). Beyond a small
tolerance for clocks that differ by seconds, such a time is treated as unknown, and the caller
says why in its output (``from_the_future``).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

#: How far ahead of now a stored time may lie (clocks of two hosts differ by that much) and
#: still be trusted.
FUTURE_TOLERANCE = timedelta(minutes=5)


def from_the_future(moment: datetime | None, now: datetime, what: str) -> str | None:
    """Why ``moment`` (``what``, a time read from local state) is unknown: it lies more than
    ``FUTURE_TOLERANCE`` ahead of ``now``; ``None`` if it can be trusted (or there is none)."""
    if moment is None:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    ahead = moment - now
    if ahead <= FUTURE_TOLERANCE:
        return None
    return (
        f"{what} ({moment.astimezone(UTC):%Y-%m-%d %H:%M} UTC) lies "
        f"{ahead.total_seconds() / 86400:.1f} days ahead of this host's clock (a clock that ran "
        "fast, or a hand edit), so it is treated as unknown"
    )
