"""Each list complete, or refused: page it into a sink, read it again, and judge it by one rule.

``OffsetWindows`` plans the ``skip`` windows (``skip`` advances by the items a page returned:
SPEC; a total is a claim, so the windows that reach it end with an empty page); ``PageExecutor``
fetches many passes over one thread pool and refuses bad pages; ``ListPasses`` pages lists into a
``Sink`` (``raw_load.Staging``) until ``PassFacts.incomplete`` accepts each, or fails.
"""

from __future__ import annotations

import functools
import time
from array import array
from collections import deque
from collections.abc import Callable, Container, Hashable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from itertools import repeat
from typing import TYPE_CHECKING, NamedTuple, Protocol, cast

import msgspec

from fieldsales_dagster.client.endpoints import ListEndpoint
from fieldsales_dagster.client.envelope import PROCESS_KEY, ListStats, Page, digest
from fieldsales_dagster.client.errors import FieldSalesAPIError, PageFormatError

if TYPE_CHECKING:
    import numpy as np

NO_NEW_IDS_PAGES = 3  # pages of a pass repeating earlier ids: the server pages forever
NAMED_IDS = 5  # in a message about ids; the rest are counted

#: One key of an item as decoded (an object or a list as a key is ``None``).
Key = str | int | float | None
#: Item keys decoded per item: ``_id`` first, then the endpoint's extra columns' keys.
ItemKeys = tuple[Key, ...]
#: ``[start, end)`` of a list; ``end`` is ``None`` for the first page, kept whole.
Window = tuple[int, int | None]


class PagingError(FieldSalesAPIError):
    """The server's pages cannot be a list: it pages forever, or claims an implausible total."""


class FilterIgnoredError(PagingError):
    """A filtered list (``eventId=X``) returned an item the filter excludes."""


class ItemTooLargeError(FieldSalesAPIError):
    """An item is larger than ``max_item_mb``."""


class IncompleteListError(FieldSalesAPIError):
    """No pass over a list was complete."""


def id_text(value: object) -> str | None:
    """An id as it is stored and compared: text (``1002`` is ``"1002"``); ``None`` for none."""
    return None if value is None or isinstance(value, bool) else str(value)


@functools.cache
def key_decoder(endpoint: ListEndpoint) -> msgspec.json.Decoder:
    """Decodes an item's ``_id`` and extra-column keys, skipping every other field."""
    keys = ("_id", *dict(endpoint.extra_columns).values())
    fields = [(f"k{i}", Key, msgspec.field(default=None, name=k)) for i, k in enumerate(keys)]
    return msgspec.json.Decoder(msgspec.defstruct("ItemKeys", fields))


def item_keys(items: list[msgspec.Raw], decode: msgspec.json.Decoder) -> list[ItemKeys | None]:
    """Each item's keys; ``None`` for an item that is JSON ``null``."""
    out: list[ItemKeys | None] = []
    names = [
        f.encode_name for f in msgspec.structs.fields(cast("type[msgspec.Struct]", decode.type))
    ]
    for item in items:
        try:
            out.append(msgspec.structs.astuple(decode.decode(item)))
        except msgspec.ValidationError:  # not an object, or a key holding an object or a list
            doc = msgspec.json.decode(item)
            found = doc if isinstance(doc, dict) else {}
            keys = tuple(v if isinstance(v, Key) else None for v in map(found.get, names))
            out.append(None if doc is None else keys)
    return out


def item_digests(items: list[msgspec.Raw], key: int = PROCESS_KEY) -> array[int]:
    """Each item's ``digest`` (id and content) as a signed BIGINT: whether two copies differ."""
    return array("q", array("Q", map(digest, items, repeat(key))).tobytes())


@dataclass(frozen=True)
class Step:
    """What the strategy made of one answer."""

    keep: int | None = None  # the page's first ``keep`` items; ``None``: all
    totals_unreliable: bool = False  # the totals proved to be page sizes: forget them
    implausible_total: int | None = None  # an empty page came far short of this total


