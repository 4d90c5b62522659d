"""An analyst's process: reads the published DuckDB file until told to stop, then reports.

    python -m fieldsales_dagster_tests.analyst_reader <database> <hold|reopen> <stop file>

``hold`` opens one read-only connection and keeps querying it (a notebook left open); ``reopen``
opens a fresh read-only connection for every query (a BI tool's short queries). Each query reads
raw and core tables in one statement; the report is one JSON line with every distinct answer,
the number of queries and any error.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import duckdb

SNAPSHOT = """
    SELECT
        (SELECT count(*) FROM raw.transactions),
        (SELECT count(*) FROM core.transactions),
        (SELECT count(*) FROM raw.events),
        (SELECT count(*) FROM core.events)
"""


def main(database: str, mode: str, stop_file: str) -> None:
    stop = Path(stop_file)
    seen: dict[str, int] = {}
    errors: list[str] = []
    queries = 0
    held = duckdb.connect(database, read_only=True) if mode == "hold" else None

    def snapshot() -> list[int]:
        if held is not None:
            return list(held.execute(SNAPSHOT).fetchone())
        with duckdb.connect(database, read_only=True) as conn:
            return list(conn.execute(SNAPSHOT).fetchone())

    print(json.dumps({"ready": snapshot()}), flush=True)
    while not stop.exists():
        try:
            key = json.dumps(snapshot())
            seen[key] = seen.get(key, 0) + 1
        except duckdb.Error as exc:
            errors.append(str(exc))
        queries += 1
        time.sleep(0.005)
    print(json.dumps({"seen": seen, "queries": queries, "errors": errors}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
