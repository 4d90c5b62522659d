"""One pass over a list endpoint: windows of ``skip``, several requests in flight.

Rules a server cannot break without the pass stopping and saying what the server did:

* ``skip`` advances by the items a page returned (SPEC): windows are planned from the latest
  page's size, a page that returns less leaves the rest of its window to a follow-up request, and
  a page that returns more than its window re-plans the stride (its overflow, which the next window
  also holds, is dropped). Windows are planned lazily, a few ahead of the requests in flight, so a
  claimed total of 1e12 costs no memory;
* a page whose items are all ids already received brings nothing: after
  ``NO_NEW_IDS_PAGES`` such pages the server is paging forever (it ignores ``skip``, or repeats a
  page past the end) and the pass fails;
* a pass holds at most ``max_pages_per_pass`` pages;
* a total that equals a full first page may be the page's size, not the list's: the next page is
  asked for, and must be empty, before the total is trusted;
* an empty page far short of the total the server claims makes the total implausible;
* ``null`` where an item belongs is an error naming the page.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import msgspec
import numpy as np

from fieldsales_dagster.client.endpoints import ListEndpoint
from fieldsales_dagster.client.errors import FieldSalesAPIError, PageFormatError

if TYPE_CHECKING:
    from fieldsales_dagster.client.resource import FieldSalesAPI

#: Pages whose ids were all received before, in one pass, that prove the server pages forever.
#: A list that moves can shift a whole page of known ids under a window once; three cannot be
#: told apart from a server that ignores ``skip``.
NO_NEW_IDS_PAGES = 3

#: Item keys decoded per item: ``_id`` first, then the endpoint's extra columns' keys.
ItemKeys = tuple[str | int | float | None, ...]


def id_text(value: object) -> str | None:
    """An id as it is stored and compared: text. A JSON number ``1002`` is ``"1002"``, the id
    ``"1002"`` is; ``None`` where there is no id (absent, ``null``, a boolean)."""
    if value is None or isinstance(value, bool):
        return None
    return value if isinstance(value, str) else str(value)


class PagingError(FieldSalesAPIError):
    """The server's pages cannot be a list: it pages forever, or claims an implausible total."""


