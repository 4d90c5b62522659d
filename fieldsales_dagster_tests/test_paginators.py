"""The paging units on scripted answers, without HTTP, as dlt's ``test_paginators.py`` drives its
paginators: ``OffsetWindows`` (which window to ask for next, and when the list ended), and
``PageExecutor`` given a ``fetch_page`` callable and its ``Limits`` (what it asks for, checks and
keeps), and ``ListPasses`` over it (a pass, the re-read that proves it, the verdict). The
end-to-end tests over HTTP are ``test_hostile_paging.py`` and ``test_moving_lists.py``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Container
from datetime import UTC, datetime
from typing import Any

import duckdb
import msgspec
import pytest

from fieldsales_dagster.client.endpoints import TRANSACTIONS, ListEndpoint
from fieldsales_dagster.client.envelope import ListStats, Page
from fieldsales_dagster.loading.lists import (
    IncompleteListError,
    ItemTooLargeError,
    Limits,
    ListPass,
    ListPasses,
    ListResult,
    OffsetWindows,
    PageExecutor,
    PagingError,
    Stream,
)
from fieldsales_dagster.loading.raw_load import Staging

LIMITS = Limits(concurrency=1, max_pages_per_pass=100, max_item_mb=1, max_list_passes=3)


def item(i: int | str, **more: Any) -> dict[str, Any]:
    return {"_id": i if isinstance(i, str) else f"i-{i:03d}", "eventId": "e-1", **more}


def page(skip: int, items: list[dict[str, Any]], total: int | None = None) -> Page:
    raw = [msgspec.Raw(json.dumps(one).encode()) for one in items]
    return Page(skip, raw, total, sum(map(len, raw)))


class Scripted:
    """A ``fetch_page`` over a list of ``page_size`` pages; ``changes[k]`` changes the list just
    before the k-th answer (counted from 1). Records every ``skip`` asked for."""

    def __init__(
        self,
        listed: list[dict[str, Any]],
        page_size: int = 10,
        with_total: bool = True,
        changes: dict[int, Callable[[list[dict[str, Any]]], None]] | None = None,
    ):
        self.listed = listed
        self.page_size = page_size
        self.with_total = with_total
        self.changes = changes or {}
        self.asked: list[int] = []
        self.unparsed = 0
        self._lock = threading.Lock()

    def __call__(
        self, endpoint: ListEndpoint, skip: int, stats: ListStats, known: Container[int] = ()
    ) -> Page:
        """The page at ``skip``, as ``FieldSalesAPI.fetch_page`` answers it: a body whose hash
        is in ``known`` is not parsed (counted in ``unparsed``)."""
        with self._lock:
            self.asked.append(skip)
            change = self.changes.get(len(self.asked))
            if change is not None:
                change(self.listed)
            items = self.listed[skip : skip + self.page_size]
            total = len(self.listed) if self.with_total else None
        stats.count(requests=1)
        answer = page(skip, items, total)
        answer.digest = hash((json.dumps(items).encode(), total))
        if answer.digest in known:
            self.unparsed += 1
            return Page(skip, [], None, answer.nbytes, digest=answer.digest)
        return answer


def fetched_ids(executor: PageExecutor) -> list[str]:
    return [
        json.loads(bytes(raw))["_id"]
        for _, one in executor.fetch([ListPass(Stream(TRANSACTIONS), ListStats())])
        for raw in one.items
    ]


# --- OffsetWindows: which window next ------------------------------------------------------------


def test_windows_after_the_first_follow_the_first_page_up_to_the_total():
    windows = OffsetWindows()
    assert windows.next_window() == (0, None)
    assert windows.next_window() is None  # nothing else until the first page answered
    windows.answered((0, None), page(0, [item(i) for i in range(10)], total=25))
    planned = [windows.next_window(), windows.next_window(), windows.next_window()]
    assert planned == [(10, 20), (20, 25), None]
    assert [windows.asked_skip(w) for w in planned[:2]] == [10, 20]


def test_without_a_total_windows_open_as_asked_until_an_empty_page():
    windows = OffsetWindows()
    windows.next_window()
    windows.answered((0, None), page(0, [item(i) for i in range(10)]))
    assert [windows.next_window(), windows.next_window()] == [(10, 20), (20, 30)]
    windows.answered((10, 20), page(10, [item(i) for i in range(10, 20)]))
    windows.answered((20, 30), page(20, []))  # the end
    assert windows.next_window() is None


def test_an_empty_page_far_short_of_the_total_makes_it_implausible():
    windows = OffsetWindows()
    windows.next_window()
    windows.answered((0, None), page(0, [item(i) for i in range(10)], total=1000))
    window = windows.next_window()
    assert window == (10, 20)
    assert windows.answered(window, page(10, [], total=1000)).implausible_total == 1000


def test_a_full_page_that_reaches_the_total_is_followed_by_one_asked_from_the_last_item():
    """The end is proven by a window past the total, asked from the list's last item."""
    windows = OffsetWindows()
    windows.next_window()
    windows.answered((0, None), page(0, [item(i) for i in range(10)], total=20))
    assert windows.next_window() == (10, 20)
    windows.answered((10, 20), page(10, [item(i) for i in range(10, 20)], total=20))
    window = windows.next_window()
    assert window == (20, 30) and windows.asked_skip(window) == 19
    assert windows.next_window() is None


