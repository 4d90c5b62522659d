"""Operating it: real ``dagster asset materialize`` processes, killed or starved of disk.

* Crash-only: a run killed with SIGKILL at each phase (held there by ``FIELDSALES_TEST_PAUSE_AT``,
  see ``fieldsales_dagster/pause.py``) leaves nothing that blocks, misleads or fills the next
  run; the next run removes what it left and succeeds, and the analysts' file never changes
  until a publish. Each phase starts from its own copy of one published state (a full run,
  shared by the module's tests), and two phases run at a time: a phase's processes wait on
  each other, the phases do not.
* A full disk at publish, on a real small tmpfs in a private mount namespace: the run fails,
  naming the file, the reason and the space needed; the analysts' file stays as it was; the next
  run after space is freed publishes.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pytest

from fieldsales_dagster.demo_api import DemoConfig, DemoServer
from fieldsales_dagster_tests.namespaces import private_tmpfs

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
#: A killed phase must be reached, and a run must end, within this long.
RUN_TIMEOUT_S = 180.0
SNAPSHOT = """
    SELECT (SELECT count(*) FROM raw.transactions), (SELECT count(*) FROM core.transactions),
           (SELECT count(*) FROM raw.events), (SELECT count(*) FROM core.events)
"""
#: What a data folder holds between runs, and nothing else.
KEPT = {
    "fieldsales.duckdb",
    "fieldsales.working.duckdb",
    "fieldsales.working.duckdb.lock",
    "fieldsales_token.json",
    "fieldsales_token.json.lock",
}


@pytest.fixture(scope="module")
def small_server() -> Iterator[DemoServer]:
    with DemoServer(DemoConfig(transactions=200, seed=5), host="127.0.0.1", port=0) as server:
        yield server


@dataclass(frozen=True)
class Published:
    """A data folder and a Dagster home after one successful run of every asset."""

    data: Path
    home: Path
    counts: list[int]

    def copy_to(self, data: Path, home: Path) -> tuple[Path, Path]:
        """The data folder and the home, copied to ``data`` (which may be a mount point) and
        ``home``."""
        shutil.copytree(self.data, data, dirs_exist_ok=True)
        shutil.copytree(self.home, home)
        return data, home


@pytest.fixture(scope="module")
def published(small_server, tmp_path_factory) -> Published:
    base = tmp_path_factory.mktemp("published")
    data, home = base / "data", base / "home"
    data.mkdir()
    home.mkdir()
    assert_succeeded(run(materialize_argv(), run_env(small_server, data, home)))
    counts = snapshot(data / "fieldsales.duckdb")
    assert counts[:2] == [200, 200] and counts[2] == counts[3] > 0
    return Published(data, home, counts)


def run_env(server: DemoServer, data: Path, home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FIELDSALES_", "DAGSTER_"))}
    return {
        **env,
        "PYTHONUNBUFFERED": "1",
        "DAGSTER_HOME": str(home),
        "FIELDSALES_BASE_URL": server.base_url,
        "FIELDSALES_API_TOKEN": server.token,
        "FIELDSALES_DUCKDB_PATH": str(data / "fieldsales.duckdb"),
        "FIELDSALES_TOKEN_STORE": str(data / "fieldsales_token.json"),
        "FIELDSALES_PAGE_SIZE": "50",
        **extra,
    }


def materialize_argv(select: str = "*") -> list[str]:
    return [str(BIN / "dagster"), "asset", "materialize", "-m", "fieldsales_dagster"] + [
        "--select",
        select,
    ]


def run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        argv,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )


def assert_succeeded(done: subprocess.CompletedProcess) -> None:
    assert done.returncode == 0 and "RUN_SUCCESS" in done.stderr, done.stderr[-4000:]


def snapshot(database: Path) -> list[int]:
    """The analysts' row counts, read from a copy (DuckDB resolves a ``/proc/<pid>/root`` path
    to this namespace's view, so a file in a private mount is read through a copy)."""
    with tempfile.TemporaryDirectory() as folder:
        copied = Path(folder) / "snapshot.duckdb"
        shutil.copyfile(database, copied)
        with duckdb.connect(str(copied), read_only=True) as conn:
            return list(conn.execute(SNAPSHOT).fetchone())


def leftovers(data: Path) -> list[str]:
    """Every file under ``data`` beyond what a finished run keeps, and every staging table."""
    found = sorted(
        str(path.relative_to(data))
        for path in data.rglob("*")
        if path.is_file() and str(path.relative_to(data)) not in KEPT
    )
    for name in ("fieldsales.duckdb", "fieldsales.working.duckdb"):
        with duckdb.connect(str(data / name), read_only=True) as conn:
            found += [
                f"{name}: {schema}.{table}"
                for schema, table in conn.execute(
                    "SELECT schema_name, table_name FROM duckdb_tables() "
                    "WHERE starts_with(table_name, '_stage_')"
                ).fetchall()
            ]
    return found


