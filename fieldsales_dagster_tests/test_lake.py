"""The embedded default lake, for real: a SQLite catalog in WAL mode and Parquet files under a
folder, the demo API over HTTP, real materializations, readers in processes of their own.
(PostgreSQL for several machines: test_ducklake.py; the single-file export: test_export.py.)
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import dagster as dg
import pytest

from fieldsales_dagster.assets.upkeep import build_upkeep_asset
from fieldsales_dagster.demo_api import DemoConfig, DemoServer
from fieldsales_dagster.warehouse import lake as lake_module
from fieldsales_dagster.warehouse.lake import Lake, prepare, run_transaction
from fieldsales_dagster.warehouse.warehouse import FieldSalesWarehouse, release_step_memory
from fieldsales_dagster_tests.analyst_reader import READS
from fieldsales_dagster_tests.conftest import make_api
from fieldsales_dagster_tests.project import DEFAULT, core_assets, mart_assets, raw_assets

ASSETS = [*raw_assets(), *core_assets()]
#: A refresh of every table an analyst reads (analyst_reader.py): raw, core and mart.
WHOLE = [*ASSETS, *mart_assets()]
SNAPSHOT = """
    SELECT (SELECT count(*) FROM raw.transactions), (SELECT count(*) FROM core.transactions),
           (SELECT count(*) FROM raw.events), (SELECT count(*) FROM core.events)
"""


def refresh(server, tmp_path, warehouse, assets=ASSETS, **kwargs) -> dg.ExecuteInProcessResult:
    return dg.materialize(
        assets,
        resources={"fieldsales_api": make_api(server, tmp_path), "warehouse": warehouse},
        raise_on_error=False,
        **kwargs,
    )


def snapshot(warehouse: FieldSalesWarehouse) -> list[int]:
    with warehouse.read_connection() as conn:
        return list(conn.execute(SNAPSHOT).fetchone())


def is_wal(catalog: Path) -> bool:
    """SQLite's file header: bytes 18 and 19 (read and write format versions) are 2 in WAL mode."""
    with open(catalog, "rb") as file:
        return file.read(20)[18:20] == b"\x02\x02"


@pytest.fixture
def bigger_server():
    with DemoServer(DemoConfig(transactions=1800, seed=4), host="127.0.0.1", port=0) as server:
        yield server


class AnalystReader:
    """A second process reading the lake in a loop (see analyst_reader.py)."""

    def __init__(self, warehouse: FieldSalesWarehouse, mode: str, tmp_path: Path):
        self.stop_file = tmp_path / f"stop-{mode}"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "fieldsales_dagster_tests.analyst_reader",
                str(warehouse.ducklake_catalog),
                str(warehouse.ducklake_data_path),
                mode,
                str(self.stop_file),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        self.first = json.loads(self.proc.stdout.readline())["ready"]

    def finish(self) -> dict:
        self.stop_file.touch()
        out, _ = self.proc.communicate(timeout=60)
        return json.loads(out.strip().splitlines()[-1])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def test_a_catalog_another_connection_is_writing_is_put_in_wal_once_it_may(tmp_path):
    """Two runs starting at once on a new lake: while one writes the SQLite catalog, SQLite refuses
    the other's switch to WAL at once, whatever its busy timeout; the switch is asked again."""
    path = (tmp_path / "catalog.sqlite").resolve()
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    other.execute("CREATE TABLE written (i INTEGER)")
    threading.Timer(1.0, lambda: other.execute("COMMIT")).start()
    try:
        lake_module.use_wal(path, "FIELDSALES_DUCKLAKE_CATALOG")
    finally:
        time.sleep(1.0)  # the commit has run
        other.close()
    with contextlib.closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("SELECT count(*) FROM written").fetchone()[0] == 0


def test_a_process_opens_the_sqlite_catalog_file_once_so_duckdbs_locks_on_it_stay(
    tmp_path, monkeypatch
):
    """Closing a file descriptor of the catalog releases every POSIX lock this process holds on
    it, DuckDB's SQLite connections' too: a second two-runs-at-once refresh then read a WAL that
    another process's checkpoint had pulled away ("disk I/O error"). Each writer connection
    prepares the lake, so the catalog's mode is read once per process, never again."""
    (tmp_path / "lake").mkdir()
    catalog = tmp_path / "catalog.sqlite"
    lake = Lake(
        catalog=f"sqlite:{catalog}", data_path=str(tmp_path / "lake"), data_path_is_default=False
    )
    prepare(lake)
    assert is_wal(catalog)
    opened = []
    monkeypatch.setattr(lake_module.sqlite3, "connect", lambda *args, **kw: opened.append(args))
    monkeypatch.setattr(lake_module, "open", lambda *args, **kw: opened.append(args), raising=False)
    for _ in range(3):
        prepare(lake)
    assert opened == []


