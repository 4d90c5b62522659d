"""Raw assets materialized for real: dagster.materialize in-process, and the CLI a user runs."""

from __future__ import annotations

import os
import subprocess
import sys

import dagster as dg
import duckdb

from fieldsales_dagster.assets.raw import TOTAL_CHECK, raw_assets
from fieldsales_dagster_tests.conftest import make_api

RAW_KEYS = ["raw_events", "raw_transactions", "raw_event_groups"]


def test_raw_assets_materialize_with_metadata_and_passing_total_checks(
    demo_server, tmp_path, warehouse
):
    result = dg.materialize(
        raw_assets,
        resources={"fieldsales_api": make_api(demo_server, tmp_path), "warehouse": warehouse},
    )
    assert result.success
    for key, name in zip(RAW_KEYS, ["events", "transactions", "event_groups"], strict=True):
        (event,) = result.asset_materializations_for_node(key)
        metadata = event.metadata
        assert metadata["dagster/row_count"].value == demo_server.dataset.count(name)
        for field in ("pages", "retries", "seconds", "api_total", "requests"):
            assert field in metadata
    checks = result.get_asset_check_evaluations()
    assert {c.check_name for c in checks} == {TOTAL_CHECK}
    assert len(checks) == 3 and all(c.passed for c in checks)
    with duckdb.connect(warehouse.database, read_only=True) as conn:
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
    assert dg.materialize(raw_assets, resources=resources, selection=["raw_transactions"]).success
    demo_server.behaviour.inject("/public/v1/api/transaction/all", "status", times=999, status=500)
    result = dg.materialize(
        raw_assets, resources=resources, selection=["raw_transactions"], raise_on_error=False
    )
    assert not result.success
    with duckdb.connect(warehouse.database, read_only=True) as conn:
        assert conn.execute("SELECT count(*) FROM raw.transactions").fetchone()[0] == 1200


def test_token_never_appears_in_run_config_metadata_or_logs(demo_server, tmp_path, warehouse):
    result = dg.materialize(
        raw_assets,
        resources={"fieldsales_api": make_api(demo_server, tmp_path), "warehouse": warehouse},
    )
    text = "\n".join(str(event) for event in result.all_events) + str(result.dagster_run.run_config)
    assert demo_server.token not in text


def test_two_cli_runs_at_once_share_the_duckdb_file(demo_server, tmp_path):
    """What users run: `dagster asset materialize -m fieldsales_dagster --select ...`, twice at once
    (say the schedule and a manual run). The lock beside the DuckDB file queues the second writer
    instead of letting it fail on DuckDB's own file lock."""
    database = tmp_path / "cli.duckdb"
    env = {
        **os.environ,
        "FIELDSALES_BASE_URL": demo_server.base_url,
        "FIELDSALES_API_TOKEN": demo_server.token,
        "FIELDSALES_DUCKDB_PATH": str(database),
        "FIELDSALES_TOKEN_STORE": str(tmp_path / "token.json"),
    }
    dagster = os.path.join(os.path.dirname(sys.executable), "dagster")
    selections = ["raw_transactions", "raw_events,raw_event_groups"]
    homes = [tmp_path / f"dagster_home_{n}" for n in range(len(selections))]
    runs = []
    for home, selection in zip(homes, selections, strict=True):
        # Separate Dagster instances (two deployments, or a CLI run beside `dagster dev`): only
        # the DuckDB file is shared, and a fresh instance's storage is not raced into existence.
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
    with duckdb.connect(str(database), read_only=True) as conn:
        for name in ("events", "transactions", "event_groups"):
            rows = conn.execute(f"SELECT count(*) FROM raw.{name}").fetchone()[0]
            assert rows == demo_server.dataset.count(name)
