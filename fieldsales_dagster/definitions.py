"""The project's one ``Definitions``: every asset, check, job, schedule, sensor and resource."""

from __future__ import annotations

import dagster as dg

from fieldsales_dagster.assets.checks import core_checks
from fieldsales_dagster.assets.core import core_assets
from fieldsales_dagster.assets.mart import mart_assets
from fieldsales_dagster.assets.raw import raw_assets
from fieldsales_dagster.automation.schedule import all_jobs, all_schedules
from fieldsales_dagster.automation.sensors import all_sensors
from fieldsales_dagster.resources import build_resources


def build_definitions() -> dg.Definitions:
    """Everything, with resources configured from the environment as it is now."""
    return dg.Definitions(
        assets=[*raw_assets, *core_assets, *mart_assets],
        asset_checks=[*core_checks],
        jobs=all_jobs,
        schedules=all_schedules,
        sensors=all_sensors,
        resources=build_resources(),
        # Every asset writes one DuckDB file, and DuckDB allows one writer per file: steps would
        # queue on its lock anyway, so running them in the run's own process saves a Python
        # process (and its start-up) per step. Separate runs (schedule, UI, CLI) still meet at
        # the lock in warehouse.py.
        executor=dg.in_process_executor,
    )


defs = build_definitions()
