"""The raw load against hostile list servers of our own on 127.0.0.1 (issue 9, paging half)."""

from __future__ import annotations

import duckdb
import pytest

from fieldsales_dagster.client.endpoints import TRANSACTIONS
from fieldsales_dagster.client.resource import FieldSalesAPI
from fieldsales_dagster.warehouse.raw_load import MAX_ITEM_BYTES, RawLoadError, load_list
from fieldsales_dagster_tests.hostile import HostileServer, items


def hostile_api(server: HostileServer, **overrides) -> FieldSalesAPI:
    settings = {
        "base_url": server.base_url,
        "api_token": server.token,
        "use_token_store": False,
        "page_size": 100,
        "concurrency": 4,
        "backoff_initial_s": 0.01,
        "backoff_max_s": 0.05,
        "max_retries": 2,
        "read_timeout_s": 10.0,
    }
    settings.update(overrides)
    return FieldSalesAPI(**settings)


def load(api, warehouse, endpoint=TRANSACTIONS, **kwargs):
    with warehouse.get_connection() as conn:
        return load_list(api, conn, endpoint, **kwargs)


def raw_tables(warehouse) -> set[str]:
    with duckdb.connect(warehouse.database, read_only=True) as conn:
        rows = conn.execute(
            "SELECT table_name FROM duckdb_tables() WHERE schema_name = 'raw'"
        ).fetchall()
    return {name for (name,) in rows}


def row_count(warehouse, table: str = "raw.transactions") -> int:
    with duckdb.connect(warehouse.database, read_only=True) as conn:
        return conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def transactions(total: int, *, count: int | None = None, huge_at: int | None = None):
    """A well-behaved transaction list of ``total`` items (optionally one oversized item)."""

    def answer(path: str, skip: int, limit: int):
        page = items(skip, min(total, skip + limit))
        if huge_at is not None and skip <= huge_at < skip + len(page):
            page[huge_at - skip]["blob"] = "x" * (MAX_ITEM_BYTES + 10)
        return {"transactions": page, "count": total if count is None else count}

    return answer


def test_load_failing_mid_insert_drops_its_staging_table_and_keeps_the_old_one(warehouse):
    with HostileServer(transactions(600)) as good:
        load(hostile_api(good), warehouse)
    with (
        HostileServer(transactions(600, huge_at=350)) as bad,
        pytest.raises(RawLoadError, match=r"raw\._stage_transactions"),
    ):
        load(hostile_api(bad, concurrency=1), warehouse, spool_bytes=1)
    assert raw_tables(warehouse) == {"transactions"}
    assert row_count(warehouse) == 600
