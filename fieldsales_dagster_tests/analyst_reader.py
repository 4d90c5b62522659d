"""An analyst's process: reads the lake until told to stop, then reports.

    python -m fieldsales_dagster_tests.analyst_reader <catalog> <data path> <hold|reopen> <stop>

``hold`` opens one read-only connection and holds one transaction (``BEGIN TRANSACTION``, a
notebook left open) while it keeps reading; ``reopen`` opens a fresh read-only connection for
every read, each read one transaction (a BI tool's short queries). A read queries raw, core and
mart tables one statement after the other (``READS``); the report is one JSON line with every
distinct answer (a dict by ``READS``' names), how often each came, and any error.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path

import duckdb

from fieldsales_dagster.warehouse.warehouse import FieldSalesWarehouse

#: What a read asks, one statement each: the ids of a raw table and of the core table built from
#: it (a count and a hash of the set), and the mart's transaction count.
READS = {
    "raw.events": "SELECT count(*), bit_xor(hash(id::VARCHAR)) FROM raw.events",
    "core.events": "SELECT count(*), bit_xor(hash(event_id::VARCHAR)) FROM core.events",
    "raw.transactions": "SELECT count(*), bit_xor(hash(id::VARCHAR)) FROM raw.transactions",
    "core.transactions": (
        "SELECT count(*), bit_xor(hash(transaction_id::VARCHAR)) FROM core.transactions"
    ),
    "mart.daily_sales": "SELECT sum(transactions)::BIGINT FROM mart.daily_sales",
}


def main(catalog: str, data_path: str, mode: str, stop_file: str) -> None:
    lake = FieldSalesWarehouse(ducklake_catalog=catalog, ducklake_data_path=data_path)
    stop = Path(stop_file)
    seen: dict[str, int] = {}
    errors: list[str] = []
    reads = 0
    stack = contextlib.ExitStack()
    held = None
    if mode == "hold":
        held = stack.enter_context(lake.read_connection())
        held.execute("BEGIN TRANSACTION")

    def read(conn: duckdb.DuckDBPyConnection) -> dict[str, list[int]]:
        return {name: list(conn.execute(sql).fetchone()) for name, sql in READS.items()}

    def answer() -> dict[str, list[int]]:
        if held is not None:
            return read(held)
        with lake.read_connection() as conn:
            conn.execute("BEGIN TRANSACTION")
            return read(conn)

    print(json.dumps({"ready": answer()}), flush=True)
    while not stop.exists():
        try:
            key = json.dumps(answer(), sort_keys=True)
            seen[key] = seen.get(key, 0) + 1
        except duckdb.Error as exc:
            errors.append(str(exc))
        reads += 1
        time.sleep(0.005)
    stack.close()
    print(json.dumps({"seen": seen, "reads": reads, "errors": errors}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:5])