def killed_at(phase: str, argv: list[str], env: dict[str, str]) -> str:
    """Start ``argv`` with the pause hook at ``phase``; SIGKILL it once it is held there."""
    proc = subprocess.Popen(
        argv,
        cwd=ROOT,
        env={**env, "FIELDSALES_TEST_PAUSE_AT": phase},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    paused = threading.Event()

    def read() -> None:
        for line in proc.stderr:
            lines.append(line)
            if f"paused at {phase}" in line:
                paused.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        reached = paused.wait(RUN_TIMEOUT_S)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        reader.join(10)
    assert reached, f"the run never reached {phase}:\n{''.join(lines)[-4000:]}"
    return "".join(lines)


#: Phase -> (what the killed run and the next one select, the file a kill there leaves).
PHASES = {
    # A fresh deployment: the token store is written on first use.
    "token_store": ("raw_event_groups", ".fieldsales_token.json.*.tmp"),
    # A new host holding only the analysts' file (a restored backup).
    "seeding": ("raw_event_groups", "fieldsales.working.duckdb.seeding"),
    "loading": ("raw_event_groups", ".fieldsales_spool/fieldsales.working.duckdb/*/*"),
    "merge": ("raw_events,raw_transactions", None),  # incremental: between delete and insert
    "core": ("core_events", None),  # a committed _stage_ table in the working database
    "publish": ("raw_event_groups", ".fieldsales.duckdb.publish-*"),
}


def test_a_run_killed_at_any_phase_never_blocks_the_next_one(small_server, published, tmp_path):
    workers = min(2, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        outcomes = {
            phase: pool.submit(kill_then_rerun, phase, small_server, published, tmp_path / phase)
            for phase in PHASES
        }
    for outcome in outcomes.values():
        outcome.result()  # a phase's failure, raised here with its own traceback


def kill_then_rerun(phase: str, server: DemoServer, published: Published, folder: Path) -> None:
    """On a copy of the published state: kill a run at ``phase``, then run again."""
    select, left = PHASES[phase]
    data, home = published.copy_to(folder / "data", folder / "home")
    env = run_env(server, data, home)
    database = data / "fieldsales.duckdb"
    if phase == "token_store":
        (data / "fieldsales_token.json").unlink()
    if phase == "seeding":
        for path in data.glob("fieldsales.working.duckdb*"):
            path.unlink()
    before = database.stat()

    killed_at(phase, materialize_argv(select), env)

    if left is not None:
        assert list(data.glob(left)), f"{phase}: the kill left no {left}"
    after = database.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns), phase
    assert snapshot(database) == published.counts, phase

    assert_succeeded(run(materialize_argv(select), env))
    assert snapshot(database) == published.counts, phase
    assert leftovers(data) == [], phase


# --- a full disk at publish ---------------------------------------------------------------------


def test_full_disk_at_publish_fails_the_run_and_the_next_run_publishes(
    small_server, published, tmp_path
):
    data = tmp_path / "volume"
    with private_tmpfs(data, "64m") as volume:
        # The published state of a full run: its data on the small volume, its home beside it.
        published.copy_to(volume.seen(data), tmp_path / "home")
        env = run_env(small_server, data, tmp_path / "home")
        database = volume.seen(data / "fieldsales.duckdb")
        working = volume.seen(data / "fieldsales.working.duckdb")
        before = database.stat()
        assert snapshot(database) == published.counts
        # Leave room for a small load, not for a second copy of the working database.
        free = shutil.disk_usage(volume.seen(data)).free
        ballast = volume.seen(data / "ballast")
        with ballast.open("wb") as out:
            out.truncate(0)
            out.write(b"\0" * (free - working.stat().st_size // 2))

        failed = run(volume.enter(materialize_argv("raw_event_groups"), ROOT), env)

        assert failed.returncode != 0 and "RUN_FAILURE" in failed.stderr
        assert f"Publishing the analysts' file {data / 'fieldsales.duckdb'} failed: No space" in (
            failed.stderr
        )
        assert "(ENOSPC). A publish needs" in failed.stderr
        assert f"MB free in {data} for a copy of" in failed.stderr
        after = database.stat()
        assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
        assert snapshot(database) == published.counts
        assert list(volume.seen(data).glob(".fieldsales.duckdb.publish-*")) == []

        ballast.unlink()
        assert_succeeded(run(volume.enter(materialize_argv("raw_event_groups"), ROOT), env))
        assert database.stat().st_ino != before.st_ino
        assert snapshot(database) == published.counts
