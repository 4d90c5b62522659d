"""Metadata the UI reads, from real materializations: each SQL asset's code version is a hash of
its SQL, each core and mart table's column lineage comes from its SQL, every table names its
storage kind and URI, and every raw row traces to the run that loaded it."""

from __future__ import annotations

import hashlib

import dagster as dg
import pytest

from fieldsales_dagster.assets import tables
from fieldsales_dagster.assets.core import build_core_asset
from fieldsales_dagster.assets.metadata import storage_metadata
from fieldsales_dagster.assets.raw import LOAD_RUNS
from fieldsales_dagster.assets.tables import derived_tables, query_code_version
from fieldsales_dagster.warehouse.warehouse import FieldSalesWarehouse
from fieldsales_dagster_tests.conftest import lake_paths, make_warehouse, read_lake
from fieldsales_dagster_tests.project import DEFAULT, OWNERS, load_project_defs

SQL_TABLES = derived_tables()
RAW_TABLES = ("raw.events", "raw.event_groups", "raw.transactions")


@pytest.fixture(scope="module")
def refreshed(tmp_path_factory):
    """One real refresh_all run against the demo API, on an instance of its own."""
    from fieldsales_dagster.demo_api import DemoConfig, DemoServer

    tmp = tmp_path_factory.mktemp("metadata")
    catalog, data_path = lake_paths(tmp)
    env = {
        "FIELDSALES_TOKEN_STORE": str(tmp / "token.json"),
        "FIELDSALES_DUCKLAKE_CATALOG": catalog,
        "FIELDSALES_DUCKLAKE_DATA_PATH": data_path,
    }
    with (
        DemoServer(DemoConfig(transactions=300, seed=5), host="127.0.0.1", port=0) as server,
        pytest.MonkeyPatch.context() as monkeypatch,
        dg.instance_for_test(temp_dir=str(tmp)) as instance,
    ):
        for name, value in {
            **env,
            "FIELDSALES_BASE_URL": server.base_url,
            "FIELDSALES_API_TOKEN": server.token,
        }.items():
            monkeypatch.setenv(name, value)
        defs = load_project_defs()
        result = defs.resolve_job_def("refresh_all").execute_in_process(instance=instance)
        assert result.success
        yield defs, instance, result, make_warehouse(tmp)


def latest_metadata(instance: dg.DagsterInstance, asset: str) -> dict:
    event = instance.get_latest_materialization_event(dg.AssetKey(asset))
    assert event is not None and event.asset_materialization is not None, asset
    return dict(event.asset_materialization.metadata)


def lake_columns(warehouse: FieldSalesWarehouse) -> dict[str, set[str]]:
    """Every table's columns in the lake, by ``schema.table``, read in one query."""
    columns: dict[str, set[str]] = {}
    with read_lake(warehouse) as conn:
        for table, column in conn.execute(
            "SELECT table_schema || '.' || table_name, column_name FROM information_schema.columns"
        ).fetchall():
            columns.setdefault(table, set()).add(column)
    return columns


# --- code version -------------------------------------------------------------------------


def test_sql_assets_carry_a_hash_of_their_sql_as_code_version(refreshed):
    defs, instance, _, _ = refreshed
    for table in SQL_TABLES:
        query = tables.core_query(table)
        expected = hashlib.sha256(
            f"{query}\n{tables.shared_macros_sql(query)}".encode()
        ).hexdigest()[:16]
        key = dg.AssetKey(table.asset_name)
        (spec,) = [s for a in defs.assets for s in getattr(a, "specs", []) if s.key == key]
        assert spec.code_version == expected, table.table
        # The UI compares this with the code version each materialization recorded.
        assert instance.get_latest_materialization_code_versions([key]) == {key: expected}


def test_a_changed_query_changes_the_code_version(monkeypatch):
    table = [t for t in derived_tables() if t.schema == "core"][1]
    before = query_code_version(table)
    shipped = tables.core_query
    monkeypatch.setattr(
        tables, "core_query", lambda t: shipped(t) + "\n-- a changed query" if t is table else ""
    )
    assert query_code_version(table) != before
    (spec,) = build_core_asset(DEFAULT, table, OWNERS, None).specs
    assert spec.code_version == query_code_version(table)


# --- column lineage -----------------------------------------------------------------------


