"""The lake on several machines, for real: a PostgreSQL catalog (pgserver), Parquet files in
tmp_path, the DuckLake and postgres extensions from their wheels, the demo API over HTTP, real
materializations. (The embedded default, a SQLite catalog: test_lake.py.)
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import duckdb
import pytest

from fieldsales_dagster.assets.upkeep import build_upkeep_asset
from fieldsales_dagster.client.endpoints import EVENT_GROUPS, EVENTS, TRANSACTIONS
from fieldsales_dagster.demo_api import DemoConfig, DemoServer
from fieldsales_dagster.loading import incremental, raw_load
from fieldsales_dagster.warehouse.lake import (
    CONFLICT_ATTEMPTS,
    Lake,
    LakeConflictError,
    LakeError,
    connect,
    run_transaction,
)
from fieldsales_dagster.warehouse.warehouse import FieldSalesWarehouse
from fieldsales_dagster_tests.conftest import make_api
from fieldsales_dagster_tests.postgres import Postgres, running_postgres
from fieldsales_dagster_tests.project import (
    DEFAULT,
    core_assets,
    load_failure,
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


def lake_warehouse(
    tmp_path: Path, catalog: str, schema: str | None = None, files: str = "lake_files", **settings
) -> FieldSalesWarehouse:
    (tmp_path / files).mkdir(exist_ok=True)
    return FieldSalesWarehouse(
        ducklake_catalog=catalog,
        ducklake_data_path=str(tmp_path / files),
        ducklake_schema=schema,
        **settings,
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


def assert_lakes_equal(lake: FieldSalesWarehouse, other: FieldSalesWarehouse) -> int:
    """Every raw, core and mart table of ``lake`` equals ``other``'s, row for row (``loaded_at``
    aside), with the same columns and types. Returns how many tables."""
    with lake.read_connection() as conn:
        conn.execute(dataclasses.replace(other.lake, alias="other_lake").attach_sql(True))
        return _compare(conn)


def _compare(conn: duckdb.DuckDBPyConnection) -> int:
    """The comparison of ``assert_lakes_equal`` (the other lake attached as other_lake)."""
    here = conn.execute("SELECT current_database()").fetchone()[0]
    names = tables(conn, here)
    assert names == tables(conn, "other_lake")
    assert {schema for schema, _ in names} == {"raw", "core", "mart"}
    for schema, table in names:
        cols = columns(conn, here, schema, table)
        assert cols == columns(conn, "other_lake", schema, table), f"{schema}.{table}"
        listed = ", ".join(as_text(c, t) for c, t in cols if c != "loaded_at")
        a, b = f'{here}."{schema}"."{table}"', f'other_lake."{schema}"."{table}"'
        only_lake, only_file, rows = conn.execute(
            f"SELECT (SELECT count(*) FROM (SELECT {listed} FROM {a} EXCEPT ALL "
            f"SELECT {listed} FROM {b})), (SELECT count(*) FROM (SELECT {listed} FROM {b} "
            f"EXCEPT ALL SELECT {listed} FROM {a})), (SELECT count(*) FROM {a})"
        ).fetchone()
        assert (only_lake, only_file) == (0, 0), (
            f"{schema}.{table}: {only_lake} rows only in the incremental lake, {only_file} only "
            f"in the full one (of {rows})"
        )
    return len(names)


def test_an_incremental_refresh_on_postgresql_equals_a_full_one(demo_server, tmp_path, catalog):
    small_demo = demo_server  # 1,200 transactions: few enough changed events for incremental
    lake = lake_warehouse(tmp_path, catalog)
    assert refresh_mode(refresh(small_demo, tmp_path, lake)) == "full"
    small_demo.behaviour.evolve(1)
    assert refresh_mode(refresh(small_demo, tmp_path, lake)) == "incremental"

    fresh = lake_warehouse(tmp_path, catalog, schema="fresh", files="fresh_files")
    assert refresh_mode(refresh(small_demo, tmp_path, fresh)) == "full"
    assert assert_lakes_equal(lake, fresh) == len(ALL)
    # Nothing is copied: no DuckDB file, only the lake's Parquet files.
    assert not list(tmp_path.rglob("*.duckdb"))
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
        assert analyst.execute(counts).fetchone() == before  # a connection keeps its refresh
    finally:
        analyst.close()
    with connect(lake.lake, read_only=True) as reader:  # a new one reads the refresh since
        after = reader.execute(counts).fetchone()
    assert after[0] == before[0] + changes["transactions_added"] - changes["transactions_deleted"]
    assert after[1] == small_demo.dataset.count("events")
    assert after[2] != before[2] and after[3] != before[3]


def test_two_tenants_write_one_catalog_database_at_once(tmp_path, catalog):
    servers = {
        tenant: DemoServer(DemoConfig(transactions=200 + 100 * i, seed=i), host="127.0.0.1", port=0)
        for i, tenant in enumerate(("acme", "globex"), start=1)
    }
    warehouses = {tenant: lake_warehouse(tmp_path, catalog, schema=tenant) for tenant in servers}
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
        with pytest.raises(
            LakeConflictError, match=rf"Writing raw\.events conflicted .* {CONFLICT_ATTEMPTS} times"
        ):
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
    # Lists without recorded digests (a lake of an earlier release) are replaced whole: every file.
    with lake.get_connection() as conn:
        for endpoint in (EVENTS, TRANSACTIONS, EVENT_GROUPS):
            conn.execute(f"DROP TABLE {raw_load.digests_table(endpoint.raw_table)}")
    refresh(small_demo, tmp_path, lake, assets=RAW, mode="full")
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


@pytest.fixture
def project_env(monkeypatch):
    monkeypatch.setenv("FIELDSALES_BASE_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("FIELDSALES_API_TOKEN", "component-test-token")


def test_the_lake_is_set_from_the_environment_alone(project_env, monkeypatch, tmp_path):
    monkeypatch.setenv("FIELDSALES_DUCKLAKE_CATALOG", "postgres:dbname=lake host=db user=etl")
    monkeypatch.setenv("FIELDSALES_DUCKLAKE_DATA_PATH", str(tmp_path / "files"))
    defs = load_project_defs()
    warehouse = defs.resources["warehouse"]
    assert (warehouse.ducklake_catalog, warehouse.ducklake_data_path, warehouse.duckdb_path) == (
        "postgres:dbname=lake host=db user=etl",
        str(tmp_path / "files"),
        None,
    )
    schedule = defs.get_schedule_def("lake_upkeep_schedule")
    assert schedule.default_status == dg.DefaultScheduleStatus.RUNNING
    graph = defs.resolve_asset_graph()
    pools = [frozenset(graph.get(key).pools) for key in graph.get_all_asset_keys()]
    assert len(pools) == len(set(pools))  # one writer per table: a pool per asset
    assert "ducklake_upkeep" in {key.to_user_string() for key in graph.get_all_asset_keys()}


@pytest.mark.parametrize(
    "catalog", ["data/lake.sqlite", "lake.ducklake", "postgresql://db/lake", "sqlite:"]
)
def test_a_catalog_the_project_cannot_open_fails_the_load_naming_the_variable(
    project_env, monkeypatch, catalog
):
    message = load_failure(monkeypatch, FIELDSALES_DUCKLAKE_CATALOG=catalog)
    assert "storage.ducklake_catalog (from FIELDSALES_DUCKLAKE_CATALOG) is invalid" in message
    assert "neither sqlite:<file>" in message and "postgres:dbname=" in message


def test_dagster_asset_materialize_writes_the_lake_from_environment_variables_alone(
    small_demo, tmp_path, catalog
):
    """``dagster asset materialize`` on a PostgreSQL lake: no YAML edit, a real process."""
    root = Path(__file__).resolve().parents[1]
    (tmp_path / "lake_files").mkdir()  # a data path that is set must exist
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("FIELDSALES_", "DAGSTER_"))},
        "DAGSTER_HOME": str(tmp_path),
        "FIELDSALES_BASE_URL": small_demo.base_url,
        "FIELDSALES_API_TOKEN": small_demo.token,
        "FIELDSALES_TOKEN_STORE": str(tmp_path / "token.json"),
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
    assert not list(tmp_path.rglob("*.duckdb"))  # no DuckDB file, no publish


def lake_snapshots(warehouse: FieldSalesWarehouse) -> int:
    with warehouse.get_connection() as conn:
        return conn.execute("SELECT count(*) FROM ducklake_snapshots('fieldsales')").fetchone()[0]


def test_each_asset_write_on_a_lake_is_one_snapshot(small_demo, tmp_path, catalog):
    """Staging, swap, state records and the step's checks' results commit together: a reader
    (or time travel) never meets a staging table, or a new table beside its old state."""
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


def test_two_spellings_of_one_postgresql_catalog_are_one_lake_and_refuse_a_second_tenant(
    small_demo, tmp_path, catalog
):
    """A text comparison of catalog strings lets ``host=127.0.0.1`` and ``host=localhost`` (or
    another key order) through; the tenant recorded in the lake refuses the second tenant
    however the catalog is spelled, before anything is written."""
    fields = dict(part.split("=", 1) for part in catalog.removeprefix("postgres:").split())
    assert fields["host"] in ("127.0.0.1", "localhost")
    other_host = "localhost" if fields["host"] == "127.0.0.1" else "127.0.0.1"
    respelled = (
        f"postgres:user={fields['user']} port={fields['port']} host={other_host} "
        f"dbname={fields['dbname']}"
    )
    first = lake_warehouse(tmp_path, catalog, tenant="https://a.example.com (key_prefix -)")
    second = lake_warehouse(tmp_path, respelled, tenant="https://b.example.com (key_prefix -)")
    refresh(small_demo, tmp_path, first, assets=RAW)
    with first.read_connection() as conn:
        before = conn.execute("SELECT count(*) FROM fieldsales.snapshots()").fetchone()

    result = dg.materialize(
        RAW,
        resources={"fieldsales_api": make_api(small_demo, tmp_path), "warehouse": second},
        raise_on_error=False,
    )
    assert not result.success
    message = result.get_step_failure_events()[0].step_failure_data.error.to_string()
    assert "belongs to 'https://a.example.com (key_prefix -)'" in message
    assert "not to 'https://b.example.com (key_prefix -)'" in message
    assert "nothing was written" in message
    with first.read_connection() as conn:
        assert conn.execute("SELECT count(*) FROM fieldsales.snapshots()").fetchone() == before
    # The same tenant, spelled either way, writes on.
    same = lake_warehouse(tmp_path, respelled, tenant="https://a.example.com (key_prefix -)")
    refresh(small_demo, tmp_path, same, assets=RAW)
