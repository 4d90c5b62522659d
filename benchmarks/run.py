"""Floor vs this project vs dlt, on the same demo API process and the same data.

    python -m benchmarks.run [--sizes 100000,1000000] [--runs 1]
                             [--only floor,project,dlt_fast,dlt_default,latency]

For each size (transactions; events = size/40, event groups = events/10) one demo API process
serves every measured command. Each command runs as a subprocess; its wall time, CPU time, peak
RSS of its whole process tree and the rows it loaded are reported in a markdown table, printed and
written to ``benchmarks/results/<UTC timestamp>-<size>.md`` and ``benchmarks/results/latest.md``
(``latest.md`` only by a run of the sizes' steps: ``--only shapes`` and the like leave it).
Logs and databases go under ``benchmarks/work/<UTC timestamp>/`` (git-ignored).
See ``benchmarks/README.md`` for what each row means.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import re
import secrets
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import duckdb
import psutil

from benchmarks.harness import (
    BIN,
    ROOT,
    BenchmarkError,
    DemoAPI,
    Expected,
    Measurement,
    compile_project,
    expected_counts,
    fmt_bytes,
    measure,
    prepare_dagster_home,
)
from benchmarks.step_cpu import StepCpu, step_cpu
from fieldsales_dagster.client.api import FieldSalesAPI  # noqa: E402
from fieldsales_dagster.demo_api.data import PROFILES
from fieldsales_dagster.warehouse.lake import Lake
from fieldsales_dagster.warehouse.lake import connect as connect_lake

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_DIR = BENCH_DIR / "results"
WORK_DIR = BENCH_DIR / "work"
# The project's default page size, which the floor and dlt copy.
PAGE_SIZE = FieldSalesAPI.model_fields["page_size"].default

STEPS = ("floor", "project_raw", "project_all", "dlt_fast", "dlt_default")
ONLY_CHOICES = (*STEPS, "project", "latency", "incremental", "shapes")
RAW_SELECTION = "raw_events,raw_transactions,raw_event_groups"
#: What the refresh job (the nightly schedule's run) selects: every asset but a lake's upkeep.
REFRESH_SELECTION = "not key:ducklake_upkeep"
#: Core assets whose materializations say how they were built (whole, or following changes).
FOLLOWING_CORE = ("core_transactions", "core_custom_report_results")
NOOP_DEFS = BENCH_DIR / "noop_defs.py"
PROJECT_TABLES = {
    "transactions": "raw.transactions",
    "events": "raw.events",
    "event_groups": "raw.event_groups",
}
DLT_TABLES = {
    "transactions": "fieldsales.transactions",
    "events": "fieldsales.events",
    "event_groups": "fieldsales.event_groups",
}
#: Environment the harness sets itself; inherited values would skew a run.
OWN_ENV = (
    "FIELDSALES_BASE_URL",
    "FIELDSALES_API_TOKEN",
    "FIELDSALES_DUCKDB_PATH",
    "FIELDSALES_TOKEN_STORE",
    "FIELDSALES_PAGE_SIZE",
    "FIELDSALES_CONCURRENCY",
    "FIELDSALES_DUCKLAKE_CATALOG",
    "FIELDSALES_DUCKLAKE_DATA_PATH",
    "FIELDSALES_DUCKLAKE_PASSWORD",
    "DAGSTER_HOME",
)
STEP_FAILURE_LINE = re.compile(r'STEP_FAILURE - Execution of step "([^"]+)" failed')
DUCKDB_ERROR = re.compile(r"DuckDB: (.*)|OutOfMemoryException: (.*)")
STEP_LINE = re.compile(r'Finished execution of step "([^"]+)" in ((?:[\d.]+(?:ms|h|m|s))+)')
DURATION_PART = re.compile(r"([\d.]+)(ms|h|m|s)")
IN_PROCESS_LINE = re.compile(r"Finished steps in process \(pid: \d+\) in ((?:[\d.]+(?:ms|h|m|s))+)")
LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [+-]\d{4}) - dagster - .* - RUN_START -")


class Interrupted(Exception):
    """SIGTERM: unwind like Ctrl-C so every process this run started is ended."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise Interrupted()


# --- one measured step -----------------------------------------------------------------------


