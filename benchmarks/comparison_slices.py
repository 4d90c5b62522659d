"""What comparing a list row by row costs, by slice count (``raw_load.list_changes``).

    python -m benchmarks.comparison_slices --from-lake DIR --events 250000 --slices 4,8,12,16,24

``DIR`` holds a lake with ``raw.events`` (``fieldsales.ducklake.sqlite`` and ``lake/``, as a
deployment benchmark's first run leaves it). Its events, repeated under new ids up to ``--events``
(the demo API's 10M tenant has 250,000), become a stored list and a staged one in which 1% of the
payloads changed, in a lake of the work folder; each slice count is then compared in a fresh
process at ``--memory-limit``: its CPU seconds (user + system), its peak RSS and the rows found
changed, or the error it failed with."""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

from fieldsales_dagster.loading.raw_load import list_changes
from fieldsales_dagster.warehouse.lake import Lake, connect

STORED, STAGED = "raw.events", "raw._fs_stage_events"


def _lake(where: Path) -> Lake:
    (where / "lake").mkdir(parents=True, exist_ok=True)
    return Lake(f"sqlite:{where / 'fieldsales.ducklake.sqlite'}", str(where / "lake"))


def _build(source: Path, work: Path, events: int) -> None:
    with connect(_lake(work)) as conn:
        conn.execute(f"ATTACH 'ducklake:{_lake(source).catalog}' AS src (READ_ONLY)")
        (held,) = conn.execute(f"SELECT count(*) FROM src.{STORED}").fetchone()
        copies = -(-events // held)
        conn.execute(
            f"CREATE SCHEMA IF NOT EXISTS raw; CREATE OR REPLACE TABLE {STORED} AS SELECT "
            f"id || '-' || k AS id, payload, loaded_at FROM src.{STORED}, range({copies}) r(k) "
            f"LIMIT {events}; "
            f"CREATE OR REPLACE TABLE {STAGED} AS SELECT id, CASE WHEN hash(id) % 100 = 0 THEN "
            "json_object('changed', payload) ELSE payload END AS payload, "
            f"loaded_at + INTERVAL 1 DAY AS loaded_at FROM {STORED}"
        )
        rows, size = conn.execute(f"SELECT count(*), sum(strlen(payload)) FROM {STORED}").fetchone()
        print(f"{rows:,} rows, {size / 1e6:,.0f} MB of payloads", flush=True)


def _measure(work: Path, slices: int, memory_limit: str) -> dict[str, object]:
    config = {"memory_limit": memory_limit, "temp_directory": str(work / "db.tmp")}
    with connect(_lake(work), config) as conn:
        before, started = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        try:
            result: object = list_changes(conn, STAGED, STORED, "_fs_list_changes", slices)
        except Exception as exc:  # reported, as the load would replace the list whole
            result = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
        after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    wall = time.perf_counter() - started
    return {"cpu_s": cpu, "wall_s": wall, "peak_rss_mib": after.ru_maxrss / 1024, "rows": result}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.comparison_slices", description=__doc__)
    p.add_argument("--from-lake", type=Path)
    p.add_argument("--events", type=int, default=250_000)
    p.add_argument("--slices", default="4,8,12,16,24")
    p.add_argument("--memory-limit", default="192MB")
    p.add_argument("--work-dir", type=Path, required=True)
    p.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a measured child process
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(_measure(args.work_dir, args.one, args.memory_limit)))
        return 0
    if args.from_lake:
        _build(args.from_lake, args.work_dir, args.events)
    print(f"| slices | CPU s | wall s | peak RSS | rows changed (at {args.memory_limit}) |")
    print("|---:|---:|---:|---:|---|")
    for slices in (int(s) for s in args.slices.split(",")):
        child = [sys.executable, "-m", "benchmarks.comparison_slices", "--one", str(slices)]
        child += ["--work-dir", str(args.work_dir), "--memory-limit", args.memory_limit]
        out = subprocess.run(child, capture_output=True, text=True, check=True).stdout
        r = json.loads(out.splitlines()[-1])
        print(
            f"| {slices} | {r['cpu_s']:.1f} | {r['wall_s']:.1f} | {r['peak_rss_mib']:.0f} MiB "
            f"| {r['rows']} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
