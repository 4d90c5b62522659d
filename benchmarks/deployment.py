"""A deployment's first run and its nightly run, for this checkout and, side by side, another one.

    python -m benchmarks.deployment --sizes 100000,1000000 [--before PATH] [--pairs 1]
    python -m benchmarks.deployment --sizes 3000000 --only-nightly-figures

``--before`` is another checkout of this project with its own ``.venv`` (``pip install -e .``),
for example an earlier revision in a git worktree. For each size one demo API serves both sides:
generation 0 for each side's first run (every asset the refresh job selects, into an empty
warehouse), then each side's run again with nothing changed (the same server), then generation 1
(~1% of the events changed; ``--changed-events N``: N of them at every size, so that two sizes
compare what the same changes cost) for each side's next run, the nightly one. Sides alternate
(before, after, before, after) so that a drift of the machine's speed falls on both. Beside them,
Dagster's own floor: ``dagster asset materialize -f benchmarks/noop_defs.py --select noop`` (one
asset that does nothing), whose CPU a run with nothing changed is held to (at most twice it), and
Dagster's cost of this project's graph alone (``benchmarks/skeleton_defs.py``: the same assets,
checks and steps, each doing nothing, with this checkout's settings): what of an unchanged run
neither the project's code nor its data cost.

Each run is ``dagster asset materialize -m fieldsales_dagster`` in a fresh process, measured as a
whole: wall, CPU of its process tree (user + system), peak RSS of the tree, the bytes it wrote to
storage (``benchmarks/io_written.py``; and of those, what reached the disk: a file deleted before it
was written out, a spill or a staging table, is cancelled), and the warehouse on disk after it:
every file the deployment's storage settings point at (for a lake: the catalog and the data path;
for a single-file warehouse: that file and what sits beside it), the requests and bytes the raw
assets fetched (their ``requests`` and ``bytes_fetched`` metadata in the run's event log), and the
CPU of each step (``step_cpu.py``), shown for the run with nothing changed, and whether the run left
its tables exact: ``raw.transactions``, ``raw.events`` and ``raw.event_groups``, and
``core.transactions`` and ``core.events``, each one row per item the server holds (rows and distinct
ids equal to the server's count, ``harness.expected_counts``). The report goes to
``benchmarks/results/<UTC timestamp>-deployment.md``."""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import subprocess
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import duckdb

from benchmarks.harness import (
    BIN,
    ROOT,
    DemoAPI,
    Expected,
    Measurement,
    expected_counts,
    fmt_bytes,
    measure,
    prepare_dagster_home,
)
from benchmarks.step_cpu import StepCpu, step_cpu
from fieldsales_dagster.warehouse.lake import Lake
from fieldsales_dagster.warehouse.lake import connect as connect_lake

RESULTS_DIR = Path(__file__).resolve().parent / "results"
#: What the nightly schedule's job refreshes: every asset but the lake's weekly upkeep (a
#: selection that names nothing absent, so an older checkout without the upkeep takes it too).
SELECTION = "*"
LAKE_SELECTION = "not key:ducklake_upkeep"
NOOP_DEFS = Path(__file__).resolve().parent / "noop_defs.py"
SKELETON_DEFS = "benchmarks.skeleton_defs"
#: (run, demo API generation): the first run, the same again with nothing changed, the nightly.
RUNS = ((0, "first"), (0, "unchanged"), (1, "nightly"))
#: The tables a run must leave holding each of the server's items once, by list: (table, id).
EXACT = {
    "transactions": (("raw.transactions", "id"), ("core.transactions", "transaction_id")),
    "events": (("raw.events", "id"), ("core.events", "event_id")),
    "event_groups": (("raw.event_groups", "id"),),
}