class OffsetWindows:
    """Which ``skip`` windows of ``[start, stop)`` (a repair's) of one list to ask for, and when
    it ended: up to the total, following it as it grows; without one, until an empty page. No I/O.
    """

    def __init__(self, start: int = 0, stop: int | None = None, *, doubt_total_from: int = 1):
        self.start = start
        self.stop = stop
        self.doubt_total_from = doubt_total_from
        self.widest = 0  # the most items one answer held: the server's page size
        self.followups: deque[Window] = deque([(start, None)])  # the first page, asked alone
        self.limit: int | None = stop  # where windows end; None: until an empty page
        self.end: int | None = None  # first skip known to be past the list
        self.opened_to = start  # windows exist for [start, opened_to)
        self.stride = 0  # set by the first page: no window opens before it answered
        self.use_totals = True
        #: Windows that prove the end, asked one item early; ``True``: the total they doubt may
        #: be the first page's own size.
        self.proofs: dict[int, bool] = {}

    def asked_skip(self, window: Window) -> int:
        """The ``skip`` that asks for ``window``. A window that proves the end is asked from the
        list's last item, so a list that ends there answers that item, not a page past its end."""
        return window[0] - 1 if window[0] in self.proofs and window[0] > self.start else window[0]

    def next_window(self) -> Window | None:
        while self.followups or self.stride:
            if self.followups:
                window = self.followups.popleft()
            elif any(b is not None and self.opened_to >= b for b in (self.end, self.limit)):
                return None
            else:
                stop = self.opened_to + self.stride
                window = (self.opened_to, stop if self.limit is None else min(stop, self.limit))
                self.opened_to = window[1]
            if self.end is None or window[0] < self.end:
                return window
        return None

    def answered(self, window: Window, page: Page) -> Step:
        """Plan on from ``page``, the answer to ``window`` (the first page's sets the stride)."""
        start, first, reached = window[0], window[1] is None, window[0] + page.n
        end = reached if window[1] is None else window[1]
        self.widest = max(self.widest, page.n)
        if page.n == 0:
            return Step(implausible_total=self._ended(start, page))
        if self.proofs.get(start):  # past a total equal to the first page's size: page sizes
            self.use_totals, self.limit, self.opened_to = False, self.stop, reached
            return Step(totals_unreliable=True)  # kept whole; paged as a list without a total
        if first or page.n != end - start and page.n != self.stride:
            self.stride = page.n  # the server's page size (another than planned: re-plan)
        keep = None
        if reached < end:
            self.followups.appendleft((reached, end))
        elif end < self.opened_to:
            keep = end - start  # the overflow is the next window's, already planned
        else:
            self.opened_to = reached  # the last window brought more
        grew = page.total is not None and (self.limit is None or page.total > self.limit)
        if self.stop is None and self.use_totals and grew:
            self.limit = page.total  # the list grew: ask for the rest
        full = page.n >= (self.doubt_total_from if first else self.widest)
        # A full page that reaches the list's planned end (``top``: not a repair's window, not
        # yet ended) is followed by a window that must come back empty.
        top = self.limit if self.stop is None and self.end is None else None
        if top is not None and reached >= max(top, self.opened_to) and (reached > top or full):
            self.limit, self.opened_to = reached + self.stride, reached
            self.proofs[reached] = first and page.total == page.n
        return Step(keep=keep)

    def _ended(self, skip: int, page: Page) -> int | None:
        """An empty page at ``skip``: the list ends here. The claimed total, if it is absurd."""
        claimed = page.total if page.total is not None or self.stop is not None else self.limit
        self.end = skip if self.end is None else min(self.end, skip)
        far = self.use_totals and claimed is not None and claimed > 2 * skip + max(self.stride, 1)
        return claimed if far else None


