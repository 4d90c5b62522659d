"""Paging, once for every list: a page strategy per list and one executor for all of them.

``OffsetWindows`` is the strategy: a small, pure object that says which ``skip`` window to ask
for next and when a list has ended (dlt's paginators and Airbyte's ``OffsetIncrement`` have the
same shape). Its rules:

* ``skip`` advances by the items a page returned (SPEC): windows are planned from the latest
  page's size, a page that returns less leaves the rest of its window to a follow-up request, and
  a page that returns more than its window re-plans the stride (its overflow, which the next window
  also holds, is dropped). Windows are planned lazily, a few ahead of the requests in flight, so a
  claimed total of 1e12 costs no memory;
* a total that equals a full first page may be the page's size, not the list's: the next page is
  asked for, and must be empty, before the total is trusted;
* an empty page far short of the total the server claims makes the total implausible;
* windows overlap (``overlap`` items): every window after a pass's first is asked from one item
  before it, and that item must be the one the neighbouring page held there. A list that shifts
  under the pager (an item deleted or inserted behind its position, an item moved between pages)
  fails that check at the boundaries the shift crossed, whatever the counts say;
* the end is proven, not assumed from a total: windows that reach the total with a full page are
  followed by one more, which must be empty (a page that brings items past the total follows
  them).

``PageExecutor.fetch`` runs many passes (``ListPass``: one list, a ``Stream``, from a window)
over one thread pool of ``limits.concurrency`` requests. It knows no client: it is given a
``fetch_page`` callable (``FieldSalesAPI.fetch_page``) and its ``Limits``, so each unit runs on
scripted answers alone. It owns what every list shares: the pass budget (``max_pages_per_pass``),
the repeat check (``NO_NEW_IDS_PAGES``: one hash of ids per page, not one per id), ``null`` items
and items the list's filter excludes (errors naming the page), progress lines, and the re-read's
saving: a pass given the checked pass's bodies as ``known`` parses only the bodies that pass did
not see (``Body``: 8 bytes per item).

The pass loop and the completeness rule that use all this are the loader's
(``loading/passes.py``, ``loading/completeness.py``).
"""

from __future__ import annotations

import functools
import secrets
import threading
import time
from array import array
from collections import deque
from collections.abc import Callable, Container, Hashable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import cast

import msgspec
import xxhash

from fieldsales_dagster.client.endpoints import ListEndpoint
from fieldsales_dagster.client.errors import FieldSalesAPIError, PageFormatError

#: Pages of one pass that repeat the ids of an earlier page, which prove the server pages
#: forever. A list that moves can shift a whole page of known ids under a window once; three
#: cannot be told apart from a server that ignores ``skip``.
NO_NEW_IDS_PAGES = 3
#: Seconds between two progress lines.
PROGRESS_EVERY_S = 5.0
#: Items each window after a pass's first re-reads of the page before it (the boundary check).
OVERLAP = 1
#: Ids named in a message about ids or boundaries; the rest are counted.
NAMED_IDS = 5

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


class FilterIgnoredError(PagingError):
    """A filtered list (``eventId=X``) returned an item the filter excludes."""


class ItemTooLargeError(FieldSalesAPIError):
    """An item is larger than ``max_item_mb``."""


@dataclass
class Page:
    """One answer of a list endpoint: its items as raw JSON, and the total it reported."""

    skip: int
    items: list[msgspec.Raw]
    total: int | None
    nbytes: int
    #: Each item's ``_id`` and extra-column keys (see ``item_keys``), where already decoded.
    keys: list[ItemKeys] | None = None
    #: Lone surrogate escapes replaced in the body (``ListStats.surrogates_replaced``).
    surrogates_replaced: int = 0
    #: ``digest`` of the body as received (keyed per process: compared here, never stored). A body
    #: in ``FetchPage``'s ``known`` was not split into items again.
    digest: int | None = None
    #: The items a page holds, where they were not split out (a re-read's known body).
    count: int | None = None
    #: Each kept item's digest (``item_digests``), where the pager admitted the page.
    digests: array[int] | None = None

    @property
    def n(self) -> int:
        return len(self.items) if self.count is None else self.count


