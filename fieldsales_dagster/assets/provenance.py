"""Which Dagster run wrote a row: ``meta.load_runs``, one record per load of a raw table.

Every raw load stamps the rows it writes with its own ``loaded_at`` and keeps the rows it did not
re-fetch as they were (``warehouse/raw_load.py``), so ``(table, loaded_at)`` names the load a row
came from, and this table names that load's run (compare dlt's ``_dlt_load_id``)::

    SELECT e.id, r.run_id
    FROM raw.events AS e
    JOIN meta.load_runs AS r ON r.table_name = 'raw.events' AND r.loaded_at = e.loaded_at

The record is written in the load's own commit (``FieldSalesWarehouse.one_commit``): a load
that fails leaves none.
"""

from __future__ import annotations

from datetime import UTC, datetime

import duckdb

from fieldsales_dagster.warehouse.resource import qualified
from fieldsales_dagster.warehouse.rows import one_row

LOAD_RUNS = "meta.load_runs"


def record_load_run(
    conn: duckdb.DuckDBPyConnection, table: str, run_id: str, asset_key: str
) -> None:
    """Record that run ``run_id`` (asset ``asset_key``) wrote ``table``'s newest load."""
    (loaded_at,) = one_row(conn, f"SELECT max(loaded_at) FROM {qualified(table)}")
    if loaded_at is None:  # an empty table: no row to trace
        return
    conn.execute("CREATE SCHEMA IF NOT EXISTS meta")
    conn.execute(
        f"CREATE TABLE IF NOT EXISTS {qualified(LOAD_RUNS)} (table_name VARCHAR, "
        "loaded_at TIMESTAMP, run_id VARCHAR, asset_key VARCHAR, recorded_at TIMESTAMP)"
    )
    # A load that wrote no row (nothing changed) leaves the newest stamp to its earlier run.
    conn.execute(
        f"INSERT INTO {qualified(LOAD_RUNS)} SELECT $table, $loaded_at, $run_id, $asset_key, "
        f"$now WHERE NOT EXISTS (SELECT 1 FROM {qualified(LOAD_RUNS)} "
        "WHERE table_name = $table AND loaded_at = $loaded_at)",
        {
            "table": table,
            "loaded_at": loaded_at,
            "run_id": run_id,
            "asset_key": asset_key,
            "now": datetime.now(UTC).replace(tzinfo=None),
        },
    )
