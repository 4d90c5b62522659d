"""Each list complete, or refused: pass over it, judge the pass, repair or page it again, and read
an accepted pass once more.

The fetching is the pager's (``client/pager.py``: windows, page checks, one thread pool for many
lists); the verdicts are ``completeness.py``'s. ``ListPasses`` runs them for the lists of one
load, pages stored in a ``Staging`` table:

* after a pass, each list's distinct ids (counted where the pages were stored,
  ``Staging.counts``) must equal the server's final total, no id may have come twice with
  different content (``Staging.differing``) and no page boundary may have shifted, or the list
  is repaired or paged again, within ``max_list_passes`` passes;
* a pass the rule accepts is read once more (``_verify``): no count, boundary or stop position
  shows two changes that cancel each other's shift inside one page; the re-read does. It costs a
  second fetch of every page, but only the pages whose bytes changed are parsed again.
"""

from __future__ import annotations

from array import array
from collections.abc import Hashable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from fieldsales_dagster.client.pager import NAMED_IDS, ListPass, ListStats, PageExecutor, Stream
from fieldsales_dagster.loading.completeness import (
    Action,
    IncompleteListError,
    PassFacts,
    Verdict,
    gap_windows,
    judge_pass,
)

if TYPE_CHECKING:
    import numpy as np

    from fieldsales_dagster.loading.raw_load import Staging

Judged = list[tuple[ListPass, PassFacts, Verdict]]


@dataclass
class ListResult:
    """A list the rule accepted: its last pass's stats and the rule's verdict."""

    stats: ListStats
    facts: PassFacts
    verdict: Verdict
    passes: int
    repairs: int


def digests_gone(held: array[int], seen: array[int]) -> np.ndarray:
    """The digests in ``held`` that ``seen`` lacks: of the items a pass kept, those its re-read
    did not list (distinct, sorted).

    A sorted search, not ``np.setdiff1d``: its hash-based ``unique`` of two arrays of random
    64-bit digests took 2.2 CPU-s at 1M items, this 0.4.
    """
    import numpy as np  # where a load runs: the definitions load without it

    kept = np.frombuffer(held, np.int64)
    listed = np.sort(np.frombuffer(seen, np.int64))
    if not listed.size:
        return np.unique(kept)
    at = np.minimum(np.searchsorted(listed, kept), listed.size - 1)
    return np.unique(kept[listed[at] != kept])


