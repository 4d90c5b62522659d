"""When a paged list is complete: a pure rule over one pass's counts, tested as a table.

A pass is complete when its distinct ids equal the server's final total and nothing shows that the
list moved under it: no total that went down, no id that came twice with different content, no
page boundary where two pages held different items. A count alone is never the proof: a pass the
rule accepts is read again, and an item it holds that the re-read no longer lists as it was
(``unverified``) is a list that moved, judged as copies that differ are. Otherwise
the list is repaired where it grew (head, tail, and the gaps a pass's out-of-order answers left),
paged again, or, after
``max_list_passes``, refused with what the server sent. The executor (``pager.py``) applies the
rule to every list it pages: the full lists and the per-event transaction lists alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from fieldsales_dagster.client.errors import FieldSalesAPIError

#: Repair rounds (head and tail re-fetched) of one pass before the list is paged again.
MAX_REPAIRS = 5


class IncompleteListError(FieldSalesAPIError):
    """Every pass over a list disagreed with the server's total."""


class Action(StrEnum):
    ACCEPT = "accept"
    REPAIR = "repair"
    REPAGE = "repage"
    FAIL = "fail"


def _named(count: int, named: tuple[str, ...], sentence: str, sep: str = ", ") -> str:
    """``sentence`` with the count and the few ``named`` ("and N more"); "" for none."""
    if not count:
        return ""
    more = f"{'; ' if sep == '; ' else ' '}and {count - len(named)} more"
    return sentence.format(count, sep.join(named) + (more if count > len(named) else ""))


@dataclass(frozen=True)
class PassFacts:
    """What one pass (with its repairs so far) staged, and what the server said meanwhile."""

    rows: int
    distinct: int
    #: Distinct totals in order of arrival; empty when the server reports none.
    totals_seen: tuple[int, ...]
    #: A request sent after another had answered reported a smaller total.
    total_decreased: bool
    pass_number: int
    max_passes: int
    repairs: int = 0
    max_repairs: int = MAX_REPAIRS
    #: ``(rows, distinct)`` of the previous pass of this load, if there was one.
    previous: tuple[int, int] | None = None
    #: Ids that came more than once with different content, and a few of them.
    differing: int = 0
    differing_ids: tuple[str, ...] = ()
    #: Page boundaries where two pages held different items, and a few of them in words.
    shifts: int = 0
    shifted_at: tuple[str, ...] = ()
    #: Items the pass holds that a re-read of the whole list after it no longer listed as they
    #: were (deleted, or their content changed), and a few of their ids.
    unverified: int = 0
    unverified_ids: tuple[str, ...] = ()

    @property
    def total(self) -> int | None:
        """The server's final total. Answers arrive out of order: while the total only grew,
        the largest is the newest (an answer computed before an insert may arrive after it)."""
        if not self.totals_seen:
            return None
        return self.totals_seen[-1] if self.total_decreased else max(self.totals_seen)

    def moves(self) -> str:
        """The signs that the list moved while it was paged, in words ("" for none)."""
        signs = [
            _named(
                self.differing,
                self.differing_ids,
                "{} ids came more than once with different content ({})",
            ),
            _named(
                self.shifts,
                self.shifted_at,
                "the list shifted under {} page boundaries "
                "(position: the id one page held there, then the id another held: {})",
                "; ",
            ),
            _named(
                self.unverified,
                self.unverified_ids,
                "{} items the pass holds were gone or changed when the list was read again ({})",
            ),
        ]
        return "; ".join(sign for sign in signs if sign)

    def describe(self) -> str:
        """What the server sent, in words."""
        repeated = self.rows - self.distinct
        sent = f"{self.rows} items with {self.distinct} distinct ids ({repeated} sent twice)"
        if self.moves():
            sent += f"; {self.moves()}"
        if self.total is None:
            return sent + "; the server reports no total"
        if len(self.totals_seen) == 1:
            return sent + f"; every page reported a total of {self.total}"
        seen = ", ".join(map(str, self.totals_seen))
        return sent + f"; the total moved while it was paged: {seen}"


@dataclass(frozen=True)
class Verdict:
    action: Action
    reason: str
    #: For ``REPAIR``: re-fetch ``[0, head)`` and everything from ``tail_from`` to the end.
    head: int = 0
    tail_from: int = 0