def test_pages_of_one_item_are_asked_one_by_one():
    windows = OffsetWindows()
    windows.next_window()
    windows.answered((0, None), page(0, [item(0)], total=3))
    window = windows.next_window()
    assert window == (1, 2) and windows.asked_skip(window) == 1


# --- PageExecutor: what it asks, checks and keeps ------------------------------------------------


def test_the_executor_asks_each_window_once_and_keeps_each_item_once():
    fetch = Scripted([item(i) for i in range(25)])
    ids = fetched_ids(PageExecutor(fetch, LIMITS, label="t"))
    assert fetch.asked == [0, 10, 20]  # windows of the first page's size
    assert ids == [f"i-{i:03d}" for i in range(25)]


def test_without_a_total_the_executor_asks_at_most_concurrency_windows_ahead():
    """The strategy opens windows as they are asked for: the executor asks only while fewer
    than ``concurrency`` requests are out, so few requests go past the end of the list."""
    fetch = Scripted([item(i) for i in range(95)], with_total=False)
    limits = Limits(concurrency=3, max_pages_per_pass=100, max_item_mb=1, max_list_passes=3)
    ids = fetched_ids(PageExecutor(fetch, limits, label="t"))
    assert sorted(ids) == [f"i-{i:03d}" for i in range(95)]
    assert 1 <= sum(skip >= 95 for skip in fetch.asked) <= limits.concurrency


def test_the_executor_stops_a_pass_past_max_pages_per_pass():
    fetch = Scripted([item(i) for i in range(50)])
    limits = Limits(concurrency=1, max_pages_per_pass=3, max_item_mb=1, max_list_passes=3)
    with pytest.raises(PagingError, match=r"4 pages in one pass.*max_pages_per_pass=3"):
        fetched_ids(PageExecutor(fetch, limits, label="t"))


def test_the_executor_names_an_item_over_max_item_mb():
    listed = [item(i) for i in range(15)]
    listed[12] = item(12, blob="x" * (1 << 20))
    with pytest.raises(ItemTooLargeError, match=r"item i-012 .* over the per-item limit of 1 MB"):
        fetched_ids(PageExecutor(Scripted(listed), LIMITS, label="t"))


# --- ListPasses.run: a pass, its re-read, the verdict ------------------------------------------


@pytest.fixture
def staging(tmp_path):
    conn = duckdb.connect(str(tmp_path / "stage.duckdb"))
    conn.execute("CREATE SCHEMA raw")
    staging = Staging(conn, TRANSACTIONS, "raw.stage", datetime.now(UTC))
    staging.create()
    yield staging
    conn.close()


def run(fetch: Scripted, staging: Staging) -> dict[Any, ListResult]:
    return ListPasses(PageExecutor(fetch, LIMITS, label="t"), staging).run([Stream(TRANSACTIONS)])


def stored(staging: Staging) -> set[str]:
    return {r[0] for r in staging.conn.execute("SELECT id FROM raw.stage").fetchall()}


def test_a_stable_list_is_read_once_more_and_accepted(staging):
    fetch = Scripted([item(i) for i in range(25)])
    (result,) = (
        ListPasses(PageExecutor(fetch, LIMITS, label="t"), staging)
        .run([Stream(TRANSACTIONS)])
        .values()
    )
    assert fetch.asked == [0, 10, 20] * 2  # the pass, then the re-read
    assert fetch.unparsed == 3  # every page of the re-read came back as the pass had it
    assert result.passes == 1 and "read again, the list still held every item" in result.reason
    assert stored(staging) == {f"i-{i:03d}" for i in range(25)}


