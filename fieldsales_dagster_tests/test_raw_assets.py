"""Raw assets materialized for real: dagster.materialize in-process, and the CLI a user runs."""

from __future__ import annotations

import os
import subprocess
import sys

import dagster as dg

from fieldsales_dagster.assets.raw import ROW_COUNT_CHECK, row_count_check
from fieldsales_dagster_tests.conftest import make_api, make_warehouse, read_lake
from fieldsales_dagster_tests.project import materialize, raw_assets

RAW_KEYS = ["raw_events", "raw_transactions", "raw_event_groups"]


def test_raw_assets_materialize_with_metadata_and_passing_row_count_checks(
    demo_server, tmp_path, warehouse
):
    result = materialize(
        raw_assets(),
        resources={"fieldsales_api": make_api(demo_server, tmp_path), "warehouse": warehouse},
    )
    assert result.success
    for key, name in zip(RAW_KEYS, ["events", "transactions", "event_groups"], strict=True):
        (event,) = result.asset_materializations_for_node(key)
        metadata = event.metadata
        assert metadata["dagster/row_count"].value == demo_server.dataset.count(name)
        for field in ("pages", "retries", "seconds", "api_total", "requests"):
            assert field in metadata
        assert metadata["dagster/table_name"].value == f"fieldsales.raw.{name}"
        columns = [column.name for column in metadata["dagster/column_schema"].value.columns]
        assert columns[:3] == ["id", "payload", "loaded_at"]
    checks = row_count_checks(result)
    assert {c.check_name for c in checks} == {ROW_COUNT_CHECK}
    assert len(checks) == 3 and all(c.passed for c in checks)
    with read_lake(warehouse) as conn:
        counts = dict(
            conn.execute(
                "SELECT table_name, estimated_size FROM duckdb_tables() WHERE schema_name = 'raw'"
            ).fetchall()
        )
    assert set(counts) == {"events", "transactions", "event_groups"}


def test_failed_raw_asset_run_reports_failure_and_keeps_previous_table(
    demo_server, tmp_path, warehouse
):
    resources = {"fieldsales_api": make_api(demo_server, tmp_path), "warehouse": warehouse}
    assets = raw_assets()
    assert materialize(assets, resources=resources, selection=["raw_transactions"]).success
    demo_server.behaviour.inject("/public/v1/api/transaction/all", "status", times=999, status=500)
    result = materialize(
        assets, resources=resources, selection=["raw_transactions"], raise_on_error=False
    )
    assert not result.success
    with read_lake(warehouse) as conn:
        assert conn.execute("SELECT count(*) FROM raw.transactions").fetchone()[0] == 1200


def test_token_never_appears_in_run_config_metadata_or_logs(demo_server, tmp_path, warehouse):
    result = materialize(
        raw_assets(),
        resources={"fieldsales_api": make_api(demo_server, tmp_path), "warehouse": warehouse},
    )
    text = "\n".join(str(event) for event in result.all_events) + str(result.dagster_run.run_config)
    assert demo_server.token not in text


def test_two_cli_runs_at_once_share_the_lake(demo_server, tmp_path):
    """What users run: `dagster asset materialize -m fieldsales_dagster --select ...`, twice at once
    (say the schedule and a manual run), into a new lake: both commit, and nothing is lost (a
    commit that conflicts with the other run's is retried)."""
    warehouse = make_warehouse(tmp_path, "cli")
    env = {
        **os.environ,
        "FIELDSALES_BASE_URL": demo_server.base_url,
        "FIELDSALES_API_TOKEN": demo_server.token,
        "FIELDSALES_DUCKLAKE_CATALOG": warehouse.ducklake_catalog,
        "FIELDSALES_DUCKLAKE_DATA_PATH": warehouse.ducklake_data_path,
        "FIELDSALES_TOKEN_STORE": str(tmp_path / "token.json"),
    }
    dagster = os.path.join(os.path.dirname(sys.executable), "dagster")
    selections = ["raw_transactions", "raw_events,raw_event_groups"]
    homes = [tmp_path / f"dagster_home_{n}" for n in range(len(selections))]
    runs = []
    for home, selection in zip(homes, selections, strict=True):
        # Separate Dagster instances (two deployments, or a CLI run beside `dagster dev`): only
        # the lake is shared, and a fresh instance's storage is not raced into existence.
        home.mkdir()
        run = subprocess.Popen(
            [dagster, "asset", "materialize", "-m", "fieldsales_dagster", "--select", selection],
            env={**env, "DAGSTER_HOME": str(home)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        runs.append(run)
    for run in runs:
        output, _ = run.communicate(timeout=240)
        assert run.returncode == 0, output[-4000:]
        assert demo_server.token not in output
    with read_lake(warehouse) as conn:
        for name in ("events", "transactions", "event_groups"):
            rows = conn.execute(f"SELECT count(*) FROM raw.{name}").fetchone()[0]
            assert rows == demo_server.dataset.count(name)


def test_row_count_check_warns_when_a_load_moves_beyond_the_tolerance_of_the_previous_one():
    assert row_count_check(1000, None, 0.2).passed  # first load: nothing to compare
    assert row_count_check(1150, 1000, 0.2).passed
    shrunk = row_count_check(700, 1000, 0.2)
    assert not shrunk.passed and shrunk.severity == dg.AssetCheckSeverity.WARN
    assert not row_count_check(1300, 1000, 0.2).passed
    assert not row_count_check(5, 0, 0.2).passed  # from empty to something is a move too


def row_count_checks(result: dg.ExecuteInProcessResult) -> list:
    return [c for c in result.get_asset_check_evaluations() if c.check_name == ROW_COUNT_CHECK]


def test_row_count_check_compares_with_the_previous_materialization(
    demo_server, tmp_path, warehouse
):
    resources = {"fieldsales_api": make_api(demo_server, tmp_path), "warehouse": warehouse}
    assets = raw_assets()
    with dg.instance_for_test() as instance:
        first = materialize(
            assets, resources=resources, selection=["raw_events"], instance=instance
        )
        (check,) = row_count_checks(first)
        assert check.passed and "previous_rows" not in check.metadata
        before = demo_server.dataset.count("events")
        # 30 % fewer: past the check's 20 % tolerance, short of the loader's 50 % shrink guard.
        demo_server.behaviour.mutate("events", delete=before * 3 // 10)
        second = materialize(
            assets, resources=resources, selection=["raw_events"], instance=instance
        )
        (check,) = row_count_checks(second)
        assert not check.passed
        assert check.metadata["previous_rows"].value == before
        assert check.metadata["rows"].value == demo_server.dataset.count("events") < before
