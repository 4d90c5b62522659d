"""The analysts' copy: readers never block a refresh, never see a half-refreshed database."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import duckdb
import pytest

from fieldsales_dagster.assets.publish import PUBLISHED_CHECK, with_publish_steps
from fieldsales_dagster.demo_api import DemoConfig, DemoServer
from fieldsales_dagster.token.store import TokenStore
from fieldsales_dagster.warehouse import resource as warehouse_module
from fieldsales_dagster.warehouse.resource import FieldSalesWarehouse
from fieldsales_dagster_tests.conftest import make_api
from fieldsales_dagster_tests.project import core_assets, materialize, raw_assets

SNAPSHOT = """
    SELECT (SELECT count(*) FROM raw.transactions), (SELECT count(*) FROM core.transactions),
           (SELECT count(*) FROM raw.events), (SELECT count(*) FROM core.events)
"""


def refresh(server, tmp_path, database: Path, *, selection=None, instance=None, **api):
    """A full refresh (or ``selection``) against ``server``, into ``database``.

    ``busy_timeout_s=0``: had anything held the working file, the run would fail at once
    instead of waiting, so a successful run is one that neither failed nor waited.
    """
    return materialize(
        [*raw_assets(), *core_assets()],
        selection=selection,
        instance=instance,
        resources={
            "fieldsales_api": make_api(server, tmp_path, **api),
            "warehouse": FieldSalesWarehouse(database=str(database), busy_timeout_s=0),
        },
        raise_on_error=False,
    )


def snapshot(database: Path) -> list[int]:
    with duckdb.connect(str(database), read_only=True) as conn:
        return list(conn.execute(SNAPSHOT).fetchone())


@pytest.fixture
def bigger_server():
    with DemoServer(DemoConfig(transactions=1800, seed=4), host="127.0.0.1", port=0) as server:
        yield server


class AnalystReader:
    """A second process reading the analysts' file in a loop (see analyst_reader.py)."""

    def __init__(self, database: Path, mode: str, tmp_path: Path):
        self.stop_file = tmp_path / f"stop-{mode}"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "fieldsales_dagster_tests.analyst_reader",
                str(database),
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


def test_reader_holding_the_file_open_neither_blocks_a_refresh_nor_sees_new_tables_mixed_in(
    demo_server, bigger_server, tmp_path
):
    database = tmp_path / "fieldsales.duckdb"
    assert refresh(demo_server, tmp_path, database).success
    old = snapshot(database)
    reader = AnalystReader(database, "hold", tmp_path)
    try:
        assert reader.first == old
        assert refresh(bigger_server, tmp_path, database).success
        report = reader.finish()
    finally:
        reader.kill()
    assert report["errors"] == []
    assert report["queries"] > 0
    # The held connection keeps the snapshot it opened: the old tables, all of them.
    assert {tuple(json.loads(k)) for k in report["seen"]} == {tuple(old)}


def test_connections_opened_during_a_refresh_see_old_or_new_tables_never_a_mix(
    demo_server, bigger_server, tmp_path
):
    database = tmp_path / "fieldsales.duckdb"
    assert refresh(demo_server, tmp_path, database).success
    old = snapshot(database)
    reader = AnalystReader(database, "reopen", tmp_path)
    try:
        assert refresh(bigger_server, tmp_path, database).success
        report = reader.finish()
    finally:
        reader.kill()
    new = snapshot(database)
    assert new == [1800, 1800, 45, 45] and old == [1200, 1200, 30, 30]
    assert report["errors"] == []
    assert {tuple(json.loads(k)) for k in report["seen"]} <= {tuple(old), tuple(new)}


def test_connection_opened_after_a_refresh_sees_the_new_tables(
    demo_server, bigger_server, tmp_path
):
    database = tmp_path / "fieldsales.duckdb"
    assert refresh(demo_server, tmp_path, database).success
    reader = AnalystReader(database, "hold", tmp_path)
    try:
        assert refresh(bigger_server, tmp_path, database).success
        assert snapshot(database) == [1800, 1800, 45, 45]
        reader.finish()
    finally:
        reader.kill()


