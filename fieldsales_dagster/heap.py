"""Handing back the heap's free pages to the system (glibc's ``malloc_trim``; elsewhere nothing):
pages read in the pager's threads and freed in the writer's stayed in glibc's arenas; trimming
took a 1M-transaction run's peak from 729 to 660 MiB (docs/performance.md)."""

import ctypes

TRIM_EVERY_PAGES = 16  # pages of a load between two trims, which cost a few ms each

try:  # glibc's, in the process's own symbols
    _malloc_trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
except OSError:
    _malloc_trim = None


def release_free_memory() -> None:
    if _malloc_trim:
        _malloc_trim(0)