def test_a_reader_process_holding_a_snapshot_neither_blocks_a_refresh_nor_sees_half_of_it(
    demo_server, bigger_server, tmp_path, warehouse
):
    """An analyst holds ``BEGIN TRANSACTION`` on a read-only attach in another process while a
    whole refresh commits (in SQLite's default rollback journal every commit failed with
    "database is locked"; the catalog is in WAL mode)."""
    assert refresh(demo_server, tmp_path, warehouse, WHOLE).success
    assert is_wal(Path(str(warehouse.ducklake_catalog).removeprefix("sqlite:")))
    old = snapshot(warehouse)
    reader = AnalystReader(warehouse, "hold", tmp_path)
    try:
        assert reader.first["raw.transactions"][0] == old[0]
        assert refresh(bigger_server, tmp_path, warehouse, WHOLE).success
        report = reader.finish()
    finally:
        reader.kill()
    assert report["errors"] == [] and report["reads"] > 0
    # The held snapshot: the old tables, all of them, throughout.
    assert [json.loads(k) for k in report["seen"]] == [reader.first]
    assert snapshot(warehouse) == [1800, 1800, 45, 45] and old == [1200, 1200, 30, 30]


def assert_agree(answer: dict[str, list[int]]) -> None:
    """Raw, core and mart of one read (analyst_reader.py) are one refresh's: the same ids in a
    raw table and the core table built from it, and the mart counts what core holds."""
    assert answer["raw.events"] == answer["core.events"], answer
    assert answer["raw.transactions"] == answer["core.transactions"], answer
    assert answer["mart.daily_sales"] == answer["core.transactions"][:1], answer


def test_readers_in_other_processes_see_whole_refreshes_never_a_mix(
    demo_server, tmp_path, warehouse
):
    """docs/storage.md: a reader sees the last complete refresh. Two analysts' processes read raw,
    core and mart over and over, one statement after the other in one transaction (one holding
    a transaction throughout, one opening a connection per read), while a refresh of changed
    data commits table after table: every read is the lake before or after it, whole."""
    assert refresh(demo_server, tmp_path, warehouse, WHOLE).success
    readers = {mode: AnalystReader(warehouse, mode, tmp_path) for mode in ("hold", "reopen")}
    try:
        before = readers["hold"].first
        assert readers["reopen"].first == before
        changes = demo_server.behaviour.evolve(1)
        assert changes["transactions_added"] != changes["transactions_deleted"]
        assert refresh(demo_server, tmp_path, warehouse, WHOLE).success
        reports = {mode: reader.finish() for mode, reader in readers.items()}
    finally:
        for reader in readers.values():
            reader.kill()
    with warehouse.read_connection() as conn:
        after = {name: list(conn.execute(sql).fetchone()) for name, sql in READS.items()}
    assert after != before
    for mode, report in reports.items():
        assert report["errors"] == [], mode
        for answer in map(json.loads, report["seen"]):
            assert_agree(answer)
            assert answer in (before, after), mode
    assert [json.loads(k) for k in reports["hold"]["seen"]] == [before]
    assert sum(reports["reopen"]["seen"].values()) == reports["reopen"]["reads"] > 1


def test_a_data_path_that_is_set_but_missing_fails_before_anything_is_written(
    demo_server, tmp_path
):
    """An unmounted volume: the run fails naming FIELDSALES_DUCKLAKE_DATA_PATH; no catalog, no
    file, no snapshot is made (nothing is re-created under the bare mount point)."""
    missing = tmp_path / "volume" / "lake"
    catalog = tmp_path / "catalog.sqlite"
    warehouse = FieldSalesWarehouse(
        ducklake_catalog=f"sqlite:{catalog}", ducklake_data_path=str(missing)
    )
    result = refresh(demo_server, tmp_path, warehouse, assets=raw_assets())
    assert not result.success
    message = result.get_step_failure_events()[0].step_failure_data.error.to_string()
    assert f"The lake's data path {missing} (FIELDSALES_DUCKLAKE_DATA_PATH) does not exist" in (
        message
    )
    assert "nothing was written" in message
    assert not missing.exists() and not catalog.exists()


