"""``make demo`` tells the truth: every check beside its table, the demo's faults named as
intended, and the run recorded in a persistent Dagster home the UI can open."""

from __future__ import annotations

import json
import re
from pathlib import Path

import dagster as dg
from dagster._cli.utils import get_possibly_temporary_instance_for_cli

from fieldsales_dagster import demo_run
from fieldsales_dagster_tests.project import load_project_defs

ROOT = Path(__file__).resolve().parents[1]
#: Small: every table gets rows and every check runs, at a fraction of `make demo`'s 20,000.
DEMO_ARGS = ["--transactions", "300"]


def summary_of(out: str) -> list[str]:
    """The summary's table and check lines: what must be the same on every run."""
    return [
        line for line in out.splitlines() if re.match(r"^(raw|core|mart)\.|^checks: |^ {8,}", line)
    ]


def test_demo_prints_checks_records_the_run_repeats_its_counts_and_a_failure_says_why(
    tmp_path, capsys, monkeypatch
):
    # main() points the environment at its demo server; restore it after the test.
    # Every variable main() sets, or a later test in this process would inherit it (a leaked
    # FIELDSALES_CREATE_DIRS=true hid the missing-folder checks of later tests); and the token
    # store's, so that the demo keeps its token in its home.
    for variable in (
        "FIELDSALES_BASE_URL",
        "FIELDSALES_API_TOKEN",
        "FIELDSALES_DUCKDB_PATH",
        "FIELDSALES_DUCKLAKE_CATALOG",
        "FIELDSALES_DUCKLAKE_DATA_PATH",
        "FIELDSALES_CREATE_DIRS",
        "FIELDSALES_TOKEN_STORE",
        "DAGSTER_HOME",
    ):
        monkeypatch.setenv(variable, "")
    # `make demo` runs from the project folder: here a copy of it holding the project's
    # dagster.yaml, so that the demo's default home is project/.dagster_home.
    project = tmp_path / "project"
    project.mkdir()
    (project / "dagster.yaml").write_bytes((ROOT / "dagster.yaml").read_bytes())
    monkeypatch.chdir(project)
    home = project / demo_run.DEFAULT_DAGSTER_HOME
    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    demo_run.prepare_dagster_home(home, tmp_path / "dagster.yaml")
    # The lake's defaults, as `make demo` uses them: under the project's data/.
    status = demo_run.main(DEMO_ARGS)
    captured = capsys.readouterr()
    out = captured.out

    assert status == 0
    assert "0 failed unexpectedly" in out
    for _asset, check in demo_run.EXPECTED_DEMO_FINDINGS:
        (line,) = [line for line in out.splitlines() if f"  {check}: " in line]
        assert "as intended" in line or "passed" in line
    assert "ids_unique: passed" in out
    assert "published" not in out  # no publish step: a table's commit is what analysts read
    data = project / "data"
    assert (data / "fieldsales.ducklake.sqlite").is_file()
    assert list((data / "lake").rglob("*.parquet"))
    assert not list(data.rglob("*.duckdb"))  # no single-file export unless one is set
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

    # ... and the instance the README's `dg dev` opens (DAGSTER_HOME unset: a temporary home
    # configured by the project's dagster.yaml) lists that same run.
    monkeypatch.delenv("DAGSTER_HOME")
    with get_possibly_temporary_instance_for_cli("dg dev") as ui_instance:
        assert [r.run_id for r in ui_instance.get_runs()] == [run.run_id]
        assert ui_instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.SUCCESS

    # ... while the terminal shows one line per finished step, then the summary: no DEBUG event.
    terminal = captured.out + captured.err
    assert " - DEBUG - " not in terminal and "STEP_START" not in terminal
    steps = [line for line in out.splitlines() if re.match(r"^ +\d+\. \S+ \(\d+\.\d s\)$", line)]
    assert {line.split()[1] for line in steps} >= {key.to_user_string() for key in keys}
    # The count it announces is the steps it lists, each named for what it does.
    assert f"Materializing {len(keys)} assets and their checks in {len(steps)} steps;" in out
    assert {line.split()[1] for line in steps} - {key.to_user_string() for key in keys} == {
        "core_cross_table_checks",
    }
    assert len(terminal.splitlines()) < 100, terminal

    # `make demo` again, twice (each start of the demo API takes a new port): the same counts.
    summaries = [summary_of(out)]
    for _ in range(2):
        status = demo_run.main(DEMO_ARGS)
        again = capsys.readouterr().out
        assert status == 0, again
        summaries.append(summary_of(again))
    assert summaries[0] and summaries[0] == summaries[1] == summaries[2]
    assert any(line.startswith("raw.transactions ") for line in summaries[0])
    store = home / "fieldsales_token.json"
    assert json.loads(store.read_text())["token"] == demo_run.DEMO_TOKEN

    # A failed run says so and why, in one line, and prints no (stale) table as if fresh.
    store.write_text('{"token": ')
    status = demo_run.main(DEMO_ARGS)
    captured = capsys.readouterr()
    assert status == 1
    assert summary_of(captured.out) == []
    assert "FAILED, so no table is summarized" in captured.err
    cause = captured.err.strip().splitlines()[-1]
    assert "TokenStoreError: Token store" in cause and "is corrupt" in cause, captured.err
    assert "DagsterExecutionStepExecutionError" not in captured.out + captured.err