def test_raw_only_run_publishes_the_table_it_changed(demo_server, tmp_path):
    database = tmp_path / "fieldsales.duckdb"
    assert refresh(demo_server, tmp_path, database, selection=["raw_events"]).success
    with duckdb.connect(str(database), read_only=True) as conn:
        assert conn.execute("SELECT count(*) FROM raw.events").fetchone() == (30,)
        tables = conn.execute(
            "SELECT table_schema, table_name FROM information_schema.tables ORDER BY ALL"
        ).fetchall()
    # raw.events and the record of the run that loaded it (meta.load_runs), nothing else.
    assert tables == [("meta", "load_runs"), ("raw", "events")]


def test_run_that_changes_no_table_leaves_the_analysts_file_alone(demo_server, tmp_path):
    database = tmp_path / "fieldsales.duckdb"
    assert refresh(demo_server, tmp_path, database, selection=["raw_events"]).success
    before = database.stat()
    failed = refresh(
        demo_server,
        tmp_path,
        database,
        selection=["raw_events"],
        api_token="refused-token",
        use_token_store=False,
    )
    assert not failed.success
    after = database.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_publish_step_reports_bytes_seconds_and_target_on_each_asset_the_run_changed(
    demo_server, tmp_path
):
    database = tmp_path / "fieldsales.duckdb"
    result = refresh(demo_server, tmp_path, database, selection=["raw_events"])
    assert result.success
    published = {
        evaluation.asset_key.to_user_string(): evaluation
        for evaluation in result.get_asset_check_evaluations()
        if evaluation.check_name == PUBLISHED_CHECK
    }
    assert list(published) == ["raw_events"]  # raw_transactions was not in the run
    assert published["raw_events"].passed
    metadata = published["raw_events"].metadata
    assert metadata["fieldsales/published_path"].value == str(database)
    assert metadata["fieldsales/published_bytes"].value == database.stat().st_size
    assert metadata["fieldsales/publish_seconds"].value >= 0
    assert metadata["fieldsales/published_at"].value > 0
    assert metadata["fieldsales/materialized_in_run"].value is True
    steps = [e.step_key for e in result.all_events if e.event_type_value == "STEP_SUCCESS"]
    assert steps == ["raw_events", "publish_warehouse"]


@pytest.mark.parametrize(
    ("code", "reason", "remedy"),
    [
        (errno.EACCES, "Permission denied", "Let the user running the refresh write to"),
        (errno.EROFS, "Read-only file system", "Mount"),
        (errno.EXDEV, "Invalid cross-device link", "Mount the folder"),
    ],
)
def test_failed_publish_fails_the_run_keeps_the_analysts_file_and_the_next_run_publishes(
    demo_server, bigger_server, tmp_path, monkeypatch, code, reason, remedy
):
    """Fault injected at the write boundary (the rename over the analysts' file); the full disk
    is a real one in test_operate.py."""
    database = tmp_path / "fieldsales.duckdb"
    assert refresh(demo_server, tmp_path, database).success
    before, old = database.stat(), snapshot(database)
    real_replace = os.replace

    def refuse(source, target):
        if Path(target) == database:
            raise OSError(code, os.strerror(code), str(target))
        return real_replace(source, target)

    monkeypatch.setattr(warehouse_module.os, "replace", refuse)
    failed = refresh(bigger_server, tmp_path, database)

    assert not failed.success
    (failure,) = [e for e in failed.all_events if e.event_type_value == "STEP_FAILURE"]
    assert failure.step_key == "publish_warehouse"
    message = failure.step_failure_data.error.to_string()
    assert f"Publishing the analysts' file {database} failed: {reason}" in message
    assert f"MB free in {tmp_path} for a copy of" in message
    assert remedy in message
    assert (database.stat().st_ino, snapshot(database)) == (before.st_ino, old)
    assert sorted(p.name for p in tmp_path.glob(".fieldsales.duckdb.publish-*")) == []

    monkeypatch.setattr(warehouse_module.os, "replace", real_replace)
    assert refresh(bigger_server, tmp_path, database, selection=["raw_event_groups"]).success
    assert snapshot(database) == [1800, 1800, 45, 45]


