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

from fieldsales_dagster_tests.conftest import silent_failures, silent_failures_in

BIN = Path(sys.executable).parent
DIES = """
import os
import dagster as dg

@dg.asset
def dies() -> None:
    os.abort()

defs = dg.Definitions(assets=[dies], executor=dg.in_process_executor)
"""


@pytest.mark.silent_failures_expected
def test_the_scan_names_a_step_whose_process_died(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    (tmp_path / "dies.py").write_text(DIES)
    done = subprocess.run(
        [str(BIN / "dagster"), "asset", "materialize", "-f", "dies.py", "--select", "dies"],
        cwd=tmp_path,
        env={**os.environ, "DAGSTER_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    (found,) = silent_failures_in(home)
    assert found.endswith(
        ": step dies started and never ended: no STEP_FAILURE (did its process die?)"
    ), found


@pytest.mark.silent_failures_expected
def test_the_scan_names_a_step_whose_error_says_nothing():
    @dg.asset
    def quiet() -> None:
        raise RuntimeError

    result = dg.materialize([quiet], raise_on_error=False)
    assert silent_failures(result.run_id, result.all_events) == [
        f"run {result.run_id}: step quiet failed with no error message"
    ]