@dataclass(frozen=True)
class Body:
    """What a parsed page body held, kept by the pass for its re-read: its total, each item's
    ``item_digests`` and the hash of the ids (the repeat check's)."""

    total: int | None
    digests: array[int]
    ids_hash: int


@dataclass
class ListStats:
    """What one pass over a list cost, for asset metadata and progress lines.

    Counts added to a ``ListStats`` with a ``parent`` are added to the parent too: the executor
    sums every list's requests, pages and bytes while they happen.
    """

    requests: int = 0
    retries: int = 0
    pages: int = 0
    items: int = 0
    bytes: int = 0
    token_rereads: int = 0
    #: Lone UTF-16 surrogate escapes replaced by U+FFFD (strings a server cut mid-emoji).
    surrogates_replaced: int = 0
    #: Every distinct total the server reported during the pass, in order of arrival (the last
    #: is the one reported last).
    totals_seen: list[int] = field(default_factory=list)
    #: A request sent after another had answered reported a smaller total: items were deleted.
    total_decreased: bool = False
    #: Every answered page as ``(skip, items, total)``: where the list moved under the pass.
    answers: list[tuple[int, int, int | None]] = field(default_factory=list)
    #: Page boundaries where two pages held different items: ``(position, id, other id)``.
    shifts: list[tuple[int, str, str]] = field(default_factory=list)
    parent: ListStats | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                setattr(self, name, getattr(self, name) + delta)
        if self.parent is not None:
            self.parent.count(**deltas)


@functools.cache
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


def item_keys(items: list[msgspec.Raw], decode: msgspec.json.Decoder) -> list[ItemKeys | None]:
    """Each item's keys; ``None`` for an item that is JSON ``null``."""
    out: list[ItemKeys | None] = []
    names = [f.encode_name for f in msgspec.structs.fields(decode.type)]
    for item in items:
        try:
            out.append(msgspec.structs.astuple(decode.decode(item)))
        except msgspec.ValidationError:  # not an object, or a key holding an object or a list
            doc = msgspec.json.decode(item)
            if doc is None:
                out.append(None)
                continue
            doc = doc if isinstance(doc, dict) else {}
            values = [doc.get(name) for name in names]
            out.append(tuple(v if isinstance(v, str | int | float) else None for v in values))
    return out


#: The key of ``digest``: drawn per process, as Python's ``hash`` is (digests are compared within
#: a run, never stored).
_DIGEST_SEED = secrets.randbits(64)


def digest(data: msgspec.Raw | bytes) -> int:
    """A 64-bit digest of bytes as received (a page body, an item): XXH3, keyed per process. Ten
    times as fast as ``hash(bytes(item))`` (SipHash, and a copy): 0.13 against 1.24 ms for a page
    of 500 transactions."""
    return xxhash.xxh3_64_intdigest(data, _DIGEST_SEED)


def item_digests(items: list[msgspec.Raw]) -> array[int]:
    """Each item's ``digest``: its id and its content (the id is in the item). The one test of
    whether two copies differ: the re-read compares them, and the staging table keeps them (its
    ``digest`` column, BIGINT, so signed) for ``Staging.differing`` and ``Staging.ids_of``."""
    signed = array("q")
    signed.frombytes(memoryview(array("Q", map(digest, items))).cast("B"))
    return signed


def _identity(keys: ItemKeys, item_digest: int) -> int:
    """What tells items apart: the ``_id``, or the whole item (its digest) where it has none."""
    item_id = id_text(keys[0])
    return hash(("id", item_id)) if item_id is not None else item_digest


# --- the strategy: pure -------------------------------------------------------------------------

#: ``[start, end)`` of a list; ``end`` is ``None`` for a page kept whole (the first, the probe).
Window = tuple[int, int | None]


@dataclass(frozen=True)
class Step:
    """What the strategy made of one answer."""

    #: Items of the page to keep (its first ``keep``); ``None``: all.
    keep: int | None = None
    #: The page proved the totals to be page sizes: forget them.
    totals_unreliable: bool = False
    #: An empty page came far short of this claimed total.
    implausible_total: int | None = None


