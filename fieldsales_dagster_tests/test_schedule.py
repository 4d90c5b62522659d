"""The refresh_all job and its schedule: whole job, once a day, never two runs at once."""

from __future__ import annotations

import dagster as dg
import pytest

from fieldsales_dagster.names import REFRESH_TAG
from fieldsales_dagster_tests.project import ASSETS, load_failure, load_project_defs


@pytest.fixture
def project_env(monkeypatch):
    """The default instance, pointed at a URL nothing needs to answer (nothing is fetched)."""
    monkeypatch.setenv("FIELDSALES_BASE_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("FIELDSALES_API_TOKEN", "schedule-test-token")
    for variable in ("FIELDSALES_SCHEDULE_CRON", "FIELDSALES_SCHEDULE_TIMEZONE"):
        monkeypatch.delenv(variable, raising=False)


@pytest.fixture
def refresh_all_schedule(project_env) -> dg.ScheduleDefinition:
    return load_project_defs().get_schedule_def("refresh_all_schedule")


@pytest.fixture
def instance(tmp_path):
    # build_schedule_context needs a persistent instance (it passes a reference on).
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        yield instance


def evaluate(schedule: dg.ScheduleDefinition, instance: dg.DagsterInstance):
    return schedule(dg.build_schedule_context(instance=instance))


def add_run(instance: dg.DagsterInstance, status: dg.DagsterRunStatus) -> dg.DagsterRun:
    return instance.add_run(dg.DagsterRun(job_name="refresh_all", status=status))


def test_schedule_requests_a_run_of_the_whole_refresh_all_job(refresh_all_schedule, instance):
    request = evaluate(refresh_all_schedule, instance)
    assert isinstance(request, dg.RunRequest)
    assert request.asset_selection is None  # the whole job, not a subset
    assert request.job_name in (None, "refresh_all")
    assert refresh_all_schedule.job_name == "refresh_all"


@pytest.mark.parametrize("status", [dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.STARTING])
def test_schedule_skips_while_a_refresh_all_run_is_in_progress(
    refresh_all_schedule, instance, status
):
    run = add_run(instance, status)
    result = evaluate(refresh_all_schedule, instance)
    assert isinstance(result, dg.SkipReason)
    assert run.run_id in result.skip_message
    assert "refresh_all" in result.skip_message


def test_schedule_runs_again_once_the_previous_run_finished(refresh_all_schedule, instance):
    add_run(instance, dg.DagsterRunStatus.SUCCESS)
    add_run(instance, dg.DagsterRunStatus.FAILURE)
    assert isinstance(evaluate(refresh_all_schedule, instance), dg.RunRequest)


def test_refresh_all_selects_every_asset_and_carries_the_concurrency_tag(project_env):
    defs = load_project_defs()
    job = defs.resolve_job_def("refresh_all")
    every_asset = defs.get_repository_def().asset_graph.get_all_asset_keys()
    # Every asset but the lake's upkeep, which has its own job and schedule (lake_upkeep).
    upkeep = dg.AssetKey("ducklake_upkeep")
    assert upkeep in every_asset
    assert set(job.asset_layer.selected_asset_keys) == set(every_asset) - {upkeep}
    assert {key.to_user_string() for key in every_asset} == ASSETS
    assert job.tags[REFRESH_TAG] == "all"


def test_schedule_defaults_to_daily_at_five_utc_and_is_on_by_default(refresh_all_schedule):
    assert refresh_all_schedule.cron_schedule == "0 5 * * *"
    assert refresh_all_schedule.execution_timezone == "UTC"
    assert refresh_all_schedule.default_status == dg.DefaultScheduleStatus.RUNNING
    assert refresh_all_schedule.description


def test_cron_and_timezone_come_from_the_environment(project_env, monkeypatch):
    monkeypatch.setenv("FIELDSALES_SCHEDULE_CRON", "30 2 * * 1-5")
    monkeypatch.setenv("FIELDSALES_SCHEDULE_TIMEZONE", "Europe/Vienna")
    schedule = load_project_defs().get_schedule_def("refresh_all_schedule")
    assert schedule.cron_schedule == "30 2 * * 1-5"
    assert schedule.execution_timezone == "Europe/Vienna"


def test_unknown_timezone_fails_the_load_naming_setting_and_variable(project_env, monkeypatch):
    message = load_failure(monkeypatch, FIELDSALES_SCHEDULE_TIMEZONE="Mars/Olympus_Mons")
    assert "refresh.schedule_timezone (from FIELDSALES_SCHEDULE_TIMEZONE) is invalid" in message
    assert "'Mars/Olympus_Mons'" in message
    assert "IANA time zone such as UTC" in message


@pytest.mark.parametrize("cron", ["0 25 * * *", "every day", "0 5 * *"])
def test_invalid_cron_fails_the_load_naming_setting_and_variable(project_env, monkeypatch, cron):
    message = load_failure(monkeypatch, FIELDSALES_SCHEDULE_CRON=cron)
    assert (
        "refresh.schedule_cron (from FIELDSALES_SCHEDULE_CRON) is invalid: it is not a cron"
        in message
    )
    assert repr(cron) in message


@pytest.mark.parametrize(
    ("cron", "timezone", "hours"),
    [
        ("0 5 * * *", "UTC", 24),
        ("30 2 * * 1-5", "Europe/Vienna", 72),  # Friday to Monday
        ("*/15 * * * *", "UTC", 0.25),
        ("0 0 1 * *", "UTC", 31 * 24),
    ],
)
def test_the_freshness_window_follows_the_longest_gap_between_ticks(cron, timezone, hours):
    from datetime import timedelta

    from fieldsales_dagster.settings import schedule_interval

    assert schedule_interval(cron, timezone) == timedelta(hours=hours)


def test_the_component_imports_no_private_dagster_module():
    # dagster._* changes without notice at an upgrade; the cron rules come from public APIs.
    import ast
    import inspect

    from fieldsales_dagster import component

    tree = ast.parse(inspect.getsource(component))
    imported = [
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    ]
    assert [name for name in imported if name and name.startswith("dagster._")] == []
