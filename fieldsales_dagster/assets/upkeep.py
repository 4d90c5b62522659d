"""The lake's upkeep (docs/storage.md), an asset with its own job and weekly schedule."""

import dagster as dg

from fieldsales_dagster.names import InstanceNames
from fieldsales_dagster.warehouse.lake import ORPHAN_SAFETY_HOURS, upkeep

UPKEEP_ASSET = "ducklake_upkeep"


class UpkeepConfig(dg.Config):
    retain_snapshots_days: float | None = None
    """Override the component's retain_snapshots_days for this run (0: keep the last only)."""
    orphan_age_hours: float = ORPHAN_SAFETY_HOURS
    """Files no snapshot lists are deleted once this old: a live write's files are younger."""


def build_upkeep_asset(
    names: InstanceNames, owners: list[str], retain_snapshots_days: float
) -> dg.AssetsDefinition:
    @dg.asset(
        key=names.asset_key(UPKEEP_ASSET),
        group_name=names.group("upkeep"),
        kinds={"ducklake"},
        owners=owners,
        pool=names.pool_for(UPKEEP_ASSET),
        required_resource_keys={names.warehouse.key},
        description=(
            "Merges the DuckLake's small files, expires snapshots older than retain_snapshots_days "
            f"({retain_snapshots_days:g}; the last one stays) and deletes the files none needs."
        ),
    )
    def _upkeep(context: dg.AssetExecutionContext, config: UpkeepConfig) -> dg.MaterializeResult:
        warehouse = names.warehouse.of(context)
        lake, days = warehouse.lake, config.retain_snapshots_days
        days = retain_snapshots_days if days is None else days
        with warehouse.get_connection() as conn:
            done = upkeep(conn, lake, days, config.orphan_age_hours)
        context.log.info(
            f"Upkeep of {lake.alias}: {done['files_before']} -> {done['files_after']} files, "
            f"{done['bytes_before'] / 1e6:,.1f} -> {done['bytes_after'] / 1e6:,.1f} MB, "
            f"{done['snapshots_before']} -> {done['snapshots_after']} snapshots, "
            f"{done['orphans_deleted']} orphaned files deleted."
        )
        return dg.MaterializeResult(metadata={**done, "retain_snapshots_days": days})

    return _upkeep


def build_upkeep_job_and_schedule(names: InstanceNames, asset: dg.AssetsDefinition, timezone: str):
    """The job (``dg.define_asset_job``'s, a type Dagster does not export) and its schedule."""
    job = dg.define_asset_job(
        name=f"{names.refresh_job.removesuffix('refresh_all')}lake_upkeep",
        selection=dg.AssetSelection.assets(asset),
        description="The DuckLake's upkeep (see the ducklake_upkeep asset).",
    )
    schedule = dg.ScheduleDefinition(
        name=f"{job.name}_schedule",
        job=job,
        cron_schedule="0 3 * * 0",  # Sundays at 03:00, before the default 05:00 refresh
        execution_timezone=timezone,
        default_status=dg.DefaultScheduleStatus.RUNNING,
        description="Weekly upkeep of the DuckLake.",
    )
    return job, schedule
