"""Plumbing of the benchmark: the demo API process, measured commands, expected row counts.

Everything here runs in the harness process, which is never measured itself: every measured load
runs as its own subprocess, and the demo API runs as another one.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import resource
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent

TRANSACTIONS_PATH = "/public/v1/api/transaction/all"
EVENTS_PATH = "/public/v1/api/event/all"
EVENT_GROUPS_PATH = "/public/v1/api/eventgroup/all"


class BenchmarkError(RuntimeError):
    """Something the harness itself needs failed (not a measured command)."""


def _kill_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM the process group this harness started for ``proc``, then SIGKILL if needed.

    Also run after ``proc`` exited: descendants it left behind are still in its group (Linux
    never hands out a pid that is still in use as a process-group id, so the id is still ours).
    """
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        proc.poll()
        return
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=grace_s)


# --- the demo API ----------------------------------------------------------------------------


class DemoAPI:
    """``fieldsales-demo-api`` as a separate process on loopback, for one ``with`` block."""

    def __init__(
        self,
        transactions: int,
        token: str,
        log_path: Path,
        *,
        latency_ms: float = 0.0,
        seed: int = 0,
        generation: int = 0,
        changed_events: int | None = None,
        prerender: bool = False,
        profile: str = "demo",
        start_timeout_s: float = 600.0,
    ):
        self.args = [
            str(BIN / "fieldsales-demo-api"),
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--transactions",
            str(transactions),
            "--seed",
            str(seed),
            f"--token={token}",
        ]
        if latency_ms:
            self.args += ["--latency-ms", str(latency_ms)]
        if generation:
            self.args += ["--generation", str(generation)]
        if changed_events:  # a fixed number per generation (default: 1% of the events)
            self.args += ["--changed-events", str(changed_events)]
        if prerender:  # every item rendered once at start; pages served from memory
            self.args.append("--prerender")
        if profile != "demo":  # how heavy the items are (demo_api.data.PROFILES)
            self.args += ["--profile", profile]
        self.token = token
        self.log_path = log_path
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen | None = None
        self.base_url = ""

    def __enter__(self) -> DemoAPI:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            self.args,
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # our own group: killed by its id on exit and on Ctrl-C
        )
        log.close()
        line: list[bytes] = []
        reader = threading.Thread(target=lambda: line.append(self.proc.stdout.readline()))
        reader.daemon = True
        reader.start()
        reader.join(self.start_timeout_s)
        if not line or not line[0].strip():
            self.__exit__()
            raise BenchmarkError(f"the demo API did not start; see {self.log_path}")
        self.base_url = json.loads(line[0])["base_url"].rstrip("/")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            _kill_group(self.proc)
            if self.proc.stdout:
                self.proc.stdout.close()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def cpu_seconds(self) -> float:
        try:
            times = psutil.Process(self.pid).cpu_times()
        except psutil.Error:
            return float("nan")
        return times.user + times.system

    def get_json(self, path: str, skip: int, limit: int) -> object:
        req = urllib.request.Request(
            f"{self.base_url}{path}?skip={skip}&limit={limit}",
            headers={"Authorization": f"Bearer {self.token}", "Accept": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=300) as resp:
            return json.loads(resp.read())


@dataclass
class Expected:
    """What the server holds: the rows a loader must end up with."""

    transactions: int
    events: int
    event_groups: int

    @property
    def rows(self) -> int:
        return self.transactions + self.events + self.event_groups

    def pages(self, page_size: int) -> dict[str, int]:
        return {
            "transactions": math.ceil(self.transactions / page_size),
            "events": math.ceil(self.events / page_size),
            "event_groups": math.ceil(self.event_groups / page_size),
        }


def expected_counts(api: DemoAPI) -> Expected:
    """Totals of transactions and event groups; events counted by paging them once."""
    transactions = api.get_json(TRANSACTIONS_PATH, 0, 1)["count"]  # type: ignore[index]
    event_groups = api.get_json(EVENT_GROUPS_PATH, 0, 1)["total"]  # type: ignore[index]
    events, skip = 0, 0
    while True:
        page = api.get_json(EVENTS_PATH, skip, 1000)
        assert isinstance(page, list), "the event list is expected as a bare JSON list"
        if not page:
            break
        events += len(page)
        skip += len(page)
    return Expected(int(transactions), events, int(event_groups))


# --- what a deployment already has before its run -------------------------------------------


def prepare_dagster_home(home: Path, env: dict[str, str]) -> None:
    """An initialised ``DAGSTER_HOME`` at ``home``, as a deployment has before its nightly run.

    Writes the project's ``dagster.yaml`` there as ``make demo`` does (its settings, the home's
    own storage) and creates the instance's storage
    (``dagster instance migrate``: the sqlite run, event log and schedule databases), so that a
    measured run does not pay their creation. Untimed.
    """
    from fieldsales_dagster.demo_run import prepare_dagster_home as write_instance_yaml

    write_instance_yaml(home, ROOT / "dagster.yaml")
    done = subprocess.run(
        [str(BIN / "dagster"), "instance", "migrate"],
        env={**env, "DAGSTER_HOME": str(home)},
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise BenchmarkError(f"dagster instance migrate failed in {home}: {done.stderr[-2000:]}")


def compile_project() -> None:
    """Bytecode for the project's packages (``fieldsales_dagster``, and ``benchmarks`` whose
    modules the floor and publish rows import), as an installed package has: pip compiles what it
    installs, while this editable install is compiled on first import only without
    PYTHONDONTWRITEBYTECODE; ``compileall`` writes it even then. Untimed."""
    packages = [str(ROOT / "fieldsales_dagster"), str(ROOT / "benchmarks")]
    done = subprocess.run(
        [sys.executable, "-m", "compileall", "-q", *packages],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise BenchmarkError(f"compileall fieldsales_dagster failed: {done.stdout[-2000:]}")


# --- measured commands -----------------------------------------------------------------------


@dataclass
class Measurement:
    """One measured command: wall clock, CPU and peak RSS of its process tree."""

    name: str
    argv: list[str]
    log_path: Path
    returncode: int | None = None
    wall_s: float = float("nan")
    cpu_s: float = float("nan")
    server_cpu_s: float = float("nan")
    peak_rss: int = 0
    peak_pss: int = 0
    timed_out: bool = False
    #: Stopped because its tree's PSS passed the memory cap (it would have exhausted the machine).
    over_memory: bool = False
    stdout: str = ""
    extra: dict[str, object] = field(default_factory=dict)
    #: (epoch, user + system CPU seconds) of the command's process tree, every ~50 ms: the run's
    #: steps execute in it (``step_cpu.py``).
    cpu_samples: list[tuple[float, float]] = field(default_factory=list)
    #: (epoch, RSS bytes of the process tree), at the same moments: a step's peak memory.
    rss_samples: list[tuple[float, int]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.over_memory


class _RSSPoller(threading.Thread):
    """Max over time of the RSS summed over a process and all its descendants.

    Forked workers share pages with their parent, and RSS counts a shared page in every process
    that maps it; so the sum over-states what the tree takes from the machine. The PSS sum
    (shared pages split between the processes sharing them) is tracked beside it, at every
    ``pss_every``-th sample because reading ``smaps_rollup`` costs more than ``statm``.
    """

    def __init__(
        self,
        pid: int,
        interval_s: float = 0.05,
        pss_every: int = 4,
        cap_bytes: int | None = None,
    ):
        super().__init__(daemon=True)
        self.pid = pid
        self.cap_bytes = cap_bytes
        self.over_cap = False
        self.interval_s = interval_s
        self.pss_every = pss_every
        self.peak = 0
        self.peak_pss = 0
        self._done = threading.Event()
        self._procs: dict[int, psutil.Process] = {}
        self.cpu_samples: list[tuple[float, float]] = []
        self.rss_samples: list[tuple[float, int]] = []

    def _tree(self) -> list[psutil.Process]:
        try:
            root = self._procs.setdefault(self.pid, psutil.Process(self.pid))
            children = root.children(recursive=True)
        except psutil.Error:
            return []
        # Reuse Process objects so psutil can tell a reused pid apart.
        return [root, *(self._procs.setdefault(c.pid, c) for c in children)]

    def run(self) -> None:
        n = 0
        while not self._done.is_set():
            tree = self._tree()
            if tree:
                self.cpu_samples.append((time.time(), _tree_cpu(tree)))
            rss = 0
            for proc in tree:
                with contextlib.suppress(psutil.Error):
                    rss += proc.memory_info().rss
            self.peak = max(self.peak, rss)
            self.rss_samples.append((time.time(), rss))
            if n % self.pss_every == 0:
                pss = 0
                for proc in tree:
                    with contextlib.suppress(psutil.Error, AttributeError):
                        pss += proc.memory_full_info().pss
                self.peak_pss = max(self.peak_pss, pss)
                if self.cap_bytes and pss > self.cap_bytes and not self.over_cap:
                    # Stop the tree (our own process group) before the kernel's OOM killer
                    # picks a victim, possibly someone else's process.
                    self.over_cap = True
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(self.pid, signal.SIGKILL)
            n += 1
            self._done.wait(self.interval_s)

    def stop(self) -> tuple[int, int]:
        self._done.set()
        self.join()
        return self.peak, self.peak_pss


def _tree_cpu(tree: list[psutil.Process]) -> float:
    """User + system CPU of the live processes of ``tree`` and the children they reaped: a
    command started through a wrapper (``io_written.py``) runs its steps in a child."""
    total = 0.0
    for proc in tree:
        with contextlib.suppress(psutil.Error):
            cpu = proc.cpu_times()
            total += cpu.user + cpu.system + cpu.children_user + cpu.children_system
    return total


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(
    name: str,
    argv: list[str],
    log_path: Path,
    env: dict[str, str],
    *,
    server: DemoAPI | None = None,
    timeout_s: float = 3 * 3600,
    memory_cap: int | None = None,
    cwd: Path = ROOT,
) -> Measurement:
    """Run ``argv`` (stderr to ``log_path``), timing it and polling its tree's RSS.

    Never raises for a failing command: the failure is in the returned ``Measurement``.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    m = Measurement(name=name, argv=argv, log_path=log_path)
    cpu_before = _children_cpu()
    server_before = server.cpu_seconds() if server else float("nan")
    with log_path.open("wb") as log:
        log.write(f"$ {' '.join(argv)}\n".encode())
        log.flush()
        started = time.perf_counter()
        try:
            proc = subprocess.Popen(
                argv,
                stdout=subprocess.PIPE,
                stderr=log,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=cwd,
                start_new_session=True,
            )
        except OSError as exc:
            log.write(f"could not start: {exc}\n".encode())
            m.returncode = -1
            return m
        poller = _RSSPoller(proc.pid, cap_bytes=memory_cap)
        poller.start()
        out: list[bytes] = []
        reader = threading.Thread(target=lambda: out.append(proc.stdout.read()), daemon=True)
        reader.start()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            m.timed_out = True
            log.write(f"\n[benchmark] timed out after {timeout_s:.0f} s\n".encode())
        finally:
            # On timeout or Ctrl-C: end what we started, by its process group id.
            _kill_group(proc)
            m.wall_s = time.perf_counter() - started
            m.peak_rss, m.peak_pss = poller.stop()
            m.cpu_samples = poller.cpu_samples
            m.rss_samples = poller.rss_samples
            if poller.over_cap:
                m.over_memory = True
                log.write(
                    f"\n[benchmark] stopped: the process tree's PSS passed the memory cap of "
                    f"{fmt_bytes(memory_cap or 0)}\n".encode()
                )
            reader.join(30)
            proc.stdout.close()
    m.returncode = proc.returncode
    m.cpu_s = _children_cpu() - cpu_before
    if server:
        m.server_cpu_s = server.cpu_seconds() - server_before
    m.stdout = (out[0] if out else b"").decode("utf-8", "replace")
    with log_path.open("a", encoding="utf-8") as log:
        log.write(f"\n[benchmark] exit {m.returncode}, wall {m.wall_s:.2f} s; stdout:\n")
        log.write(m.stdout)
    return m


def fmt_bytes(n: float) -> str:
    if not n or n != n:
        return "–"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit in ("B", "KiB") else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"