class ListPasses:
    """Pages lists with ``executor`` into ``staging`` until the rule accepts each of them."""

    def __init__(self, executor: PageExecutor, staging: Staging):
        self.executor = executor
        self.staging = staging
        self.log = executor.log

    def run(self, lists: list[Stream]) -> dict[Hashable, ListResult]:
        """Page every list, each until the rule accepts it; raises ``IncompleteListError``."""
        executor = self.executor
        results: dict[Hashable, ListResult] = {}
        previous: dict[Hashable, tuple[int, int]] = {}
        todo = lists
        executor.lists = len(lists)
        for number in range(1, executor.limits.max_list_passes + 1):
            passes = [ListPass(stream, ListStats(parent=executor.spent)) for stream in todo]
            self._stage(passes)
            repage: list[Stream] = []
            for lp, facts, verdict in self._verify(self._judge(passes, number, previous)):
                if verdict.action is Action.ACCEPT:
                    results[lp.stream.key] = ListResult(
                        lp.stats, facts, verdict, number, lp.repairs
                    )
                elif verdict.action is Action.FAIL:
                    endpoint = lp.stream.endpoint
                    raise IncompleteListError(
                        f"{endpoint.name} ({lp.stream.url}): after "
                        f"{facts.pass_number} passes, {verdict.reason}. {endpoint.raw_table} was "
                        "left as it was. Run again later; if the server's list is stable, report "
                        "its counts to the Field-Sales service (or raise max_list_passes)."
                    )
                else:
                    previous[lp.stream.key] = (facts.rows, facts.distinct)
                    name = lp.stream.endpoint.name
                    self.log(f"{name}: pass {number}: {verdict.reason}; paging it again.")
                    repage.append(lp.stream)
            if not repage:
                break
            self.staging.forget([stream.key for stream in repage])
            todo = repage
        return results

    def _judge(
        self, passes: list[ListPass], number: int, previous: dict[Hashable, tuple[int, int]]
    ) -> Judged:
        """The rule's verdict on each pass, after the repairs it asks for."""
        judged: Judged = []
        unjudged = passes
        while unjudged:
            counts = self.staging.counts()
            repairing: list[ListPass] = []
            windows: list[ListPass] = []
            for lp in unjudged:
                facts = self._facts(lp, counts.get(lp.stream.key, (0, 0)), number, previous)
                verdict = judge_pass(facts)
                if verdict.action is Action.REPAIR:
                    repairing.append(lp)
                    windows.extend(self._repairs(lp, verdict, facts, number))
                else:
                    judged.append((lp, facts, verdict))
            self._stage(windows)
            unjudged = repairing
        return judged

    def _facts(
        self,
        lp: ListPass,
        counted: tuple[int, int],
        number: int,
        previous: dict[Hashable, tuple[int, int]],
    ) -> PassFacts:
        rows, distinct = counted
        differing, differing_ids = (
            self.staging.differing(lp.stream.key) if rows > distinct else (0, [])
        )
        shifts = lp.stats.shifts
        return PassFacts(
            rows=rows,
            distinct=distinct,
            totals_seen=tuple(lp.stats.totals_seen),
            total_decreased=lp.stats.total_decreased,
            pass_number=number,
            max_passes=self.executor.limits.max_list_passes,
            repairs=lp.repairs,
            previous=previous.get(lp.stream.key),
            differing=differing,
            differing_ids=tuple(differing_ids),
            shifts=len(shifts),
            shifted_at=tuple(f"{at}: {a} then {b}" for at, a, b in shifts[:NAMED_IDS]),
        )

    def _verify(self, judged: Judged) -> Judged:
        """Read every list the rule accepted once more, storing nothing, and judge it again.

        Each item the pass holds must be listed again, with the same content, after the pass
        ended: then it was listed at that moment (an id deleted does not come back, content that
        changed does not change back). With the rule's count, that is the whole list of that
        moment. A shift anywhere (an item deleted and another inserted inside one page, the
        total moved by a third change) leaves an item the re-read no longer lists, and the list
        is paged again. Items the re-read lists beyond the pass's are a list that grew after it:
        a busy tenant's inserts do not fail it, and the items a re-read's pages answered out of
        order around an insert skipped (``gap_windows``) are read once more before an item
        counts as gone.
        """
        spent = self.executor.spent
        held = [lp for lp, _, verdict in judged if verdict.action is Action.ACCEPT]
        rereads = {
            id(lp): ListPass(lp.stream, ListStats(parent=spent), known=lp.bodies or {})
            for lp in held
        }
        self._drain(list(rereads.values()))
        self._drain(
            [
                ListPass(lp.stream, again.stats, start, stop, share=again)
                for lp in held
                if digests_gone(lp.digests, (again := rereads[id(lp)]).digests).size
                for start, stop in gap_windows(
                    again.stats.answers, (again.stats.totals_seen or [0])[-1]
                )
            ]
        )
        out = []
        for lp, facts, verdict in judged:
            if id(lp) in rereads:
                gone = digests_gone(lp.digests, rereads[id(lp)].digests)
                if gone.size:
                    named = self.staging.ids_of(lp.stream.key, set(gone.tolist()))
                    facts = replace(facts, unverified=int(gone.size), unverified_ids=tuple(named))
                    verdict = judge_pass(facts)
                else:
                    reason = f"{verdict.reason}; read again, the list still held every item"
                    verdict = replace(verdict, reason=reason)
            out.append((lp, facts, verdict))
        return out

    def _drain(self, passes: list[ListPass]) -> None:
        """Fetch every page of ``passes`` and keep only their digests."""
        for _ in self.executor.fetch(passes):
            pass

    def _repairs(
        self, lp: ListPass, verdict: Verdict, facts: PassFacts, number: int
    ) -> list[ListPass]:
        """The windows that re-fetch the head and the tail of a list that grew (and, the first
        time, the gaps its out-of-order answers left); they count into the pass's stats."""
        lp.repairs += 1
        self.log(
            f"{lp.stream.endpoint.name}: pass {number}: {verdict.reason}; re-fetching items "
            f"0-{verdict.head} and from {verdict.tail_from} (repair {lp.repairs})."
        )
        windows: list[tuple[int, int | None]] = [(0, verdict.head)]
        if lp.repairs == 1:  # boundaries the pass's pages straddled while the list grew
            windows += gap_windows(lp.stats.answers, facts.total or 0)
        windows.append((verdict.tail_from, None))
        return [ListPass(lp.stream, lp.stats, start, stop, share=lp) for start, stop in windows]

    def _stage(self, passes: list[ListPass]) -> None:
        if passes:
            self.staging.write(self.executor.fetch(passes))