@dataclass(frozen=True)
class Stream:
    """One list to page, and the key its pages are stored under (``None``: whole; event id)."""

    endpoint: ListEndpoint
    key: Hashable = None
    doubt_total_from: int = 1  # a first page's total equal to its size is proven from this size

    @property
    def url(self) -> str:
        query = "&".join(f"{k}={v}" for k, v in self.endpoint.params)
        return self.endpoint.path + (f"?{query}" if query else "")

    def where(self, skip: int) -> str:
        return f"GET {self.url} (skip={skip})"


class Body(NamedTuple):
    """A parsed page body, kept for the re-read."""

    total: int | None
    digests: array[int]
    ids_hash: int


class ListPass:
    """One pass (or one repair window, which ``share``s its pass's digests) over one list. A
    re-read (``known``: the bodies of the pass it checks) parses only the bodies it did not."""

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
        self.strategy = OffsetWindows(start, stop, doubt_total_from=stream.doubt_total_from)
        self.pages = self.repeated_pages = self.repairs = 0
        self.page_hashes: dict[int, None] = {}  # in order: the first is the first page's
        self.digests: array[int] = share.digests if share else array("q")
        self.bodies: dict[int, Body] = share.bodies if share else {}
        self.known: dict[int, Body] = share.known if share else known or {}

    @property
    def one_answer(self) -> bool:
        """No request, repair or probe followed the first answer (``_read_again``)."""
        return len(self.stats.answers) < 2

    def reread(self, spent: ListStats) -> ListPass:
        """A pass that reads the list again; a pass of one answer is its own."""
        if self.one_answer:
            return self
        return ListPass(self.stream, ListStats(parent=spent), known=self.bodies)


@dataclass(frozen=True)
class Limits:
    """What bounds the executor: the client's settings of the same names."""

    concurrency: int
    max_pages_per_pass: int
    max_item_mb: int
    max_list_passes: int
    max_item_variable: str = "FIELDSALES_MAX_ITEM_MB"  # this tenant's, for errors