def delete_and_insert_inside_the_first_page(listed: list[dict[str, Any]]) -> None:
    """i-003 deleted and n-1 inserted three positions on: the boundaries stay; n-2 inserted at
    the end moves the total."""
    del listed[3]
    listed.insert(6, item("n-1"))
    listed.append(item("n-2"))


def test_a_pass_holding_an_item_its_re_read_no_longer_lists_is_paged_again(staging):
    fetch = Scripted(
        [item(i) for i in range(25)], changes={3: delete_and_insert_inside_the_first_page}
    )
    (result,) = (
        ListPasses(PageExecutor(fetch, LIMITS, label="t"), staging)
        .run([Stream(TRANSACTIONS)])
        .values()
    )
    assert result.passes == 2
    assert stored(staging) == {one["_id"] for one in fetch.listed}
    assert "i-003" not in stored(staging)


def test_a_list_that_shifted_between_two_answers_is_paged_again(staging):
    """i-002 deleted before the second answer: i-010 shifts into the first page and is in
    neither; the pass holds i-002, which the re-read no longer lists."""
    fetch = Scripted([item(i) for i in range(25)], changes={2: lambda listed: listed.pop(2)})
    (result,) = run(fetch, staging).values()
    assert result.passes == 2
    assert stored(staging) == {one["_id"] for one in fetch.listed}
    assert "i-002" not in stored(staging) and "i-010" in stored(staging)


def test_a_list_that_moves_inside_its_pages_every_pass_fails_naming_the_ids(staging):
    def pair(listed: list[dict[str, Any]]) -> None:
        listed.pop(1)
        listed.insert(4, item(f"n-{len(fetch.asked)}"))

    fetch = Scripted([item(i) for i in range(25)], changes={k: pair for k in range(2, 40, 4)})
    with pytest.raises(IncompleteListError) as raised:
        run(fetch, staging)
    message = str(raised.value)
    assert "after 3 passes" in message
    assert "were gone or changed when the list was read again (" in message


def test_a_re_read_parses_only_the_pages_whose_bytes_changed_and_judges_their_items(staging):
    """i-012's content changes after the pass (4th answer: the re-read's first): the re-read
    parses only the page that holds it, finds the pass's copy gone, and pages the list again."""

    def change(listed: list[dict[str, Any]]) -> None:
        listed[12] = item(12, note="changed")

    fetch = Scripted([item(i) for i in range(25)], changes={4: change})
    (result,) = (
        ListPasses(PageExecutor(fetch, LIMITS, label="t"), staging)
        .run([Stream(TRANSACTIONS)])
        .values()
    )
    assert fetch.asked[:6] == [0, 10, 20] * 2
    assert result.passes == 2
    # Unparsed: the first re-read's first and third pages (the same bytes as the pass's), and
    # every page of the second pass's re-read.
    assert fetch.unparsed == 2 + 3
    (payload,) = staging.conn.execute(
        "SELECT payload::VARCHAR FROM raw.stage WHERE id = 'i-012'"
    ).fetchone()
    assert json.loads(payload)["note"] == "changed"


def test_a_re_read_that_answers_the_first_page_for_every_skip_still_fails_as_paging_forever(
    staging,
):
    """The pass is sound; its re-read gets the first page's bytes for every skip. Those bodies
    are known (not parsed again), and the repeat check still counts them."""
    fetch = Scripted([item(i) for i in range(45)])
    answers = []

    def stuck(endpoint: ListEndpoint, skip: int, stats: ListStats, known: Container[int] = ()):
        answers.append(skip)
        answer = fetch(endpoint, 0 if len(answers) > 5 else skip, stats, known)
        answer.skip = skip  # as fetch_page answers: the page asked for
        return answer

    with pytest.raises(PagingError, match=r"the same items as skip=0: the server ignores `skip`"):
        ListPasses(PageExecutor(stuck, LIMITS, label="t"), staging).run([Stream(TRANSACTIONS)])
    assert answers[:5] == [0, 10, 20, 30, 40]  # the pass
    assert fetch.unparsed == len(answers) - 5  # every page of the re-read: page 0's bytes
