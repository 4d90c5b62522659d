"""Operating it: real ``dagster asset materialize`` processes, killed or starved of disk.

* Crash-only: a run killed with SIGKILL at each phase (held there by ``FIELDSALES_TEST_PAUSE_AT``,
  see ``fieldsales_dagster/pause.py``) leaves nothing that blocks, misleads or fills the next
  run: the lake's last snapshot stays whole (nothing of the killed write was committed), and
  the next run removes the killed process's local files and succeeds, with no manual step.
  Each phase starts from its own copy of one refreshed lake (a full run, shared by the module's
  tests), and two phases run at a time.
* A full disk at the single-file export, on a real small tmpfs in a private mount namespace:
  the run fails, naming the file and the reason; the previous export and the lake's snapshot
  stay as they were; the next run after space is freed exports.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pytest

from fieldsales_dagster.demo_api import DemoConfig, DemoServer
from fieldsales_dagster.warehouse.warehouse import FieldSalesWarehouse
from fieldsales_dagster_tests.namespaces import private_tmpfs

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
#: A killed phase must be reached, and a run must end, within this long.
RUN_TIMEOUT_S = 180.0
SNAPSHOT = """
    SELECT (SELECT count(*) FROM raw.transactions), (SELECT count(*) FROM core.transactions),
           (SELECT count(*) FROM raw.events), (SELECT count(*) FROM core.events)
"""
#: What a data folder holds between runs besides the lake's Parquet files, and nothing else.
KEPT = {
    "fieldsales.ducklake.sqlite",
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
    counts = snapshot(data)
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
        "FIELDSALES_DUCKLAKE_CATALOG": f"sqlite:{data / 'fieldsales.ducklake.sqlite'}",
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


def lake(data: Path) -> FieldSalesWarehouse:
    return FieldSalesWarehouse(ducklake_catalog=f"sqlite:{data / 'fieldsales.ducklake.sqlite'}")


def snapshot(data: Path) -> list[int]:
    """The analysts' row counts, as a reader of the lake under ``data`` sees them."""
    with lake(data).read_connection() as conn:
        return list(conn.execute(SNAPSHOT).fetchone())


def leftovers(data: Path) -> list[str]:
    """Every file under ``data`` beyond what a finished run keeps (the lake's catalog and
    Parquet files, the token store), and every staging table in the lake."""
    with lake(data).read_connection() as conn:
        found = [
            f"lake: {schema}.{table}"
            for schema, table in conn.execute(
                "SELECT schema_name, table_name FROM duckdb_tables() "
                "WHERE starts_with(table_name, '_stage_')"
            ).fetchall()
        ]
    for path in data.rglob("*"):
        name = str(path.relative_to(data))
        if not path.is_file() or name in KEPT or name.startswith("fieldsales.ducklake.sqlite"):
            continue
        if name.startswith("lake/") and path.suffix == ".parquet":
            # Listed by the catalog, or a killed write's file (the upkeep deletes those past
            # their safety age: test_lake.py).
            continue
        found.append(name)
    return sorted(found)


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
    "loading": ("raw_event_groups", None),
    "merge": ("raw_events,raw_transactions", None),  # incremental: between rows and digests
    "core": ("core_events", None),  # a staging table built, not yet swapped in
}

#: SQL on a phase's copy first, so that its run has work there: the published state is current,
#: and a run with nothing changed merges and builds nothing. The stored transactions of one event
#: differ from the server's (payloads and digests), and that event's state passes for changed; no
#: build is on record, nor what a following table reflects (so it is built whole, through a
#: staging table).
STALE = {
    "merge": [
        "UPDATE meta.event_fingerprints SET fingerprint = 'stale' WHERE event_id = ?",
        "UPDATE raw.transactions SET payload = '{}' WHERE event_id = ?",
        # A list is compared by the digests stored with its rows: theirs say what was stored.
        "UPDATE meta.raw_transactions_digests SET digest = 0 WHERE event_id = ?",
    ],
    "core": ["UPDATE meta.lake_builds SET fingerprint = NULL"],
}


@pytest.mark.silent_failures_expected
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
    if phase == "token_store":
        (data / "fieldsales_token.json").unlink()
    if phase in STALE:
        with lake(data).get_connection() as conn:
            (event,) = conn.execute("SELECT min(event_id) FROM raw.transactions").fetchone()
            for statement in STALE[phase]:
                conn.execute(statement, [event] if "?" in statement else [])

    killed_at(phase, materialize_argv(select), env)

    if left is not None:
        assert list(data.glob(left)), f"{phase}: the kill left no {left}"
    # Nothing of the killed write was committed: every table as the last snapshot holds it.
    assert snapshot(data) == published.counts, phase

    assert_succeeded(run(materialize_argv(select), env))
    assert snapshot(data) == published.counts, phase
    assert leftovers(data) == [], phase


# --- a full disk at the export -----------------------------------------------------------------


def test_full_disk_at_the_export_fails_the_run_and_the_next_run_exports(
    small_server, published, tmp_path
):
    data, volume_path = tmp_path / "data", tmp_path / "volume"
    published.copy_to(data, tmp_path / "home")
    with private_tmpfs(volume_path, "64m") as volume:
        export = volume_path / "fieldsales.duckdb"
        env = run_env(small_server, data, tmp_path / "home", FIELDSALES_DUCKDB_PATH=str(export))
        assert_succeeded(run(volume.enter(materialize_argv("duckdb_export"), ROOT), env))
        seen = volume.seen(export)
        before = seen.stat()
        # Leave room for half an export, not a whole one.
        free = shutil.disk_usage(volume.seen(volume_path)).free
        ballast = volume.seen(volume_path / "ballast")
        with ballast.open("wb") as out:
            out.write(b"\0" * (free - seen.stat().st_size // 2))

        failed = run(volume.enter(materialize_argv("duckdb_export"), ROOT), env)

        assert failed.returncode != 0 and "RUN_FAILURE" in failed.stderr
        assert f"to {export} (FIELDSALES_DUCKDB_PATH) failed" in failed.stderr, failed.stderr[
            -3000:
        ]
        assert "(ENOSPC)" in failed.stderr and f"Free disk space in {volume_path}" in failed.stderr
        assert "The lake's snapshot stays committed" in failed.stderr
        after = seen.stat()
        assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
        assert not list(volume.seen(volume_path).glob(".fieldsales.duckdb.export-*"))
        assert snapshot(data) == published.counts

        ballast.unlink()
        assert_succeeded(run(volume.enter(materialize_argv("duckdb_export"), ROOT), env))
        assert seen.stat().st_ino != before.st_ino
        copy = tmp_path / "copy.duckdb"
        shutil.copyfile(seen, copy)
    with duckdb.connect(str(copy), read_only=True) as conn:
        assert list(conn.execute(SNAPSHOT).fetchone()) == published.counts
