"""An analyst's process: reads the lake until told to stop, then reports.

    python -m fieldsales_dagster_tests.analyst_reader <catalog> <data path> <hold|reopen> <stop>

``hold`` opens one read-only connection and holds a snapshot (``BEGIN TRANSACTION``, a notebook
left open) while it keeps querying; ``reopen`` opens a fresh read-only connection for every
query (a BI tool's short queries). Each query reads raw and core tables in one statement; the
report is one JSON line with every distinct answer, the number of queries and any error.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path

import duckdb

from fieldsales_dagster.warehouse.warehouse import FieldSalesWarehouse

SNAPSHOT = """
    SELECT
        (SELECT count(*) FROM raw.transactions),
        (SELECT count(*) FROM core.transactions),
        (SELECT count(*) FROM raw.events),
        (SELECT count(*) FROM core.events)
"""


def main(catalog: str, data_path: str, mode: str, stop_file: str) -> None:
    lake = FieldSalesWarehouse(ducklake_catalog=catalog, ducklake_data_path=data_path)
    stop = Path(stop_file)
    seen: dict[str, int] = {}
    errors: list[str] = []
    queries = 0
    stack = contextlib.ExitStack()
    held = None
    if mode == "hold":
        held = stack.enter_context(lake.read_connection())
        held.execute("BEGIN TRANSACTION")

    def snapshot() -> list[int]:
        if held is not None:
            return list(held.execute(SNAPSHOT).fetchone())
        with lake.read_connection() as conn:
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
    stack.close()
    print(json.dumps({"seen": seen, "queries": queries, "errors": errors}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:5])
