"""The deletion audit: every row a refresh removes from a ``raw.*`` table, in ``meta.*_deleted``
(docs/tables.md, "Deletions"), with ``deleted_at`` and ``run_id``; an id that comes back gets
``reappeared_at``. Recorded in the removing transaction: both commit in one snapshot or neither.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import duckdb

from fieldsales_dagster.client.endpoints import ListEndpoint
from fieldsales_dagster.warehouse.lake import ensure_table
from fieldsales_dagster.warehouse.quoting import qualified, quote_ident
from fieldsales_dagster.warehouse.rows import one_row
from fieldsales_dagster.warehouse.warehouse import table_exists

#: The rows of the events ``$events`` lists: DuckDB evaluates this in the Parquet scan, which then
#: reads payloads only where those events' rows lie. ``event_id IN (<list or query>)`` is a join
#: above the scan (the list only an optional filter for zone maps, which random ids never prune):
#: it read every stored payload.
OF_EVENTS = "list_contains($events::VARCHAR[], event_id)"


def audit_table(endpoint: ListEndpoint) -> str:
    """``raw.transactions`` -> ``meta.transactions_deleted``."""
    return f"meta.{endpoint.table}_deleted"


def record_deletions(
    conn: duckdb.DuckDBPyConnection,
    endpoint: ListEndpoint,
    *,
    changes: str,
    events: list[str] | None = None,
    run_id: str | None,
    at: datetime,
) -> int:
    """Before a refresh replaces rows: audit every stored row (of ``events`` only, if given) whose
    id ``changes`` (the digests compared: ``raw_load.compare_digests``) holds as stored but not
    staged (gone), and mark open audit rows of ids it holds as staged as reappeared (an id with an
    open audit row is stored nowhere, so it is new to the table). Returns how many were deleted.
    Payloads are read only for rows that are gone (and, with ``events``, only where those events'
    rows lie)."""
    audit = qualified(audit_table(endpoint))
    extra = "".join(f", {quote_ident(column)} VARCHAR" for column, _ in endpoint.extra_columns)
    ensure_table(
        conn,
        audit_table(endpoint),
        f"id VARCHAR, payload JSON, loaded_at TIMESTAMP{extra}, deleted_at TIMESTAMP, "
        "run_id VARCHAR, reappeared_at TIMESTAMP, reappeared_run_id VARCHAR",
    )
    stamp = {"at": at.astimezone(UTC).replace(tzinfo=None), "run_id": run_id}
    _write_if_any(
        conn,
        f"{audit} WHERE reappeared_at IS NULL",
        f"UPDATE {audit} SET reappeared_at = $at, reappeared_run_id = $run_id "
        f"WHERE reappeared_at IS NULL AND id IN (SELECT id FROM {changes} WHERE staged)",
        stamp,
    )
    if not table_exists(conn, endpoint.raw_table):
        return 0
    scope, of_events = ("true", {}) if events is None else (OF_EVENTS, {"events": events})
    gone = f"{changes} WHERE NOT staged"
    return _write_if_any(
        conn,
        gone,
        f"INSERT INTO {audit} BY NAME SELECT *, $at AS deleted_at, $run_id AS run_id FROM "
        f"{qualified(endpoint.raw_table)} WHERE {scope} AND id IN (SELECT id FROM {gone})",
        stamp | of_events,
    )


def _write_if_any(
    conn: duckdb.DuckDBPyConnection, rows: str, write: str, params: dict[str, Any]
) -> int:
    """Run ``write`` only if ``rows`` (a table and condition) holds any; returns how many."""
    (count,) = one_row(conn, f"SELECT count(*) FROM {rows}")
    if count:
        conn.execute(write, params)
    return int(count)
