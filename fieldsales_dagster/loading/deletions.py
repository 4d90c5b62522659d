"""The deletion audit: every row a refresh removes from a ``raw.*`` table, in ``meta.*_deleted``.

The convention (docs/tables.md, "Deletions"): ``raw.*``, ``core.*`` and ``mart.*`` hold what the
server lists now, so analysts' tables exclude deleted rows with no filter to remember. Each row a
refresh removes (a full refresh replacing a list, an incremental or re-sync merge dropping an
event's vanished transactions or a vanished event's transactions) is copied, as it was stored,
to ``meta.<list>_deleted`` (``meta.events_deleted``, ``meta.transactions_deleted``,
``meta.event_groups_deleted``): the raw table's columns (``id``, ``payload``, ``loaded_at``, and
``event_id`` for transactions), ``deleted_at`` (when the refresh found it gone: the load's time),
and ``run_id`` (the Dagster run of that refresh).

The audit keeps history: an id that comes back is loaded again like any other, and its open audit
rows (``reappeared_at IS NULL``) get ``reappeared_at`` and ``reappeared_run_id``; an id deleted
again gets a new audit row. So "deleted now" is ``reappeared_at IS NULL``.

``record_deletions`` runs inside the transaction that removes the rows (before the removal, which
it reads), so the audit and the table commit together, in one lake snapshot, or not at all.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import duckdb

from fieldsales_dagster.client.endpoints import ListEndpoint
from fieldsales_dagster.warehouse.lake import drop_table
from fieldsales_dagster.warehouse.quoting import qualified, quote_ident
from fieldsales_dagster.warehouse.rows import one_row
from fieldsales_dagster.warehouse.warehouse import table_exists

AUDIT_SCHEMA = "meta"
#: Ids gone in one recording (this connection's temporary table).
GONE_TABLE = "_fs_gone"


def audit_table(endpoint: ListEndpoint) -> str:
    """``raw.transactions`` -> ``meta.transactions_deleted``."""
    return f"{AUDIT_SCHEMA}.{endpoint.table}_deleted"


def record_deletions(
    conn: duckdb.DuckDBPyConnection,
    endpoint: ListEndpoint,
    *,
    kept: str,
    scope: str = "true",
    run_id: str | None,
    at: datetime,
) -> int:
    """Before a refresh replaces rows of ``endpoint.raw_table``: copy to its audit every stored
    row within ``scope`` (an SQL condition on the raw table; everything by default) whose id is
    not in ``kept`` (a query of the ids stored after the change), and mark as reappeared the open
    audit rows whose id is in ``kept``. Returns how many rows were recorded as deleted.

    Reads narrow columns first: a payload is read only for the rows that are gone.
    """
    audit = qualified(audit_table(endpoint))
    extra = "".join(f", {quote_ident(column)} VARCHAR" for column, _ in endpoint.extra_columns)
    conn.execute(f"CREATE SCHEMA IF NOT EXISTS {AUDIT_SCHEMA}")
    conn.execute(
        f"CREATE TABLE IF NOT EXISTS {audit} (id VARCHAR, payload JSON, loaded_at TIMESTAMP"
        f"{extra}, deleted_at TIMESTAMP, run_id VARCHAR, reappeared_at TIMESTAMP, "
        "reappeared_run_id VARCHAR)"
    )
    stamp = {"at": at.astimezone(UTC).replace(tzinfo=None), "run_id": run_id}
    _write_if_any(
        conn,
        f"{audit} WHERE reappeared_at IS NULL",
        f"UPDATE {audit} SET reappeared_at = $at, reappeared_run_id = $run_id "
        f"WHERE reappeared_at IS NULL AND id IN ({kept})",
        stamp,
    )
    if not table_exists(conn, endpoint.raw_table):
        return 0
    target = qualified(endpoint.raw_table)
    conn.execute(
        f"CREATE OR REPLACE TEMP TABLE {GONE_TABLE} AS "
        f"SELECT id FROM {target} WHERE ({scope}) EXCEPT SELECT id FROM ({kept})"
    )
    try:
        return _write_if_any(
            conn,
            GONE_TABLE,
            f"INSERT INTO {audit} BY NAME SELECT *, $at AS deleted_at, $run_id AS run_id "
            f"FROM {target} WHERE id IN (SELECT id FROM {GONE_TABLE})",
            stamp,
        )
    finally:
        drop_table(conn, f"temp.{GONE_TABLE}")


def _write_if_any(
    conn: duckdb.DuckDBPyConnection, rows: str, write: str, params: dict[str, Any]
) -> int:
    """Run ``write`` only if ``rows`` (a table, with its condition) holds any: most refreshes
    delete nothing, and a write that changes nothing is not made. Returns how many it held."""
    (count,) = one_row(conn, f"SELECT count(*) FROM {rows}")
    if count:
        conn.execute(write, params)
    return int(count)
