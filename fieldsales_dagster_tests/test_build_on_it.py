"""Building on the tables (docs/building-on-it.md), for real.

A user code location in ``tmp_path``: the project's own ``defs.yaml`` plus a ``defs/analytics/``
folder holding the page's two examples, copied from its code blocks as they stand (so
the docs are what is tested): one SQL asset through ``FieldSalesWarehouse``, one pandas asset
through ``fieldsales_io_manager``, both on ``core.transactions``. Runs go to the demo API over
loopback and write real DuckDB files; the automation is the project's own sensor, evaluated.
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import dagster as dg
import duckdb
import pytest
from dagster._core.definitions.automation_condition_sensor_definition import (
    _evaluate as evaluate_automation_sensor,
)

import fieldsales_dagster
from fieldsales_dagster_tests.conftest import lake_at, lake_paths, read_lake
from fieldsales_dagster_tests.project import error_chain, instance_yaml, write_project

REPO_ROOT = Path(__file__).resolve().parents[1]
BUILD_ON_IT = REPO_ROOT / "docs" / "building-on-it.md"
PROJECT = Path(fieldsales_dagster.__file__).parent
BIN = Path(sys.executable).parent
USER_ASSETS = {dg.AssetKey("daily_revenue"), dg.AssetKey("product_sales")}
#: What core.transactions is built from, itself included, and core.events, which a check of
#: core.transactions reads.
TRANSACTIONS_LINEAGE = [
    dg.AssetKey(name)
    for name in ("raw_events", "raw_transactions", "core_transactions", "core_events")
]


def readme_examples() -> dict[str, str]:
    """The "Build on it" section's Python blocks that start with ``# defs/analytics/<file>.py``."""
    section = BUILD_ON_IT.read_text("utf-8").split("# Build on it\n", 1)[1].split("\n## ", 1)[0]
    examples = {}
    for block in re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL):
        if match := re.fullmatch(r"# (defs/analytics/\w+\.py)", block.partition("\n")[0]):
            examples[match.group(1)] = block
    return examples


def write_user_location(
    root: Path, files: dict[str, str], instances: dict[str, str] | None = None
) -> Path:
    """A code location of its own: the project's ``definitions.py``, its ``defs/fieldsales`` (the
    env-driven ``defs.yaml``) unless ``instances`` replace it, and ``files`` under the package."""
    package = write_project(root, instances or {})
    if instances is None:
        shutil.copytree(PROJECT / "defs" / "fieldsales", package / "defs" / "fieldsales")
    shutil.copy(PROJECT / "definitions.py", package / "definitions.py")
    for path, code in files.items():
        (package / path).parent.mkdir(parents=True, exist_ok=True)
        (package / path).write_text(code)
    return package


def load_user_location(package: Path, monkeypatch) -> dg.Definitions:
    """The location's definitions, as ``dagster -m <package>.definitions`` loads them."""
    monkeypatch.syspath_prepend(str(package.parent))
    return importlib.import_module(f"{package.name}.definitions").defs()


def test_readme_holds_the_two_examples():
    assert sorted(readme_examples()) == [
        "defs/analytics/daily_revenue.py",
        "defs/analytics/product_sales.py",
    ]


# --- what the two examples should hold, computed from core.transactions in the same file --------


def daily_revenue(conn: duckdb.DuckDBPyConnection, table: str) -> list[tuple]:
    return conn.execute(
        f"SELECT sale_date, transactions, round(revenue, 6) FROM {table} ORDER BY 1 NULLS FIRST"
    ).fetchall()


def expected_daily_revenue(conn: duckdb.DuckDBPyConnection) -> list[tuple]:
    return daily_revenue(
        conn,
        "(SELECT CAST(sale_time AS DATE) AS sale_date, count(*) AS transactions, "
        "sum(total_value) AS revenue FROM core.transactions GROUP BY ALL)",
    )


def product_sales(conn: duckdb.DuckDBPyConnection, table: str) -> list[tuple]:
    return conn.execute(
        f"SELECT product_id, round(qty, 6), round(total_value, 6) FROM {table} "
        "ORDER BY 1 NULLS FIRST"
    ).fetchall()