class OffsetWindows:
    """Which ``skip`` windows of ``[start, stop)`` of one list to ask for, and when it ended.

    With a total, windows run up to it (and follow it when it grows); without one, windows are
    opened as they are asked for (the caller bounds the requests in flight) until a page comes
    back empty. ``stop`` bounds a partial pass
    (a repair); the total is then recorded but not followed. A first page whose total equals its
    size (and has at least ``doubt_total_from`` items) is followed by a probe of the next page.
    Holds no I/O: ``next_window`` and ``answered`` are the whole interface.
    """

    def __init__(
        self,
        start: int = 0,
        stop: int | None = None,
        *,
        doubt_total_from: int = 1,
        overlap: int = 0,
    ):
        self.start = start
        self.stop = stop
        self.doubt_total_from = doubt_total_from
        #: Items of the page before that each later window re-reads (see ``asked_skip``).
        self.overlap = overlap
        #: The most items one answer held (with its overlap): the server's page size.
        self.widest = 0
        self.phase = "first"  # "first" page, the "probe", then "windows"
        self.waiting = False  # the first page or the probe is in flight: nothing else is asked
        self.followups: deque[Window] = deque()
        self.limit: int | None = stop  # where windows end; None: until an empty page
        self.end: int | None = None  # first skip known to be past the list
        self.opened_to = start  # windows exist for [start, opened_to)
        self.stride = 0
        self.use_totals = True

    def next_window(self) -> Window | None:
        """The next window to ask for, or ``None``."""
        if self.waiting:
            return None
        if self.phase != "windows":
            self.waiting = True
            return (self.start if self.phase == "first" else self.opened_to, None)
        while True:
            if self.followups:
                window = self.followups.popleft()
            elif any(
                bound is not None and self.opened_to >= bound for bound in (self.end, self.limit)
            ):
                return None
            else:
                stop = self.opened_to + self.stride
                window = (self.opened_to, stop if self.limit is None else min(stop, self.limit))
                self.opened_to = window[1]
            if self.end is None or window[0] < self.end:
                return window

    def asked_skip(self, window: Window) -> int:
        """The ``skip`` that asks for ``window``: ``overlap`` items early, but for the first."""
        return window[0] - self.overlap if window[0] > self.start else window[0]

    def answered(self, window: Window, page: Page) -> Step:
        """Plan on from ``page``, the answer to ``window`` (its overlap already taken off)."""
        start, end = window
        self.widest = max(self.widest, page.n + (start - self.asked_skip(window)))
        if self.phase == "first":
            self.waiting = False
            self.phase = "windows"
            if page.n == 0:
                return Step(implausible_total=self._ended(start, page))
            if page.n <= self.overlap:  # pages of one item cannot overlap
                self.overlap = 0
            self.stride = page.n - self.overlap
            self.opened_to = start + page.n
            self._follow_total(page)
            doubt = page.total == page.n and page.n >= self.doubt_total_from
            if self.stop is None and doubt:
                self.phase = "probe"
            return Step()
        if self.phase == "probe":
            self.waiting = False
            self.phase = "windows"
            if page.n == 0:
                self.end = start
                return Step()
            # Every page reports its own size: page until an empty page, as without a total.
            self.use_totals = False
            self.limit = self.stop
            self.opened_to = start + page.n
            return Step(totals_unreliable=True)
        if page.n == 0:
            return Step(implausible_total=self._ended(start, page))
        assert end is not None
        if page.n != end - start and page.n != self.stride:
            self.stride = page.n  # the server's page size changed: re-plan
        keep = None
        if start + page.n < end:
            self.followups.appendleft((start + page.n, end))
        elif end < self.opened_to:
            keep = end - start  # the overflow is the next window's, already planned
        else:
            self.opened_to = start + page.n  # the last window brought more
        self._follow_total(page)
        self._prove_end(start, page)
        return Step(keep=keep)

    def _prove_end(self, start: int, page: Page) -> None:
        """A total is a claim: the windows that reach it end with a page that shows the end.

        A page that brings items past the total (or a full page that ends on it) is followed by
        one more window, which must come back empty; a short page is the end.
        """
        if self.stop is not None or self.limit is None or self.end is not None:
            return
        reached = start + page.n
        if reached < self.limit or self.opened_to > reached:
            return
        full = page.n + self.overlap >= self.widest
        if reached > self.limit or full:
            self.limit = reached + self.stride  # one window past what the total claims
            self.opened_to = reached

    def _follow_total(self, page: Page) -> None:
        grew = page.total is not None and (self.limit is None or page.total > self.limit)
        if self.stop is None and self.use_totals and grew:
            self.limit = page.total  # the list grew: ask for the rest

    def _ended(self, skip: int, page: Page) -> int | None:
        """An empty page at ``skip``: the list ends here. Returns the claimed total if that
        total is absurd next to where the pages end."""
        claimed = page.total if page.total is not None and self.use_totals else None
        if claimed is None and self.stop is None and self.use_totals:
            claimed = self.limit
        self.end = skip if self.end is None else min(self.end, skip)
        if claimed is not None and claimed > 2 * skip + max(self.stride, 1):
            return claimed
        return None


