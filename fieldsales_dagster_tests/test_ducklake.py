"""storage: ducklake, for real: a PostgreSQL catalog (pgserver), Parquet files in tmp_path, the
DuckLake and postgres extensions from their wheels, the demo API over HTTP, real materializations.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import duckdb
import pandas as pd
import pytest

from fieldsales_dagster.assets.upkeep import build_upkeep_asset
from fieldsales_dagster.demo_api import DemoConfig, DemoServer
from fieldsales_dagster.demo_api.data import Dataset
from fieldsales_dagster.warehouse import incremental
from fieldsales_dagster.warehouse.lake import (
    CONFLICT_ATTEMPTS,
    Lake,
    LakeConflictError,
    LakeError,
    connect,
    run_transaction,
)
from fieldsales_dagster.warehouse.resource import STORAGE_VERSION, FieldSalesWarehouse
from fieldsales_dagster_tests.conftest import make_api
from fieldsales_dagster_tests.postgres import Postgres, running_postgres
from fieldsales_dagster_tests.project import (
    DEFAULT,
    core_assets,
    error_chain,
    load_project_defs,
    mart_assets,
    raw_assets,
)

PASSWORD_VARIABLE = "FIELDSALES_DUCKLAKE_PASSWORD"
RAW = raw_assets()
ALL = [*RAW, *core_assets(True), *mart_assets(True)]


@pytest.fixture(scope="module")
def postgres() -> Iterator[Postgres]:
    with running_postgres("lakes") as pg:
        yield pg


@pytest.fixture
def catalog(postgres, monkeypatch, tmp_path) -> str:
    """A database of its own on the module's PostgreSQL, for this test's lake catalog."""
    name = f"lake_{tmp_path.name.lower()[-40:].replace('-', '_')}"
    conn = postgres.connect()
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')
    conn.close()
    monkeypatch.setenv(PASSWORD_VARIABLE, postgres.password)
    return f"postgres:dbname={name} host={postgres.host} port={postgres.port} user={postgres.user}"


@pytest.fixture
def small_demo():
    with DemoServer(DemoConfig(transactions=300, seed=3), host="127.0.0.1", port=0) as server:
        yield server


def lake_warehouse(tmp_path: Path, catalog: str, schema: str | None = None, name="lake"):
    return FieldSalesWarehouse(
        database=str(tmp_path / name / "fieldsales.duckdb"),
        storage="ducklake",
        ducklake_catalog=catalog,
        ducklake_data_path=str(tmp_path / "lake_files"),
        ducklake_schema=schema,
    )


def refresh(server, tmp_path, warehouse, assets=ALL, mode=None) -> dg.ExecuteInProcessResult:
    run_config = {"ops": {"raw_transactions": {"config": {"refresh_mode": mode}}}} if mode else None
    result = dg.materialize(
        assets,
        resources={"fieldsales_api": make_api(server, tmp_path), "warehouse": warehouse},
        run_config=run_config,
    )
    assert result.success
    return result


def refresh_mode(result) -> str:
    (event,) = result.asset_materializations_for_node("raw_transactions")
    return event.metadata["refresh_mode"].value


def tables(conn: duckdb.DuckDBPyConnection, database: str) -> list[tuple[str, str]]:
    return conn.execute(
        "SELECT schema_name, table_name FROM duckdb_tables() WHERE database_name = ? "
        "AND schema_name IN ('raw', 'core', 'mart') AND NOT starts_with(table_name, '_') "
        "ORDER BY ALL",
        [database],
    ).fetchall()


def columns(conn, database: str, schema: str, table: str) -> list[tuple[str, str]]:
    return conn.execute(
        "SELECT column_name, data_type FROM duckdb_columns() WHERE database_name = ? AND "
        "schema_name = ? AND table_name = ? ORDER BY column_index",
        [database, schema, table],
    ).fetchall()


def as_text(column: str, data_type: str) -> str:
    """A column as text to compare; floating-point sums to 9 significant digits (their last bits
    depend on the order the rows were added in, which differs between any two scans)."""
    if data_type in ("DOUBLE", "FLOAT"):
        return f"printf('%.9g', \"{column}\")"
    return f'"{column}"::VARCHAR'


def assert_lake_equals_file(lake: FieldSalesWarehouse, file: FieldSalesWarehouse) -> int:
    """Every raw, core and mart table of the lake equals the file backend's, row for row
    (``loaded_at`` aside), with the same columns and types. Returns how many tables."""
    with lake.get_connection() as conn:
        conn.execute(f"ATTACH '{file.working_path}' AS file_backend (READ_ONLY)")
        try:
            return _compare(conn)
        finally:
            conn.execute("DETACH file_backend")  # the lake's instance outlives the connection


def _compare(conn: duckdb.DuckDBPyConnection) -> int:
    """The comparison of ``assert_lake_equals_file`` (the file attached as file_backend)."""
    here = conn.execute("SELECT current_database()").fetchone()[0]
    names = tables(conn, here)
    assert names == tables(conn, "file_backend")
    assert {schema for schema, _ in names} == {"raw", "core", "mart"}
    for schema, table in names:
        cols = columns(conn, here, schema, table)
        assert cols == columns(conn, "file_backend", schema, table), f"{schema}.{table}"
        listed = ", ".join(as_text(c, t) for c, t in cols if c != "loaded_at")
        a, b = f'{here}."{schema}"."{table}"', f'file_backend."{schema}"."{table}"'
        only_lake, only_file, rows = conn.execute(
            f"SELECT (SELECT count(*) FROM (SELECT {listed} FROM {a} EXCEPT ALL "
            f"SELECT {listed} FROM {b})), (SELECT count(*) FROM (SELECT {listed} FROM {b} "
            f"EXCEPT ALL SELECT {listed} FROM {a})), (SELECT count(*) FROM {a})"
        ).fetchone()
        assert (only_lake, only_file) == (0, 0), (
            f"{schema}.{table}: {only_lake} rows only on the lake, {only_file} only in the "
            f"file (of {rows})"
        )
    return len(names)


def test_every_table_on_ducklake_equals_the_file_backend_after_a_full_and_an_incremental_refresh(
    demo_server, tmp_path, catalog
):
    small_demo = demo_server  # 1,200 transactions: few enough changed events for incremental
    lake = lake_warehouse(tmp_path, catalog)
    file = FieldSalesWarehouse(
        database=str(tmp_path / "file" / "fieldsales.duckdb"), create_dirs=True
    )

    for warehouse in (lake, file):
        assert refresh_mode(refresh(small_demo, tmp_path, warehouse)) == "full"
    assert assert_lake_equals_file(lake, file) == len(RAW) + len(ALL) - len(RAW)

    small_demo.behaviour.evolve(1)
    for warehouse in (lake, file):
        assert refresh_mode(refresh(small_demo, tmp_path, warehouse)) == "incremental"
    assert_lake_equals_file(lake, file)
    # On a lake nothing is copied: no working copy, no analysts' file.
    assert not list((tmp_path / "lake").glob("*.duckdb"))
    assert list((tmp_path / "lake_files").rglob("*.parquet"))


def test_an_analysts_snapshot_neither_blocks_a_refresh_nor_sees_half_of_it(
    small_demo, tmp_path, catalog
):
    lake = lake_warehouse(tmp_path, catalog)
    refresh(small_demo, tmp_path, lake, assets=RAW)
    counts = (
        "SELECT (SELECT count(*) FROM raw.transactions), (SELECT count(*) FROM raw.events), "
        "(SELECT bit_xor(hash(id, payload::VARCHAR)) FROM raw.events), "
        "(SELECT bit_xor(hash(id, payload::VARCHAR)) FROM raw.transactions)"
    )
    analyst = connect(lake.lake, read_only=True)
    try:
        analyst.execute("BEGIN TRANSACTION")
        before = analyst.execute(counts).fetchone()
        changes = small_demo.behaviour.evolve(1)

        # Not blocked: the whole refresh commits while the analyst's transaction is open.
        refresh(small_demo, tmp_path, lake, assets=RAW, mode="full")

        assert analyst.execute(counts).fetchone() == before  # still the old snapshot, whole
        analyst.execute("COMMIT")
        after = analyst.execute(counts).fetchone()
    finally:
        analyst.close()
    assert after[0] == before[0] + changes["transactions_added"] - changes["transactions_deleted"]
    assert after[1] == small_demo.dataset.count("events")
    assert after[2] != before[2] and after[3] != before[3]


def test_two_tenants_write_one_catalog_database_at_once(tmp_path, catalog):
    servers = {
        tenant: DemoServer(DemoConfig(transactions=200 + 100 * i, seed=i), host="127.0.0.1", port=0)
        for i, tenant in enumerate(("acme", "globex"), start=1)
    }
    warehouses = {
        tenant: lake_warehouse(tmp_path, catalog, schema=tenant, name=tenant) for tenant in servers
    }
    results: dict[str, object] = {}
    barrier = threading.Barrier(len(servers))

    def run(tenant: str) -> None:
        barrier.wait()
        try:
            results[tenant] = refresh(servers[tenant], tmp_path / tenant, warehouses[tenant], RAW)
        except BaseException as exc:  # reported below, in the test's thread
            results[tenant] = exc

    for server in servers.values():
        server.start()
    try:
        threads = [threading.Thread(target=run, args=(tenant,)) for tenant in servers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(300)
        for tenant, server in servers.items():
            assert isinstance(results[tenant], dg.ExecuteInProcessResult), results[tenant]
            with warehouses[tenant].get_connection() as conn:
                ids = {row[0] for row in conn.execute("SELECT id FROM raw.transactions").fetchall()}
            assert ids == set(server.dataset.ids("transactions")), tenant
    finally:
        for server in servers.values():
            server.stop()
    # Both tenants' catalogs sit in one PostgreSQL database, each in its own schema.
    pg = Postgres(*_postgres_fields(catalog))
    conn = pg.connect()
    with conn.cursor() as cur:
        cur.execute(
            "SELECT table_schema FROM information_schema.tables "
            "WHERE table_name = 'ducklake_snapshot' ORDER BY 1"
        )
        assert [row[0] for row in cur.fetchall()] == ["acme", "globex"]
    conn.close()


def _postgres_fields(catalog: str) -> tuple[str, int, str, str, str]:
    fields = dict(part.split("=", 1) for part in catalog.removeprefix("postgres:").split())
    password = os.environ[PASSWORD_VARIABLE]
    return fields["host"], int(fields["port"]), fields["user"], password, fields["dbname"]


def test_a_conflict_is_retried_then_fails_naming_the_table(tmp_path, catalog):
    lake = lake_warehouse(tmp_path, catalog).lake
    writer, rival = connect(lake), connect(lake)
    try:
        writer.execute("CREATE SCHEMA raw")
        writer.execute("CREATE TABLE raw.events AS SELECT range AS id FROM range(100)")
        attempts: list[int] = []

        def delete_one(mine: int, rival_wins: int) -> None:
            attempts.append(len(attempts) + 1)
            writer.execute(f"DELETE FROM raw.events WHERE id = {mine}")
            if len(attempts) <= rival_wins:  # another writer commits first: a conflict
                rival.execute(f"DELETE FROM raw.events WHERE id = {10 * mine + len(attempts)}")

        run_transaction(writer, "raw.events", lambda: delete_one(1, rival_wins=1))
        assert attempts == [1, 2]
        # The writer's delete (retried) and the rival's: both committed.
        assert writer.execute("SELECT count(*) FROM raw.events").fetchone() == (98,)

        attempts.clear()
        with pytest.raises(LakeConflictError, match=r"Writing raw\.events conflicted .* 5 times"):
            run_transaction(writer, "raw.events", lambda: delete_one(2, CONFLICT_ATTEMPTS))
        assert len(attempts) == CONFLICT_ATTEMPTS
    finally:
        writer.close()
        rival.close()


def test_upkeep_removes_old_files_and_keeps_the_last_snapshot_readable(
    small_demo, tmp_path, catalog
):
    lake = lake_warehouse(tmp_path, catalog)
    refresh(small_demo, tmp_path, lake, assets=RAW)
    files = tmp_path / "lake_files"
    first = set(files.rglob("*.parquet"))
    small_demo.behaviour.evolve(1)
    refresh(small_demo, tmp_path, lake, assets=RAW, mode="full")  # replaces every file
    with lake.get_connection() as conn:
        expected = conn.execute("SELECT count(*), max(id) FROM raw.transactions").fetchone()
        (old_version,) = conn.execute(
            "SELECT min(snapshot_id) FROM fieldsales.snapshots()"
        ).fetchone()

    upkeep = build_upkeep_asset(DEFAULT, ["team:data"], retain_snapshots_days=7)
    result = dg.materialize(
        [upkeep],
        resources={"warehouse": lake},
        run_config={"ops": {"ducklake_upkeep": {"config": {"retain_snapshots_days": 0}}}},
    )
    assert result.success
    (event,) = result.asset_materializations_for_node("ducklake_upkeep")
    meta = {key: value.value for key, value in event.metadata.items()}
    assert meta["files_after"] < meta["files_before"]
    assert meta["bytes_after"] < meta["bytes_before"]
    assert meta["snapshots_after"] == 1
    remaining = set(files.rglob("*.parquet"))
    assert first and not first & remaining  # the first refresh's files are gone from storage
    assert len(remaining) == meta["files_after"]
    with lake.get_connection() as conn:
        assert conn.execute("SELECT count(*), max(id) FROM raw.transactions").fetchone() == expected
        with pytest.raises(duckdb.Error):
            conn.execute(f"SELECT count(*) FROM raw.transactions AT (VERSION => {old_version})")


def test_a_wrong_catalog_password_names_the_variable_and_never_shows_the_password(
    tmp_path, catalog, monkeypatch
):
    monkeypatch.setenv(PASSWORD_VARIABLE, "not-the-password-4711")
    with pytest.raises(LakeError) as failure:
        connect(Lake(catalog, str(tmp_path / "files")))
    message = str(failure.value)
    assert PASSWORD_VARIABLE in message and "FIELDSALES_DUCKLAKE_CATALOG" in message
    assert "not-the-password-4711" not in message


def test_the_analysts_file_is_written_in_a_storage_format_every_duckdb_client_reads(tmp_path):
    """storage: file: the format is set explicitly (STORAGE_VERSION), not left to the writer."""
    warehouse = FieldSalesWarehouse(database=str(tmp_path / "fieldsales.duckdb"))
    with warehouse.get_connection() as conn:
        conn.execute("CREATE SCHEMA raw")
        conn.execute("CREATE TABLE raw.events AS SELECT 'e1' AS id")
    assert warehouse.publish() is not None
    with duckdb.connect(warehouse.database, read_only=True) as reader:  # a DuckDB 1.5 client
        (version,) = reader.execute(
            "SELECT tags['storage_version'] FROM duckdb_databases() "
            "WHERE database_name = current_database()"
        ).fetchone()
        assert reader.execute("SELECT id FROM raw.events").fetchall() == [("e1",)]
    assert version == f"{STORAGE_VERSION}+" == "v1.2.0+"


def test_the_analysts_file_compresses_the_payloads(tmp_path):
    """storage: file: the raw payloads (most of the file) are stored compressed.

    Under storage format v1.0.0 strings longer than a few KB were stored as they are: 1M demo
    transactions made a 5.4 GiB file. Under v1.2.0 (ZSTD for long strings) the same data is
    ~6x smaller.
    """
    dataset = Dataset(transactions=6000, events=150, event_groups=15, seed=3)
    payloads = pd.DataFrame(
        {"payload": [json.dumps(dataset.item("transactions", i)) for i in range(6000)]}
    )
    warehouse = FieldSalesWarehouse(database=str(tmp_path / "fieldsales.duckdb"))
    with warehouse.get_connection() as conn:
        conn.execute("CREATE SCHEMA raw")
        conn.register("payloads", payloads)
        conn.execute(
            "CREATE TABLE raw.transactions AS SELECT payload::JSON AS payload FROM payloads"
        )
        (payload_bytes,) = conn.execute(
            "SELECT sum(strlen(payload::VARCHAR)) FROM raw.transactions"
        ).fetchone()
    assert warehouse.publish() is not None
    assert payload_bytes > 20e6  # long strings, ~5 KB each
    assert Path(warehouse.database).stat().st_size < payload_bytes / 4


@pytest.fixture
def project_env(monkeypatch):
    monkeypatch.setenv("FIELDSALES_BASE_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("FIELDSALES_API_TOKEN", "component-test-token")


def test_storage_ducklake_is_set_from_the_environment_alone(project_env, monkeypatch, tmp_path):
    monkeypatch.setenv("FIELDSALES_STORAGE", "ducklake")
    monkeypatch.setenv("FIELDSALES_DUCKLAKE_CATALOG", "postgres:dbname=lake host=db user=etl")
    monkeypatch.setenv("FIELDSALES_DUCKLAKE_DATA_PATH", str(tmp_path / "files"))
    defs = load_project_defs()
    warehouse = defs.resources["warehouse"]
    assert (warehouse.storage, warehouse.ducklake_catalog, warehouse.ducklake_data_path) == (
        "ducklake",
        "postgres:dbname=lake host=db user=etl",
        str(tmp_path / "files"),
    )
    assert warehouse.working_path is None and warehouse.lock_path is None  # nothing to publish
    schedule = defs.get_schedule_def("ducklake_upkeep_schedule")
    assert schedule.default_status == dg.DefaultScheduleStatus.RUNNING
    graph = defs.resolve_asset_graph()
    pools = [frozenset(graph.get(key).pools) for key in graph.get_all_asset_keys()]
    assert len(pools) == len(set(pools))  # one writer per table: a pool per asset
    assert "ducklake_upkeep" in {key.to_user_string() for key in graph.get_all_asset_keys()}


def test_storage_file_has_no_upkeep_and_one_pool(project_env):
    defs = load_project_defs()
    assert defs.resources["warehouse"].storage == "file"
    assert "ducklake_upkeep_schedule" not in {s.name for s in defs.schedules}
    graph = defs.resolve_asset_graph()
    assert {p for key in graph.get_all_asset_keys() for p in graph.get(key).pools} == {
        "fieldsales_duckdb"
    }


def test_on_a_lake_duckdb_path_is_checked_as_the_spill_folder_it_is(
    project_env, monkeypatch, tmp_path
):
    """On storage: ducklake duckdb_path's folder holds only spill and spool files: the load-time
    check says so, and checks that folder's place rather than a DuckDB file."""
    monkeypatch.setenv("FIELDSALES_STORAGE", "ducklake")
    monkeypatch.setenv("FIELDSALES_DUCKLAKE_CATALOG", "postgres:dbname=lake host=db user=etl")
    monkeypatch.setenv("FIELDSALES_DUCKLAKE_DATA_PATH", str(tmp_path / "files"))
    mistyped = tmp_path / "scratch"
    monkeypatch.setenv("FIELDSALES_DUCKDB_PATH", str(mistyped / "fieldsales.duckdb"))
    with pytest.raises(Exception) as failure:
        load_project_defs()
    message = error_chain(failure.value)
    assert (
        "duckdb_path (from FIELDSALES_DUCKDB_PATH) is invalid: on storage: ducklake no DuckDB "
        "file is written there, its folder only holds DuckDB's spill and spool files; "
        f"{mistyped}/.duckdb_tmp is in a folder that does not exist ({mistyped})"
    ) in message
    assert f"mkdir -p {mistyped}" in message and "FIELDSALES_CREATE_DIRS=true" in message

    monkeypatch.setenv("FIELDSALES_CREATE_DIRS", "true")
    assert load_project_defs().resources["warehouse"].storage == "ducklake"
    assert not mistyped.exists()  # loading creates nothing