def expected_product_sales(conn: duckdb.DuckDBPyConnection) -> list[tuple]:
    # pandas sums NULL as 0, and keeps a NULL product as a group of its own (dropna=False).
    return product_sales(
        conn,
        "(SELECT product_id, coalesce(sum(qty), 0) AS qty, coalesce(sum(total_value), 0) AS "
        "total_value FROM core.transactions GROUP BY ALL)",
    )


def user_tables(database: Path) -> tuple[list[tuple], list[tuple]]:
    """Both user tables as analysts read them in the lake (asserting they match core.*)."""
    with read_lake(database) as conn:
        revenue, sales = (
            daily_revenue(conn, "analytics.daily_revenue"),
            product_sales(conn, "analytics.product_sales"),
        )
        assert revenue == expected_daily_revenue(conn)
        assert sales == expected_product_sales(conn)
    assert revenue and sales
    return revenue, sales


def materialize(package: Path, env: dict[str, str], selection: str) -> None:
    """``dagster asset materialize`` on the user location, in a process of its own."""
    done = subprocess.run(
        [str(BIN / "dagster"), "asset", "materialize", "-m", f"{package.name}.definitions"]
        + ["--select", selection],
        cwd=package.parent,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


@pytest.fixture
def user_env(demo_server, tmp_path, monkeypatch) -> dict[str, str]:
    env = {
        "FIELDSALES_BASE_URL": demo_server.base_url,
        "FIELDSALES_API_TOKEN": demo_server.token,
        "FIELDSALES_TOKEN_STORE": str(tmp_path / "token.json"),
        "FIELDSALES_PAGE_SIZE": "200",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


def test_readme_examples_build_with_everything_and_survive_a_raw_only_run(
    user_env, demo_server, tmp_path
):
    """The two examples on the lake the environment sets (catalog and data path): their tables
    land in its ``analytics`` schema, beside the core tables they read, and a raw-only run leaves
    them as they were; with no export set, no DuckDB file is written anywhere."""
    package = write_user_location(tmp_path / "location", readme_examples())
    database = tmp_path / "fieldsales.duckdb"
    env = {**user_env, "DAGSTER_HOME": str(tmp_path)}

    materialize(package, env, "*")
    built = user_tables(database)

    with read_lake(database) as conn:
        (raw_loaded,) = conn.execute("SELECT max(loaded_at) FROM raw.events").fetchone()
    demo_server.behaviour.evolve(1)  # events changed: the raw-only run has rows to write
    materialize(package, env, "group:raw")
    with lake_at(database).get_connection() as conn:  # the latest snapshot
        (republished,) = conn.execute("SELECT max(loaded_at) FROM raw.events").fetchone()
    assert republished > raw_loaded  # the raw-only run committed its table ...
    assert user_tables(database) == built  # ... and left the user tables as they were
    with read_lake(database) as conn:  # ... which readers see with the core tables built from it
        assert conn.execute("SELECT max(loaded_at) FROM raw.events").fetchone() == (raw_loaded,)
    assert not list(tmp_path.rglob("*.duckdb"))  # no export: no DuckDB file at all


def run_assets(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    keys: list[dg.AssetKey],
    checks: list[dg.AssetCheckKey] | None = None,
    **kwargs,
) -> dg.ExecuteInProcessResult:
    """A run of these assets in this process: with every check on them, as a run the UI or the
    CLI launches for them, or with exactly ``checks``, as a sensor's run request says."""
    selection = dg.AssetSelection.assets(*keys)
    if checks is not None:
        selection = selection.without_checks() | dg.AssetSelection.checks(*checks)
    return dg.materialize(
        [*defs.assets, *defs.asset_checks],
        selection=selection,
        resources=defs.resources,
        instance=instance,
        **kwargs,
    )


def evaluate_sensor(defs: dg.Definitions, instance: dg.DagsterInstance, cursor: str | None):
    """One tick of the project's ``core_automation_sensor``, as its code server evaluates it."""
    sensor = defs.get_sensor_def("core_automation_sensor")
    context = dg.build_sensor_context(
        instance=instance, repository_def=defs.get_repository_def(), cursor=cursor
    )
    return evaluate_automation_sensor(sensor, context)


def test_automation_sensor_brings_user_assets_up_to_date_after_the_scheduled_refresh(
    user_env, demo_server, tmp_path, monkeypatch
):
    defs = load_user_location(
        write_user_location(tmp_path / "location", readme_examples()), monkeypatch
    )
    database = tmp_path / "fieldsales.duckdb"
    with dg.instance_for_test() as instance:
        # Built once, with the tables they read.
        assert run_assets(defs, instance, [*TRANSACTIONS_LINEAGE, *USER_ASSETS]).success
        before = user_tables(database)
        first = evaluate_sensor(defs, instance, None)
        assert not first.run_requests

        demo_server.behaviour.evolve(1)
        # What the schedule runs: the project's job, which selects none of the user assets.
        assert defs.resolve_job_def("refresh_all").execute_in_process(instance=instance).success
        with read_lake(database) as conn:
            # Untouched by the refresh's table swaps, not yet rebuilt.
            assert daily_revenue(conn, "analytics.daily_revenue") == before[0]
            assert expected_daily_revenue(conn) != before[0]

        second = evaluate_sensor(defs, instance, first.cursor)
        requested = {key for request in second.run_requests for key in request.asset_selection}
        assert requested == USER_ASSETS
        for request in second.run_requests:
            keys, checks = request.asset_selection, request.asset_check_keys or []
            assert run_assets(defs, instance, keys, checks, tags=request.tags).success
    after = user_tables(database)
    assert after != before


PROBES = """
import dagster as dg
import pandas as pd


def seen(frame: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"column": list(frame.columns), "rows": len(frame)})


@dg.asset(
    io_manager_key="fieldsales_io_manager",
    ins={"core_transactions": dg.AssetIn(metadata={"columns": ["transaction_id", "qty"]})},
)
def columns_selected(core_transactions: pd.DataFrame) -> pd.DataFrame:
    return seen(core_transactions)


@dg.asset(io_manager_key="fieldsales_io_manager")
def columns_all(core_transactions: pd.DataFrame) -> pd.DataFrame:
    return seen(core_transactions)


@dg.asset(
    io_manager_key="fieldsales_io_manager",
    ins={"core_transactions": dg.AssetIn(metadata={"columns": ["no_such_column"]})},
)
def columns_unknown(core_transactions: pd.DataFrame) -> pd.DataFrame:
    return seen(core_transactions)


@dg.asset(io_manager_key="fieldsales_io_manager", metadata={"schema": "core"})
def shadows_core() -> pd.DataFrame:
    return pd.DataFrame({"transaction_id": ["x"]})
"""


def test_pandas_input_loads_only_the_columns_its_metadata_names(user_env, tmp_path, monkeypatch):
    defs = load_user_location(
        write_user_location(tmp_path / "location", {"defs/analytics/probes.py": PROBES}),
        monkeypatch,
    )
    probes = [dg.AssetKey("columns_selected"), dg.AssetKey("columns_all")]
    with dg.instance_for_test() as instance:
        assert run_assets(defs, instance, TRANSACTIONS_LINEAGE).success
        # A run of pandas assets alone commits what they wrote, too.
        assert run_assets(defs, instance, probes).success
        unknown = run_assets(defs, instance, [dg.AssetKey("columns_unknown")], raise_on_error=False)
    with read_lake(tmp_path / "fieldsales.duckdb") as conn:
        (rows,) = conn.execute("SELECT count(*) FROM core.transactions").fetchone()
        columns = [r[0] for r in conn.execute("DESCRIBE core.transactions").fetchall()]
        seen = {
            table: conn.execute(f'SELECT "column", rows FROM analytics.{table}').fetchall()
            for table in ("columns_selected", "columns_all")
        }
    assert seen["columns_selected"] == [("transaction_id", rows), ("qty", rows)]
    assert seen["columns_all"] == [(column, rows) for column in columns]
    failure = unknown.get_step_failure_events()[0].step_failure_data.error.to_string()
    assert "could not load core.transactions for input 'core_transactions'" in failure
    assert "no_such_column" in failure


def test_pandas_output_into_a_project_schema_is_refused_naming_the_table(
    user_env, tmp_path, monkeypatch
):
    defs = load_user_location(
        write_user_location(tmp_path / "location", {"defs/analytics/probes.py": PROBES}),
        monkeypatch,
    )
    with dg.instance_for_test() as instance:
        assert run_assets(defs, instance, [dg.AssetKey("raw_event_groups")]).success
        result = run_assets(defs, instance, [dg.AssetKey("shadows_core")], raise_on_error=False)
    assert not result.success
    failure = result.get_step_failure_events()[0].step_failure_data.error.to_string()
    assert "core.shadows_core" in failure and "schema core belongs to the project" in failure
    with read_lake(tmp_path / "fieldsales.duckdb") as conn:
        tables = conn.execute("SELECT schema_name, table_name FROM duckdb_tables()").fetchall()
    assert ("raw", "event_groups") in tables
    assert not [table for table in tables if table[1] == "shadows_core"]


TENANT_ASSET = """
import dagster as dg
import pandas as pd


@dg.asset(
    io_manager_key="acme_fieldsales_io_manager",
    ins={"events": dg.AssetIn(key=["acme", "core_events"], metadata={"columns": ["event_id"]})},
)
def acme_event_ids(events: pd.DataFrame) -> pd.DataFrame:
    return events
"""


def test_second_tenant_has_its_own_prefixed_io_manager_on_its_own_lake(
    demo_server, tmp_path, monkeypatch
):
    monkeypatch.setenv("ACME_TOKEN", demo_server.token)
    catalog, data_path = lake_paths(tmp_path, "acme")
    package = write_user_location(
        tmp_path / "location",
        {"defs/analytics/events.py": TENANT_ASSET},
        instances={
            "acme": instance_yaml(
                base_url=demo_server.base_url,
                api_token="{{ env.ACME_TOKEN }}",
                ducklake_catalog=catalog,
                ducklake_data_path=data_path,
                token_store_path=tmp_path / "acme_token.json",
                key_prefix="acme",
            )
        },
    )
    defs = load_user_location(package, monkeypatch)
    assert "acme_fieldsales_io_manager" in defs.resources
    assert "fieldsales_io_manager" not in defs.resources
    selection = [dg.AssetKey(["acme", "raw_events"]), dg.AssetKey(["acme", "core_events"])]
    with dg.instance_for_test() as instance:
        assert run_assets(defs, instance, [*selection, dg.AssetKey("acme_event_ids")]).success
    with read_lake(tmp_path / "acme.duckdb") as conn:
        stored = conn.execute("SELECT * FROM analytics.acme_event_ids ORDER BY 1").fetchall()
        events = conn.execute("SELECT event_id FROM core.events ORDER BY 1").fetchall()
    assert stored == events and stored


def test_user_schema_that_is_a_project_schema_fails_the_load(tmp_path, monkeypatch):
    monkeypatch.setenv("FIELDSALES_API_TOKEN", "user-schema-test-token")
    instance = instance_yaml(
        base_url="http://127.0.0.1:9", duckdb_path=tmp_path / "x.duckdb", user_schema="core"
    )
    package = write_user_location(tmp_path, {}, {"main": instance})
    with pytest.raises(Exception) as failure:
        load_user_location(package, monkeypatch)
    message = error_chain(failure.value)
    assert "Field-Sales setting user_schema is invalid" in message
    assert "the project rebuilds that schema" in message


def test_warehouse_is_importable_from_the_package_and_is_the_resource_of_the_key_warehouse(
    user_env, tmp_path, monkeypatch
):
    from fieldsales_dagster import FieldSalesWarehouse
    from fieldsales_dagster.warehouse.warehouse import FieldSalesWarehouse as resource_class

    assert FieldSalesWarehouse is resource_class
    defs = load_user_location(
        write_user_location(tmp_path / "location", readme_examples()), monkeypatch
    )
    assert isinstance(defs.resources["warehouse"], FieldSalesWarehouse)
