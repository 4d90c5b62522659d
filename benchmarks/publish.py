"""Publish a working database over the analysts' copy once, and say what it cost.

    python -m benchmarks.publish --database <analysts' file> [--compare-compact]

Uses ``FieldSalesWarehouse.publish`` exactly as a run's end does (checkpoint, copy beside the
analysts' file, fsync, atomic rename). Prints one JSON line: seconds, the working and published
file sizes, the copy method; with ``--compare-compact`` also the cost of the alternative that
rewrites the database compactly (``COPY FROM DATABASE`` into a new file, then the same rename).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import duckdb

from fieldsales_dagster.warehouse.resource import FieldSalesWarehouse, _fsync_dir


def compact_copy(working: Path, published: Path) -> dict[str, float]:
    """The alternative: DuckDB rewrites every table into a fresh file, which is renamed in."""
    temporary = published.with_name(f".{published.name}.compact")
    started = time.monotonic()
    with duckdb.connect(":memory:") as conn:
        conn.execute(f"ATTACH '{working}' AS working (READ_ONLY)")
        conn.execute(f"ATTACH '{temporary}' AS compact")
        conn.execute("COPY FROM DATABASE working TO compact")
        conn.execute("DETACH compact")
    with open(temporary, "rb+") as f:
        os.fsync(f.fileno())
    size = temporary.stat().st_size
    os.replace(temporary, published)
    _fsync_dir(published.parent)
    return {"seconds": round(time.monotonic() - started, 3), "bytes": size}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--database", required=True, help="the analysts' file (FIELDSALES_DUCKDB_PATH)")
    p.add_argument("--compare-compact", action="store_true")
    args = p.parse_args(argv)
    warehouse = FieldSalesWarehouse(database=args.database)
    working = warehouse.working_path
    publication = warehouse.publish()
    if publication is None:
        raise SystemExit(f"nothing to publish: {working} does not exist")
    result: dict[str, object] = {
        "seconds": round(publication.seconds, 3),
        "working_bytes": working.stat().st_size,
        "published_bytes": publication.bytes,
        "copy_method": publication.copy_method,
    }
    if args.compare_compact:
        result["compact"] = compact_copy(working, Path(args.database))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