@dataclass
class StepResult:
    step: str
    label: str
    m: Measurement
    loaded: dict[str, tuple[int, int]] = field(default_factory=dict)  # table -> (rows, distinct)
    exact: bool | None = None
    rows: int = 0
    note: str = ""
    dagster_steps: list[tuple[str, float]] = field(default_factory=list)
    #: Wall and CPU seconds of each Dagster step, from the run's event log (``step_cpu.py``).
    step_cpu: list[StepCpu] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.m.ok

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.m.wall_s if self.ok and self.m.wall_s > 0 else float("nan")


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path):
        self.args = args
        self.work = work
        self.python = sys.executable
        self.base_env = {k: v for k, v in os.environ.items() if k not in OWN_ENV}
        self.base_env["PYTHONUNBUFFERED"] = "1"
        self.base_env["RUNTIME__DLTHUB_TELEMETRY"] = "false"
        self.token_values: list[str] = []
        self.interrupted = False
        self._last: dict[str, StepResult] = {}

    # -- helpers --------------------------------------------------------------------------------

    def _env(self, api: DemoAPI, **extra: str) -> dict[str, str]:
        return {
            **self.base_env,
            "FIELDSALES_BASE_URL": api.base_url,
            "FIELDSALES_API_TOKEN": api.token,
            **extra,
        }

    def scrub(self, text: str) -> str:
        for token in self.token_values:
            text = text.replace(token, "***")
        return text

    def _count(self, database: Path | Lake, tables: dict[str, str], id_column: str) -> dict:
        loaded: dict[str, tuple[int, int]] = {}
        with _read_only(database) as conn:
            for name, table in tables.items():
                try:
                    rows, distinct = conn.execute(
                        f'SELECT count(*), count(DISTINCT "{id_column}") FROM {table}'
                    ).fetchone()
                except duckdb.Error:
                    continue
                loaded[name] = (int(rows), int(distinct))
        return loaded

    def _verify(
        self, r: StepResult, expected: Expected, database: Path | Lake, tables, id_col
    ) -> None:
        if not r.ok:
            return
        try:
            r.loaded = self._count(database, tables, id_col)
        except duckdb.Error as exc:
            r.exact = False
            r.note = f"could not read {database.name}: {exc}"
            return
        want = {
            "transactions": expected.transactions,
            "events": expected.events,
            "event_groups": expected.event_groups,
        }
        r.rows = sum(rows for rows, _ in r.loaded.values())
        r.exact = all(r.loaded.get(name) == (n, n) for name, n in want.items())
        if not r.exact:
            r.note = "; ".join(
                f"{name}: {r.loaded[name][0]} rows/{r.loaded[name][1]} ids, want {n}"
                if name in r.loaded
                else f"{name}: table missing"
                for name, n in want.items()
                if r.loaded.get(name) != (n, n)
            )

    def _cleanup_db(self, database: Path) -> None:
        if self.args.keep_databases:
            return
        # A DuckDB file (dlt's), or the lake a project step named by this path.
        lake = _lake_of(database)
        for path in (database, *database.parent.glob(Path(lake.catalog[7:]).name + "*")):
            if path.is_file():
                path.unlink()
        shutil.rmtree(lake.data_path, ignore_errors=True)

    # -- the steps ------------------------------------------------------------------------------

    def floor(self, api: DemoAPI, expected: Expected, where: Path, concurrency: int = 8):
        argv = [
            self.python,
            "-m",
            "benchmarks.floor",
            "--base-url",
            api.base_url,
            "--page-size",
            str(PAGE_SIZE),
            "--concurrency",
            str(concurrency),
        ]
        m = self._measure("floor", argv, where / "floor.log", self._env(api), api)
        r = StepResult("floor", "floor (fetch + discard)", m)
        if not m.ok:
            return r
        try:
            out = json.loads(m.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            r.m.returncode = r.m.returncode or -2
            r.note = "no result line on stdout"
            return r
        want_pages = expected.pages(PAGE_SIZE)
        got_pages = {name: out[name]["pages"] for name in want_pages}
        totals_ok = (
            out["transactions"]["total"] == expected.transactions
            and out["event_groups"]["total"] == expected.event_groups
        )
        r.exact = totals_ok and got_pages == want_pages
        r.rows = expected.rows if r.exact else 0
        r.note = (
            f"{out['requests']} requests, {out['bytes'] / 1e6:,.0f} MB"
            if r.exact
            else f"pages {got_pages}, want {want_pages}; totals ok: {totals_ok}"
        )
        r.m.extra["bytes"] = out["bytes"]
        return r

    def project(
        self,
        api: DemoAPI,
        expected: Expected,
        where: Path,
        name: str,
        selection: str,
        label: str,
        keep: bool = False,
        database: Path | None = None,
        home: Path | None = None,
        lake: Lake | None = None,
        count_writes: bool = False,
        **env: str,
    ) -> StepResult:
        # A database the caller passes in is the caller's to delete.
        keep = keep or database is not None
        database = database or where / f"{name}.duckdb"
        lake = lake or _lake_of(database)
        if lake.is_sqlite:
            Path(lake.data_path).mkdir(parents=True, exist_ok=True)  # a data path set must exist
        # A DAGSTER_HOME the caller passes in was prepared by an earlier step (a second run of the
        # same deployment); a fresh one is prepared, untimed, as a deployment has it.
        if home is None:
            home = where / f"{name}.dagster_home"
            prepare_dagster_home(home, self.base_env)
        argv = [
            str(BIN / "dagster"),
            "asset",
            "materialize",
            "-m",
            "fieldsales_dagster",
            "--select",
            selection,
        ]
        writes = where / f"{name}.io.json"
        if count_writes:  # the bytes the run's process tree wrote (benchmarks/io_written.py)
            argv = [self.python, "-m", "benchmarks.io_written", str(writes), "--", *argv]
        run_env = self._env(
            api,
            FIELDSALES_DUCKLAKE_CATALOG=lake.catalog,
            FIELDSALES_DUCKLAKE_DATA_PATH=lake.data_path,
            FIELDSALES_TOKEN_STORE=str(where / f"{name}.token.json"),
            DAGSTER_HOME=str(home),
            **env,
        )
        started_at = time.time()
        m = self._measure(name, argv, where / f"{name}.log", run_env, api)
        r = StepResult(name, label, m)
        r.dagster_steps, run_start = _dagster_steps(m.log_path)
        r.m.extra["in_run_s"] = _in_process_s(m.log_path)
        r.step_cpu = step_cpu(home, m.cpu_samples)
        if run_start is not None:
            r.m.extra["startup_s"] = max(0.0, run_start - started_at)
        if count_writes and writes.exists():
            r.m.extra["io"] = json.loads(writes.read_text())
        self._verify(r, expected, lake, PROJECT_TABLES, "id")
        every_asset = selection in ("*", REFRESH_SELECTION)
        if r.ok and every_asset:
            r.m.extra["core_tables"] = _core_table_count(lake)
        if r.ok:
            keys = RAW_SELECTION.split(",") + (list(FOLLOWING_CORE) if every_asset else [])
            r.m.extra["refresh"] = _latest_metadata(home, keys)
        if not keep:
            self._cleanup_db(database)
        return r

    def dlt(self, api: DemoAPI, expected: Expected, where: Path, mode: str) -> StepResult:
        name = f"dlt_{mode}"
        database = where / f"{name}.duckdb"
        argv = [
            self.python,
            str(BENCH_DIR / "dlt_load.py"),
            "--page-size",
            str(PAGE_SIZE),
            "--base-url",
            api.base_url,
            "--database",
            str(database),
            "--mode",
            mode,
            "--pipelines-dir",
            str(where / f"{name}.pipelines"),
        ]
        m = self._measure(name, argv, where / f"{name}.log", self._env(api), api)
        label = (
            "dlt fast (max_table_nesting=0, jsonl)"
            if mode == "fast"
            else "dlt default (nested child tables)"
        )
        r = StepResult(name, label, m)
        r.m.extra["dlt_stages"] = _dlt_stages(m.stdout)
        self._verify(r, expected, database, DLT_TABLES, "_id")
        if r.ok and mode == "default":
            r.m.extra["child_tables"] = _dlt_child_tables(database)
        self._cleanup_db(database)
        shutil.rmtree(where / f"{name}.pipelines", ignore_errors=True)
        return r

    def _measure(
        self, name: str, argv: list[str], log: Path, env: dict[str, str], api: DemoAPI
    ) -> Measurement:
        return measure(
            name,
            argv,
            log,
            env,
            server=api,
            timeout_s=float(self.args.timeout),
            memory_cap=int(self.args.memory_cap_gib * 2**30),
        )

    # -- a whole size -------------------------------------------------------------------------

    def run_size(self, size: int, steps: list[str]) -> tuple[Expected, dict[str, list[StepResult]]]:
        where_size = self.work / f"size-{size}"
        token = secrets.token_hex(24)
        self.token_values.append(token)
        results: dict[str, list[StepResult]] = {s: [] for s in steps}
        print(f"\n== {size:,} transactions: starting the demo API", flush=True)
        with DemoAPI(
            size,
            token,
            where_size / "demo_api.log",
            seed=self.args.seed,
            prerender=not self.args.live_server,
        ) as api:
            expected = expected_counts(api)
            print(
                f"   server holds {expected.transactions:,} transactions, {expected.events:,} "
                f"events, {expected.event_groups:,} event groups",
                flush=True,
            )
            try:
                for run in range(1, self.args.runs + 1):
                    where = where_size / f"run-{run}"
                    for step in steps:
                        if step == "dlt_default" and size > self.args.dlt_default_max:
                            continue
                        if step == "dlt_fast" and size > self.args.dlt_fast_max:
                            continue
                        print(f"   run {run}: {step} ...", end=" ", flush=True)
                        r = self._one(step, api, expected, where)
                        self._last[step] = r
                        results[step].append(r)
                        print(_progress_line(r), flush=True)
            except (KeyboardInterrupt, Interrupted):
                self._interrupted()
        return expected, results

    def _interrupted(self) -> None:
        self.interrupted = True
        print("\ninterrupted: stopping the running command and the demo API", file=sys.stderr)

    def _one(self, step: str, api: DemoAPI, expected: Expected, where: Path) -> StepResult:
        if step == "floor":
            return self.floor(api, expected, where)
        if step == "project_raw":
            return self.project(
                api, expected, where, "project_raw", RAW_SELECTION, "project raw (3 raw assets)"
            )
        if step == "project_all":
            return self.project(
                api,
                expected,
                where,
                "project_all",
                "*",
                "project all (`--select '*'`)",
            )
        if step == "dlt_fast":
            return self.dlt(api, expected, where, "fast")
        if step == "dlt_default":
            return self.dlt(api, expected, where, "default")
        raise ValueError(step)

    # -- the incremental scenario -------------------------------------------------------------

    def run_incremental(self, size: int) -> tuple[Expected, list[StepResult], dict[str, str]]:
        """Full load of generation 0 (every asset); the demo data evolves (generation 1: ~1% of
        the events); then, on copies of that deployment, the incremental refresh of the raw
        assets and of every asset (the nightly schedule's run), and full refreshes of the same
        data into fresh files. Last, a run that does nothing: Dagster's own floor."""
        where = self.work / f"incremental-{size}"
        token = secrets.token_hex(24)
        self.token_values.append(token)
        kept = where / "incremental.duckdb"
        out: list[StepResult] = []
        equal = {"raw": "not compared", "all": "not compared"}
        db = {
            "incremental_all": kept,
            "incremental_raw": where / "incremental_raw.duckdb",
            "full_gen1_raw": where / "full_gen1_raw.duckdb",
            "full_gen1_all": where / "full_gen1_all.duckdb",
        }
        print(f"\n== incremental: {size:,} transactions", flush=True)
        try:
            log = where / "demo_api-gen0.log"
            with DemoAPI(
                size, token, log, seed=self.args.seed, prerender=not self.args.live_server
            ) as api:
                expected = expected_counts(api)
                print("   full refresh of generation 0, every asset (setup) ...", end=" ")
                setup_home = where / "full_gen0.dagster_home"
                r = self.project(
                    api, expected, where, "full_gen0", "*",
                    "full refresh, generation 0, every asset (setup)", database=kept,
                )  # fmt: skip
                out.append(r)
                print(_progress_line(r), flush=True)
            # The raw-only refresh runs on a copy of the deployment: the same files and history.
            raw_home = where / "incremental_raw.dagster_home"
            _copy_deployment(kept, db["incremental_raw"], setup_home, raw_home)
            log = where / "demo_api-gen1.log"
            with DemoAPI(
                size,
                token,
                log,
                seed=self.args.seed,
                prerender=not self.args.live_server,
                generation=1,
            ) as api:
                expected = expected_counts(api)
                # An incremental refresh is the deployment's next run (its DAGSTER_HOME and
                # files); a full refresh is a first run of its own, into a fresh file.
                steps = [
                    ("incremental_raw", RAW_SELECTION, "incremental refresh, raw assets", raw_home),
                    ("incremental_all", "*", "incremental refresh, every asset", setup_home),
                    ("full_gen1_raw", RAW_SELECTION, "full refresh, raw assets", None),
                    ("full_gen1_all", "*", "full refresh, every asset", None),
                ]
                for name, selection, label, home in steps:
                    print(f"   {label} ...", end=" ", flush=True)
                    r = self.project(
                        api, expected, where, name, selection, label, database=db[name], home=home
                    )
                    out.append(r)
                    print(_progress_line(r), flush=True)
                print("   a materialization that does nothing (Dagster's floor) ...", end=" ")
                r = self.noop(api, where)
                out.append(r)
                print(_progress_line(r), flush=True)
            ok = {r.step for r in out if r.ok}
            for kind in ("raw", "all"):
                incremental, full = f"incremental_{kind}", f"full_gen1_{kind}"
                if {incremental, full} <= ok:
                    equal[kind] = _compare_tables(db[incremental], db[full], core=kind == "all")
        except (KeyboardInterrupt, Interrupted):
            self._interrupted()
        finally:
            for database in db.values():
                self._cleanup_db(database)
        return expected, out, equal

    def noop(self, api: DemoAPI, where: Path) -> StepResult:
        """``dagster asset materialize`` of one asset that does nothing, on a prepared home."""
        home = where / "noop.dagster_home"
        prepare_dagster_home(home, self.base_env)
        argv = [str(BIN / "dagster"), "asset", "materialize", "-f", str(NOOP_DEFS)]
        argv += ["--select", "noop"]
        env = {**self.base_env, "DAGSTER_HOME": str(home)}
        m = self._measure("noop", argv, where / "noop.log", env, api)
        r = StepResult("noop", "a materialization that does nothing (Dagster's floor)", m)
        r.dagster_steps, _ = _dagster_steps(m.log_path)
        return r

    def run_shape(self, profile: str, size: int) -> tuple[Expected, list[StepResult]]:
        """The floor (one pass's bytes) and every asset on default settings (the first run),
        ``--runs`` times, on the demo API's ``profile`` (``demo_api.data.PROFILES``) at ``size``
        transactions."""
        where = self.work / f"shape-{profile}-{size}"
        token = secrets.token_hex(24)
        self.token_values.append(token)
        out: list[StepResult] = []
        print(f"\n== profile {profile}: {size:,} transactions: starting the demo API", flush=True)
        with DemoAPI(
            size,
            token,
            where / "demo_api.log",
            seed=self.args.seed,
            prerender=not self.args.live_server,
            profile=profile,
        ) as api:
            expected = expected_counts(api)
            try:
                for run in range(1, self.args.runs + 1):
                    print(f"   run {run}: floor, every asset ...", end=" ", flush=True)
                    r = self.project(
                        api, expected, where / f"run-{run}", "shape_all", "*",
                        f"project all (`--select '*'`), {profile}",
                    )  # fmt: skip
                    r.m.extra["pass_bytes"] = self.floor(
                        api, expected, where / f"run-{run}"
                    ).m.extra.get("bytes")
                    out.append(r)
                    print(_progress_line(r), flush=True)
            except (KeyboardInterrupt, Interrupted):
                self._interrupted()
        return expected, out

    # -- the latency scenario -----------------------------------------------------------------

    def run_latency(self) -> tuple[Expected, list[StepResult]]:
        size = self.args.latency_size
        where = self.work / f"latency-{size}"
        token = secrets.token_hex(24)
        self.token_values.append(token)
        out: list[StepResult] = []
        print(
            f"\n== latency: {size:,} transactions, {self.args.latency_ms:g} ms per response",
            flush=True,
        )
        with DemoAPI(
            size,
            token,
            where / "demo_api.log",
            latency_ms=self.args.latency_ms,
            seed=self.args.seed,
            prerender=not self.args.live_server,
        ) as api:
            expected = expected_counts(api)
            try:
                for run in range(1, self.args.runs + 1):
                    self._latency_run(api, expected, where / f"run-{run}", run, out)
            except (KeyboardInterrupt, Interrupted):
                self._interrupted()
        return expected, out

    def _latency_run(
        self, api: DemoAPI, expected: Expected, where: Path, run: int, out: list[StepResult]
    ) -> None:
        for concurrency in (1, 8):
            name = f"project_raw_c{concurrency}"
            print(f"   run {run}: {name} ...", end=" ", flush=True)
            r = self.project(
                api,
                expected,
                where,
                name,
                RAW_SELECTION,
                f"project raw, concurrency {concurrency}",
                FIELDSALES_CONCURRENCY=str(concurrency),
            )
            out.append(r)
            print(_progress_line(r), flush=True)
        for concurrency in (1, 8):
            print(f"   run {run}: floor_c{concurrency} ...", end=" ", flush=True)
            r = self.floor(api, expected, where / f"c{concurrency}", concurrency)
            r.step = f"floor_c{concurrency}"
            r.label = f"floor, concurrency {concurrency}"
            out.append(r)
            print(_progress_line(r), flush=True)


# --- parsing what the commands left behind -----------------------------------------------------


def _dagster_steps(log_path: Path) -> tuple[list[tuple[str, float]], float | None]:
    """Seconds per Dagster step, and the epoch of RUN_START, from a ``dagster`` CLI log."""
    steps: list[tuple[str, float]] = []
    run_start = None
    try:
        text = log_path.read_text("utf-8", "replace")
    except OSError:
        return steps, None
    for line in text.splitlines():
        if run_start is None and (match := LOG_TIME.match(line)):
            run_start = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S %z").timestamp()
        if match := STEP_LINE.search(line):
            steps.append((match.group(1), _duration_s(match[2])))
    return steps, run_start


def _in_process_s(log_path: Path) -> float:
    """The run's own time: Dagster's ``Finished steps in process ... in 4.92s``."""
    try:
        match = IN_PROCESS_LINE.search(log_path.read_text("utf-8", "replace"))
    except OSError:
        return float("nan")
    return _duration_s(match[1]) if match else float("nan")


def _duration_s(text: str) -> float:
    """Seconds in a Dagster duration: "512ms", "4.39s", "1m15s"."""
    unit_s = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    return sum(float(value) * unit_s[unit] for value, unit in DURATION_PART.findall(text))


def _latest_metadata(home: Path, keys: list[str]) -> dict[str, dict[str, object]]:
    """Metadata of the latest materialization of each asset in ``keys``, from the instance."""
    import dagster as dg

    out: dict[str, dict[str, object]] = {}
    try:
        with dg.DagsterInstance.from_config(str(home)) as instance:
            for key in keys:
                entry = instance.get_latest_materialization_event(dg.AssetKey(key))
                if entry is not None and entry.asset_materialization is not None:
                    metadata = entry.asset_materialization.metadata
                    out[key] = {name: value.value for name, value in metadata.items()}
    except Exception as exc:  # the report says so; the run is not lost
        out["error"] = {"message": str(exc)}
    return out


def _compare_tables(a_path: Path, b_path: Path, core: bool = False) -> str:
    """``yes`` when every raw table of a equals b's row for row (``loaded_at`` aside), and with
    ``core`` every core and mart table too."""
    parts = []
    config = {
        "memory_limit": "4GB",
        "preserve_insertion_order": False,
        "enable_progress_bar": False,
    }
    a, b = _lake_of(a_path), dataclasses.replace(_lake_of(b_path), alias="other")
    with connect_lake(a, config, read_only=True) as conn:
        conn.execute(b.attach_sql(read_only=True))
        here = conn.execute("SELECT current_database()").fetchone()[0]
        tables = [  # md5 of the payload: the set operations stay small
            ("raw.events", "id, md5(payload::VARCHAR)"),
            ("raw.transactions", "id, event_id, md5(payload::VARCHAR)"),
            ("raw.event_groups", "id, md5(payload::VARCHAR)"),
        ]
        if core:
            tables += [(table, _md5_of_row(conn, here, table)) for table in _analyst_tables(conn)]
        for table, columns in tables:
            x, y = f"{here}.{table}", f"other.{table}"
            only_a, only_b = conn.execute(
                f"SELECT (SELECT count(*) FROM (SELECT {columns} FROM {x} EXCEPT ALL "
                f"SELECT {columns} FROM {y})), (SELECT count(*) FROM (SELECT {columns} FROM {y} "
                f"EXCEPT ALL SELECT {columns} FROM {x}))"
            ).fetchone()
            if only_a or only_b:
                parts.append(f"{table}: {only_a} rows only incremental, {only_b} only full")
    return "; ".join(parts) or "yes"


def _analyst_tables(conn: duckdb.DuckDBPyConnection) -> list[str]:
    return [
        f"{schema}.{name}"
        for schema, name in conn.execute(
            "SELECT schema_name, table_name FROM duckdb_tables() WHERE database_name = "
            "current_database() AND schema_name IN ('core', 'mart') ORDER BY ALL"
        ).fetchall()
    ]


def _md5_of_row(conn: duckdb.DuckDBPyConnection, database: str, table: str) -> str:
    """``md5`` of a row's columns as text, ``loaded_at`` aside (a load's own time).

    DOUBLE columns count to 6 decimals: a sum's last bits depend on the order DuckDB adds the
    rows in (mart totals: 366.515 or 366.51500000000004), which no two builds promise.
    """
    schema, _, name = table.partition(".")
    columns = conn.execute(
        "SELECT column_name, data_type FROM duckdb_columns() WHERE database_name = ? "
        "AND schema_name = ? AND table_name = ? AND column_name <> 'loaded_at' "
        "ORDER BY column_index",
        [database, schema, name],
    ).fetchall()
    values = [
        f'round("{c}", 6)' if kind in ("DOUBLE", "FLOAT") else f'"{c}"' for c, kind in columns
    ]
    text = ", ".join(f"coalesce({v}::VARCHAR, '<NULL>')" for v in values)
    return f"md5(concat_ws('|', {text}))"


def _copy_deployment(database: Path, to: Path, home: Path, to_home: Path) -> None:
    """A copy of a deployment's lake (catalog and data folder) and its DAGSTER_HOME."""
    source, target = _lake_of(database), _lake_of(to)
    shutil.copy(source.catalog.removeprefix("sqlite:"), target.catalog.removeprefix("sqlite:"))
    shutil.copytree(source.data_path, target.data_path)
    shutil.copytree(home, to_home)


def _dlt_stages(stdout: str) -> dict[str, float]:
    """Seconds of dlt's extract, normalize and load, from ``dlt_load.py``'s result line."""
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            try:
                return dict(json.loads(line).get("stage_seconds") or {})
            except ValueError:
                return {}
    return {}


def _lake_of(database: Path) -> Lake:
    """The lake a step names by a path, as the steps named DuckDB files: the catalog
    ``<stem>.ducklake.sqlite`` and the data folder ``<stem>_lake`` beside it."""
    return Lake(
        catalog=f"sqlite:{database.with_name(database.stem + '.ducklake.sqlite')}",
        data_path=str(database.with_name(database.stem + "_lake")),
    )


def _read_only(database: Path | Lake) -> duckdb.DuckDBPyConnection:
    """A read-only connection to a DuckDB file (dlt's), or to a lake (as an analyst attaches it)."""
    if isinstance(database, Lake):
        return connect_lake(database, read_only=True)
    return duckdb.connect(str(database), read_only=True)


def _core_table_count(database: Path | Lake) -> int | None:
    try:
        with _read_only(database) as conn:
            return conn.execute(
                "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'core' "
                "AND table_catalog = current_database()"
            ).fetchone()[0]
    except duckdb.Error:
        return None


def _dlt_child_tables(database: Path) -> int | None:
    try:
        with duckdb.connect(str(database), read_only=True) as conn:
            return conn.execute(
                "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'fieldsales' "
                "AND table_name LIKE '%\\_\\_%' ESCAPE '\\'"
            ).fetchone()[0]
    except duckdb.Error:
        return None


# --- reporting ---------------------------------------------------------------------------------


def _progress_line(r: StepResult) -> str:
    if not r.ok:
        return f"FAILED ({_why(r)})"
    exact = {True: "exact", False: "NOT EXACT", None: "?"}[r.exact]
    return (
        f"{r.m.wall_s:.2f} s, peak RSS {fmt_bytes(r.m.peak_rss)} "
        f"(PSS {fmt_bytes(r.m.peak_pss)}), {exact}"
    )


def _why(r: StepResult) -> str:
    if r.m.over_memory:
        return f"stopped at the memory cap, PSS {fmt_bytes(r.m.peak_pss)}"
    if r.m.timed_out:
        return "timed out"
    return f"exit {r.m.returncode}"


def _median(values: list[float]) -> float:
    values = [v for v in values if v == v]
    return statistics.median(values) if values else float("nan")


def _wall(results: list[StepResult]) -> float:
    """Median wall seconds over the successful runs (nan when none succeeded)."""
    return _median([r.m.wall_s for r in results if r.ok])


def _fmt_s(seconds: float) -> str:
    return "–" if seconds != seconds else f"{seconds:,.2f}"


def _row(results: list[StepResult], scrub) -> str:
    first = results[0]
    ok = [r for r in results if r.ok]
    failed = [r for r in results if not r.ok]
    if not ok:
        r = failed[0]
        why = _why(r)
        dashes = " – |" * 6
        return f"| {first.label} | FAILED ({why}) |{dashes} log: `{r.m.log_path}` |"
    walls = [r.m.wall_s for r in ok]
    wall = statistics.median(walls)
    wall_txt = _fmt_s(wall) + (f" ({', '.join(f'{w:.2f}' for w in walls)})" if len(ok) > 1 else "")
    rows_s = _median([r.rows_per_s for r in ok])
    rss = max(r.m.peak_rss for r in ok)
    pss = max(r.m.peak_pss for r in ok)
    cpu = _median([r.m.cpu_s for r in ok])
    server_cpu = _median([r.m.server_cpu_s for r in ok])
    exact_values = {r.exact for r in ok}
    exact = "yes" if exact_values == {True} else "NO" if False in exact_values else "?"
    notes = [r.note for r in ok if r.note][:1]
    extra = ok[0].m.extra
    if "startup_s" in extra:
        notes.append(f"start-up to RUN_START ≈ {extra['startup_s']:.1f} s")
    if extra.get("core_tables") is not None:
        notes.append(f"{extra['core_tables']} core tables")
    if extra.get("dlt_stages"):
        notes.append(", ".join(f"{k} {v:.1f} s" for k, v in extra["dlt_stages"].items()))
    if extra.get("child_tables") is not None:
        notes.append(f"{extra['child_tables']} child tables")
    if failed:
        notes.append(f"{len(failed)} run(s) failed, e.g. log `{failed[0].m.log_path}`")
    rows_txt = "–" if rows_s != rows_s else f"{rows_s:,.0f}"
    return (
        f"| {first.label} | {wall_txt} | {rows_txt} | {fmt_bytes(rss)} | {fmt_bytes(pss)} | "
        f"{_fmt_s(cpu)} | "
        f"{_fmt_s(server_cpu)} | {exact} | {scrub('; '.join(notes))} |"
    )


TABLE_HEAD = (
    "| step | wall s | rows/s | peak RSS (tree) | peak PSS (tree) | client CPU s | server CPU s "
    "| exact rows | notes |\n"
    "|---|---:|---:|---:|---:|---:|---:|:---:|---|"
)


def _steps_time(results: list[StepResult] | None) -> float:
    """Median over runs of the seconds spent inside Dagster steps."""
    return _median([sum(t for _, t in r.dagster_steps) for r in results or [] if r.ok])


def _ratio(a: list[StepResult] | None, b: list[StepResult] | None, cpu: bool = False) -> str:
    """Median wall time of ``a`` over ``b``'s; with ``cpu``, of the client's CPU seconds."""
    if not a or not b:
        return "–"
    if cpu:
        wa = _median([r.m.cpu_s for r in a if r.ok])
        wb = _median([r.m.cpu_s for r in b if r.ok])
    else:
        wa, wb = _wall(a), _wall(b)
    if wa != wa or wb != wb or wb == 0:
        return "–"
    return f"{wa / wb:.2f}×"


def _server_share(floor: list[StepResult] | None) -> str:
    """How many times the floor's wall time exceeds the server's CPU during it (>1: the demo
    API is not what bounds the floor)."""
    ok = [r for r in floor or [] if r.ok]
    if not ok:
        return "–"
    wall, cpu = _wall(ok), _median([r.m.server_cpu_s for r in ok])
    if wall != wall or cpu != cpu or cpu == 0:
        return "–"
    return f"{wall / cpu:.1f}× ({_fmt_s(cpu)} server CPU-s in {_fmt_s(wall)} s)"


def size_section(
    size: int,
    expected: Expected,
    results: dict[str, list[StepResult]],
    scrub,
    dlt_default_max: int,
    dlt_fast_max: int | None = None,
) -> str:
    lines = [
        f"## {size:,} transactions",
        "",
        f"Server: {expected.transactions:,} transactions, {expected.events:,} events, "
        f"{expected.event_groups:,} event groups = {expected.rows:,} rows.",
        "",
        TABLE_HEAD,
    ]
    for step in STEPS:
        if step not in results:
            continue
        if results[step]:
            lines.append(_row(results[step], scrub))
        elif step == "dlt_fast" and dlt_fast_max is not None and size > dlt_fast_max:
            lines.append(
                f"| dlt fast (max_table_nesting=0, jsonl) | skipped (> {dlt_fast_max:,} "
                "transactions, `--dlt-fast-max`) | – | – | – | – | – | – | – |"
            )
        elif step == "dlt_default" and size > dlt_default_max:
            lines.append(
                f"| dlt default (nested child tables) | skipped (> {dlt_default_max:,} "
                "transactions) | – | – | – | – | – | – | needs more memory than the machine has |"
            )
    get = results.get
    lines += [
        "",
        "| ratio | wall time | client CPU |",
        "|---|---:|---:|",
        *(
            f"| {label} | {_ratio(get(a), get(b))} | {_ratio(get(a), get(b), cpu=True)} |"
            for label, a, b in (
                ("project raw / floor", "project_raw", "floor"),
                ("project all / floor", "project_all", "floor"),
                ("dlt fast / project all", "dlt_fast", "project_all"),
                ("dlt default / project all", "dlt_default", "project_all"),
            )
        ),
        f"| floor wall / server CPU during the floor | {_server_share(get('floor'))} | |",
    ]
    steps_lines = _dagster_breakdown(results)
    if steps_lines:
        lines += ["", *steps_lines]
    return "\n".join(lines)


def _dagster_breakdown(results: dict[str, list[StepResult]]) -> list[str]:
    """The Dagster steps of the first successful project runs, slowest first."""
    out: list[str] = []
    for step in ("project_raw", "project_all"):
        ok = [r for r in results.get(step, []) if r.ok and r.dagster_steps]
        if not ok:
            continue
        r = ok[0]
        top = sorted(r.dagster_steps, key=lambda s: -s[1])
        total = sum(s for _, s in r.dagster_steps)
        shown = ", ".join(f"`{name}` {s:.2f} s" for name, s in top[:8])
        # The core and mart tables with the checks that run in their steps: the issue's
        # "core assets" figure (the raw column-schema check step is left out).
        core = sum(s for name, s in r.dagster_steps if name.startswith(("core_", "mart_")))
        core_note = f"; core and mart steps: {core:.1f} s" if step == "project_all" else ""
        out.append(
            f"Dagster steps of {r.label} (run 1): {len(top)} steps, {total:.1f} s in steps of "
            f"{r.m.wall_s:.1f} s wall{core_note}; slowest: {shown}."
        )
        out.append("")
        out += _step_cpu_table(r)
    return out[:-1] if out else out


def _step_cpu_table(r: StepResult) -> list[str]:
    """The run's steps with wall and CPU seconds (CPU first: wall on a shared machine is noise),
    most CPU first, and what the run spent outside its steps (start-up, definitions, exit)."""
    if not r.step_cpu:
        return []
    in_steps = sum(s.cpu_s for s in r.step_cpu)
    lines = [
        f"CPU per step of {r.label} (run 1; the run's process, sampled every ~50 ms): "
        f"{in_steps:.1f} CPU-s in steps of {r.m.cpu_s:.1f} CPU-s for the whole command.",
        "",
        "| step | CPU s | wall s |",
        "|---|---:|---:|",
    ]
    for s in sorted(r.step_cpu, key=lambda s: -s.cpu_s):
        lines.append(f"| `{s.step}` | {s.cpu_s:.2f} | {s.wall_s:.2f} |")
    lines.append(f"| outside the steps | {r.m.cpu_s - in_steps:.2f} | |")
    return [*lines, ""]


def _failed_steps(log_path: Path) -> list[str]:
    """The Dagster steps a run's log reports failed, each with the DuckDB error that follows."""
    try:
        text = log_path.read_text("utf-8", "replace")
    except OSError:
        return []
    out: dict[str, str] = {}
    for found in STEP_FAILURE_LINE.finditer(text):
        error = DUCKDB_ERROR.search(text, found.end())
        reason = next(g for g in error.groups() if g) if error else ""
        out.setdefault(found.group(1), f"`{found.group(1)}`" + (f": {reason}" if reason else ""))
    return list(out.values())


def shapes_section(shapes: list[tuple[str, Expected, list[StepResult]]], scrub) -> str:
    """The first run of every shape side by side, then each step's CPU per shape: CPU-s, and
    CPU-ms per MB a pass (what a step costs per byte the tenant sends)."""
    lines = [
        "## Shapes: the first run (`--select '*'`, default settings) on each demo API profile",
        "",
        "Profiles of `fieldsales_dagster/demo_api/data.py` (`PROFILES`); a pass is one read of "
        "every list (the floor's bytes); the project fetches more (the completeness re-read). "
        "CPU, wall and peak RSS are the median run's (CPU: the project's process tree).",
        "",
        "| shape | transactions | events | MB a pass | MB fetched | CPU s | wall s | peak RSS "
        "| CPU s per 100 MB a pass | × the first shape's | exact rows |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|",
    ]
    ok: dict[str, tuple[StepResult, float]] = {}
    for profile, expected, results in shapes:
        good = [r for r in results if r.ok]
        if not good:
            why = "; ".join(_failed_steps(results[0].m.log_path)) or _why(results[0])
            failed = f"FAILED ({scrub(why)})" if results else "FAILED (the demo API did not start)"
            lines.append(f"| {profile} | {expected.transactions:,} | – | {failed} |" + " – |" * 7)
            continue
        r = sorted(good, key=lambda r: r.m.cpu_s)[len(good) // 2]
        mb = (r.m.extra.get("pass_bytes") or float("nan")) / 1e6
        ok[profile] = (r, mb)
        per_100mb = 100 * r.m.cpu_s / mb
        first_r, first_mb = next(iter(ok.values()))
        exact = "yes" if all(g.exact for g in good) else "NO"
        lines.append(
            f"| {profile} | {expected.transactions:,} | {expected.events:,} | {mb:,.0f} | "
            f"{_bytes(r) / 1e6:,.0f} | {r.m.cpu_s:.1f} | {r.m.wall_s:.1f} | "
            f"{fmt_bytes(r.m.peak_rss)} | {per_100mb:.2f} | "
            f"{per_100mb / (100 * first_r.m.cpu_s / first_mb):.2f} | {exact} |"
        )
    if ok:
        # Each shape's CPU per step, and outside the steps (start-up, definitions, exit).
        cpu = {
            name: {
                **{s.step: s.cpu_s for s in r.step_cpu},
                "outside the steps": r.m.cpu_s - sum(s.cpu_s for s in r.step_cpu),
            }
            for name, (r, _) in ok.items()
        }
        first = next(iter(cpu.values()))
        steps = sorted(first, key=lambda step: -first[step])
        steps += sorted({step for c in cpu.values() for step in c} - set(steps))
        head = f"| step | {' | '.join(ok)} |\n|---|" + "---:|" * len(ok)
        for title, per_mb in (("CPU s", False), ("CPU ms per MB a pass", True)):
            lines += ["", f"{title} per step (each shape's median run):", "", head]
            for step in steps:
                cells = [
                    f"{1000 * c / mb:.1f}" if per_mb else f"{c:.2f}"
                    for name, (_, mb) in ok.items()
                    for c in [cpu[name].get(step, float("nan"))]
                ]
                lines.append(f"| `{step}` | {' | '.join(cells)} |")
    return "\n".join(lines)


def latency_section(expected: Expected, results: list[StepResult], scrub, latency_ms: float):
    by_step: dict[str, list[StepResult]] = {}
    for r in results:
        by_step.setdefault(r.step, []).append(r)
    lines = [
        f"## Latency: {expected.transactions:,} transactions, {latency_ms:g} ms added per response",
        "",
        f"Server: {expected.rows:,} rows; project raw load at `FIELDSALES_CONCURRENCY` 1 vs 8 "
        "(and the floor at 1 vs 8 for reference).",
        "",
        TABLE_HEAD,
    ]
    for step in ("project_raw_c1", "project_raw_c8", "floor_c1", "floor_c8"):
        if by_step.get(step):
            lines.append(_row(by_step[step], scrub))
    c1, c8 = _steps_time(by_step.get("project_raw_c1")), _steps_time(by_step.get("project_raw_c8"))
    in_steps = f"{c1 / c8:.2f}×" if c1 == c1 and c8 == c8 and c8 > 0 else "–"
    lines += [
        "",
        f"Speed-up of concurrency 8 over 1 (wall time): project raw "
        f"{_ratio(by_step.get('project_raw_c1'), by_step.get('project_raw_c8'))}, floor "
        f"{_ratio(by_step.get('floor_c1'), by_step.get('floor_c8'))}. On the time inside the "
        f"three raw Dagster steps only (start-up excluded): {_fmt_s(c1)} s vs {_fmt_s(c8)} s, "
        f"{in_steps}.",
    ]
    return "\n".join(lines)


def _refresh(r: StepResult) -> dict[str, dict[str, object]]:
    return r.m.extra.get("refresh") or {}


def _bytes(r: StepResult, key: str | None = None) -> float:
    refresh = _refresh(r)
    keys = [key] if key else RAW_SELECTION.split(",")
    values = [refresh.get(k, {}).get("bytes_fetched") for k in keys]
    return float(sum(values)) if values and None not in values else float("nan")


def incremental_section(
    size: int, expected: Expected, results: list[StepResult], equal: dict[str, str]
) -> str:
    lines = [
        f"## Incremental refresh: {size:,} transactions, then ~1% of the events evolve",
        "",
        f"Generation 1 (`fieldsales-demo-api --generation 1`): {expected.transactions:,} "
        f"transactions, {expected.events:,} events, {expected.event_groups:,} event groups. "
        "Each row is `dagster asset materialize -m fieldsales_dagster --select <selection>` with "
        f"the default refresh_mode (auto): the raw assets (`{RAW_SELECTION}`), or every asset "
        "(`'*'`, what the nightly schedule refreshes). The incremental rows are the setup "
        "deployment's next run (its files and DAGSTER_HOME, copied for the raw-only one); the full "
        "rows are first runs into fresh files. *In the run* is the run's own time (from the "
        "run's start to its end: Dagster's `Finished steps in process`); "
        "the rest of *wall* is the CLI's start-up and exit.",
        "",
        "| step | mode used | wall s | in the run s | raw_transactions step s | core steps s | "
        "peak RSS (tree) | bytes fetched (all) | transaction bytes | events re-fetched | "
        "tx added/changed/removed |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    by_step = {r.step: r for r in results}
    for r in results:
        if not r.ok:
            lines.append(f"| {r.label} | FAILED ({_why(r)}) |" + " – |" * 9)
            continue
        tx = _refresh(r).get("raw_transactions", {})
        changes = "/".join(
            str(tx.get(f"transactions_{k}", "–")) for k in ("added", "changed", "removed")
        )
        mode = tx.get("refresh_mode", "–")
        if r.step.endswith("_all") and (builds := _core_builds(r)):
            mode += f"; core: {builds}"
        lines.append(
            f"| {r.label} | {mode} | {_fmt_s(r.m.wall_s)} | {_fmt_s(_in_run(r))} | "
            f"{_fmt_s(_step_s(r, 'raw_transactions'))} | {_fmt_s(_core_steps_s(r))} | "
            f"{fmt_bytes(r.m.peak_rss)} | {fmt_bytes(_bytes(r))} | "
            f"{fmt_bytes(_bytes(r, 'raw_transactions'))} | {tx.get('events_refetched', '–')} | "
            f"{changes} |"
        )
    ratio = lambda a, b: "–" if a != a or b != b or b == 0 else f"{a / b:.1f}×"  # noqa: E731
    lines += [
        "",
        "| full refresh / incremental refresh (same evolved data) | raw assets | every asset |",
        "|---|---:|---:|",
    ]
    pairs = [
        (by_step.get(f"full_gen1_{k}"), by_step.get(f"incremental_{k}")) for k in ("raw", "all")
    ]
    rows = [
        ("wall time", lambda r: r.m.wall_s),
        ("time in the run (start-up and exit aside)", _in_run),
        ("raw_transactions step time", lambda r: _step_s(r, "raw_transactions")),
        ("core and mart steps time", _core_steps_s),
        ("transaction bytes fetched", lambda r: _bytes(r, "raw_transactions")),
        ("bytes fetched, all raw assets", _bytes),
    ]
    for label, value in rows:
        cells = [
            ratio(value(full), value(inc)) if full and inc and full.ok and inc.ok else "–"
            for full, inc in pairs
        ]
        lines.append(f"| {label} | {' | '.join(cells)} |")
    rss = [
        f"{inc.m.peak_rss / max(full.m.peak_rss, 1):.2f}"
        if full and inc and full.ok and inc.ok
        else "–"
        for full, inc in pairs
    ]
    lines.append(f"| peak RSS (incremental / full) | {' | '.join(rss)} |")
    lines += [
        "",
        f"Incremental result equals the full refresh: raw assets, raw tables row for row: "
        f"{equal['raw']}; every asset, raw, core and mart tables row for row (DOUBLE columns "
        f"to 6 decimals, see `_md5_of_row`): {equal['all']}.",
    ]
    noop, full_raw = by_step.get("noop"), by_step.get("full_gen1_raw")
    if noop and noop.ok and full_raw and full_raw.ok:
        lines += [
            "",
            f"Dagster's floor: `dagster asset materialize` of one asset that does nothing "
            f"(`benchmarks/noop_defs.py`, a prepared DAGSTER_HOME) took {noop.m.wall_s:.2f} s "
            f"wall in this run; a refresh {10:d}× faster than the raw full refresh would have "
            f"to take {full_raw.m.wall_s / 10:.2f} s.",
        ]
    return "\n".join(lines)


def _step_s(r: StepResult, step: str) -> float:
    return dict(r.dagster_steps).get(step, float("nan"))


def _core_steps_s(r: StepResult) -> float:
    steps = [s for name, s in r.dagster_steps if name.startswith(("core_", "mart_"))]
    return sum(steps) if steps else float("nan")


def _in_run(r: StepResult) -> float:
    return r.m.extra.get("in_run_s", float("nan"))


def _core_builds(r: StepResult) -> str:
    refresh = _refresh(r)
    modes = [
        str(refresh.get(key, {}).get("fieldsales/build", "")).partition(":")[0]
        for key in FOLLOWING_CORE
    ]
    return ", ".join(
        f"{key} {mode}" for key, mode in zip(FOLLOWING_CORE, modes, strict=True) if mode
    )


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


def _git_revision() -> str:
    try:
        rev = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (rev or "unknown") + (" (uncommitted changes)" if dirty else "")


def header(started: datetime, work: Path, live_server: bool = False) -> str:
    mem = psutil.virtual_memory().total
    cmd = " ".join(shlex.quote(a) for a in ["python", "-m", "benchmarks.run", *sys.argv[1:]])
    return "\n".join(
        [
            f"# fieldsales_dagster benchmark, {started:%Y-%m-%d %H:%M} UTC",
            "",
            f"- command: `{cmd}`",
            f"- machine: {os.cpu_count()} cores, {mem / 2**30:.1f} GiB memory, "
            f"{platform.system()} {platform.release()} {platform.machine()}; load average at the "
            f"start {', '.join(f'{x:.1f}' for x in os.getloadavg())} (1, 5, 15 min: other work "
            "on the machine makes CPU figures noisy, wall figures more so)",
            f"- Python {platform.python_version()}, duckdb {_version('duckdb')}, dagster "
            f"{_version('dagster')}, dlt {_version('dlt')}, requests {_version('requests')}",
            f"- project revision: {_git_revision()}",
            f"- page size {PAGE_SIZE}, concurrency 8 (project defaults; the floor copies them); "
            "demo API in its own process on 127.0.0.1, "
            + (
                "rendering every page per request (`--live-server`)"
                if live_server
                else "serving items rendered once at its start (`fieldsales-demo-api --prerender`)"
            ),
            f"- logs: `{work}`",
        ]
    )


# --- main ----------------------------------------------------------------------------------------


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.run", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--sizes", default="100000,1000000", help="transactions per size, comma list")
    p.add_argument("--runs", type=int, default=1, help="repetitions of every step (median shown)")
    p.add_argument(
        "--only",
        default="floor,project,dlt_fast,dlt_default,latency,incremental,shapes",
        help=f"steps to run, comma list of {', '.join(ONLY_CHOICES)} (project = raw + all)",
    )
    p.add_argument("--latency-size", type=int, default=20_000)
    p.add_argument(
        "--shapes",
        default="heavy",
        help="demo API profiles of `--only shapes`, comma list, each PROFILE or "
        "PROFILE:TRANSACTIONS (e.g. demo,many-events,deep-reports:20000)",
    )
    p.add_argument(
        "--shape-size",
        type=int,
        default=1_000_000,
        help="transactions of a `--shapes` profile that names none",
    )
    p.add_argument("--latency-ms", type=float, default=50.0)
    p.add_argument(
        "--dlt-fast-max",
        type=int,
        default=10**12,
        help="skip dlt fast above this many transactions (time: ~16 min at 1M)",
    )
    p.add_argument(
        "--dlt-default-max",
        type=int,
        default=100_000,
        help="skip dlt default above this many transactions (memory)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--live-server",
        action="store_true",
        help="the demo API renders every page per request (as before), instead of serving "
        "pre-rendered items from memory; its CPU then bounds the floor",
    )
    p.add_argument("--timeout", type=float, default=3 * 3600, help="seconds per measured command")
    p.add_argument(
        "--memory-cap-gib",
        type=float,
        default=round(psutil.virtual_memory().available * 0.8 / 2**30, 1),
        help="stop a command whose process tree's PSS passes this many GiB, before the machine "
        "runs out (default: 80%% of the memory available when the benchmark starts)",
    )
    p.add_argument("--keep-databases", action="store_true", help="keep the DuckDB files")
    p.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    p.add_argument("--work-dir", type=Path, default=None, help="default benchmarks/work/<UTC ts>")
    args = p.parse_args(argv)
    try:
        args.sizes = [int(s.replace("_", "")) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        p.error("--sizes takes whole numbers, e.g. 100000,1000000")
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    unknown = only - set(ONLY_CHOICES)
    if unknown:
        p.error(f"unknown --only value(s) {', '.join(sorted(unknown))}; known: {ONLY_CHOICES}")
    if "project" in only:
        only |= {"project_raw", "project_all"}
    args.steps = [s for s in STEPS if s in only]
    args.latency = "latency" in only
    args.incremental = "incremental" in only
    args.shapes_run = "shapes" in only
    try:
        args.shapes = [
            (name, int(size.replace("_", "")) if size else args.shape_size)
            for name, _, size in (s.strip().partition(":") for s in args.shapes.split(","))
            if name
        ]
    except ValueError:
        p.error("--shapes takes PROFILE or PROFILE:TRANSACTIONS, e.g. demo,deep-reports:20000")
    unknown = {name for name, _ in args.shapes} - set(PROFILES)
    if unknown:
        p.error(
            f"unknown --shapes profile(s) {', '.join(sorted(unknown))}; known: {list(PROFILES)}"
        )
    if args.runs < 1:
        p.error("--runs must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    started = datetime.now(UTC)
    stamp = f"{started:%Y%m%dT%H%M%SZ}"
    work = (args.work_dir or WORK_DIR / stamp).resolve()
    work.mkdir(parents=True, exist_ok=True)
    bench = Bench(args, work)
    signal.signal(signal.SIGTERM, _on_sigterm)
    compile_project()  # untimed: the bytecode an installed package ships with (README)

    head = header(started, work, args.live_server)
    sections: list[tuple[str, str]] = []  # (file suffix, markdown)
    try:
        if args.steps:
            for size in args.sizes:
                try:
                    expected, results = bench.run_size(size, args.steps)
                except BenchmarkError as exc:
                    print(f"   FAILED: {exc}", file=sys.stderr)
                    sections.append((str(size), f"## {size:,} transactions\n\nFAILED: {exc}"))
                    continue
                section = size_section(
                    size, expected, results, bench.scrub, args.dlt_default_max, args.dlt_fast_max
                )
                sections.append((str(size), section))
                if bench.interrupted:
                    break
        if args.incremental and not bench.interrupted:
            for size in args.sizes:
                try:
                    expected, results, equal = bench.run_incremental(size)
                    section = incremental_section(size, expected, results, equal)
                except BenchmarkError as exc:
                    print(f"   FAILED: {exc}", file=sys.stderr)
                    section = f"## Incremental refresh, {size:,}\n\nFAILED: {exc}"
                sections.append((f"incremental-{size}", section))
                if bench.interrupted:
                    break
        if args.shapes_run and not bench.interrupted:
            shapes = []
            for profile, size in args.shapes:
                try:
                    shapes.append((profile, *bench.run_shape(profile, size)))
                except BenchmarkError as exc:
                    print(f"   FAILED: {exc}", file=sys.stderr)
                    shapes.append((profile, Expected(size, 0, 0), []))
                if bench.interrupted:
                    break
            sizes = sorted({size for _, size in args.shapes})
            sections.append(
                (f"shapes-{'-'.join(map(str, sizes))}", shapes_section(shapes, bench.scrub))
            )
        if args.latency and not bench.interrupted:
            suffix = f"latency-{args.latency_size}"
            try:
                expected, results = bench.run_latency()
                section = latency_section(expected, results, bench.scrub, args.latency_ms)
            except BenchmarkError as exc:
                print(f"   FAILED: {exc}", file=sys.stderr)
                section = f"## Latency\n\nFAILED: {exc}"
            sections.append((suffix, section))
    except (KeyboardInterrupt, Interrupted):
        bench._interrupted()
    if bench.interrupted:
        head += "\n- **interrupted**: the steps after the interruption are missing"
        if not sections:
            return 130

    args.results_dir.mkdir(parents=True, exist_ok=True)
    report = bench.scrub("\n\n".join([head, *(md for _, md in sections)]) + "\n")
    for suffix, md in sections:
        path = args.results_dir / f"{stamp}-{suffix}.md"
        path.write_text(bench.scrub(f"{head}\n\n{md}\n"))
    # latest.md is the table of `make bench` (the sizes' steps) that the README quotes; a run of
    # only the shapes, incremental, DuckLake or latency comparisons leaves it as it is.
    written = f"{len(sections)} file(s) {stamp}-*.md"
    if args.steps:
        (args.results_dir / "latest.md").write_text(report)
        written = f"{args.results_dir / 'latest.md'} and {written}"
    print()
    print(report)
    print(f"written: {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