@pytest.mark.parametrize(
    ("missing", "variable"),
    [
        ("FIELDSALES_DUCKLAKE_CATALOG", "FIELDSALES_DUCKLAKE_CATALOG"),
        ("FIELDSALES_DUCKLAKE_DATA_PATH", "FIELDSALES_DUCKLAKE_DATA_PATH"),
    ],
)
def test_storage_ducklake_without_its_place_fails_naming_setting_and_variable(
    project_env, monkeypatch, missing, variable
):
    monkeypatch.setenv("FIELDSALES_STORAGE", "ducklake")
    monkeypatch.setenv("FIELDSALES_DUCKLAKE_CATALOG", "postgres:dbname=lake host=db")
    monkeypatch.setenv("FIELDSALES_DUCKLAKE_DATA_PATH", "/srv/lake")
    monkeypatch.delenv(missing)
    with pytest.raises(Exception) as failure:
        load_project_defs()
    message = error_chain(failure.value)
    setting = variable.removeprefix("FIELDSALES_").lower()
    assert f"Field-Sales setting {setting} (from {variable}) is not set" in message
    assert "storage: ducklake (FIELDSALES_STORAGE)" in message


def test_dagster_asset_materialize_writes_the_lake_from_environment_variables_alone(
    small_demo, tmp_path, catalog
):
    """``FIELDSALES_STORAGE=ducklake dagster asset materialize``: no YAML edit, a real process."""
    root = Path(__file__).resolve().parents[1]
    (tmp_path / "local").mkdir()  # duckdb_path's folder must exist (it holds local spill files)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("FIELDSALES_", "DAGSTER_"))},
        "DAGSTER_HOME": str(tmp_path),
        "FIELDSALES_BASE_URL": small_demo.base_url,
        "FIELDSALES_API_TOKEN": small_demo.token,
        "FIELDSALES_TOKEN_STORE": str(tmp_path / "token.json"),
        "FIELDSALES_DUCKDB_PATH": str(tmp_path / "local" / "fieldsales.duckdb"),
        "FIELDSALES_STORAGE": "ducklake",
        "FIELDSALES_DUCKLAKE_CATALOG": catalog,
        "FIELDSALES_DUCKLAKE_DATA_PATH": str(tmp_path / "lake_files"),
        PASSWORD_VARIABLE: os.environ[PASSWORD_VARIABLE],
    }
    done = subprocess.run(
        [str(Path(sys.executable).parent / "dagster"), "asset", "materialize"]
        + ["-m", "fieldsales_dagster", "--select", "raw_events"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert os.environ[PASSWORD_VARIABLE] not in done.stdout + done.stderr
    lake = lake_warehouse(tmp_path, catalog)
    with connect(lake.lake, read_only=True) as conn:
        ids = {row[0] for row in conn.execute("SELECT id FROM raw.events").fetchall()}
    assert ids == set(small_demo.dataset.ids("events"))
    assert not list((tmp_path / "local").glob("*.duckdb"))  # no DuckDB file, no publish


def lake_snapshots(warehouse: FieldSalesWarehouse) -> int:
    with warehouse.get_connection() as conn:
        return conn.execute("SELECT count(*) FROM ducklake_snapshots('fieldsales')").fetchone()[0]


def test_each_asset_write_on_a_lake_is_one_snapshot(small_demo, tmp_path, catalog):
    """Staging, swap and state records commit together: a reader (or time travel) never meets
    a staging table, or a new table beside its old state."""
    lake = lake_warehouse(tmp_path, catalog)
    core = {asset.key.to_user_string(): asset for asset in core_assets(True)}
    # Raw loads (the transactions' with its refresh state), a following core table (decode,
    # table and following state) and one reading the events' decode (built and dropped).
    steps = [*RAW, core["core_transactions"], core["core_events"]]
    added: dict[str, list[int]] = {}
    for round_ in range(2):  # a full refresh, then the incremental one
        if round_:
            small_demo.behaviour.evolve(1)
        for asset in steps:
            before = lake_snapshots(lake)
            refresh(small_demo, tmp_path, lake, assets=[asset])
            added.setdefault(asset.key.to_user_string(), []).append(lake_snapshots(lake) - before)
    assert added == {name: [1, 1] for name in added}


def test_a_write_that_fails_after_its_swap_leaves_the_lake_unchanged(
    small_demo, tmp_path, catalog, monkeypatch
):
    """A failure between the new raw.transactions and its refresh state (recorded in the same
    transaction) leaves the table, the state and the lake's snapshots as they were."""
    lake = lake_warehouse(tmp_path, catalog)
    refresh(small_demo, tmp_path, lake, assets=RAW)
    small_demo.behaviour.evolve(1)
    state = (
        "SELECT (SELECT bit_xor(hash(id, payload::VARCHAR)) FROM raw.transactions), "
        "(SELECT list(last_load_at) FROM meta.refresh_state), "
        "(SELECT count(*) FROM ducklake_snapshots('fieldsales'))"
    )
    with lake.get_connection() as conn:
        before = conn.execute(state).fetchone()

    def state_write_fails(*args, **kwargs):
        raise RuntimeError("injected: the refresh state could not be written")

    monkeypatch.setattr(incremental, "_write_state", state_write_fails)
    result = dg.materialize(
        [asset for asset in RAW if asset.key.to_user_string() == "raw_transactions"],
        resources={"fieldsales_api": make_api(small_demo, tmp_path), "warehouse": lake},
        run_config={"ops": {"raw_transactions": {"config": {"refresh_mode": "full"}}}},
        raise_on_error=False,
    )
    assert not result.success
    assert "injected" in str(result.get_step_failure_events()[0].event_specific_data.error)
    with lake.get_connection() as conn:
        assert conn.execute(state).fetchone() == before
        staged = conn.execute(
            "SELECT count(*) FROM duckdb_tables() WHERE database_name = 'fieldsales' "
            "AND starts_with(table_name, '_stage_')"
        ).fetchone()
    assert staged == (0,)
