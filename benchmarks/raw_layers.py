"""The raw load of transactions, layer by layer, in this process (no Dagster, no CLI start-up).

Each layer runs alone and is timed in CPU seconds (``time.process_time``: every thread of this
process, DuckDB's included; the server's CPU is not counted) and wall seconds:

* ``fetch``: one pass of the pager (HTTP, envelope decode, ids), pages thrown away;
* ``batch``: the same, each page also made into the Arrow batch ``load_list`` hands DuckDB;
* ``load``: ``load_list`` end to end into a fresh working file, then CHECKPOINT (the insert alone
  is ``load`` minus ``batch``).

The DuckDB files are attached with the row group size the file engine used (``ROW_GROUP_SIZE``)
and the warehouse's default ``memory_limit``.

    FIELDSALES_API_TOKEN=... python -m benchmarks.raw_layers --base-url http://127.0.0.1:8765

Prints one line per layer, then one JSON line with every figure. The token comes from the
environment only.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import duckdb

from fieldsales_dagster.client.api import FieldSalesAPI
from fieldsales_dagster.client.endpoints import TRANSACTIONS
from fieldsales_dagster.client.envelope import ListStats
from fieldsales_dagster.loading.lists import ListPass, Stream, key_decoder
from fieldsales_dagster.loading.raw_load import load_list, page_batch, page_executor, page_schema
from fieldsales_dagster.warehouse.warehouse import FieldSalesWarehouse

LAYERS = ("fetch", "batch", "load")


#: Rows per row group of the DuckDB files compared here (the retired file engine used 16,384).
ROW_GROUP_SIZE = 16384


def _connect(path: Path) -> duckdb.DuckDBPyConnection:
    memory_limit = FieldSalesWarehouse.model_fields["memory_limit"].default
    conn = duckdb.connect(config={"memory_limit": memory_limit, "preserve_insertion_order": False})
    conn.execute(f"ATTACH '{path}' AS bench (ROW_GROUP_SIZE {ROW_GROUP_SIZE})")
    conn.execute("USE bench")
    conn.execute("CREATE SCHEMA IF NOT EXISTS raw")
    return conn


def _fetch(api: FieldSalesAPI, batches: bool) -> tuple[int, int]:
    stats = ListStats()
    decode, schema = key_decoder(TRANSACTIONS), page_schema(TRANSACTIONS)
    executor = page_executor(api, label="fetch")
    for _, page in executor.fetch([ListPass(Stream(TRANSACTIONS), stats)]):
        if batches:
            page_batch(page, schema, decode)
    return stats.items, stats.bytes


def _load(api: FieldSalesAPI, db: Path) -> tuple[int, int]:
    conn = _connect(db)
    report = load_list(api, conn, TRANSACTIONS)
    conn.execute("CHECKPOINT")
    conn.close()
    return report.rows, report.bytes


def _timed(run: Callable[[], object]) -> dict[str, float]:
    cpu, wall = time.process_time(), time.monotonic()
    run()
    return {"cpu_s": time.process_time() - cpu, "wall_s": time.monotonic() - wall}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--layers", default=",".join(LAYERS), help="comma-separated subset")
    parser.add_argument("--work-dir", type=Path, default=None, help="default: a temporary one")
    args = parser.parse_args(argv)
    token = os.environ.get("FIELDSALES_API_TOKEN")
    if not token:
        parser.error("set FIELDSALES_API_TOKEN")
    layers = [layer for layer in args.layers.split(",") if layer]
    if unknown := set(layers) - set(LAYERS):
        parser.error(f"unknown layers: {', '.join(sorted(unknown))}")
    api = FieldSalesAPI(base_url=args.base_url, api_token=token, use_token_store=False)

    with tempfile.TemporaryDirectory(dir=args.work_dir, prefix="raw-layers-") as tmp:
        work = Path(tmp)
        figures: dict[str, object] = {}
        counted: dict[str, int] = {}

        def fetch(batches: bool) -> None:
            counted["items"], counted["bytes"] = _fetch(api, batches)

        def load(db: Path) -> None:
            counted["items"], counted["bytes"] = _load(api, db)

        runs: dict[str, Callable[[], object]] = {
            "fetch": lambda: fetch(False),
            "batch": lambda: fetch(True),
            "load": lambda: load(work / "load.duckdb"),
        }
        for layer in LAYERS:
            if layer not in layers:
                continue
            figures[layer] = result = _timed(runs[layer])
            gb = counted.get("bytes", 0) / 1e9
            result["cpu_s_per_gb"] = result["cpu_s"] / gb if gb else None
            print(
                f"{layer:7s} {result['cpu_s']:7.2f} CPU-s {result['wall_s']:7.2f} s wall"
                + (f"  {result['cpu_s_per_gb']:.2f} CPU-s/GB" if gb else ""),
                file=sys.stderr,
            )
    figures["items"] = counted.get("items")
    figures["bytes"] = counted.get("bytes")
    figures["maxrss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
