"""The analysts' copy: readers never block a refresh, never see a half-refreshed database."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import dagster as dg
import duckdb
import pytest

from fieldsales_dagster.demo_api import DemoConfig, DemoServer
from fieldsales_dagster.warehouse import resource as warehouse_module
from fieldsales_dagster.warehouse.resource import FieldSalesWarehouse
from fieldsales_dagster_tests.conftest import make_api
from fieldsales_dagster_tests.project import core_assets, raw_assets

SNAPSHOT = """
    SELECT (SELECT count(*) FROM raw.transactions), (SELECT count(*) FROM core.transactions),
           (SELECT count(*) FROM raw.events), (SELECT count(*) FROM core.events)
"""


def refresh(server, tmp_path, database: Path, *, selection=None, instance=None, **api):
    """A full refresh (or ``selection``) against ``server``, into ``database``.

    ``busy_timeout_s=0``: had anything held the working file, the run would fail at once
    instead of waiting, so a successful run is one that neither failed nor waited.
    """
    return dg.materialize(
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
        tables = conn.execute("SELECT table_name FROM information_schema.tables").fetchall()
    assert tables == [("events",)]


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


def test_publish_is_observed_on_the_assets_the_run_changed(demo_server, tmp_path):
    database = tmp_path / "fieldsales.duckdb"
    with dg.DagsterInstance.ephemeral() as instance:
        result = refresh(
            demo_server, tmp_path, database, selection=["raw_events"], instance=instance
        )
        assert result.success
        (record,) = instance.fetch_observations(dg.AssetKey("raw_events"), limit=5).records
        untouched = instance.fetch_observations(dg.AssetKey("raw_transactions"), limit=5)
    metadata = record.asset_observation.metadata
    assert metadata["fieldsales/published_path"].value == str(database)
    assert metadata["fieldsales/published_megabytes"].value == pytest.approx(
        database.stat().st_size / 1e6, abs=0.1
    )
    assert metadata["fieldsales/publish_seconds"].value >= 0
    assert metadata["fieldsales/published_at"].value > 0
    assert metadata["fieldsales/run_id"].value == result.run_id
    assert untouched.records == []


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
