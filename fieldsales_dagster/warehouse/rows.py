"""``one_row``: run a query that always returns one row, such as ``SELECT count(*)``."""

from __future__ import annotations

from typing import Any

import duckdb


def one_row(conn: duckdb.DuckDBPyConnection, sql: str, params: object = None) -> tuple[Any, ...]:
    """The row of ``sql``; ``None`` would be a bug, named at once rather than on unpacking."""
    row = conn.execute(sql, params).fetchone()
    if row is None:
        raise RuntimeError(f"DuckDB returned no row for {sql[:80]!r}: a bug, please report it.")
    return row