@dataclass
class Side:
    """One checkout: where its package and its ``dagster`` command live."""

    name: str
    root: Path

    @property
    def bin(self) -> Path:
        return BIN if self.root == ROOT else self.root / ".venv" / "bin"

    def revision(self) -> str:
        out = subprocess.run(
            ["git", "-C", str(self.root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
        )
        return out.stdout.strip() or "?"

    def has_lake_only(self) -> bool:
        """A checkout whose only storage is the lake has no publish step."""
        return not (self.root / "fieldsales_dagster" / "assets" / "publish.py").exists()


@dataclass
class Row:
    side: str
    run: str
    m: Measurement
    written: int
    size: int
    requests: int = 0
    fetched: int = 0
    steps: tuple[StepCpu, ...] = ()
    exact: str = "–"
    #: Of ``written``, the bytes of files deleted before they reached the disk (spills, staging).
    cancelled: int = 0


def _du(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _storage_env(side: Side, where: Path) -> tuple[dict[str, str], list[Path]]:
    """The settings that put this side's warehouse under ``where``, and the paths it takes."""
    if side.has_lake_only():
        (where / "lake").mkdir(parents=True, exist_ok=True)
        catalog = where / "fieldsales.ducklake.sqlite"
        env = {
            "FIELDSALES_DUCKLAKE_CATALOG": f"sqlite:{catalog}",
            "FIELDSALES_DUCKLAKE_DATA_PATH": str(where / "lake"),
        }
        return env, [catalog, where / "lake"]
    database = where / "fieldsales.duckdb"
    return {"FIELDSALES_DUCKDB_PATH": str(database)}, [database]


def _exact(storage: dict[str, str], expected: Expected) -> str:
    """``yes``, or each table of ``EXACT`` whose rows or distinct ids are not the server's count."""
    if "FIELDSALES_DUCKDB_PATH" in storage:
        conn = duckdb.connect(storage["FIELDSALES_DUCKDB_PATH"], read_only=True)
    else:
        catalog, data_path = (storage[f"FIELDSALES_DUCKLAKE_{k}"] for k in ("CATALOG", "DATA_PATH"))
        conn = connect_lake(Lake(catalog, data_path), read_only=True)
    wrong = []
    with conn:
        for name, tables in EXACT.items():
            want = getattr(expected, name)
            for table, key in tables:
                sql = f"SELECT count(*), count(DISTINCT {key}) FROM {table}"
                rows, ids = conn.execute(sql).fetchone() or (0, 0)
                if (rows, ids) != (want, want):
                    wrong.append(f"{table}: {rows:,} rows, {ids:,} ids, want {want:,}")
    return "; ".join(wrong) or "yes"


def _home(side: Side, home: Path, env: dict[str, str]) -> None:
    """An initialised DAGSTER_HOME holding the side's own dagster.yaml, untimed."""
    write = (
        "import sys, pathlib; from fieldsales_dagster.demo_run import prepare_dagster_home as p; "
    )
    write += "p(pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]))"
    for command in (
        [str(side.bin / "python"), "-c", write, str(home), str(side.root / "dagster.yaml")],
        [str(side.bin / "dagster"), "instance", "migrate"],
    ):
        subprocess.run(
            command,
            env={**env, "DAGSTER_HOME": str(home)},
            cwd=side.root,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            check=True,
        )


def _env(side: Side, api: DemoAPI, where: Path, home: Path, base: dict[str, str]) -> dict[str, str]:
    """The settings of a deployment of ``side`` whose warehouse and token sit under ``where``."""
    return {
        **base,
        **_storage_env(side, where)[0],
        "FIELDSALES_BASE_URL": api.base_url,
        "FIELDSALES_API_TOKEN": api.token,
        "FIELDSALES_TOKEN_STORE": str(where / "token.json"),
        "DAGSTER_HOME": str(home),
    }


def _selection(side: Side) -> str:
    return LAKE_SELECTION if side.has_lake_only() else SELECTION


def _run(
    side: Side, api: DemoAPI, expected: Expected, where: Path, run: str, base_env: dict[str, str]
) -> Row:
    storage, paths = _storage_env(side, where)
    home = where / "dagster_home"
    env = _env(side, api, where, home, base_env)
    if not home.exists():
        _home(side, home, env)
    io_json = where / f"{run}.io.json"
    argv = [sys.executable, str(ROOT / "benchmarks" / "io_written.py"), str(io_json), "--"]
    argv += [str(side.bin / "dagster"), "asset", "materialize", "-m", "fieldsales_dagster"]
    argv += ["--select", _selection(side)]
    # From the side's own root: Dagster puts the working directory first on the import path.
    m = measure(f"{side.name}-{run}", argv, where / f"{run}.log", env, server=api, cwd=side.root)
    io = json.loads(io_json.read_text()) if io_json.exists() else {}
    written, cancelled = io.get("write_bytes", 0), io.get("cancelled_write_bytes", 0)
    size = sum(_du(p) for p in paths if p.exists())
    steps = tuple(step_cpu(home, m.cpu_samples, m.rss_samples))
    exact = _exact(storage, expected) if m.ok else "–"
    return Row(side.name, run, m, written, size, *_fetched(home), steps, exact, cancelled)


def _fetched(home: Path) -> tuple[int, int]:
    """Requests and bytes the latest run's raw assets fetched, from their metadata."""
    import dagster as dg

    requests = fetched = 0
    with dg.DagsterInstance.from_config(str(home)) as instance:
        runs = instance.get_runs(limit=1)
        of_type = dg.DagsterEventType.ASSET_MATERIALIZATION
        for entry in instance.all_logs(runs[0].run_id, of_type=of_type) if runs else ():
            metadata = entry.asset_materialization.metadata
            if "requests" in metadata and "bytes_fetched" in metadata:
                requests += int(metadata["requests"].value)
                fetched += int(metadata["bytes_fetched"].value)
    return requests, fetched


def _noop(where: Path, base_env: dict[str, str]) -> Row:
    """Dagster's own floor: one asset that does nothing, on a prepared ``DAGSTER_HOME``."""
    home = where / "noop_home"
    prepare_dagster_home(home, base_env)
    io_json = where / "noop.io.json"
    argv = [sys.executable, str(ROOT / "benchmarks" / "io_written.py"), str(io_json), "--"]
    argv += [str(BIN / "dagster"), "asset", "materialize", "-f", str(NOOP_DEFS), "--select", "noop"]
    m = measure("noop", argv, where / "noop.log", {**base_env, "DAGSTER_HOME": str(home)})
    io = json.loads(io_json.read_text()) if io_json.exists() else {}
    written, cancelled = io.get("write_bytes", 0), io.get("cancelled_write_bytes", 0)
    steps = tuple(step_cpu(home, m.cpu_samples))
    return Row("dagster", "noop", m, written, 0, steps=steps, cancelled=cancelled)


def _graph(side: Side, api: DemoAPI, where: Path, base_env: dict[str, str]) -> Row:
    """Dagster's own cost of this project's graph: its assets, checks and steps, each step doing
    nothing (``skeleton_defs.py``), with ``side``'s settings (the definitions load from them). Its
    second run is measured, on a home of its own: the unchanged run is a deployment's second."""
    home = where / "graph_home"
    env = _env(side, api, where, home, base_env)
    prepare_dagster_home(home, env)
    argv = [str(BIN / "dagster"), "asset", "materialize", "-m", SKELETON_DEFS]
    argv += ["--select", _selection(side)]
    for attempt in ("graph-first", "graph"):
        m = measure(attempt, argv, where / f"{attempt}.log", env, cwd=ROOT)
    return Row("dagster", "graph", m, 0, 0, steps=tuple(step_cpu(home, m.cpu_samples)))


def _table(size: int, rows: list[Row], sides: list[Side]) -> list[str]:
    lines = [
        f"## {size:,} transactions",
        "",
        "| side | run | exit | wall s | CPU s | peak RSS (tree) | written by the run "
        "| of it, reached the disk | warehouse after | added by the run | requests | fetched "
        "| exact rows |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    before_size: dict[str, int] = {}
    for r in rows:
        added = r.size - before_size.get(r.side, 0)
        before_size[r.side] = r.size
        lines.append(
            f"| {r.side} | {r.run} | {r.m.returncode} | {r.m.wall_s:.1f} | {r.m.cpu_s:.1f} | "
            f"{fmt_bytes(r.m.peak_rss)} | {fmt_bytes(r.written)} | "
            f"{fmt_bytes(r.written - r.cancelled)} | {fmt_bytes(r.size)} | "
            f"{fmt_bytes(added)} | {r.requests:,} | {fmt_bytes(r.fetched)} | {r.exact} |"
        )
    floor = {r.run: r.m.cpu_s for r in rows if r.run in ("noop", "graph") and r.m.ok}
    for r in rows:
        if "noop" in floor and r.run == "unchanged" and r.m.ok:
            line = f"{r.side}, unchanged / noop CPU: {r.m.cpu_s / floor['noop']:.2f}"
            if "graph" in floor:
                line += (
                    f"; Dagster's graph alone / noop: {floor['graph'] / floor['noop']:.2f}; "
                    f"unchanged / graph: {r.m.cpu_s / floor['graph']:.2f}"
                )
            lines += ["", line]
    lines += _nightly_ratios(rows)
    lines += ["", "| step | " + " | ".join(f"{r.side} {r.run} CPU s" for r in rows) + " |"]
    lines.append("|---|" + "---:|" * len(rows))
    cpu = [{s.step: s.cpu_s for s in r.steps} for r in rows]
    by = next((c for c, r in zip(cpu, rows, strict=True) if r.run == "unchanged"), cpu[0])
    names = sorted({step for by_step in cpu for step in by_step}, key=lambda s: -by.get(s, 0))
    for step in names:
        lines.append(f"| `{step}` | " + " | ".join(f"{c.get(step, 0):.2f}" for c in cpu) + " |")
    outside = [r.m.cpu_s - sum(s.cpu_s for s in r.steps) for r in rows]
    lines.append("| outside the steps | " + " | ".join(f"{c:.2f}" for c in outside) + " |")
    if len(sides) == 2:
        lines += ["", "| run | wall before/after | CPU before/after |", "|---|---:|---:|"]
        for _, run in RUNS:
            pair = {r.side: r for r in rows if r.run == run}
            b, a = pair.get("before"), pair.get("after")
            if b and a and b.m.ok and a.m.ok:
                lines.append(
                    f"| {run} | {b.m.wall_s / a.m.wall_s:.2f} | {b.m.cpu_s / a.m.cpu_s:.2f} |"
                )
    return lines


def _nightly_ratios(rows: list[Row]) -> list[str]:
    """Per side, the nightly run over the first: CPU, bytes written, and the bytes each wrote
    above the run with nothing changed (what every run writes whatever changed: Dagster's event
    log, in SQLite here, is most of it), and what each added to the warehouse."""
    lines = []
    for side in dict.fromkeys(r.side for r in rows if r.run == "nightly"):
        by = {r.run: r for r in rows if r.side == side and r.m.ok}
        first, floor, nightly = by.get("first"), by.get("unchanged"), by.get("nightly")
        if not (first and floor and nightly):
            continue
        added = nightly.size - floor.size  # the first run began with no warehouse
        lines += [
            "",
            f"{side}, nightly / first: CPU {nightly.m.cpu_s / first.m.cpu_s:.2f}; written "
            f"{nightly.written / first.written:.3f}; written above the unchanged run's "
            f"{fmt_bytes(floor.written)}: {fmt_bytes(nightly.written - floor.written)} / "
            f"{fmt_bytes(first.written - floor.written)} = "
            f"{(nightly.written - floor.written) / max(1, first.written - floor.written):.3f}; "
            f"added to the warehouse: {fmt_bytes(added)} / {fmt_bytes(first.size)} = "
            f"{added / max(1, first.size):.3f}",
        ]
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.deployment", description=__doc__)
    p.add_argument("--sizes", default="100000,1000000")
    p.add_argument("--before", type=Path, default=None, help="another checkout with its .venv")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--live-server", action="store_true", help="no --prerender (less memory)")
    p.add_argument("--work-dir", type=Path, default=None)
    p.add_argument(
        "--changed-events",
        type=int,
        default=None,
        help="events changed for the nightly run (default: 1%% of them): the same number at "
        "every size compares what the same changes cost on a larger tenant",
    )
    args = p.parse_args(argv)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    work = args.work_dir or ROOT / "benchmarks" / "work" / f"{stamp}-deployment"
    sides = [Side("after", ROOT)]
    if args.before:
        sides.insert(0, Side("before", args.before.resolve()))
    base_env = {
        k: v for k, v in os.environ.items() if not k.startswith(("FIELDSALES_", "DAGSTER_"))
    }
    report = [
        f"# A deployment's first and nightly run, {stamp}",
        "",
        f"- command: `python -m benchmarks.deployment {' '.join(argv or sys.argv[1:])}`",
        f"- machine: {os.cpu_count()} cores, {platform.platform()}",
        *(
            f"- {s.name}: {s.root.name if s.root != ROOT else 'this checkout'} at {s.revision()}"
            for s in sides
        ),
        "- each run: `dagster asset materialize -m fieldsales_dagster` (every asset the "
        "refresh job selects), default settings, the warehouse in the work folder",
        "",
    ]
    for size in (int(s) for s in args.sizes.split(",")):
        rows: list[Row] = []
        token = secrets.token_hex(24)
        for generation in sorted({generation for generation, _ in RUNS}):
            log = work / f"{size}" / f"demo_api-{generation}.log"
            with DemoAPI(
                size,
                token,
                log,
                seed=args.seed,
                generation=generation,
                changed_events=args.changed_events,
                prerender=not args.live_server,
            ) as api:
                expected = expected_counts(api)
                for side, run in [(s, r) for g, r in RUNS if g == generation for s in sides]:
                    print(f"{size:,} {side.name} {run} ...", end=" ", flush=True)
                    row = _run(side, api, expected, work / f"{size}" / side.name, run, base_env)
                    rows.append(row)
                    print(f"exit {row.m.returncode}, {row.m.wall_s:.1f} s", flush=True)
            if generation == RUNS[-1][0]:  # the graph with this side's (the last's) settings
                rows.append(_graph(sides[-1], api, work / f"{size}" / "graph", base_env))
        rows.append(_noop(work / f"{size}", base_env))
        report += _table(size, rows, sides) + [""]
    text = "\n".join(report)
    RESULTS_DIR.mkdir(exist_ok=True)
    (RESULTS_DIR / f"{stamp}-deployment.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