def test_the_default_data_folder_is_made_for_a_new_lake_only(demo_server, tmp_path):
    catalog = tmp_path / "data" / "fieldsales.ducklake.sqlite"
    warehouse = FieldSalesWarehouse(ducklake_catalog=f"sqlite:{catalog}")
    assert warehouse.lake.data_path == str(tmp_path / "data" / "lake")
    assert refresh(demo_server, tmp_path, warehouse, assets=raw_assets()).success
    assert list((tmp_path / "data" / "lake").rglob("*.parquet"))
    # Vanished later (a volume not mounted): the catalog lists files there, so no new folder.
    (tmp_path / "data" / "lake").rename(tmp_path / "data" / "lake.away")
    failed = refresh(
        demo_server,
        tmp_path,
        FieldSalesWarehouse(ducklake_catalog=f"sqlite:{catalog}"),
        assets=raw_assets(),
    )
    assert not failed.success
    message = failed.get_step_failure_events()[0].step_failure_data.error.to_string()
    assert f"the lake's catalog {catalog} lists its files there" in message
    assert not (tmp_path / "data" / "lake").exists()


def test_a_failing_user_asset_never_withholds_the_projects_tables(demo_server, tmp_path, warehouse):
    """With no publish step, a refresh whose raw and core tables are all built is what analysts
    read, whatever of the user's fails after it in the same run."""

    @dg.asset(deps=["core_transactions"])
    def team_kpi() -> None:
        raise RuntimeError("the data team's query is broken")

    result = refresh(demo_server, tmp_path, warehouse, assets=[*ASSETS, team_kpi])
    assert not result.success
    assert [e.step_key for e in result.get_step_failure_events()] == ["team_kpi"]
    assert snapshot(warehouse) == [1200, 1200, 30, 30]


def run_upkeep(warehouse, **config) -> dict:
    upkeep = build_upkeep_asset(DEFAULT, ["team:data"], retain_snapshots_days=7)
    result = dg.materialize(
        [upkeep],
        resources={"warehouse": warehouse},
        run_config={"ops": {"ducklake_upkeep": {"config": config}}} if config else None,
    )
    assert result.success
    (event,) = result.asset_materializations_for_node("ducklake_upkeep")
    return {key: value.value for key, value in event.metadata.items()}


def test_upkeep_deletes_orphaned_files_past_the_safety_age_and_keeps_the_live_ones(
    demo_server, tmp_path, warehouse
):
    """A killed run leaves Parquet files no snapshot lists: the upkeep deletes them once older
    than orphan_age_hours, never a file a snapshot lists, never a young one (a live write's)."""
    assert refresh(demo_server, tmp_path, warehouse, assets=raw_assets()).success
    data = Path(str(warehouse.ducklake_data_path))
    live = set(data.rglob("*.parquet"))
    folder = next(iter(live)).parent
    old_orphan, young_orphan = (
        folder / "ducklake-killed-old.parquet",
        folder / "ducklake-killed-young.parquet",
    )
    for orphan in (old_orphan, young_orphan):
        orphan.write_bytes(next(iter(live)).read_bytes())
    two_days_ago = time.time() - 2 * 86400
    os.utime(old_orphan, (two_days_ago, two_days_ago))

    meta = run_upkeep(warehouse, orphan_age_hours=24.0)

    assert meta["orphans_deleted"] == 1
    assert not old_orphan.exists() and young_orphan.exists()
    assert live <= set(data.rglob("*.parquet"))
    with warehouse.read_connection() as conn:
        counts = conn.execute(
            "SELECT (SELECT count(*) FROM raw.transactions), (SELECT count(*) FROM raw.events)"
        ).fetchone()
    assert counts == (1200, 30)  # every live file still read


