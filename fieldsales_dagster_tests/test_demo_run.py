"""``make demo`` tells the truth: every check beside its table, the demo's faults named as
intended, and the run recorded in a persistent Dagster home the UI can open."""

from __future__ import annotations

import dagster as dg

from fieldsales_dagster import demo_run


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
    out = capsys.readouterr().out

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