@dataclass
class PageExecutor:
    """Fetches the pages of many passes over one thread pool (``fetch``); ``spent`` sums them."""

    #: ``(endpoint, skip, stats, known)``: a body whose ``digest`` is ``known`` comes without items.
    fetch_page: Callable[[ListEndpoint, int, ListStats, Container[int]], Page]
    limits: Limits
    label: str
    log: Callable[[str], None] = lambda message: None
    spent: ListStats = field(default_factory=ListStats)
    started: float = field(default_factory=time.monotonic)
    digest_key: int = PROCESS_KEY  # of the items' digests (``item_digests``)

    def fetch(self, passes: list[ListPass]) -> Iterator[tuple[Stream, Page]]:
        """Every page of ``passes`` as it arrives, ``limits.concurrency`` requests in flight;
        lists that have started go first, so few lists are open at once."""
        concurrency = self.limits.concurrency
        waiting, active = deque(passes), list[ListPass]()
        pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="fieldsales")
        in_flight: dict[Future[Page], tuple[ListPass, Window, int | None]] = {}
        last_progress = time.monotonic()

        def fill(lp: ListPass) -> bool:
            """Ask for ``lp``'s next windows while requests are free; whether it is still open."""
            while len(in_flight) < concurrency:
                if (window := lp.strategy.next_window()) is None:
                    return any(owner is lp for owner, _, _ in in_flight.values())
                skip = lp.strategy.asked_skip(window)
                future = pool.submit(self.fetch_page, lp.stream.endpoint, skip, lp.stats, lp.known)
                in_flight[future] = (lp, window, max(lp.stats.totals_seen, default=None))
            return True

        try:
            while True:
                active = [lp for lp in active if fill(lp)]
                while waiting and len(in_flight) < concurrency:
                    if fill(lp := waiting.popleft()):
                        active.append(lp)
                if not in_flight:
                    return
                done, _ = wait(in_flight, return_when=FIRST_COMPLETED)
                for future in done:
                    lp, window, baseline = in_flight.pop(future)
                    page = self._admit(lp, window, future.result(), baseline)
                    if page.n:
                        yield lp.stream, page
                if (now := time.monotonic()) - last_progress >= 5.0:  # a progress line every 5 s
                    last_progress, spent = now, self.spent
                    lists = f"{len(passes) - len(waiting) - len(active)}/{len(passes)} lists, "
                    self.log(
                        f"{self.label}: {lists if len(passes) > 1 else ''}{spent.items} items in "
                        f"{spent.pages} pages, {spent.bytes / 1e6:.0f} MB, {spent.retries} "
                        f"retries, {now - self.started:.1f} s"
                    )
        finally:
            pool.shutdown(cancel_futures=True)  # waits for the requests under way

    def _admit(self, lp: ListPass, window: Window, page: Page, baseline: int | None) -> Page:
        stream = lp.stream
        if page.digest in lp.known:  # a re-read's body the pass parsed: its checks passed
            body = lp.known[page.digest]
            shaped = Page(page.skip, [], body.total, page.nbytes, count=len(body.digests))
            keep = self._answered(lp, window, shaped, baseline)
            if keep:
                self._repeats(lp, shaped, body.ids_hash)
            lp.digests.extend(body.digests[:keep])
            lp.stats.count(items=keep)
            return Page(page.skip, [], body.total, page.nbytes, count=keep)
        if over := window[0] - page.skip:  # asked one item early: that item is another page's
            page = Page(window[0], page.items[over:], page.total, page.nbytes)
        all_keys = item_keys(page.items, key_decoder(stream.endpoint))
        digests = item_digests(page.items, self.digest_key)
        keep = self._answered(lp, window, page, baseline)
        if nulls := all_keys.count(None):
            raise PageFormatError(
                f"{stream.where(page.skip)} answered {nulls} `null` items among {page.n} where "
                f"{stream.endpoint.name} belong; report it to the Field-Sales service."
            )
        keys = cast("list[ItemKeys]", all_keys)
        items, kept, limit = page.items[:keep], keys[:keep], self.limits.max_item_mb
        if items and max(map(len, items)) > limit << 20:
            size, item_id = max(
                (len(item), id_text(key[0]) or "without _id")
                for item, key in zip(items, kept, strict=True)
            )
            raise ItemTooLargeError(
                f"{stream.where(page.skip)}: item {item_id} of {stream.endpoint.name} is "
                f"{size / (1 << 20):.1f} MB ({size} bytes), over the per-item limit of {limit} MB "
                f"(max_item_mb, {self.limits.max_item_variable}); raise max_item_mb to load it."
            )
        params = dict(stream.endpoint.params)  # a filter (``eventId``) is an extra column's key
        for index, (_, key) in enumerate(stream.endpoint.extra_columns, 1):
            for item_key in kept:
                if key in params and id_text(item_key[index]) != str(params[key]):
                    raise FilterIgnoredError(
                        f"{stream.where(page.skip)} returned an item of {stream.endpoint.name} "
                        f"with {key} {item_key[index]!r}: the server ignores the {key} filter"
                    )
        if items:
            # What tells items apart: the ``_id``, or the whole item (its digest) without one.
            ids = [
                d if (i := id_text(k[0])) is None else hash(("id", i))
                for k, d in zip(keys, digests, strict=True)
            ]
            page_hash = hash(frozenset(ids[:keep]))
            self._repeats(lp, page, page_hash)
            if page.digest is not None:
                whole = page_hash if keep == page.n else hash(frozenset(ids))
                lp.bodies[page.digest] = Body(page.total, digests, whole)
        lp.digests.extend(digests[:keep])
        lp.stats.count(items=keep)
        return Page(page.skip, items, page.total, page.nbytes, kept, digests=digests[:keep])

    def _answered(self, lp: ListPass, window: Window, page: Page, baseline: int | None) -> int:
        """Give the strategy its answer, count the page; the items to keep."""
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
            stats.total_decreased |= baseline is not None and page.total < baseline
        if lp.pages > (max_pages := self.limits.max_pages_per_pass):
            raise PagingError(
                f"{stream.where(page.skip)}: {lp.pages} pages in one pass, more than "
                f"max_pages_per_pass={max_pages}; if the list is that long, raise it."
            )
        if step.implausible_total is not None:
            raise PagingError(
                f"{stream.where(page.skip)} answered no items, far short of its total of "
                f"{step.implausible_total}: not plausible; report it to the Field-Sales service."
            )
        return page.n if step.keep is None else step.keep

    def _repeats(self, lp: ListPass, page: Page, page_hash: int) -> None:
        """Count a page whose ids repeat an earlier page of the pass; refuse the third."""
        if page_hash in lp.page_hashes:
            lp.repeated_pages += 1
            if lp.repeated_pages >= NO_NEW_IDS_PAGES:
                what = (
                    f"the same items as skip={lp.strategy.start}: the server ignores `skip`"
                    if page.skip != lp.strategy.start and page_hash == next(iter(lp.page_hashes))
                    else "only items of earlier pages: the server repeats pages"
                )
                raise PagingError(
                    f"{lp.stream.where(page.skip)} answered {what}; {NO_NEW_IDS_PAGES} pages "
                    "brought no new id. Report it to the Field-Sales service."
                )
        lp.page_hashes[page_hash] = None


