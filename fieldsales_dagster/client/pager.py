"""One pass over a list endpoint: windows of ``skip``, several requests in flight."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgspec

from fieldsales_dagster.client.endpoints import ListEndpoint
from fieldsales_dagster.client.errors import PageFormatError

if TYPE_CHECKING:
    from fieldsales_dagster.client.resource import FieldSalesAPI


@dataclass
class Page:
    """One answer of a list endpoint: its items as raw JSON, and the total it reported."""

    skip: int
    items: list[msgspec.Raw]
    total: int | None
    nbytes: int

    @property
    def n(self) -> int:
        return len(self.items)


@dataclass
class ListStats:
    """What one pass over a list cost, for asset metadata and progress lines."""

    requests: int = 0
    retries: int = 0
    pages: int = 0
    items: int = 0
    bytes: int = 0
    token_rereads: int = 0
    #: Lone UTF-16 surrogate escapes replaced by U+FFFD (strings a server cut mid-emoji).
    surrogates_replaced: int = 0
    #: The total the server reported last (by arrival), ``None`` where it reports none.
    total: int | None = None
    #: Every distinct total the server reported during the pass, in order of arrival.
    totals_seen: list[int] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                setattr(self, name, getattr(self, name) + delta)


class Pager:
    """Schedules the requests of one pass.

    Windows ``[start, end)`` of the list are asked for from ``start``; a page that returns fewer
    items than its window holds leaves the rest of the window to a follow-up request, so a server
    that caps ``limit`` (at any depth) still yields every item. The first page sets the stride.
    With a total, every window is known at once and fetched concurrently; without one, windows
    are opened ``concurrency`` ahead until a page comes back empty.
    """

    def __init__(
        self,
        api: FieldSalesAPI,
        endpoint: ListEndpoint,
        stats: ListStats,
        progress: Callable[[ListStats], None] | None,
    ):
        self.api = api
        self.endpoint = endpoint
        self.stats = stats
        self.progress = progress
        self.pending: deque[tuple[int, int]] = deque()
        self.end: int | None = None  # first skip known to be past the list (no total)
        self.opened_to = 0  # windows exist for [0, opened_to)
        self.stride = 0

    def _record(self, page: Page) -> None:
        self.stats.count(pages=1, items=page.n, bytes=page.nbytes)
        if page.total is not None:
            with self.stats._lock:
                if not self.stats.totals_seen or self.stats.totals_seen[-1] != page.total:
                    self.stats.totals_seen.append(page.total)
                self.stats.total = page.total

    def _open_windows(self, limit: int) -> None:
        """Plan windows up to ``limit`` (the total)."""
        while self.opened_to < limit:
            end = min(self.opened_to + self.stride, limit)
            self.pending.append((self.opened_to, end))
            self.opened_to = end

    def _open_speculative(self, in_flight: int) -> None:
        while self.end is None and len(self.pending) + in_flight < self.api.concurrency:
            self.pending.append((self.opened_to, self.opened_to + self.stride))
            self.opened_to += self.stride

    def run(self) -> Iterator[Page]:
        first = self.api.fetch_page(self.endpoint, 0, self.stats)
        self._record(first)
        started = time.monotonic()
        last_progress = started
        yield first
        if first.n == 0:
            return
        self.stride = first.n
        self.opened_to = first.n
        first_item = bytes(first.items[0])
        known_total = first.total
        if known_total is not None:
            self._open_windows(known_total)

        pool = ThreadPoolExecutor(
            max_workers=self.api.concurrency, thread_name_prefix=f"fieldsales-{self.endpoint.name}"
        )
        in_flight: dict[Future[Page], tuple[int, int]] = {}
        try:
            while True:
                if known_total is None:
                    self._open_speculative(len(in_flight))
                while self.pending and len(in_flight) < self.api.concurrency:
                    start, end = self.pending.popleft()
                    if self.end is not None and start >= self.end:
                        continue
                    future = pool.submit(self.api.fetch_page, self.endpoint, start, self.stats)
                    in_flight[future] = (start, end)
                if not in_flight:
                    return
                done, _ = wait(in_flight, return_when=FIRST_COMPLETED)
                for future in done:
                    start, end = in_flight.pop(future)
                    page = future.result()
                    self._record(page)
                    if page.n and bytes(page.items[0]) == first_item:
                        raise PageFormatError(
                            f"GET {self.endpoint.path} (skip={start}) answered the same items as "
                            "skip=0: the server ignores `skip`, so the list cannot be paged."
                        )
                    if page.n == 0:
                        # The list ends here (or shrank under us: the loader's check decides).
                        self.end = start if self.end is None else min(self.end, start)
                    elif start + page.n < end:
                        self.pending.appendleft((start + page.n, end))
                    grew = page.total is not None and page.total > self.opened_to
                    if grew and known_total is not None:
                        self._open_windows(page.total)  # the list grew: ask for the rest
                    if page.n:
                        yield page
                now = time.monotonic()
                if self.progress and now - last_progress >= 5.0:
                    last_progress = now
                    self.progress(self.stats)
        finally:
            for future in in_flight:
                future.cancel()
            pool.shutdown(wait=True, cancel_futures=True)