def test_changes_are_read_once_per_snapshot_and_a_commit_since_is_seen(warehouse):
    """A run's steps share one read of the lake's changes while nothing commits; a table written
    meanwhile (by an earlier step, or another writer) counts as changed for the next."""
    lake = warehouse.lake
    with warehouse.get_connection() as conn:
        conn.execute("CREATE SCHEMA raw")
        run_transaction(conn, "raw.a", lambda: conn.execute("CREATE TABLE raw.a AS SELECT 1"))
        run_transaction(conn, "raw.b", lambda: conn.execute("CREATE TABLE raw.b AS SELECT 1"))
        (built,) = conn.execute("SELECT id FROM current_snapshot()").fetchone()
        assert lake_module.changed_since(conn, lake, built, ["raw.a", "raw.b"]) == []
        read = lake_module._READ_AT[lake, "changes"]
        assert lake_module.changed_since(conn, lake, built - 1, ["raw.a", "raw.b"]) == ["raw.b"]
        assert lake_module._READ_AT[lake, "changes"] is read  # no commit since: not read again
        with warehouse.get_connection() as writer:
            run_transaction(writer, "raw.a", lambda: writer.execute("INSERT INTO raw.a VALUES (2)"))
        assert lake_module.changed_since(conn, lake, built, ["raw.a", "raw.b"]) == ["raw.a"]
        assert lake_module._READ_AT[lake, "changes"] is not read


def test_the_changes_read_from_the_catalog_are_those_snapshots_lists_and_a_lake_made_again_is_new(
    warehouse,
):
    """The changes are parsed from the catalog's rows, each snapshot once a process: they must be
    what DuckLake's ``snapshots()`` lists, whatever the names (quotes, dots, commas), after drops,
    renames and expired snapshots; and a snapshot read before under the same id but another time
    (a lake made again, whose ids start over) is parsed anew, not taken for the one before."""
    odd = 'raw."x, ""y"".z"'

    def listed(conn) -> dict:
        rows = conn.execute("SELECT snapshot_id, flatten(map_values(changes)) FROM snapshots()")
        # snapshots() quotes a name that needs it; the changes name it as the list of tables does
        found = {snapshot: frozenset(changed or ()) for snapshot, changed in rows.fetchall()}
        return {s: frozenset(n.replace(odd, 'raw.x, "y".z') for n in v) for s, v in found.items()}

    lake = warehouse.lake
    with warehouse.get_connection() as conn:
        conn.execute("CREATE SCHEMA raw")
        for sql in (
            "CREATE TABLE raw.a AS SELECT 1 AS v",
            f"CREATE TABLE {odd} AS SELECT 1 AS v",
            f"INSERT INTO {odd} VALUES (2)",
            "ALTER TABLE raw.a RENAME TO c",
            "DELETE FROM raw.c",
            "ALTER TABLE raw.c ADD COLUMN w INT",
            f"DROP TABLE {odd}",
        ):
            run_transaction(conn, "raw.a", lambda sql=sql: conn.execute(sql))
            assert lake_module._changes(conn, lake).touched == listed(conn)
            lake_module.changed_since(conn, lake, 0, ["raw.c"])  # kept for the next read
        expired = [s for s in listed(conn) if 0 < s < max(listed(conn)) and s % 2]
        conn.execute(f"CALL ducklake_expire_snapshots('{lake.alias}', versions => {expired})")
        run_transaction(conn, "raw.c", lambda: conn.execute("INSERT INTO raw.c VALUES (3, 4)"))
        now = lake_module._changes(conn, lake)
        assert now.touched == listed(conn) and not set(expired) & set(now.touched)
        other = {s: frozenset({"raw.gone"}) for s in now.touched}  # another lake's, same ids
        then = {s: f"{time} (another lake)" for s, time in now.times.items()}
        lake_module._READ_AT[lake, "changes"] = (0, replace(now, touched=other, times=then))
        assert lake_module._changes(conn, lake).touched == listed(conn)


def test_readers_wait_for_the_tables_built_from_a_new_one_unless_they_were_dropped(warehouse):
    """A table written again makes the tables built from it stale: readers keep the snapshot
    before, until they are built again, or dropped (a table the project no longer builds)."""
    with warehouse.get_connection() as conn:

        def write(statement: str) -> Callable[[], object]:
            return lambda: conn.execute(statement)

        conn.execute("CREATE SCHEMA raw")
        conn.execute("CREATE SCHEMA core")
        warehouse.one_commit(conn, "raw.a", write("CREATE TABLE raw.a AS SELECT 1 AS id"))
        built = write("CREATE OR REPLACE TABLE core.b AS SELECT * FROM raw.a")
        warehouse.one_commit(conn, "core.b", built, reads=["raw.a"])
        warehouse.one_commit(conn, "raw.a", write("INSERT INTO raw.a VALUES (2)"))

        def read() -> tuple | None:
            with warehouse.read_connection() as reader:
                counts = "SELECT (SELECT count(*) FROM raw.a), count(*) FROM core.b"
                return reader.execute(counts).fetchone()

        assert read() == (1, 1)
        warehouse.one_commit(conn, "core.b", built, reads=["raw.a"])
        assert read() == (2, 2)
        warehouse.one_commit(conn, "raw.a", write("INSERT INTO raw.a VALUES (3)"))
        assert read() == (2, 2)
        run_transaction(conn, "core.b", write("DROP TABLE core.b"))
    with warehouse.read_connection() as reader:
        assert reader.execute("SELECT count(*) FROM raw.a").fetchone() == (3,)