class Sink(Protocol):
    """Where the pages of the lists go and are counted (``raw_load.Staging``)."""

    def write(self, pages: Iterator[tuple[Stream, Page]]) -> None: ...

    def counts(self) -> dict[Hashable, tuple[int, int]]:
        """``(rows, distinct ids)`` stored per list."""

    def differing(self, key: Hashable) -> tuple[int, tuple[str, ...]]:
        """Ids of one list stored more than once with different content: how many, a few."""

    def ids_of(self, key: Hashable, digests: set[int]) -> tuple[str, ...]:
        """A few ids of one list's items with these digests."""

    def forget(self, keys: list[Hashable]) -> None:
        """Remove what is stored for these lists: they are paged again."""


def named(count: int, few: tuple[str, ...], sentence: str) -> str:
    """``sentence`` with the count and the ``few`` named of them ("and N more"); "" for none."""
    more = f" and {count - len(few)} more" if count > len(few) else ""
    return sentence.format(count, ", ".join(few) + more) if count else ""


@dataclass(frozen=True)
class PassFacts:
    """What one pass (with its repairs) stored, the totals the server said meanwhile, and what
    its re-read no longer listed as it was (``gone``)."""

    rows: int
    distinct: int
    totals_seen: tuple[int, ...] = ()  # in order of arrival
    total_decreased: bool = False
    previous: tuple[int, int] | None = None  # ``(rows, distinct)`` of this load's previous pass
    differing: int = 0
    differing_ids: tuple[str, ...] = ()
    gone: int = 0
    gone_ids: tuple[str, ...] = ()

    @property
    def total(self) -> int | None:
        """The server's final total: while it only grew, the largest is the newest (answers
        arrive out of order)."""
        seen = self.totals_seen
        return seen[-1] if seen and self.total_decreased else max(seen, default=None)

    def describe(self) -> str:
        differing = "{} ids came more than once with different content ({})"
        gone = "{} items the pass holds were gone or changed when the list was read again ({})"
        totals = (
            f"every page reported a total of {self.total}"
            if len(self.totals_seen) == 1
            else f"the total moved while it was paged: {', '.join(map(str, self.totals_seen))}"
        )
        sent = [
            f"{self.rows} items with {self.distinct} distinct ids "
            f"({self.rows - self.distinct} sent twice)",
            named(self.differing, self.differing_ids, differing),
            named(self.gone, self.gone_ids, gone),
            "the server reports no total" if self.total is None else totals,
        ]
        return "; ".join(part for part in sent if part)

    def repair(self) -> int | None:
        """For a list that only grew while it was paged and misses ids: the head ``[0, head)``
        to fetch again (items appended are paged in the pass: it follows a growing total)."""
        missing = (self.total or 0) - self.distinct
        grew = missing > 0 and len(self.totals_seen) > 1 and not self.total_decreased
        return 2 * missing if grew else None

    def incomplete(self) -> str | None:
        """Why the pass is not a list the server held at one moment; ``None`` when it is: what
        it kept came back unchanged, no id twice with different content, distinct ids == total
        (or rows). A server that counts every copy of an id is believed if two passes agree."""
        expected = self.rows if self.total is None else self.total
        changed = self.differing or self.gone
        moved = changed or len(self.totals_seen) > 1
        agreed = not moved and self.rows == expected and self.previous == (self.rows, self.distinct)
        if not changed and (self.distinct == expected or agreed):
            return None
        if moved:
            why = "the list shifted under its pages: it kept changing while it was paged"
        elif self.distinct > expected:
            why = "the server lists more distinct ids than its total counts"
        elif self.rows < expected:
            why = "the server delivers fewer items than its total counts"
        else:
            why = "the server lists ids more than once, differently in each pass"
        return f"{self.describe()}: {why}"


