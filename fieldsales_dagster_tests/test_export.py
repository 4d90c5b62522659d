"""The optional single-file export: one lake snapshot in one DuckDB file, replaced atomically.

Off by default; on when ``duckdb_path`` (``FIELDSALES_DUCKDB_PATH``) is set. A failing export
fails its own step and the run, naming the file and the cause; the lake's snapshot stays
committed and the previous export stays whole. (A real full disk: test_operate.py.)
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import duckdb
import pytest

from fieldsales_dagster.assets.export import EXPORT_ASSET, build_export_asset
from fieldsales_dagster.warehouse import lake as lake_module
from fieldsales_dagster.warehouse.lake import EXPORT_MARKER
from fieldsales_dagster_tests.conftest import make_api, make_warehouse
from fieldsales_dagster_tests.project import DEFAULT, core_assets, load_project_defs, raw_assets

TABLES = [*raw_assets(), *core_assets()]
COUNTS = "SELECT (SELECT count(*) FROM raw.transactions), (SELECT count(*) FROM core.transactions)"


def export_asset() -> dg.AssetsDefinition:
    keys = [key for asset in TABLES for key in asset.keys if key.path[-1].startswith("core_")]
    return build_export_asset(DEFAULT, ["team:data"], keys)


def run(server, tmp_path, warehouse, selection=None) -> dg.ExecuteInProcessResult:
    return dg.materialize(
        [*TABLES, export_asset()],
        resources={"fieldsales_api": make_api(server, tmp_path), "warehouse": warehouse},
        selection=selection,
        raise_on_error=False,
    )


def failure(result: dg.ExecuteInProcessResult) -> str:
    (event,) = result.get_step_failure_events()
    assert event.step_key == EXPORT_ASSET
    return event.step_failure_data.error.to_string()


def read(path: Path) -> tuple:
    with duckdb.connect(str(path), read_only=True) as conn:
        return conn.execute(COUNTS).fetchone()


def test_the_export_is_off_by_default_and_on_when_duckdb_path_is_set(
    demo_env, monkeypatch, tmp_path
):
    graph = load_project_defs().resolve_asset_graph()
    assert EXPORT_ASSET not in {key.to_user_string() for key in graph.get_all_asset_keys()}

    monkeypatch.setenv("FIELDSALES_DUCKDB_PATH", str(tmp_path / "export.duckdb"))
    defs = load_project_defs()
    graph = defs.resolve_asset_graph()
    export = graph.get(dg.AssetKey(EXPORT_ASSET))
    # After every core and mart table, in the refresh job.
    assert {key.to_user_string() for key in export.parent_keys} == {
        key.to_user_string()
        for key in graph.get_all_asset_keys()
        if key.path[-1].startswith(("core_", "mart_"))
    }
    assert (
        dg.AssetKey(EXPORT_ASSET)
        in defs.resolve_job_def("refresh_all").asset_layer.executable_asset_keys
    )


def test_the_export_holds_one_snapshot_of_every_table_marked_as_an_export(demo_server, tmp_path):
    target = tmp_path / "export.duckdb"
    warehouse = make_warehouse(tmp_path, duckdb_path=str(target))
    result = run(demo_server, tmp_path, warehouse)
    assert result.success
    (event,) = result.asset_materializations_for_node(EXPORT_ASSET)
    with warehouse.read_connection() as conn:
        (snapshot,) = conn.execute("SELECT id FROM fieldsales.current_snapshot()").fetchone()
        lake_tables = conn.execute(
            "SELECT schema_name, table_name FROM duckdb_tables() WHERE database_name = "
            "'fieldsales' ORDER BY ALL"
        ).fetchall()
    assert event.metadata["fieldsales/snapshot_id"].value == snapshot
    with duckdb.connect(str(target), read_only=True) as conn:
        assert conn.execute(COUNTS).fetchone() == (1200, 1200)
        tables = conn.execute(
            "SELECT schema_name, table_name FROM duckdb_tables() ORDER BY ALL"
        ).fetchall()
        (marked,) = conn.execute(f"SELECT snapshot_id FROM {EXPORT_MARKER}").fetchone()
        (version,) = conn.execute(
            "SELECT tags['storage_version'] FROM duckdb_databases() "
            "WHERE database_name = current_database()"
        ).fetchone()
    assert set(tables) == {*lake_tables, ("meta", "fieldsales_export")}
    assert marked == snapshot
    assert version == "v1.2.0+"  # readable by every DuckDB client from 1.2 on
    assert not list(tmp_path.glob(".export.duckdb.export-*"))


def test_a_failing_export_fails_its_step_and_the_run_and_keeps_lake_and_previous_file(
    demo_server, tmp_path, monkeypatch
):
    target = tmp_path / "export.duckdb"
    warehouse = make_warehouse(tmp_path, duckdb_path=str(target))
    assert run(demo_server, tmp_path, warehouse).success
    before = (target.stat().st_ino, read(target))
    demo_server.behaviour.evolve(1)
    real_replace = os.replace

    def no_permission(source, destination):
        if Path(destination) == target:
            raise PermissionError(13, "Permission denied", str(destination))
        return real_replace(source, destination)

    monkeypatch.setattr(lake_module.os, "replace", no_permission)
    result = run(demo_server, tmp_path, warehouse)

    assert not result.success
    message = failure(result)
    assert f"to {target} (FIELDSALES_DUCKDB_PATH) failed: Permission denied (EACCES)" in message
    assert "The lake's snapshot stays committed" in message
    assert f"Let the user running the refresh write to {tmp_path}" in message
    assert (target.stat().st_ino, read(target)) == before  # the previous export, whole
    assert not list(tmp_path.glob(".export.duckdb.export-*"))
    with warehouse.read_connection() as conn:  # the refresh itself was committed
        assert conn.execute(COUNTS).fetchone()[0] == demo_server.dataset.count("transactions")


def test_the_next_export_removes_what_a_killed_export_left(demo_server, tmp_path):
    target = tmp_path / "export.duckdb"
    warehouse = make_warehouse(tmp_path, duckdb_path=str(target))
    dead = tmp_path / ".export.duckdb.export-0badf00d"
    live = tmp_path / ".export.duckdb.export-0000beef"
    for path in (dead, Path(f"{dead}.wal"), live):
        path.write_bytes(b"half an export")
    old = time.time() - lake_module.DEAD_EXPORT_AGE_S - 60
    os.utime(dead, (old, old))
    other = tmp_path / ".other.duckdb.export-0badf00d"  # another target's: not this export's
    other.write_bytes(b"x")
    os.utime(other, (old, old))

    assert run(demo_server, tmp_path, warehouse).success

    assert not dead.exists() and not Path(f"{dead}.wal").exists()
    assert live.exists()  # written to moments ago: possibly a live export, kept
    assert other.exists()
    assert read(target)


HOLDER = """
import sys, time, duckdb
conn = duckdb.connect(sys.argv[1])
conn.execute("CREATE TABLE scratch AS SELECT 1 AS x")
print("ready", flush=True)
time.sleep(60)
"""


def test_an_export_file_another_process_holds_read_write_is_not_replaced(demo_server, tmp_path):
    target = tmp_path / "export.duckdb"
    warehouse = make_warehouse(tmp_path, duckdb_path=str(target))
    assert run(demo_server, tmp_path, warehouse).success
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(target)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "ready"
        inode = target.stat().st_ino
        result = run(demo_server, tmp_path, warehouse, selection=[EXPORT_ASSET])
        assert not result.success
        message = failure(result)
        assert f"Cannot replace the export {target}" in message
        assert "read-write" in message
        assert target.stat().st_ino == inode
    finally:
        holder.kill()
        holder.wait()


#: DuckDB files at duckdb_path that are not an export: a user's own file, and one whose tables
#: are named like the project's but carry no marker.
NOT_EXPORTS = {
    "own file": "CREATE TABLE my_notes AS SELECT 'keep me' AS note",
    "project-like tables": "CREATE SCHEMA raw; CREATE TABLE raw.transactions AS SELECT 'x' AS id",
}


@pytest.mark.parametrize("sql", NOT_EXPORTS.values(), ids=NOT_EXPORTS.keys())
def test_a_duckdb_file_that_is_not_an_export_is_never_overwritten(demo_server, tmp_path, sql):
    """A file without the export's marker is left alone, and the message says what it is and
    what to set instead."""
    target = tmp_path / "fieldsales.duckdb"
    with duckdb.connect(str(target)) as conn:
        conn.execute(sql)
    before = target.read_bytes()
    warehouse = make_warehouse(tmp_path, "lake", duckdb_path=str(target))
    result = run(demo_server, tmp_path, warehouse)
    assert not result.success
    message = failure(result)
    assert (
        f"{target} (FIELDSALES_DUCKDB_PATH) is a DuckDB file that is not an export of this "
        f"project (it has no table {EXPORT_MARKER}), so the export does not replace it; nothing "
        "of it was changed. Set FIELDSALES_DUCKDB_PATH to another path for the export (a new "
        "file), or unset it to write no export."
    ) in message
    assert "run a full refresh" not in message
    assert target.read_bytes() == before