def judge_pass(facts: PassFacts) -> Verdict:
    """Accept a pass, repair it, page the list again, or fail; with the reason.

    A pass is complete when its distinct ids equal the server's final total and nothing shows a
    deleted item was fetched (a total that went down). A list that only grew is repaired where
    it grows (head and tail) rather than paged again; the same counts in two passes in a row
    are the server's list as it is (say, ids it lists twice), not a list that moves.
    """
    f = facts
    # Copies that differ, or pages that disagree at a boundary: the list moved under the pass,
    # so no count can vouch for it. A list whose total only grew is repaired below instead: its
    # new items shift the boundaries, and the head, tail and gap windows fetch what they pushed.
    grew = len(f.totals_seen) > 1 and not f.total_decreased
    if f.differing or f.unverified or (f.shifts and not grew):
        return _again_or_fail(
            f,
            f"{f.moves()}: the list moved while it was paged",
            f"{f.describe()}: the list kept changing while it was paged, so no pass holds a set of "
            "items the server had at one moment",
        )
    if f.total is None:
        repeated = f.rows - f.distinct
        if repeated == 0:
            return Verdict(Action.ACCEPT, "every id came once; the server reports no total")
        if f.previous == (f.rows, f.distinct):
            return Verdict(
                Action.ACCEPT, f"the server lists {repeated} ids twice, the same in two passes"
            )
        return _again_or_fail(
            f,
            f"{repeated} ids came twice: the list moved",
            f"{f.describe()}, differently in each of {f.pass_number} passes: the list kept "
            "changing while it was paged",
        )
    return _against_total(f, f.total)


def _again_or_fail(f: PassFacts, again: str, fail: str) -> Verdict:
    """Page the list again, or, after the last pass, fail."""
    if f.pass_number < f.max_passes:
        return Verdict(Action.REPAGE, again)
    return Verdict(Action.FAIL, fail)


def _against_total(f: PassFacts, total: int) -> Verdict:
    """``judge_pass`` for a list with a total and no sign that it moved inside."""
    last = f.pass_number >= f.max_passes
    same_as_before = f.previous == (f.rows, f.distinct)
    repeated = f.rows - f.distinct
    moved = len(f.totals_seen) > 1
    if f.distinct == total:
        if repeated == 0 and not moved:
            return Verdict(Action.ACCEPT, "the distinct ids equal a total that stayed the same")
        if not f.total_decreased and moved:
            return Verdict(Action.ACCEPT, "the list only grew and every id it counts is here")
        if not moved and (same_as_before or last):
            return Verdict(
                Action.ACCEPT, f"the distinct ids equal a stable total; {repeated} repeats dropped"
            )
    if f.distinct < total and moved and not f.total_decreased and f.repairs < f.max_repairs:
        missing = total - f.distinct
        return Verdict(
            Action.REPAIR,
            f"{missing} ids missing from a list that grew",
            head=2 * missing,
            tail_from=max(0, total - 2 * missing),
        )
    if f.distinct < total and not moved and f.rows == total and same_as_before:
        return Verdict(
            Action.ACCEPT,
            f"the server lists {repeated} ids twice and counts every copy in its total, "
            "the same in two passes",
        )
    if moved:
        why = "the list kept changing while it was paged"
    elif f.distinct > total:
        why = "the server lists more distinct ids than its total counts"
    elif f.rows < total:
        why = "the server delivers fewer items than its total counts"
    else:
        why = "the server lists ids more than once, differently in each pass"
    return _again_or_fail(f, f.describe(), f"{f.describe()}: {why}")


def gap_windows(
    answers: list[tuple[int, int, int | None]], total_now: int, slack: int = 2
) -> list[tuple[int, int]]:
    """Where a pass may have missed items because the list grew while pages were in flight.

    Two adjacent pages answered out of order around an insertion ahead of them: the lower one saw
    the longer list (its items shifted further), so the items between the two were in neither.
    Each such boundary gives the window ``[start, stop)`` (today's positions) that holds them.
    ``answers`` holds ``(skip, items, total)`` per answered page.
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