def test_upkeep_keeps_the_refresh_readers_read_however_old(demo_server, tmp_path, warehouse):
    """A raw-only refresh is not complete: readers keep the whole refresh before it, and an
    upkeep that expires every older snapshot (retain_snapshots_days 0) keeps that one."""
    assert refresh(demo_server, tmp_path, warehouse, WHOLE).success
    demo_server.behaviour.evolve(1)
    assert refresh(demo_server, tmp_path, warehouse, assets=raw_assets()).success

    meta = run_upkeep(warehouse, retain_snapshots_days=0)

    assert meta["snapshots_after"] < meta["snapshots_before"]
    with warehouse.read_connection() as conn:
        answer = {name: list(conn.execute(sql).fetchone()) for name, sql in READS.items()}
    assert_agree(answer)
    assert answer["raw.transactions"][0] == 1200 != demo_server.dataset.count("transactions")


def test_time_travel_reaches_back_retain_snapshots_days(demo_server, tmp_path, warehouse):
    assert refresh(demo_server, tmp_path, warehouse, assets=raw_assets()).success
    with warehouse.read_connection() as conn:
        (first,) = conn.execute("SELECT max(snapshot_id) FROM fieldsales.snapshots()").fetchone()
    demo_server.behaviour.evolve(1)
    assert refresh(
        demo_server,
        tmp_path,
        warehouse,
        assets=raw_assets(),
        run_config={"ops": {"raw_transactions": {"config": {"refresh_mode": "full"}}}},
    ).success

    meta = run_upkeep(warehouse)  # retain_snapshots_days=7: the first refresh is minutes old
    assert meta["retain_snapshots_days"] == 7
    with warehouse.read_connection() as conn:
        (then,) = conn.execute(
            f"SELECT count(*) FROM raw.transactions AT (VERSION => {first})"
        ).fetchone()
        (now,) = conn.execute("SELECT count(*) FROM raw.transactions").fetchone()
    assert then == 1200 and now == demo_server.dataset.count("transactions")


def test_upkeep_is_scheduled_by_default(demo_env):
    from fieldsales_dagster_tests.project import load_project_defs

    defs = load_project_defs()
    schedule = defs.get_schedule_def("lake_upkeep_schedule")
    assert schedule.default_status == dg.DefaultScheduleStatus.RUNNING
    assert schedule.cron_schedule == "0 3 * * 0"
    assert schedule.job.name == "lake_upkeep"