def test_a_user_asset_writing_through_the_warehouse_is_published_by_its_own_run(
    demo_server, tmp_path
):
    @dg.asset(deps=["raw_events"])
    def events_per_state(warehouse: FieldSalesWarehouse) -> None:
        with warehouse.get_connection() as conn:
            conn.execute("CREATE SCHEMA IF NOT EXISTS analytics")
            conn.execute(
                "CREATE OR REPLACE TABLE analytics.events_per_state AS "
                "SELECT payload->>'state' AS state, count(*) AS n FROM raw.events GROUP BY 1"
            )

    database = tmp_path / "fieldsales.duckdb"
    warehouse = FieldSalesWarehouse(database=str(database))
    resources = {"fieldsales_api": make_api(demo_server, tmp_path), "warehouse": warehouse}
    defs = with_publish_steps(
        dg.Definitions(assets=[*raw_assets(), events_per_state], resources=resources)
    )
    job = defs.resolve_implicit_global_asset_job_def()
    assert job.execute_in_process(asset_selection=[dg.AssetKey("raw_events")]).success
    with duckdb.connect(str(database), read_only=True) as conn:
        assert not conn.execute(
            "SELECT * FROM duckdb_schemas() WHERE schema_name = 'analytics'"
        ).fetchall()

    result = job.execute_in_process(asset_selection=[dg.AssetKey("events_per_state")])

    assert result.success
    with duckdb.connect(str(database), read_only=True) as conn:
        (total,) = conn.execute("SELECT sum(n) FROM analytics.events_per_state").fetchone()
    assert total == 30


def test_every_writer_of_the_code_location_is_followed_by_the_publish_step(demo_env):
    from fieldsales_dagster_tests.project import load_project_defs

    defs = load_project_defs()
    repository = defs.get_repository_def()
    writers = {
        key
        for assets in defs.assets
        if "warehouse" in assets.required_resource_keys
        for key in assets.keys
    }
    published = {
        key.asset_key
        for key in repository.asset_graph.asset_check_keys
        if key.name == PUBLISHED_CHECK
    }
    assert published == writers and len(writers) == 18
    refresh_job = defs.get_job_def("refresh_all")
    assert "publish_warehouse" in {node.name for node in refresh_job.graph.node_defs}
    sensor = defs.get_sensor_def("core_automation_sensor")
    checks = sensor.asset_selection.resolve_checks(repository.asset_graph)
    assert {key for key in checks if key.name == PUBLISHED_CHECK} == {
        dg.AssetCheckKey(key, PUBLISHED_CHECK) for key in writers
    }


def test_symlinked_paths_are_written_through_their_targets_and_the_links_stay(
    demo_server, tmp_path
):
    volume = tmp_path / "volume"  # the mounted volume the links point at
    volume.mkdir()
    database, store = tmp_path / "fieldsales.duckdb", tmp_path / "token.json"
    database.symlink_to(volume / "fieldsales.duckdb")
    store.symlink_to(volume / "token.json")
    resources = {
        "fieldsales_api": make_api(demo_server, tmp_path, token_store_path=str(store)),
        "warehouse": FieldSalesWarehouse(database=str(database)),
    }
    for _ in range(2):  # the first publish creates the target, the second replaces it
        assert materialize(raw_assets(), resources=resources, selection=["raw_events"]).success

    assert database.is_symlink() and store.is_symlink()
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "fieldsales.duckdb",
        "token.json",
        "volume",
    ]
    assert snapshot_raw_events(volume / "fieldsales.duckdb") == 30
    assert (volume / "fieldsales.working.duckdb").is_file()
    assert TokenStore(volume / "token.json").read().token == demo_server.token


def snapshot_raw_events(database: Path) -> int:
    with duckdb.connect(str(database), read_only=True) as conn:
        return conn.execute("SELECT count(*) FROM raw.events").fetchone()[0]


