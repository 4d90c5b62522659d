"""Handing back what the steps before have done with: DuckDB's cache, and the heap's free pages.

A raw load reads each page (a few MB) in the pager's threads and frees it in the writer's: glibc
keeps such freed chunks in the arena that made them, so the process's RSS kept what a load had
freed into the next step. ``malloc_trim(0)`` returns every arena's free pages; it is called every
``TRIM_EVERY_PAGES`` pages of a load and when a step opens the warehouse. At 1M transactions
the run's peak RSS went from 729 to 660 MiB; the heavy tenant's raw load from 808 to 625 MiB, for
1.9 CPU-s more (4%: the pages given back are faulted in again;
``benchmarks/results/20261127T065300Z-heap-trim-1000000.md``). Elsewhere (musl, macOS) it does
nothing.

DuckDB's pool keeps the blocks of the lake's files and of the run's shared event decode after
the steps that read them, so a later step had less of ``duckdb_memory_limit`` and the process
held both: ``release_step_memory`` empties the pool first (1M: the run's peak 630 -> 584 MiB;
docs/performance.md).
"""

import functools
from collections.abc import Callable

import duckdb

from fieldsales_dagster.warehouse.quoting import sql_literal
from fieldsales_dagster.warehouse.rows import one_row

#: Pages of a load between two trims: each trim costs a few milliseconds.
TRIM_EVERY_PAGES = 16
#: DuckDB's pool is emptied above this share of its limit; below, loading it again costs more
#: than it frees (unloading at every step cost the 88k run ~1 s in 14).
UNLOAD_ABOVE_SHARE = 0.25


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


def release_step_memory(
    conn: duckdb.DuckDBPyConnection, memory_limit: str, limit_bytes: float
) -> None:
    """What a step does as it opens: empty DuckDB's pool of what ended queries left in it, when
    that passes ``UNLOAD_ABOVE_SHARE`` of the limit, then ``release_free_memory``.

    DuckDB evicts what no running query holds when its limit is lowered (in-memory tables to the
    temp folder, to be read again from there); the limit is then set back. With a query running,
    DuckDB refuses the lower limit and nothing changes.
    """
    (cached,) = one_row(conn, "SELECT coalesce(sum(memory_usage_bytes), 0) FROM duckdb_memory()")
    if cached > UNLOAD_ABOVE_SHARE * limit_bytes:
        try:
            conn.execute("SET memory_limit = '1MB'")
        except duckdb.OutOfMemoryException:
            pass  # pinned by a running query: not now
        finally:
            conn.execute(f"SET memory_limit = {sql_literal(memory_limit)}")
    release_free_memory()