def test_storage_never_imports_the_http_client():
    """The lake module and the warehouse resource load without the API client."""
    code = (
        "import sys, fieldsales_dagster.warehouse.lake, fieldsales_dagster.warehouse.warehouse; "
        "print(sorted(m for m in sys.modules if m.startswith('fieldsales_dagster.client')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]"


def test_a_run_against_a_wrong_url_records_no_tenant_and_the_right_url_then_writes(tmp_path):
    """The lake records its tenant with its first commit, after the server answered: a run
    against a mistyped URL (another host) fails and leaves nothing that blocks the right one."""
    from fieldsales_dagster.warehouse.lake import recorded_tenant
    from fieldsales_dagster_tests.conftest import make_warehouse

    with DemoServer(DemoConfig(transactions=60, seed=3), host="127.0.0.1", port=0) as server:
        wrong_api = make_api(
            server, tmp_path, base_url="http://localhost:9", unreachable_budget_s=0.5
        )
        wrong = make_warehouse(tmp_path, tenant="localhost (key_prefix -)")
        result = dg.materialize(
            raw_assets(),
            resources={"fieldsales_api": wrong_api, "warehouse": wrong},
            raise_on_error=False,
        )
        assert not result.success
        if Path(wrong.lake.catalog.removeprefix("sqlite:")).exists():
            with wrong.read_connection() as conn:
                assert recorded_tenant(conn) is None
        right = make_warehouse(tmp_path, tenant="127.0.0.1 (key_prefix -)")
        assert refresh(server, tmp_path, right, assets=raw_assets()).success
        with right.read_connection() as conn:
            assert recorded_tenant(conn) == "127.0.0.1 (key_prefix -)"
        # And another tenant is refused, naming both.
        other = make_warehouse(tmp_path, tenant="other.example.com (key_prefix -)")
        refused = refresh(server, tmp_path, other, assets=raw_assets())
        assert not refused.success
        message = refused.get_step_failure_events()[0].step_failure_data.error.to_string()
        assert "belongs to '127.0.0.1 (key_prefix -)'" in message


def test_a_lake_moved_to_another_tenant_refuses_the_old_one_in_the_same_process(tmp_path):
    """A process reads its tenant's record once; moving the lake (``move_tenant``) makes it
    read again, so the tenant moved away from is refused at its next write."""
    from fieldsales_dagster.warehouse.lake import move_tenant
    from fieldsales_dagster_tests.conftest import make_warehouse

    with DemoServer(DemoConfig(transactions=60, seed=3), host="127.0.0.1", port=0) as server:
        old = make_warehouse(tmp_path, tenant="old.example.com (key_prefix -)")
        assert refresh(server, tmp_path, old, assets=raw_assets()).success
        assert refresh(server, tmp_path, old, assets=raw_assets()).success
        new = make_warehouse(tmp_path, tenant="new.example.com (key_prefix -)")
        assert move_tenant(new.lake) == "old.example.com (key_prefix -)"
        refused = refresh(server, tmp_path, old, assets=raw_assets())
        assert not refused.success
        message = refused.get_step_failure_events()[0].step_failure_data.error.to_string()
        assert "belongs to 'new.example.com (key_prefix -)'" in message
        assert refresh(server, tmp_path, new, assets=raw_assets()).success


def test_asking_whether_a_table_exists_inside_a_write_leaves_the_write_whole(warehouse):
    """``table_exists`` binds a query: an unknown schema or table answers False, and the lake's
    open transaction still commits what it wrote."""
    from fieldsales_dagster.warehouse.lake import run_transaction, table_exists

    with warehouse.get_connection() as conn:
        conn.execute("CREATE SCHEMA IF NOT EXISTS core")

        def write() -> list[bool]:
            conn.execute("CREATE TABLE core.written AS SELECT 1 AS x")
            found = [
                table_exists(conn, name)
                for name in ("core.written", "core.missing", "nowhere.written")
            ]
            conn.execute("INSERT INTO core.written VALUES (2)")
            return found

        assert run_transaction(conn, "core.written", write) == [True, False, False]
    with warehouse.read_connection() as conn:
        assert conn.execute("SELECT x FROM core.written ORDER BY x").fetchall() == [(1,), (2,)]
        assert table_exists(conn, "core.written") and not table_exists(conn, "core.missing")


def test_a_lake_connection_returns_freed_memory_from_a_thread_of_its_own(tmp_path):
    (tmp_path / "lake").mkdir()
    warehouse = FieldSalesWarehouse(
        ducklake_catalog=f"sqlite:{tmp_path / 'catalog.sqlite'}",
        ducklake_data_path=str(tmp_path / "lake"),
    )
    with warehouse.get_connection() as conn:
        (background,) = conn.execute(
            "SELECT current_setting('allocator_background_threads')"
        ).fetchone()
    assert background is True


def test_each_step_s_connection_starts_with_the_pool_emptied_of_what_earlier_steps_cached(
    tmp_path,
):
    """What one step left in DuckDB's pool (here tables of an in-memory database, as the run's
    shared event decode is) goes to the temp folder as the next step opens its connection, once
    it is more than a quarter of the limit: the next step has the pool's whole limit, and the
    tables read back whole. Less than that stays, since loading it again costs more."""
    (tmp_path / "lake").mkdir()
    warehouse = FieldSalesWarehouse(
        ducklake_catalog=f"sqlite:{tmp_path / 'catalog.sqlite'}",
        ducklake_data_path=str(tmp_path / "lake"),
        duckdb_memory_limit="128MB",
    )
    in_pool = (
        "SELECT sum(memory_usage_bytes) // 2**20, sum(temporary_storage_bytes) // 2**20 "
        "FROM duckdb_memory()"
    )
    table = (
        "CREATE TABLE earlier_step.{name} AS SELECT i, md5(i::VARCHAR) || md5((i + 1)::VARCHAR) "
        "AS text FROM range({rows}) AS r(i)"
    )
    with warehouse.get_connection() as conn:
        conn.execute("ATTACH ':memory:' AS earlier_step")
        conn.execute(table.format(name="small", rows=150000))
        small, _ = conn.execute(in_pool).fetchone()
        limit = conn.execute("SELECT current_setting('memory_limit')").fetchone()[0]
    assert 8 <= small <= 24  # MiB: under a quarter of 128MB (30.5 MiB)

    with warehouse.get_connection() as conn:
        held, spilled = conn.execute(in_pool).fetchone()
        assert (held, spilled) == (small, 0)  # kept: the next step reads it from memory
        conn.execute(table.format(name="large", rows=450000))
        cached, _ = conn.execute(in_pool).fetchone()
    assert cached >= 40

    with warehouse.get_connection() as conn:
        held, spilled = conn.execute(in_pool).fetchone()
        assert held <= 4
        assert spilled >= cached // 2  # to the temp folder, to be read again
        assert conn.execute("SELECT current_setting('memory_limit')").fetchone()[0] == limit
        for name, rows in (("small", 150000), ("large", 450000)):
            assert conn.execute(
                f"SELECT count(*), sum(length(text)) FROM earlier_step.{name}"
            ).fetchone() == (rows, rows * 64)


def test_emptying_the_pool_while_a_query_runs_leaves_that_query_whole():
    """DuckDB refuses the lower limit while a query holds more than it (it cannot evict what a
    running query pinned): the query finishes, and the limit is as it was."""
    import threading

    import duckdb

    db = duckdb.connect(config={"memory_limit": "256MB", "threads": 2})
    db.execute("ATTACH ':memory:' AS m")
    db.execute("CREATE TABLE m.t AS SELECT md5(i::VARCHAR) AS s FROM range(2000000) AS r(i)")
    outcome: list[object] = []

    def sort() -> None:
        try:
            outcome.append(
                db.cursor()
                .execute("SELECT count(DISTINCT s) FROM (SELECT s FROM m.t ORDER BY s)")
                .fetchone()
            )
        except duckdb.Error as exc:
            outcome.append(exc)

    running = threading.Thread(target=sort)
    running.start()
    unloads = 0
    while running.is_alive() or not unloads:
        release_step_memory(db.cursor(), "256MB", limit_bytes=0)  # whatever it holds
        unloads += 1
    running.join()
    assert outcome == [(2000000,)]
    assert db.execute("SELECT current_setting('memory_limit')").fetchone() == ("244.1 MiB",)


def test_a_new_extension_folder_gets_the_catalogs_scanner_installed_once(tmp_path, monkeypatch):
    """The scanner is installed into the user's extension folder by the first connection that
    finds it missing; the next lake's connection loads it from there."""
    from fieldsales_dagster_tests.conftest import make_warehouse

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for name in ("first", "second"):
        with make_warehouse(tmp_path, name).get_connection() as conn:
            conn.execute("CREATE TABLE t AS SELECT 1 AS x")
            assert conn.execute("SELECT x FROM t").fetchall() == [(1,)]
        (installed,) = (tmp_path / "cache").rglob("sqlite_scanner.duckdb_extension")
        if name == "first":
            first_install = installed.stat().st_mtime_ns
    assert installed.stat().st_mtime_ns == first_install


def test_a_lake_connection_loads_only_signed_extensions(tmp_path):
    """The extensions come from the pinned wheels, and DuckDB still checks their signatures: a
    file swapped under the wheels' folder is refused, not run with the lake's access."""
    (tmp_path / "lake").mkdir()
    warehouse = FieldSalesWarehouse(
        ducklake_catalog=f"sqlite:{tmp_path / 'catalog.sqlite'}",
        ducklake_data_path=str(tmp_path / "lake"),
    )
    with warehouse.get_connection() as conn:
        (allowed,) = conn.execute("SELECT current_setting('allow_unsigned_extensions')").fetchone()
        loaded = {
            name
            for (name,) in conn.execute(
                "SELECT extension_name FROM duckdb_extensions() WHERE loaded"
            ).fetchall()
        }
    assert allowed is False
    assert "ducklake" in loaded