# --- the executor -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stream:
    """One list to page: an endpoint with fixed parameters, and the key its pages are stored
    under (``None`` for a whole list, the event id for ``eventId=X``)."""

    endpoint: ListEndpoint
    key: Hashable = None
    #: A first page's total equal to its size is doubted (and probed) from this many items.
    doubt_total_from: int = 1

    @property
    def url(self) -> str:
        """The endpoint's path with its fixed parameters."""
        query = "&".join(f"{k}={v}" for k, v in self.endpoint.params)
        return self.endpoint.path + (f"?{query}" if query else "")

    def where(self, skip: int) -> str:
        return f"GET {self.url} (skip={skip})"

    def filters(self) -> list[tuple[int, str, str]]:
        """``(index in item keys, key, value)`` of each parameter that an item also carries."""
        params = dict(self.endpoint.params)
        return [
            (i + 1, key, str(params[key]))
            for i, (_, key) in enumerate(self.endpoint.extra_columns)
            if key in params
        ]


class ListPass:
    """One pass (or one repair window) over one list: its strategy and what it received.

    A repair window, or a re-read's gap window, ``share``s the digests and bodies of the pass it
    belongs to. A re-read (``known``: the bodies of the pass it checks) parses only the bodies
    the pass did not, and keeps none.
    """

    def __init__(
        self,
        stream: Stream,
        stats: ListStats,
        start: int = 0,
        stop: int | None = None,
        *,
        share: ListPass | None = None,
        known: dict[int, Body] | None = None,
    ):
        self.stream = stream
        self.stats = stats
        self.strategy = OffsetWindows(
            start, stop, doubt_total_from=stream.doubt_total_from, overlap=OVERLAP
        )
        self.decode = key_decoder(stream.endpoint)
        self.filters = stream.filters()
        self.pages = 0
        self.in_flight = 0
        self.finished = False
        self.page_hashes: set[int] = set()
        self.first_hash: int | None = None
        self.repeated_pages = 0
        self.repairs = 0
        #: What the pages held at a window's edge: position -> (identity, id as text).
        self.edges: dict[int, tuple[int, str]] = {}
        #: A whole pass over the list, counted done in the progress line when it ends.
        self.whole = start == 0 and stop is None and known is None
        #: A digest of each item kept, ``(id, content)`` as received (``item_digests``), and the
        #: bodies parsed, by ``digest``: 8 bytes per item twice, no per-id object.
        self.digests: array[int] = share.digests if share else array("q")
        self.bodies: dict[int, Body] | None = (
            share.bodies if share else {} if known is None else None
        )
        self.known: dict[int, Body] = share.known if share else known or {}


