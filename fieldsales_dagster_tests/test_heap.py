"""``release_free_memory``: the heap's free pages go back to the system (glibc's malloc_trim)."""

import platform
import subprocess
import sys
import textwrap

# In a process of its own: what it allocates and frees is its heap alone. 200 chunks of 2 MB are
# freed under a chunk still held (so glibc cannot shrink its heap from the top by itself), after
# a 16 MB chunk freed once raised glibc's mmap threshold above them, as a load's freed page
# bodies do: the RSS keeps them until the trim.
PROBE = textwrap.dedent(
    """
    import os
    from fieldsales_dagster.heap import release_free_memory

    def rss_mib():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    big = bytearray(16 * 2**20); del big
    chunks = [bytearray(2 * 2**20) for _ in range(200)]
    pin = bytearray(2**20)
    before = rss_mib()
    del chunks
    freed = rss_mib()
    release_free_memory()
    print(before, freed, rss_mib())
    """
)


def test_the_freed_heap_goes_back_to_the_system():
    from fieldsales_dagster import heap

    if platform.libc_ver()[0] != "glibc":  # musl, macOS: no malloc_trim, so nothing is called
        assert heap._malloc_trim is None
        return
    assert heap._malloc_trim is not None
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True
    ).stdout
    before, freed, trimmed = map(float, out.split())
    assert freed > before - 100, "glibc gave the chunks back by itself: the probe tests nothing"
    assert trimmed < freed - 300, (before, freed, trimmed)


def test_it_does_nothing_where_the_c_library_has_no_trim(monkeypatch):
    from fieldsales_dagster import heap

    monkeypatch.setattr(heap, "_malloc_trim", None)
    heap.release_free_memory()  # no error