def test_every_core_and_mart_table_reports_column_lineage_from_its_sql(refreshed):
    defs, instance, _, warehouse = refreshed
    deps_of = {
        s.key: {d.asset_key for d in s.deps} for a in defs.assets for s in getattr(a, "specs", [])
    }
    table_of = {dg.AssetKey(t.asset_name): t.table for t in SQL_TABLES}
    table_of.update({dg.AssetKey(t.replace(".", "_")): t for t in RAW_TABLES})
    columns = lake_columns(warehouse)
    for table in SQL_TABLES:
        key = dg.AssetKey(table.asset_name)
        lineage = latest_metadata(instance, table.asset_name)["dagster/column_lineage"].value
        assert isinstance(lineage, dg.TableColumnLineage), table.table
        assert lineage.deps_by_column, table.table
        assert set(lineage.deps_by_column) <= columns[table.table]
        for column, deps in lineage.deps_by_column.items():
            for dep in deps:
                # A column comes from a table the asset depends on, and from a column it has.
                assert dep.asset_key in deps_of[key], (table.table, column, dep)
                upstream = columns[table_of[dep.asset_key]]
                assert dep.column_name in upstream, (table.table, column, dep)


def test_column_lineage_follows_expressions_and_joins(refreshed):
    _, instance, _, _ = refreshed

    def sources(asset: str, column: str) -> set[str]:
        lineage = latest_metadata(instance, asset)["dagster/column_lineage"].value
        return {
            f"{d.asset_key.to_user_string()}.{d.column_name}"
            for d in lineage.deps_by_column[column]
        }

    assert sources("mart_daily_sales", "sale_date") == {"core_transactions.sale_time"}
    assert sources("mart_daily_sales", "project_id") == {"core_events.project_id"}
    # An aggregate's FILTER clause: placed by the columns the upstream tables are known to have.
    assert sources("mart_event_summary", "planned_at") == {
        "core_event_state_durations.entered_at",
        "core_event_state_durations.state",
    }
    assert sources("core_events", "event_id") == {"raw_events.id"}
    # ... and shown in the open-source UI, which does not draw dagster/column_lineage.
    shown = latest_metadata(instance, "core_events")["fieldsales/column_lineage"].value
    assert "| event_id | raw_events.id |" in shown.splitlines()
    assert sources("core_events", "project_id") == {"raw_events.payload"}
    assert sources("core_event_state_durations", "event_id") == {
        "core_event_status_history.event_id"
    }
    # Through a table macro's body (event_copies.sql), its parameter choosing the column.
    assert sources("core_areas", "area_id") == {"core_events.area_id"}
    assert sources("core_users", "user_id") == {"core_events.assigned_user_ids"}
    assert sources("core_dim_point_of_sale_history", "pos_id") == {"core_events.pos_id"}


# --- storage kind and URI -----------------------------------------------------------------


def test_every_table_asset_names_its_storage_kind_and_uri(refreshed):
    _, instance, _, warehouse = refreshed
    catalog_file = warehouse.lake.catalog_file
    assert catalog_file is not None
    for table in (*RAW_TABLES, *(t.table for t in SQL_TABLES)):
        metadata = latest_metadata(instance, table.replace(".", "_"))
        assert metadata["dagster/storage_kind"].value == "ducklake", table
        assert metadata["dagster/uri"].value == (
            f"ducklake:sqlite:{catalog_file.resolve()}?table={table}"
        )


def test_a_postgres_catalog_names_its_own_uri(tmp_path):
    lake = FieldSalesWarehouse(
        ducklake_catalog="postgres:dbname=lake host=db user=dagster",
        ducklake_data_path=str(tmp_path / "lake"),
        ducklake_schema="acme",
    )
    assert storage_metadata(lake, "core.events") == {
        "dagster/table_name": "fieldsales.core.events",
        "dagster/storage_kind": "ducklake",
        "dagster/uri": (
            "ducklake:postgres:dbname=lake host=db user=dagster?table=core.events"
            "&metadata_schema=acme"
        ),
    }


# --- run id -------------------------------------------------------------------------------


def test_every_raw_row_traces_to_the_run_that_loaded_it(refreshed):
    _, _, result, warehouse = refreshed
    with read_lake(warehouse) as conn:
        for table in RAW_TABLES:
            runs = conn.execute(
                f"SELECT r.run_id, count(*) FROM {table} AS t LEFT JOIN {LOAD_RUNS} AS r "
                "ON r.table_name = ? AND r.loaded_at = t.loaded_at GROUP BY ALL",
                [table],
            ).fetchall()
            assert runs and [run for run, _ in runs] == [result.run_id], table
            (asset,) = conn.execute(
                f"SELECT DISTINCT asset_key FROM {LOAD_RUNS} WHERE table_name = ?", [table]
            ).fetchone()
            assert asset == table.replace(".", "_")