@dataclass(frozen=True)
class Limits:
    """What bounds the executor: the client's settings of the same names."""

    #: Requests in flight at once, over every list.
    concurrency: int
    #: Pages one pass over one list may hold before the server counts as paging forever.
    max_pages_per_pass: int
    #: The largest item, in MB, let through to the staging table.
    max_item_mb: int
    #: Passes over one list before it is refused.
    max_list_passes: int
    #: What errors call ``max_item_mb``'s variable (this tenant's).
    max_item_variable: str = "FIELDSALES_MAX_ITEM_MB"


#: Fetches one page: ``(endpoint, skip, stats, known)``, counting its requests and retries in
#: ``stats``. A body whose ``digest`` is in ``known`` is not parsed: the page comes back with no
#: items and its ``digest``.
FetchPage = Callable[[ListEndpoint, int, ListStats, Container[int]], Page]


class PageExecutor:
    """Fetches the pages of many passes (``ListPass``) over one thread pool: ``fetch`` is its one
    entry point. ``spent`` sums every request, retry, page and byte of every pass of every list.
    """

    def __init__(
        self,
        fetch_page: FetchPage,
        limits: Limits,
        *,
        label: str,
        log: Callable[[str], None] = lambda message: None,
        spent: ListStats | None = None,
    ):
        self.fetch_page = fetch_page
        self.limits = limits
        self.label = label
        self.log = log
        self.spent = spent if spent is not None else ListStats()
        self._started = time.monotonic()
        self.lists = 0
        self.lists_done = 0

    # --- requests -------------------------------------------------------------------------

    def fetch(self, passes: list[ListPass]) -> Iterator[tuple[Stream, Page]]:
        """Every page of ``passes``, as it arrives; ``limits.concurrency`` requests in flight.

        Lists that have started go first, so a list's pages follow each other and few lists are
        open at once; the others start as requests come free.
        """
        concurrency = self.limits.concurrency
        waiting = deque(passes)
        active: list[ListPass] = []
        pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="fieldsales")
        in_flight: dict[Future[Page], tuple[ListPass, Window, int | None]] = {}
        last_progress = time.monotonic()

        def fill(lp: ListPass) -> None:
            while len(in_flight) < concurrency:
                window = lp.strategy.next_window()
                if window is None:
                    if lp.in_flight == 0:
                        lp.finished = True
                        lp.page_hashes = set()
                        self.lists_done += lp.whole
                    return
                endpoint = lp.stream.endpoint
                skip = lp.strategy.asked_skip(window)
                future = pool.submit(self.fetch_page, endpoint, skip, lp.stats, lp.known)
                in_flight[future] = (lp, window, max(lp.stats.totals_seen, default=None))
                lp.in_flight += 1

        try:
            while True:
                for lp in active:
                    fill(lp)
                while waiting and len(in_flight) < concurrency:
                    active.append(waiting.popleft())
                    fill(active[-1])
                active = [lp for lp in active if not lp.finished]
                if not in_flight:
                    return
                done, _ = wait(in_flight, return_when=FIRST_COMPLETED)
                for future in done:
                    lp, window, baseline = in_flight.pop(future)
                    lp.in_flight -= 1
                    page = self._admit(lp, window, future.result(), baseline)
                    if page.n:
                        yield lp.stream, page
                now = time.monotonic()
                if now - last_progress >= PROGRESS_EVERY_S:
                    last_progress = now
                    self.log(self._progress_line())
        finally:
            for future in in_flight:
                future.cancel()
            pool.shutdown(wait=True, cancel_futures=True)

    def _progress_line(self) -> str:
        spent = self.spent
        lists = f"{self.lists_done}/{self.lists} lists, " if self.lists > 1 else ""
        return (
            f"{self.label}: {lists}{spent.items} items in {spent.pages} pages, "
            f"{spent.bytes / 1e6:.0f} MB, {spent.retries} retries, "
            f"{time.monotonic() - self._started:.1f} s"
        )

    # --- checks of one page ---------------------------------------------------------------

    def _admit(self, lp: ListPass, window: Window, page: Page, baseline: int | None) -> Page:
        """Plan on from the page, record it, check it, and return what of it to keep."""
        if page.digest in lp.known:
            return self._admit_known(lp, window, page, baseline)
        asked = page
        all_keys = item_keys(page.items, lp.decode)
        digests = item_digests(page.items)
        overlap = min(window[0] - page.skip, page.n)
        if overlap:  # the page before's last item(s), asked again: the boundary check
            for offset in range(overlap):
                self._edge(lp, page.skip + offset, all_keys[offset], digests[offset])
            if page.surrogates_replaced:  # counted once, with the page that keeps the item
                again = sum(bytes(item).count(b"\\ufffd") for item in page.items[:overlap])
                lp.stats.count(surrogates_replaced=-min(again, page.surrogates_replaced))
            page = Page(window[0], page.items[overlap:], page.total, page.nbytes)
        step = self._answered(lp, window, page, baseline)
        nulls = sum(1 for k in all_keys if k is None)
        if nulls:
            stream = lp.stream
            raise PageFormatError(
                f"{stream.where(asked.skip)} answered {nulls} `null` items among {asked.n}: the "
                f"server sent null where an item of {stream.endpoint.name} belongs, so the list "
                "cannot be stored as received. Report it to the Field-Sales service."
            )
        self._plausible(lp, page, step)
        keep = page.n if step.keep is None else step.keep
        items = page.items[:keep]
        page_keys = cast("list[ItemKeys]", all_keys[overlap : overlap + keep])  # none is None
        self._check_items(lp, page, items, page_keys)
        if items:
            last = overlap + len(items) - 1
            self._edge(lp, page.skip + len(items) - 1, page_keys[-1], digests[last])
            # The repeat check hashes the page as asked, its overlap included: a server that
            # ignores `skip` answers every window with the same ids as the first page.
            answered = zip(all_keys, digests, strict=True)
            ids = [_identity(cast("ItemKeys", k), i) for k, i in answered]
            page_hash = hash(frozenset(ids[: overlap + keep]))
            self._repeats(lp, page, page_hash)
            if lp.bodies is not None and asked.digest is not None:
                whole = page_hash if overlap + keep == asked.n else hash(frozenset(ids))
                lp.bodies[asked.digest] = Body(asked.total, digests, whole)
        lp.digests.extend(digests[overlap : overlap + keep])
        lp.stats.count(items=len(items))
        kept = digests[overlap : overlap + keep]
        return Page(page.skip, items, page.total, page.nbytes, page_keys, digests=kept)

    def _admit_known(self, lp: ListPass, window: Window, page: Page, baseline: int | None) -> Page:
        """A re-read's page whose body equals one the pass parsed (``lp.known``): the same
        items, so their checks passed already and their digests are known. Planned on and
        counted as a parsed page is; no item is decoded."""
        body = lp.known[cast("int", page.digest)]
        overlap = min(window[0] - page.skip, len(body.digests))
        shaped = Page(window[0], [], body.total, page.nbytes, count=len(body.digests) - overlap)
        step = self._answered(lp, window, shaped, baseline)
        self._plausible(lp, shaped, step)
        keep = shaped.n if step.keep is None else step.keep
        if keep:
            self._repeats(lp, shaped, body.ids_hash)
        lp.digests.extend(body.digests[overlap : overlap + keep])
        lp.stats.count(items=keep)
        return Page(shaped.skip, [], body.total, page.nbytes, count=keep)

    def _answered(self, lp: ListPass, window: Window, page: Page, baseline: int | None) -> Step:
        """Give the strategy its answer and count the page into the pass."""
        step = lp.strategy.answered(window, page)
        stats, stream = lp.stats, lp.stream
        if step.totals_unreliable:  # they were page sizes: paged as a list without a total
            stats.totals_seen.clear()
        use_totals = lp.strategy.use_totals
        lp.pages += 1
        stats.count(pages=1, bytes=page.nbytes)
        stats.answers.append((page.skip, page.n, page.total if use_totals else None))
        if page.total is not None and use_totals:
            if not stats.totals_seen or stats.totals_seen[-1] != page.total:
                stats.totals_seen.append(page.total)
            # ``baseline``: the largest total answered when this page was asked for.
            stats.total_decreased |= baseline is not None and page.total < baseline
        max_pages = self.limits.max_pages_per_pass
        if lp.pages > max_pages:
            raise PagingError(
                f"{stream.where(page.skip)}: {lp.pages} pages in one pass over "
                f"{stream.endpoint.name} ({stats.items} items so far), more than "
                f"max_pages_per_pass={max_pages}: the server seems to page forever. If the list "
                "really is that long, raise max_pages_per_pass."
            )
        return step

    @staticmethod
    def _plausible(lp: ListPass, page: Page, step: Step) -> None:
        if step.implausible_total is not None:
            raise PagingError(
                f"{lp.stream.where(page.skip)} answered no items while the server reports a "
                f"total of {step.implausible_total} {lp.stream.endpoint.name}; the pages end at "
                f"{page.skip}, far short of it. The total is not plausible; nothing was "
                "replaced. Report it to the Field-Sales service."
            )

    def _check_items(
        self, lp: ListPass, page: Page, items: list[msgspec.Raw], keys: list[ItemKeys]
    ) -> None:
        """Refuse an item over ``max_item_mb``, or one the list's filter excludes."""
        stream = lp.stream
        if items and max(map(len, items)) > self.limits.max_item_mb << 20:
            raise self._too_large(stream, page, items, keys)
        for index, key, value in lp.filters:
            for item_key in keys:
                if id_text(item_key[index]) != value:
                    raise FilterIgnoredError(
                        f"{stream.where(page.skip)} returned an item of {stream.endpoint.name} "
                        f"with {key} {item_key[index]!r}: the server ignores the {key} filter"
                    )

    def _repeats(self, lp: ListPass, page: Page, page_hash: int) -> None:
        """Count a page whose ids repeat an earlier page of the pass; refuse the third."""
        if lp.first_hash is None:
            lp.first_hash = page_hash
        if page_hash in lp.page_hashes:
            lp.repeated_pages += 1
            if lp.repeated_pages >= NO_NEW_IDS_PAGES:
                raise PagingError(self._repeats_message(lp, page, page_hash))
        lp.page_hashes.add(page_hash)

    def _too_large(
        self, stream: Stream, page: Page, items: list[msgspec.Raw], keys: list[ItemKeys]
    ) -> ItemTooLargeError:
        limit = self.limits.max_item_mb
        size, item_id = max(
            (len(item), id_text(key[0]) or "without _id")
            for item, key in zip(items, keys, strict=True)
        )
        return ItemTooLargeError(
            f"{stream.where(page.skip)}: item {item_id} of {stream.endpoint.name} is "
            f"{size / (1 << 20):.1f} MB ({size} bytes), over the per-item limit of {limit} MB "
            f"(max_item_mb, {self.limits.max_item_variable}). Nothing was replaced. To load it, "
            "raise max_item_mb above its size (and duckdb_memory_limit to 16 times max_item_mb)."
        )

    def _edge(self, lp: ListPass, at: int, keys: ItemKeys | None, item_digest: int) -> None:
        """Record the item a page held at ``at``, a window's edge; a different item there from
        another page of the pass means the list shifted between the two answers."""
        if keys is None:
            return  # a null item: refused with the page
        seen = (_identity(keys, item_digest), id_text(keys[0]) or "an item without _id")
        other = lp.edges.setdefault(at, seen)
        if other[0] != seen[0]:
            lp.stats.shifts.append((at, other[1], seen[1]))

    def _repeats_message(self, lp: ListPass, page: Page, page_hash: int) -> str:
        start = lp.strategy.start
        if page.skip != start and page_hash == lp.first_hash:
            what = (
                f"the same items as skip={start}: the server ignores `skip`, so the list "
                "cannot be paged"
            )
        else:
            what = (
                "only items already received on earlier pages: the server repeats pages (for "
                "example its last page for any skip past the end) instead of answering an "
                "empty page"
            )
        return (
            f"{lp.stream.where(page.skip)} answered {page.n} items, {what}. {NO_NEW_IDS_PAGES} "
            f"pages of {lp.stream.endpoint.name} brought no new id; stopped after {lp.pages} "
            "pages. Nothing was replaced; report it to the Field-Sales service."
        )