def test_missing_folder_fails_the_first_step_before_any_request_unless_create_dirs(
    demo_server, tmp_path
):
    database = tmp_path / "new" / "fieldsales.duckdb"
    resources = {
        "fieldsales_api": make_api(demo_server, tmp_path),
        "warehouse": FieldSalesWarehouse(database=str(database)),
    }
    failed = materialize(
        raw_assets(), resources=resources, selection=["raw_events"], raise_on_error=False
    )
    assert not failed.success
    (failure,) = [e for e in failed.all_events if e.event_type_value == "STEP_FAILURE"]
    assert failure.step_key == "raw_events"
    message = failure.step_failure_data.error.to_string()
    assert "duckdb_path (from FIELDSALES_DUCKDB_PATH) is invalid" in message
    assert f"mkdir -p {database.parent}" in message
    assert sum(demo_server.behaviour.request_counts.values()) == 0
    assert not database.parent.exists()

    resources["warehouse"] = FieldSalesWarehouse(database=str(database), create_dirs=True)
    assert materialize(raw_assets(), resources=resources, selection=["raw_events"]).success
    assert snapshot_raw_events(database) == 30


def test_first_run_seeds_the_working_database_from_an_existing_analysts_file(demo_server, tmp_path):
    database = tmp_path / "fieldsales.duckdb"
    with duckdb.connect(str(database)) as conn:  # the single-file layout's database
        conn.execute("CREATE SCHEMA raw")
        conn.execute("CREATE TABLE raw.transactions AS SELECT 'kept' AS id")
    warehouse = FieldSalesWarehouse(database=str(database))
    assert not warehouse.working_path.exists()

    assert refresh(demo_server, tmp_path, database, selection=["raw_events"]).success

    for path in (database, warehouse.working_path):
        with duckdb.connect(str(path), read_only=True) as conn:
            assert conn.execute("SELECT id FROM raw.transactions").fetchall() == [("kept",)]
            assert conn.execute("SELECT count(*) FROM raw.events").fetchone() == (30,)


def test_working_database_sits_beside_the_analysts_file_under_its_own_name(tmp_path):
    warehouse = FieldSalesWarehouse(database=str(tmp_path / "fieldsales.duckdb"))
    assert warehouse.working_path == tmp_path / "fieldsales.working.duckdb"
    assert warehouse.lock_path == tmp_path / "fieldsales.working.duckdb.lock"
    chosen = FieldSalesWarehouse(database="a.duckdb", working_database=str(tmp_path / "w.duckdb"))
    assert chosen.working_path == tmp_path / "w.duckdb"


def test_resource_has_no_setting_it_ignores():
    assert set(FieldSalesWarehouse.model_fields) == {
        "database",
        "working_database",
        "memory_limit",
        "threads",
        "lock_timeout_s",
        "busy_timeout_s",
        "pii",
        "pii_hash_key",
        "redact_pii_in_raw",
        "create_dirs",
        "refresh_mode",
        "full_refresh_every_days",
        "lookback_days",
        "max_shrink_fraction",
        "storage",
        "ducklake_catalog",
        "ducklake_data_path",
        "ducklake_schema",
        "ducklake_password_env_var",
    }


def test_motherduck_database_is_written_in_place_without_lock_or_publish(tmp_path, monkeypatch):
    """MotherDuck cannot run here (no network): the connection is recorded, not opened."""
    opened: list[tuple[str, dict]] = []

    class Recorded:
        def close(self) -> None:
            pass

    def record_connect(database: str, config: dict) -> Recorded:
        opened.append((database, config))
        return Recorded()

    monkeypatch.setattr(warehouse_module.duckdb, "connect", record_connect)
    monkeypatch.chdir(tmp_path)
    warehouse = FieldSalesWarehouse(database="md:fieldsales")

    assert warehouse.is_motherduck
    assert warehouse.working_path is None and warehouse.lock_path is None
    with warehouse.get_connection():
        pass
    assert [database for database, _ in opened] == ["md:fieldsales"]
    assert "temp_directory" not in opened[0][1]
    assert warehouse.publish() is None
    assert list(tmp_path.iterdir()) == []
