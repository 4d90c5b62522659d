"""A deployment's first run and its nightly run, for this checkout and, side by side, another one.

    python -m benchmarks.deployment --sizes 100000,1000000 [--before PATH] [--pairs 1]
    python -m benchmarks.deployment --sizes 3000000 --only-nightly-figures

``--before`` is another checkout of this project with its own ``.venv`` (``pip install -e .``),
for example an earlier revision in a git worktree. For each size one demo API serves both sides:
generation 0 for each side's first run (every asset the refresh job selects, into an empty
warehouse), then generation 1 (~1% of the events changed) for each side's next run, the nightly
one. Sides alternate (before, after, before, after) so that a drift of the machine's speed falls
on both.

Each run is ``dagster asset materialize -m fieldsales_dagster`` in a fresh process, measured as a
whole: wall, CPU of its process tree (user + system), peak RSS of the tree, the bytes it wrote to
storage (``benchmarks/io_written.py``), and the warehouse on disk after it: every file the
deployment's storage settings point at (for a lake: the catalog and the data path; for a
single-file warehouse: that file and what sits beside it). The report goes to
``benchmarks/results/<UTC timestamp>-deployment.md``.
"""

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

from benchmarks.harness import BIN, ROOT, DemoAPI, Measurement, fmt_bytes, measure

RESULTS_DIR = Path(__file__).resolve().parent / "results"
#: What the nightly schedule's job refreshes: every asset but the lake's weekly upkeep (a
#: selection that names nothing absent, so an older checkout without the upkeep takes it too).
SELECTION = "*"
LAKE_SELECTION = "not key:ducklake_upkeep"


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


def _run(side: Side, api: DemoAPI, where: Path, run: str, base_env: dict[str, str]) -> Row:
    storage, paths = _storage_env(side, where)
    home = where / "dagster_home"
    env = {
        **base_env,
        **storage,
        "FIELDSALES_BASE_URL": api.base_url,
        "FIELDSALES_API_TOKEN": api.token,
        "FIELDSALES_TOKEN_STORE": str(where / "token.json"),
        "DAGSTER_HOME": str(home),
    }
    if not home.exists():
        _home(side, home, env)
    selection = LAKE_SELECTION if side.has_lake_only() else SELECTION
    io_json = where / f"{run}.io.json"
    argv = [sys.executable, str(ROOT / "benchmarks" / "io_written.py"), str(io_json), "--"]
    argv += [str(side.bin / "dagster"), "asset", "materialize", "-m", "fieldsales_dagster"]
    argv += ["--select", selection]
    # From the side's own root: Dagster puts the working directory first on the import path.
    m = measure(f"{side.name}-{run}", argv, where / f"{run}.log", env, server=api, cwd=side.root)
    written = json.loads(io_json.read_text())["write_bytes"] if io_json.exists() else 0
    return Row(side.name, run, m, written, sum(_du(p) for p in paths if p.exists()))


def _table(size: int, rows: list[Row], sides: list[Side]) -> list[str]:
    lines = [
        f"## {size:,} transactions",
        "",
        "| side | run | exit | wall s | CPU s | peak RSS (tree) | written by the run "
        "| warehouse after | added by the run |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    before_size: dict[str, int] = {}
    for r in rows:
        added = r.size - before_size.get(r.side, 0)
        before_size[r.side] = r.size
        lines.append(
            f"| {r.side} | {r.run} | {r.m.returncode} | {r.m.wall_s:.1f} | {r.m.cpu_s:.1f} | "
            f"{fmt_bytes(r.m.peak_rss)} | {fmt_bytes(r.written)} | {fmt_bytes(r.size)} | "
            f"{fmt_bytes(added)} |"
        )
    if len(sides) == 2:
        lines += ["", "| run | wall before/after | CPU before/after |", "|---|---:|---:|"]
        for run in ("first", "nightly"):
            pair = {r.side: r for r in rows if r.run == run}
            b, a = pair.get("before"), pair.get("after")
            if b and a and b.m.ok and a.m.ok:
                lines.append(
                    f"| {run} | {b.m.wall_s / a.m.wall_s:.2f} | {b.m.cpu_s / a.m.cpu_s:.2f} |"
                )
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.deployment", description=__doc__)
    p.add_argument("--sizes", default="100000,1000000")
    p.add_argument("--before", type=Path, default=None, help="another checkout with its .venv")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--live-server", action="store_true", help="no --prerender (less memory)")
    p.add_argument("--work-dir", type=Path, default=None)
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
        *(f"- {s.name}: {s.root} at {s.revision()}" for s in sides),
        "- each run: `dagster asset materialize -m fieldsales_dagster` (every asset the "
        "refresh job selects), default settings, the warehouse in the work folder",
        "",
    ]
    for size in (int(s) for s in args.sizes.split(",")):
        rows: list[Row] = []
        token = secrets.token_hex(24)
        for generation, run in ((0, "first"), (1, "nightly")):
            log = work / f"{size}" / f"demo_api-{generation}.log"
            with DemoAPI(
                size,
                token,
                log,
                seed=args.seed,
                generation=generation,
                prerender=not args.live_server,
            ) as api:
                for side in sides:
                    print(f"{size:,} {side.name} {run} ...", end=" ", flush=True)
                    row = _run(side, api, work / f"{size}" / side.name, run, base_env)
                    rows.append(row)
                    print(f"exit {row.m.returncode}, {row.m.wall_s:.1f} s", flush=True)
        report += _table(size, rows, sides) + [""]
    text = "\n".join(report)
    RESULTS_DIR.mkdir(exist_ok=True)
    (RESULTS_DIR / f"{stamp}-deployment.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