def gap_windows(
    answers: list[tuple[int, int, int | None]], total_now: int, slack: int = 2
) -> list[tuple[int, int]]:
    """Where a pass may have missed items because the list grew while pages were in flight: of
    two adjacent pages answered out of order around an insertion, the lower saw the longer list,
    so the items between them were in neither. Windows ``[start, stop)`` in today's positions."""
    gaps: list[tuple[int, int]] = []
    ordered = sorted((a for a in answers if a[2] is not None and a[1] > 0), key=lambda a: a[0])
    for (s1, n1, t1), (s2, _, t2) in zip(ordered, ordered[1:], strict=False):
        if s1 < s2 <= s1 + n1 and cast("int", t1) > cast("int", t2):
            start = max(0, s1 + n1 + total_now - cast("int", t1) - slack)
            stop = s1 + n1 + total_now - cast("int", t2) + slack
            if gaps and start <= gaps[-1][1]:
                gaps[-1] = (gaps[-1][0], max(stop, gaps[-1][1]))
            else:
                gaps.append((start, stop))
    return gaps


def in_sorted(values: np.ndarray, ordered: np.ndarray) -> np.ndarray:
    """Whether each of ``values`` is in ``ordered`` (sorted): a sorted search, five times as fast
    as ``np.isin`` on random 64-bit digests."""
    import numpy as np  # where a load runs: the definitions load without it

    if not ordered.size:
        return np.zeros(values.shape, bool)
    return ordered[np.minimum(np.searchsorted(ordered, values), ordered.size - 1)] == values


def digests_gone(held: array[int], seen: array[int]) -> np.ndarray:
    """The digests in ``held`` that ``seen`` lacks (distinct, sorted)."""
    import numpy as np

    kept = np.frombuffer(held, np.int64)
    return np.unique(kept[~in_sorted(kept, np.sort(np.frombuffer(seen, np.int64)))])


@dataclass
class ListResult:
    """A list the rule accepted, by its last pass."""

    stats: ListStats
    facts: PassFacts
    reason: str
    passes: int
    repairs: int


