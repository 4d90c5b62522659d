"""The refresh job and the schedule that runs it, one run at a time.

Two guards keep refreshes from overlapping: the schedule skips its tick while a run of the job is
queued or in progress (and says which run), and the instance's run queue (``dagster.yaml``) limits
runs tagged ``fieldsales/refresh`` to one at a time, which also covers runs launched by hand.
"""

from __future__ import annotations

import os
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import dagster as dg

REFRESH_TAG = "fieldsales/refresh"
CRON_ENV_VAR = "FIELDSALES_SCHEDULE_CRON"
TIMEZONE_ENV_VAR = "FIELDSALES_SCHEDULE_TIMEZONE"
DEFAULT_CRON = "0 5 * * *"
DEFAULT_TIMEZONE = "UTC"

#: Runs that hold (or will soon hold) the DuckDB file: a new refresh waits for them.
ACTIVE_RUN_STATUSES = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
]


def schedule_cron() -> str:
    """``$FIELDSALES_SCHEDULE_CRON`` or daily at 05:00 (Dagster rejects an invalid expression)."""
    return os.environ.get(CRON_ENV_VAR, "").strip() or DEFAULT_CRON


def schedule_timezone() -> str:
    """``$FIELDSALES_SCHEDULE_TIMEZONE`` (an IANA name) or UTC."""
    timezone = os.environ.get(TIMEZONE_ENV_VAR, "").strip() or DEFAULT_TIMEZONE
    try:
        ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(
            f"{TIMEZONE_ENV_VAR}={timezone!r} is not an IANA time zone such as UTC or "
            "Europe/Vienna."
        ) from None
    return timezone


SCHEDULE_CRON = schedule_cron()
SCHEDULE_TIMEZONE = schedule_timezone()

refresh_all = dg.define_asset_job(
    name="refresh_all",
    selection=dg.AssetSelection.all(),
    tags={REFRESH_TAG: "all"},
    description=(
        "Full refresh: load every Field-Sales list into the raw schema, then rebuild every core "
        "table and run the checks."
    ),
)


@dg.schedule(
    job=refresh_all,
    cron_schedule=SCHEDULE_CRON,
    execution_timezone=SCHEDULE_TIMEZONE,
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description=(
        f"Runs refresh_all on cron '{SCHEDULE_CRON}' ({SCHEDULE_TIMEZONE}; set "
        f"{CRON_ENV_VAR} and {TIMEZONE_ENV_VAR} to change it). Skips a tick while a run of "
        "refresh_all is queued or in progress."
    ),
)
def refresh_all_schedule(context: dg.ScheduleEvaluationContext):
    active = context.instance.get_runs(
        filters=dg.RunsFilter(job_name=refresh_all.name, statuses=ACTIVE_RUN_STATUSES), limit=1
    )
    if active:
        run = active[0]
        return dg.SkipReason(
            f"refresh_all run {run.run_id} is still {run.status.value.lower()}; skipping this "
            "tick so refreshes do not overlap."
        )
    return dg.RunRequest()


all_jobs = [refresh_all]
all_schedules = [refresh_all_schedule]
