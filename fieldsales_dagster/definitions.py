"""The code location: every instance under ``defs/``, loaded lazily when Dagster asks for it."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from fieldsales_dagster.assets.publish import with_publish_steps


@dg.definitions
def defs() -> dg.Definitions:
    # Every asset that writes a warehouse (the project's, and any user asset in defs/ taking the
    # warehouse resource) is followed by that warehouse's publish step: see assets/publish.py.
    loaded = with_publish_steps(dg.load_from_defs_folder(path_within_project=Path(__file__).parent))
    return dg.Definitions.merge(
        loaded,
        # Every asset writes one DuckDB file, and DuckDB allows one writer per file: steps would
        # queue on its lock anyway, so running them in the run's own process saves a Python
        # process (and its start-up) per step. Separate runs (schedule, UI, CLI) still meet at
        # the lock in warehouse/resource.py.
        dg.Definitions(executor=dg.in_process_executor),
    )