@dataclass
class Page:
    """One answer of a list endpoint: its items as raw JSON, and the total it reported."""

    skip: int
    items: list[msgspec.Raw]
    total: int | None
    nbytes: int
    #: Each item's ``_id`` and extra-column keys (see ``item_keys``), where already decoded.
    keys: list[ItemKeys] | None = None
    #: Whether the body may hold a raw line break (``False`` only where it was checked not to).
    line_breaks: bool = True

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
    #: A request sent after another had answered reported a smaller total: items were deleted.
    total_decreased: bool = False
    #: The server's total turned out to be a page size (the page after it was not empty).
    total_unreliable: bool = False
    #: Largest total reported by a request that has answered.
    max_total_answered: int | None = None
    #: Every answered page as ``(skip, items, total)``: where the list moved under the pass.
    answers: list[tuple[int, int, int | None]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                setattr(self, name, getattr(self, name) + delta)

    def record_total(self, total: int, baseline: int | None) -> None:
        """A page reported ``total``; ``baseline`` was ``max_total_answered`` when it was sent."""
        with self._lock:
            if not self.totals_seen or self.totals_seen[-1] != total:
                self.totals_seen.append(total)
            self.total = total
            if baseline is not None and total < baseline:
                self.total_decreased = True
            if self.max_total_answered is None or total > self.max_total_answered:
                self.max_total_answered = total


def key_decoder(endpoint: ListEndpoint) -> msgspec.json.Decoder:
    """Decodes an item's ``_id`` and extra-column keys, skipping every other field."""
    keys = ("_id", *(key for _, key in endpoint.extra_columns))
    struct = msgspec.defstruct(
        "ItemKeys",
        [
            (f"k{i}", str | int | float | None, msgspec.field(default=None, name=key))
            for i, key in enumerate(keys)
        ],
    )
    return msgspec.json.Decoder(struct)


_NULL = object()


def item_keys(items: list[msgspec.Raw], decode: msgspec.json.Decoder) -> list[ItemKeys | object]:
    """Each item's keys; ``_NULL`` for an item that is JSON ``null``."""
    out: list[ItemKeys | object] = []
    names = [f.encode_name for f in msgspec.structs.fields(decode.type)]
    for item in items:
        try:
            out.append(msgspec.structs.astuple(decode.decode(item)))
        except msgspec.ValidationError:  # not an object, or a key holding an object or a list
            doc = msgspec.json.decode(item)
            if doc is None:
                out.append(_NULL)
                continue
            doc = doc if isinstance(doc, dict) else {}
            values = [doc.get(name) for name in names]
            out.append(tuple(v if isinstance(v, str | int | float) else None for v in values))
    return out


def _identity(keys: ItemKeys, item: msgspec.Raw) -> int:
    """What tells items apart: the ``_id``, or the whole item where it has none."""
    item_id = id_text(keys[0])
    return hash(("id", item_id)) if item_id is not None else hash(bytes(item))


class SeenIds:
    """The identities (see ``_identity``) one pass has received, in 8 bytes each.

    The latest ones sit in a set; every ``RECENT`` of them move into one sorted array. A Python
    set of a million ints takes ~75 MB, which made a pass's memory grow with the list; the array
    takes 8 MB.
    """

    RECENT = 1 << 16

    def __init__(self) -> None:
        self._recent: set[int] = set()
        self._sorted = np.empty(0, dtype=np.int64)

    def __len__(self) -> int:
        return len(self._recent) + len(self._sorted)

    def unseen(self, ids: set[int]) -> set[int]:
        """Those of ``ids`` not received before."""
        new = ids - self._recent
        if new and len(self._sorted):
            candidates = np.fromiter(new, dtype=np.int64, count=len(new))
            at = np.searchsorted(self._sorted, candidates)
            at[at == len(self._sorted)] = 0
            known = self._sorted[at] == candidates
            if known.any():
                new = set(candidates[~known].tolist())
        return new

    def add(self, new: set[int]) -> None:
        """Record ``new``, ids ``unseen`` returned (so none is recorded already)."""
        self._recent |= new
        if len(self._recent) >= self.RECENT:
            batch = np.fromiter(self._recent, dtype=np.int64, count=len(self._recent))
            batch.sort()
            # Two sorted runs: the stable sort (a merge sort) joins them in linear time.
            self._sorted = np.sort(np.concatenate((self._sorted, batch)), kind="stable")
            self._recent = set()


class Pager:
    """Schedules the requests of one pass over ``[start, stop)`` of a list.

    With a total, windows run up to it (and follow it when it grows); without one, windows are
    opened ``concurrency`` ahead until a page comes back empty. ``stop`` bounds a partial pass
    (the loader's repairs); the total is then recorded but not followed.
    """

    def __init__(
        self,
        api: FieldSalesAPI,
        endpoint: ListEndpoint,
        stats: ListStats,
        progress: Callable[[ListStats], None] | None = None,
        *,
        start: int = 0,
        stop: int | None = None,
    ):
        self.api = api
        self.endpoint = endpoint
        self.stats = stats
        self.progress = progress
        self.start = start
        self.stop = stop
        self.decode = key_decoder(endpoint)
        self.followups: deque[tuple[int, int]] = deque()
        self.limit: int | None = stop  # where windows end; None: until an empty page
        self.end: int | None = None  # first skip known to be past the list
        self.opened_to = start  # windows exist for [start, opened_to)
        self.stride = 0
        self.pages = 0
        self.seen = SeenIds()
        self.first_ids: set[int] = set()
        self.no_new_pages = 0
        self.use_totals = True

    # --- checks of one page -------------------------------------------------------------

    def _where(self, skip: int) -> str:
        return f"GET {self.endpoint.path} (skip={skip})"

    def _admit(self, page: Page, baseline: int | None, keep: int | None = None) -> Page:
        """Record the page, check it, and keep its first ``keep`` items (all by default)."""
        self.pages += 1
        self.stats.count(pages=1, bytes=page.nbytes)
        self.stats.answers.append((page.skip, page.n, page.total if self.use_totals else None))
        if page.total is not None and self.use_totals:
            self.stats.record_total(page.total, baseline)
        if self.pages > self.api.max_pages_per_pass:
            raise PagingError(
                f"{self._where(page.skip)}: {self.pages} pages in one pass over "
                f"{self.endpoint.name} ({self.stats.items} items so far), more than "
                f"max_pages_per_pass={self.api.max_pages_per_pass}: the server seems to page "
                "forever. If the list really is that long, raise max_pages_per_pass."
            )
        keys = item_keys(page.items, self.decode)
        nulls = sum(1 for k in keys if k is _NULL)
        if nulls:
            raise PageFormatError(
                f"{self._where(page.skip)} answered {nulls} `null` items among {page.n}: the "
                f"server sent null where an item of {self.endpoint.name} belongs, so the list "
                "cannot be stored as received. Report it to the Field-Sales service."
            )
        keep = page.n if keep is None else keep
        # No item is null past the check above: every entry holds an item's keys.
        items, page_keys = page.items[:keep], cast("list[ItemKeys]", keys[:keep])
        ids = {_identity(k, item) for k, item in zip(page_keys, items, strict=True)}
        new = self.seen.unseen(ids)
        if self.pages == 1:
            self.first_ids = ids
        if ids and not new:
            self.no_new_pages += 1
            if self.no_new_pages >= NO_NEW_IDS_PAGES:
                raise PagingError(self._no_new_ids_message(page, ids))
        self.seen.add(new)
        self.stats.count(items=len(items))
        return Page(page.skip, items, page.total, page.nbytes, page_keys, page.line_breaks)

    def _no_new_ids_message(self, page: Page, ids: set[int]) -> str:
        if page.skip != self.start and ids == self.first_ids:
            what = (
                f"the same items as skip={self.start}: the server ignores `skip`, so the list "
                "cannot be paged"
            )
        else:
            what = (
                "only items already received on earlier pages: the server repeats pages (for "
                "example its last page for any skip past the end) instead of answering an "
                "empty page"
            )
        return (
            f"{self._where(page.skip)} answered {page.n} items, {what}. {NO_NEW_IDS_PAGES} pages "
            f"of {self.endpoint.name} brought no new id; stopped after {self.pages} pages. "
            "Nothing was replaced; report it to the Field-Sales service."
        )

    def _check_empty(self, skip: int, page: Page) -> None:
        """An empty page at ``skip``: the list ends here, unless the claimed total is absurd."""
        claimed = page.total if page.total is not None and self.use_totals else None
        if claimed is None and self.stop is None and self.use_totals:
            claimed = self.limit
        if claimed is not None and claimed > 2 * skip + max(self.stride, 1):
            raise PagingError(
                f"{self._where(skip)} answered no items while the server reports a total of "
                f"{claimed} {self.endpoint.name}; the pages end at {skip}, far short of it. The "
                "total is not plausible; nothing was replaced. Report it to the Field-Sales "
                "service."
            )
        self.end = skip if self.end is None else min(self.end, skip)

    # --- planning -----------------------------------------------------------------------

    def _next_window(self, in_flight: int) -> tuple[int, int] | None:
        if self.followups:
            return self.followups.popleft()
        if self.end is not None and self.opened_to >= self.end:
            return None
        if self.limit is not None:
            if self.opened_to >= self.limit:
                return None
            window = (self.opened_to, min(self.opened_to + self.stride, self.limit))
        elif in_flight < self.api.concurrency:
            window = (self.opened_to, self.opened_to + self.stride)
        else:
            return None
        self.opened_to = window[1]
        return window

    def _follow_total(self, page: Page) -> None:
        grew = page.total is not None and (self.limit is None or page.total > self.limit)
        if self.stop is None and self.use_totals and grew:
            self.limit = page.total  # the list grew: ask for the rest

    def _probe_total(self, first: Page) -> Iterator[Page]:
        """A total equal to a full first page may be the page's size: the next page tells."""
        if self.stop is not None or not (first.total is not None and first.total == first.n):
            return
        probe = self.api.fetch_page(self.endpoint, self.start + first.n, self.stats)
        if probe.n == 0:
            self.end = self.start + first.n
            self._admit(probe, None)
            return
        # Every page reports its own size: page until an empty page, as without a total.
        self.use_totals = False
        self.limit = self.stop
        with self.stats._lock:
            self.stats.total_unreliable = True
            self.stats.total = None
            self.stats.totals_seen.clear()
            self.stats.max_total_answered = None
        page = self._admit(probe, None)
        self.opened_to = probe.skip + probe.n
        yield page

    def run(self) -> Iterator[Page]:
        first = self._admit(self.api.fetch_page(self.endpoint, self.start, self.stats), None)
        yield first
        if first.n == 0:
            self._check_empty(self.start, first)
            return
        self.stride = first.n
        self.opened_to = self.start + first.n
        self._follow_total(first)
        yield from self._probe_total(first)
        last_progress = time.monotonic()

        pool = ThreadPoolExecutor(
            max_workers=self.api.concurrency, thread_name_prefix=f"fieldsales-{self.endpoint.name}"
        )
        in_flight: dict[Future[Page], tuple[int, int, int | None]] = {}
        try:
            while True:
                while len(in_flight) < self.api.concurrency:
                    window = self._next_window(len(in_flight))
                    if window is None:
                        break
                    start, end = window
                    if self.end is not None and start >= self.end:
                        continue
                    future = pool.submit(self.api.fetch_page, self.endpoint, start, self.stats)
                    in_flight[future] = (start, end, self.stats.max_total_answered)
                if not in_flight:
                    return
                done, _ = wait(in_flight, return_when=FIRST_COMPLETED)
                for future in done:
                    start, end, baseline = in_flight.pop(future)
                    answer = future.result()
                    if answer.n == 0:
                        self._admit(answer, baseline)
                        self._check_empty(start, answer)
                        continue
                    if answer.n != end - start and answer.n != self.stride:
                        self.stride = answer.n  # the server's page size changed: re-plan
                    keep = None
                    if start + answer.n < end:
                        self.followups.appendleft((start + answer.n, end))
                    elif end < self.opened_to:
                        keep = end - start  # the overflow is the next window's, already planned
                    else:
                        self.opened_to = start + answer.n  # the last window brought more
                    page = self._admit(answer, baseline, keep)
                    self._follow_total(answer)
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


def gap_windows(
    answers: list[tuple[int, int, int | None]], total_now: int, slack: int = 2
) -> list[tuple[int, int]]:
    """Where a pass may have missed items because the list grew while pages were in flight.

    Two adjacent pages answered out of order around an insertion ahead of them: the lower one saw
    the longer list (its items shifted further), so the items between the two were in neither.
    Each such boundary gives the window ``[start, stop)`` (today's positions) that holds them.
    """
    gaps: list[tuple[int, int]] = []
    ordered = sorted(
        ((s, n, t) for s, n, t in answers if t is not None and n > 0), key=lambda a: a[0]
    )
    for (s1, n1, t1), (s2, _, t2) in zip(ordered, ordered[1:], strict=False):
        if s1 < s2 <= s1 + n1 and t1 > t2:
            end = s1 + n1
            start = max(0, end + total_now - t1 - slack)
            stop = end + total_now - t2 + slack
            if gaps and start <= gaps[-1][1]:
                gaps[-1] = (gaps[-1][0], max(stop, gaps[-1][1]))
            else:
                gaps.append((start, stop))
    return gaps
