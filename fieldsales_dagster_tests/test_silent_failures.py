"""The scan of conftest.py (``no_silent_failure``) can fail: a run whose step process dies
mid-step, as a process does when DuckDB aborts it (a lone surrogate reaching DuckDB's string
code used to), leaves a STEP_START and nothing after it; a step can fail with an error that
says nothing. The scan names the step of each."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from fieldsales_dagster_tests.conftest import lake_paths, silent_failures, silent_failures_in

BIN = Path(sys.executable).parent
DIES = """
import os
import dagster as dg

@dg.asset
def dies() -> None:
    os.abort()

defs = dg.Definitions(assets=[dies], executor=dg.in_process_executor)
"""
#: A user's assets writing a frame with a lone surrogate: one in its own transaction through
#: ``warehouse.get_connection()`` (DuckDB fails inside it with an internal error), one through
#: the IO manager (refused before DuckDB, naming the column); then a whole frame. The steps
#: share one process.
CUT = """
import dagster as dg
import pandas as pd

from fieldsales_dagster import FieldSalesWarehouse
from fieldsales_dagster.assets.io_manager import build_io_manager

CUT = pd.DataFrame({"name": ["ok", "\\ud800"]})


@dg.asset
def cut_by_sql(warehouse: FieldSalesWarehouse) -> None:
    with warehouse.get_connection() as conn:
        conn.execute("CREATE SCHEMA IF NOT EXISTS analytics")
        conn.register("cut", CUT)
        conn.begin()
        conn.execute("CREATE OR REPLACE TABLE analytics.cut_by_sql AS SELECT * FROM cut")
        conn.commit()


@dg.asset(io_manager_key="fieldsales_io_manager")
def cut_frame() -> pd.DataFrame:
    return CUT


@dg.asset(io_manager_key="fieldsales_io_manager")
def whole_frame() -> pd.DataFrame:
    return CUT.head(1)


defs = dg.Definitions(
    assets=[cut_by_sql, cut_frame, whole_frame],
    resources={
        "warehouse": FieldSalesWarehouse(ducklake_catalog=%r, ducklake_data_path=%r),
        "fieldsales_io_manager": build_io_manager("warehouse", "analytics"),
    },
    executor=dg.in_process_executor,
)
"""


def materialize_all(folder: Path, source: str) -> Path:
    """``dagster asset materialize`` of every asset of the file ``source`` (expected to fail),
    with an instance of its own under ``folder``; the instance's home."""
    home = folder / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    (folder / "assets.py").write_text(source)
    done = subprocess.run(
        [str(BIN / "dagster"), "asset", "materialize", "-f", "assets.py", "--select", "*"],
        cwd=folder,
        env={**os.environ, "DAGSTER_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0, done.stderr[-3000:]
    return home


@pytest.mark.silent_failures_expected
def test_the_scan_names_a_step_whose_process_died(tmp_path):
    home = materialize_all(tmp_path, DIES)
    (found,) = silent_failures_in(home)
    assert found.endswith(
        ": step dies started and never ended: no STEP_FAILURE (did its process die?)"
    ), found


def test_a_step_that_breaks_duckdb_fails_naming_its_asset_and_the_cause(tmp_path):
    """DuckDB invalidates its database on an internal error in a transaction, and closing the
    connection then aborted the process: the run stayed STARTED, its step with no failure."""
    home = materialize_all(tmp_path, CUT % lake_paths(tmp_path))
    with dg.DagsterInstance.local_temp(str(home)) as instance:
        (run,) = instance.get_runs()
        events = [e.dagster_event for e in instance.all_logs(run.run_id) if e.dagster_event]
    assert run.status == dg.DagsterRunStatus.FAILURE
    failures = {e.step_key: e.step_failure_data.error for e in events if e.is_step_failure}
    assert sorted(failures) == ["cut_by_sql", "cut_frame"]
    cause = failures["cut_by_sql"]
    while cause.cause is not None:
        cause = cause.cause
    assert "invalid code point" in cause.message and "UTF-8" in cause.message, cause.message
    assert "column 'name'" in failures["cut_frame"].message, failures["cut_frame"].message
    # DuckDB is still usable in the process after the failed step: a later step writes.
    steps = [e.step_key for e in events if e.event_type == dg.DagsterEventType.STEP_START]
    assert steps == ["cut_by_sql", "cut_frame", "whole_frame"]
    assert [e.step_key for e in events if e.is_step_success] == ["whole_frame"]


@pytest.mark.silent_failures_expected
def test_the_scan_names_a_step_whose_error_says_nothing():
    @dg.asset
    def quiet() -> None:
        raise RuntimeError

    result = dg.materialize([quiet], raise_on_error=False)
    assert silent_failures(result.run_id, result.all_events) == [
        f"run {result.run_id}: step quiet failed with no error message"
    ]
