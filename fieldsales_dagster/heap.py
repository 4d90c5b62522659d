"""Handing back the heap's free pages to the system.

A raw load reads each page (a few MB) in the pager's threads and frees it in the writer's: glibc
keeps such freed chunks in the arena that made them, so the process's RSS kept what a load had
freed into the next step. ``malloc_trim(0)`` returns every arena's free pages; it is called every
``TRIM_EVERY_PAGES`` pages of a load and when a step opens the warehouse. At 1M transactions
the run's peak RSS went from 729 to 660 MiB; the heavy tenant's raw load from 808 to 625 MiB, for
1.9 CPU-s more (4%: the pages given back are faulted in again;
``benchmarks/results/20261127T065300Z-heap-trim-1000000.md``). Elsewhere (musl, macOS) it does
nothing. DuckDB's cache is the warehouse's (``warehouse.release_step_memory``).
"""

import functools
from collections.abc import Callable

#: Pages of a load between two trims: each trim costs a few milliseconds.
TRIM_EVERY_PAGES = 16


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    import ctypes

    try:
        return ctypes.CDLL(None).malloc_trim  # glibc's, in the process's own symbols
    except (OSError, AttributeError):
        return None


def release_free_memory() -> None:
    """Return the heap's free pages to the system (glibc); elsewhere, nothing."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