@dataclass
class ListPasses:
    """Pages lists with ``executor`` into ``sink`` until the rule accepts each of them."""

    executor: PageExecutor
    sink: Sink

    def run(self, lists: list[Stream]) -> dict[Hashable, ListResult]:
        executor, results = self.executor, dict[Hashable, ListResult]()
        todo, previous = lists, dict[Hashable, tuple[int, int]]()
        max_passes = executor.limits.max_list_passes
        for number in range(1, max_passes + 1):
            passes = [ListPass(stream, ListStats(parent=executor.spent)) for stream in todo]
            self._stage(passes)
            self._repair(passes, number)
            counts, todo = self.sink.counts(), []  # the re-read stores nothing
            for lp, missing in zip(passes, self._read_again(passes), strict=True):
                key, name, stats = lp.stream.key, lp.stream.endpoint.name, lp.stats
                rows, distinct = counts.get(key, (0, 0))
                differing = self.sink.differing(key) if rows > distinct else (0, ())
                gone_ids = self.sink.ids_of(key, set(missing.tolist())) if missing.size else ()
                seen = tuple(stats.totals_seen), stats.total_decreased, previous.get(key)
                facts = PassFacts(rows, distinct, *seen, *differing, missing.size, gone_ids)
                if (why := facts.incomplete()) is None:
                    proof = "read again, the list still held every item"
                    proof = "one answer held the whole list" if lp.one_answer else proof
                    reason = f"{facts.describe()}; {proof}"
                    results[key] = ListResult(lp.stats, facts, reason, number, lp.repairs)
                elif number == max_passes:
                    raise IncompleteListError(
                        f"{name} ({lp.stream.url}): after {number} passes, {why}. Run again "
                        "later, or raise max_list_passes if the server's list is stable."
                    )
                else:
                    previous[key] = (rows, distinct)
                    executor.log(f"{name}: pass {number}: {why}; paging it again.")
                    todo.append(lp.stream)
            if not todo:
                break
            self.sink.forget([stream.key for stream in todo])
        return results

    def _repair(self, passes: list[ListPass], number: int) -> None:
        """Re-fetch the head (and, the first time, the gaps) of each list that grew, while ids
        are missing."""
        while passes:
            counts, windows, growing = self.sink.counts(), list[ListPass](), []
            for lp in passes:
                seen = tuple(lp.stats.totals_seen), lp.stats.total_decreased
                facts = PassFacts(*counts.get(lp.stream.key, (0, 0)), *seen)
                if (head := facts.repair()) is None or lp.repairs >= 5:  # rounds, at most
                    continue
                lp.repairs += 1
                self.executor.log(
                    f"{lp.stream.endpoint.name}: pass {number}: {head // 2} ids missing from a "
                    f"list that grew; re-fetching items 0-{head} (repair {lp.repairs})."
                )
                gaps = gap_windows(lp.stats.answers, facts.total or 0) if lp.repairs == 1 else []
                windows += [ListPass(lp.stream, lp.stats, *w, share=lp) for w in [(0, head), *gaps]]
                growing.append(lp)
            self._stage(windows)
            passes = growing

    def _read_again(self, passes: list[ListPass]) -> list[np.ndarray]:
        """Read each list once more, storing nothing: what each pass kept that the re-read did
        not list as it was (its own gaps read, so items an insert shifted are not gone).

        A pass of one answer (an empty list, or a page whose total equals its items and is not
        doubted) is its own re-read: one response is a set the server held at one instant, with
        its end in it. A later answer that proves the end (a probe, an empty page) may see the
        list after it shrank, so such a pass is read again (``test_hostile_paging.py``)."""
        spent = self.executor.spent
        again = [(lp, lp.reread(spent)) for lp in passes]
        deque(self.executor.fetch([r for lp, r in again if r is not lp]), maxlen=0)  # no store
        gaps = [
            ListPass(lp.stream, reread.stats, start, stop, share=reread)
            for lp, reread in again
            if digests_gone(lp.digests, reread.digests).size
            for start, stop in gap_windows(
                reread.stats.answers, (reread.stats.totals_seen or [0])[-1]
            )
        ]
        deque(self.executor.fetch(gaps), maxlen=0)
        return [digests_gone(lp.digests, reread.digests) for lp, reread in again]

    def _stage(self, passes: list[ListPass]) -> None:
        if passes:
            self.sink.write(self.executor.fetch(passes))
