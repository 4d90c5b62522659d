"""Publishing the analysts' copy: the last step of every run that wrote the working database.

Assets write the warehouse's working database; analysts read ``database``, which only a publish
replaces (see ``warehouse/resource.py``). The publish is a step of the run like any other: a
multi-asset check ``publish_<warehouse key>`` with one check ``published`` on every asset that
writes through that warehouse. Dagster adds an asset's checks to every run that selects the asset
(``dagster asset materialize --select raw_events``, a click in the UI, the refresh job, and, with
the checks' automation condition, the automation sensor's runs), and runs a check after its
asset: so whatever a run wrote is published by that run, once, after its last writer. A publish
that fails (no space, permission, read-only file system) fails the step and so the run, with the
file, the reason and the space needed; the analysts keep the previous file, and the next run
publishes again. A run in which a writer failed skips the publish step (Dagster skips a step
whose upstream failed) and fails; the next successful run publishes everything.

Which assets write is found when the definitions are built (``with_publish_steps``): every asset
that requires a ``FieldSalesWarehouse`` resource, or a resource that holds one (an IO manager
writing through it). A user's own asset (``defs/analytics/kpi.py`` taking the ``warehouse``
resource) is published with the run that builds it, without any wiring of its own.
"""

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import dagster as dg

from fieldsales_dagster.names import ResourceKey
from fieldsales_dagster.warehouse.resource import FieldSalesWarehouse

#: The check every writing asset carries: the analysts' file holds what this run built.
PUBLISHED_CHECK = "published"

#: The check joins every run that requests its asset (the automation sensor's runs too).
WITH_ITS_ASSET = dg.AutomationCondition.any_deps_match(dg.AutomationCondition.will_be_requested())


def publish_step_name(warehouse_key: str) -> str:
    return f"publish_{warehouse_key}"


def build_publish_step(
    warehouse_key: str, targets: Sequence[dg.AssetKey]
) -> dg.AssetChecksDefinition:
    """The step that publishes warehouse ``warehouse_key`` after ``targets`` (its writers)."""
    warehouse_resource = ResourceKey(warehouse_key, FieldSalesWarehouse)

    @dg.multi_asset_check(
        specs=[
            dg.AssetCheckSpec(
                PUBLISHED_CHECK,
                asset=key,
                description=(
                    "The analysts' DuckDB file holds this run's tables: the working database was "
                    "published after the run's last writer (bytes, seconds and target in the "
                    "metadata). A failed publish fails the run; analysts keep the previous file."
                ),
                automation_condition=WITH_ITS_ASSET,
            )
            for key in targets
        ],
        name=publish_step_name(warehouse_key),
        can_subset=True,
        required_resource_keys={warehouse_resource.key},
        description=f"Publishes the working database of resource {warehouse_key} to analysts.",
    )
    def _publish(context: dg.AssetCheckExecutionContext) -> Iterator[dg.AssetCheckResult]:
        warehouse = warehouse_resource.of(context)
        selected = sorted(context.selected_asset_check_keys, key=str)
        changed = materialized_in_run(context.instance, context.run.run_id)
        metadata: dict[str, Any]
        if not any(check.asset_key in changed for check in selected):
            metadata = {"fieldsales/publish": "nothing was materialized in this run"}
            context.log.info(f"No table changed in this run; {warehouse.database} is left alone.")
        elif (publication := warehouse.publish()) is None:
            metadata = {"fieldsales/publish": "written in place (no analysts' copy)"}
        else:
            metadata = publication.metadata()
            context.log.info(
                f"Published {warehouse.working_path} to {publication.path}: "
                f"{publication.bytes / 1e6:,.1f} MB in {publication.seconds:.2f} s "
                f"({publication.copy_method})."
            )
        for check in selected:
            yield dg.AssetCheckResult(
                asset_key=check.asset_key,
                check_name=check.name,
                passed=True,
                metadata={
                    **metadata,
                    "fieldsales/materialized_in_run": check.asset_key in changed,
                },
            )

    return _publish


def materialized_in_run(instance: dg.DagsterInstance, run_id: str) -> set[dg.AssetKey]:
    """The asset keys materialized so far in run ``run_id``."""
    records = instance.get_records_for_run(
        run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION
    ).records
    return {
        record.event_log_entry.dagster_event.asset_key
        for record in records
        if record.event_log_entry.dagster_event is not None
        and record.event_log_entry.dagster_event.asset_key is not None
    }


def writer_keys(resources: Mapping[str, object], warehouse_key: str) -> set[str]:
    """``warehouse_key`` and the keys of resources that hold or require that warehouse."""
    warehouse = resources[warehouse_key]
    keys = {warehouse_key}
    for key, resource in resources.items():
        fields = getattr(type(resource), "model_fields", {})
        if any(getattr(resource, name, None) == warehouse for name in fields):
            keys.add(key)
        # An IO manager that depends on the warehouse by key (fieldsales_io_manager).
        if warehouse_key in getattr(resource, "required_resource_keys", ()):
            keys.add(key)
    return keys


def publish_steps(
    assets: Sequence[object], resources: Mapping[str, object]
) -> list[dg.AssetChecksDefinition]:
    """One publish step per ``FieldSalesWarehouse`` resource, after every asset writing it."""
    steps = []
    for warehouse_key, resource in resources.items():
        if not isinstance(resource, FieldSalesWarehouse):
            continue
        writers = writer_keys(resources, warehouse_key)
        targets = [
            key
            for asset in assets
            if isinstance(asset, dg.AssetsDefinition)
            and not isinstance(asset, dg.AssetChecksDefinition)
            and asset.required_resource_keys & writers
            for key in asset.keys
        ]
        if targets:
            steps.append(build_publish_step(warehouse_key, targets))
    return steps


def with_publish_steps(defs: dg.Definitions) -> dg.Definitions:
    """``defs`` with a publish step for each of its warehouses (see the module docstring)."""
    assets = list(defs.assets or [])
    steps = publish_steps(assets, dict(defs.resources or {}))
    return dg.Definitions.merge(defs, dg.Definitions(asset_checks=steps)) if steps else defs
