"""Handing back the heap's free pages to the system (glibc's ``malloc_trim``; elsewhere nothing):
pages read in the pager's threads and freed in the writer's stayed in glibc's arenas; trimming
took a 1M-transaction run's peak from 729 to 660 MiB (docs/performance.md)."""

import functools
from collections.abc import Callable

TRIM_EVERY_PAGES = 16  # pages of a load between two trims, which cost a few ms each


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    import ctypes

    try:
        return ctypes.CDLL(None).malloc_trim  # glibc's, in the process's own symbols
    except (OSError, AttributeError):
        return None


def release_free_memory() -> None:
    if trim := _malloc_trim():
        trim(0)
