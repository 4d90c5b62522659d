"""The refresh_all job and its schedule: whole job, once a day, never two runs at once."""

from __future__ import annotations

import dagster as dg
import pytest

from fieldsales_dagster.automation.schedule import (
    REFRESH_TAG,
    all_jobs,
    all_schedules,
    refresh_all,
    refresh_all_schedule,
    schedule_cron,
    schedule_timezone,
)


@pytest.fixture
def instance(tmp_path):
    # build_schedule_context needs a persistent instance (it passes a reference on).
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        yield instance


def evaluate(instance: dg.DagsterInstance):
    return refresh_all_schedule(dg.build_schedule_context(instance=instance))


def add_run(instance: dg.DagsterInstance, status: dg.DagsterRunStatus) -> dg.DagsterRun:
    return instance.add_run(dg.DagsterRun(job_name=refresh_all.name, status=status))


def test_schedule_requests_a_run_of_the_whole_refresh_all_job(instance):
    request = evaluate(instance)
    assert isinstance(request, dg.RunRequest)
    assert request.asset_selection is None  # the whole job, not a subset
    assert request.job_name in (None, refresh_all.name)
    assert refresh_all_schedule.job_name == refresh_all.name


@pytest.mark.parametrize("status", [dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.STARTING])
def test_schedule_skips_while_a_refresh_all_run_is_in_progress(instance, status):
    run = add_run(instance, status)
    result = evaluate(instance)
    assert isinstance(result, dg.SkipReason)
    assert run.run_id in result.skip_message
    assert "refresh_all" in result.skip_message


def test_schedule_runs_again_once_the_previous_run_finished(instance):
    add_run(instance, dg.DagsterRunStatus.SUCCESS)
    add_run(instance, dg.DagsterRunStatus.FAILURE)
    assert isinstance(evaluate(instance), dg.RunRequest)


def test_refresh_all_selects_every_asset_and_carries_the_concurrency_tag():
    @dg.asset(key=["raw", "events"])
    def raw_events() -> None: ...

    @dg.asset(key=["core", "events"], deps=[raw_events])
    def core_events() -> None: ...

    defs = dg.Definitions(assets=[raw_events, core_events], jobs=[refresh_all])
    job = defs.resolve_job_def(refresh_all.name)
    assert set(job.asset_layer.selected_asset_keys) == {
        dg.AssetKey(["raw", "events"]),
        dg.AssetKey(["core", "events"]),
    }
    assert job.tags[REFRESH_TAG] == "all"


def test_schedule_defaults_to_daily_at_five_utc_and_is_on_by_default():
    assert refresh_all_schedule.cron_schedule == "0 5 * * *"
    assert refresh_all_schedule.execution_timezone == "UTC"
    assert refresh_all_schedule.default_status == dg.DefaultScheduleStatus.RUNNING
    assert refresh_all_schedule.description
    assert all_jobs == [refresh_all]
    assert all_schedules == [refresh_all_schedule]


def test_cron_and_timezone_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("FIELDSALES_SCHEDULE_CRON", "30 2 * * 1-5")
    monkeypatch.setenv("FIELDSALES_SCHEDULE_TIMEZONE", "Europe/Vienna")
    assert schedule_cron() == "30 2 * * 1-5"
    assert schedule_timezone() == "Europe/Vienna"


def test_unknown_timezone_is_refused_with_the_variable_name(monkeypatch):
    monkeypatch.setenv("FIELDSALES_SCHEDULE_TIMEZONE", "Mars/Olympus_Mons")
    with pytest.raises(ValueError, match="FIELDSALES_SCHEDULE_TIMEZONE"):
        schedule_timezone()
