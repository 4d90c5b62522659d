"""``make demo`` tells the truth: every check beside its table, the demo's faults named as
intended, and the run recorded in a persistent Dagster home the UI can open."""

from __future__ import annotations

import re

import dagster as dg

from fieldsales_dagster import demo_run
from fieldsales_dagster_tests.project import load_project_defs


def test_demo_prints_checks_names_intended_failures_and_records_the_run(
    tmp_path, capsys, monkeypatch
):
    # main() points the environment at its demo server; restore it after the test.
    for variable in ("FIELDSALES_BASE_URL", "FIELDSALES_API_TOKEN", "DAGSTER_HOME"):
        monkeypatch.setenv(variable, "")
    home = tmp_path / "home"
    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    demo_run.prepare_dagster_home(home, tmp_path / "dagster.yaml")
    status = demo_run.main(
        [
            "--transactions",
            "600",
            "--database",
            str(tmp_path / "demo.duckdb"),
            "--dagster-home",
            str(home),
        ]
    )
    captured = capsys.readouterr()
    out = captured.out

    assert status == 0
    assert "0 failed unexpectedly" in out
    for _asset, check in demo_run.EXPECTED_DEMO_FINDINGS:
        (line,) = [line for line in out.splitlines() if f"  {check}: " in line]
        assert "as intended" in line or "passed" in line
    assert "ids_unique: passed" in out
    assert (home / "dagster.yaml").is_file()
    with dg.DagsterInstance.from_config(str(home)) as instance:
        (run,) = instance.get_runs()
        assert run.status == dg.DagsterRunStatus.SUCCESS
        # The run names its target (the UI's "Target" column): every asset of the project.
        keys = set(load_project_defs().resolve_all_asset_keys())
        assert run.asset_selection == keys
        # ... and its full log, Dagster's DEBUG events included, stays in the instance ...
        events = {
            entry.dagster_event.event_type_value
            for entry in instance.all_logs(run.run_id)
            if entry.dagster_event is not None
        }
        assert {"STEP_START", "STEP_OUTPUT", "STEP_SUCCESS", "ASSET_MATERIALIZATION"} <= events

    # ... while the terminal shows one line per finished step, then the summary: no DEBUG event.
    terminal = captured.out + captured.err
    assert " - DEBUG - " not in terminal and "STEP_START" not in terminal
    steps = [line for line in out.splitlines() if re.match(r"^ +\d+\. \S+ \(\d+\.\d s\)$", line)]
    assert {line.split()[1] for line in steps} >= {key.to_user_string() for key in keys}
    assert len(terminal.splitlines()) < 100, terminal
