"""The refresh job and its schedule, which skips a tick while a run is active; the run queue
(``dagster.yaml``) limits runs tagged ``fieldsales/refresh`` to one, covering runs by hand too."""

import dagster as dg

from fieldsales_dagster.names import REFRESH_TAG, InstanceNames

#: Runs that hold (or will soon hold) the DuckDB file: a new refresh waits for them.
ACTIVE_RUN_STATUSES = [
    dg.DagsterRunStatus[status]
    for status in ("QUEUED", "NOT_STARTED", "STARTING", "STARTED", "CANCELING")
]


def build_refresh_job_and_schedule(
    names: InstanceNames, selection: dg.AssetSelection, cron: str, timezone: str
):
    """The job (``dg.define_asset_job``'s, a type Dagster does not export) and its schedule."""
    job = dg.define_asset_job(
        name=names.refresh_job,
        selection=selection,
        tags={REFRESH_TAG: names.refresh_tag_value},
        description="Loads every Field-Sales list into raw, then rebuilds and checks every table.",
    )

    @dg.schedule(
        name=names.refresh_schedule,
        job=job,
        cron_schedule=cron,
        execution_timezone=timezone,
        default_status=dg.DefaultScheduleStatus.RUNNING,
        description=(
            f"Runs {job.name} on cron '{cron}' ({timezone}: FIELDSALES_SCHEDULE_CRON and "
            "FIELDSALES_SCHEDULE_TIMEZONE), skipping a tick while a run of it is queued or running."
        ),
    )
    def _refresh_schedule(context: dg.ScheduleEvaluationContext):
        active = dg.RunsFilter(job_name=job.name, statuses=ACTIVE_RUN_STATUSES)
        if runs := context.instance.get_runs(filters=active, limit=1):
            return dg.SkipReason(
                f"{job.name} run {runs[0].run_id} is still {runs[0].status.value.lower()}; "
                "skipping this tick so refreshes do not overlap."
            )
        return dg.RunRequest()

    return job, _refresh_schedule
