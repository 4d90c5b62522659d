"""The deletion audit (docs/tables.md, "Deletions"), for real: the demo API deletes events and
transactions between runs, and every row a refresh removes from ``raw.*`` is in
``meta.<list>_deleted`` as it was stored, with the time it was found gone and the run that found
it; the analysts' tables hold none of them; an id that comes back is marked reappeared; a failed
run leaves the audit and the tables as they were."""

from __future__ import annotations

from datetime import datetime

import dagster as dg
import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fieldsales_dagster.client.endpoints import TRANSACTIONS
from fieldsales_dagster.loading import incremental, raw_load
from fieldsales_dagster.loading.deletions import OF_EVENTS, record_deletions
from fieldsales_dagster_tests.conftest import make_api, make_warehouse, read_lake
from fieldsales_dagster_tests.project import core_assets, raw_assets

RAW_ASSETS = raw_assets()
LISTS = ("events", "transactions", "event_groups")


def refresh(server, tmp_path, warehouse, mode=None, assets=RAW_ASSETS, **kwargs):
    run_config = {"ops": {"raw_transactions": {"config": {"refresh_mode": mode}}}} if mode else None
    return dg.materialize(
        assets,
        resources={"fieldsales_api": make_api(server, tmp_path), "warehouse": warehouse},
        run_config=run_config,
        **kwargs,
    )


def stored(warehouse, table: str) -> dict[str, tuple]:
    """``raw.<table>``: id -> the row as stored."""
    with read_lake(warehouse) as conn:
        rows = conn.execute(f"SELECT id, payload::VARCHAR, loaded_at FROM raw.{table}").fetchall()
    return {row[0]: row for row in rows}


def audit(warehouse, table: str) -> list[tuple]:
    """``meta.<table>_deleted``, oldest first; empty where it does not exist yet."""
    with read_lake(warehouse) as conn:
        found = conn.execute(
            "SELECT count(*) FROM duckdb_tables() WHERE schema_name = 'meta' AND table_name = ?",
            [f"{table}_deleted"],
        ).fetchone()[0]
        if not found:
            return []
        return conn.execute(
            f"SELECT id, payload::VARCHAR, loaded_at, deleted_at, run_id, reappeared_at, "
            f"reappeared_run_id FROM meta.{table}_deleted ORDER BY deleted_at, id"
        ).fetchall()


def assert_audited(before: dict[str, tuple], after: dict[str, tuple], rows: list[tuple], run_id):
    """``rows`` (an audit) are exactly the rows of ``before`` missing from ``after``, as they
    were stored, found gone by ``run_id`` no earlier than they were loaded, and still open."""
    gone = sorted(set(before) - set(after))
    assert gone, "the server deleted nothing: the test proves nothing"
    assert sorted(row[0] for row in rows) == gone
    for row in rows:
        assert row[:3] == before[row[0]]
        assert row[3] >= row[2] and row[4] == run_id and row[5:] == (None, None)


@pytest.mark.parametrize("mode", ["full", "incremental"])
def test_every_row_a_refresh_removes_is_audited_as_it_was_with_its_run(demo_server, tmp_path, mode):
    warehouse = make_warehouse(tmp_path)
    assert refresh(demo_server, tmp_path, warehouse, mode="full").success
    assert [audit(warehouse, name) for name in LISTS] == [[], [], []]
    before = {name: stored(warehouse, name) for name in LISTS}

    changes = demo_server.behaviour.evolve(1)  # deletes events, their transactions, and more
    assert changes["events_deleted"] and changes["transactions_deleted"]
    result = refresh(demo_server, tmp_path, warehouse, mode=mode)
    assert result.success
    (event,) = result.asset_materializations_for_node("raw_transactions")
    assert event.metadata["refresh_mode"].value == mode

    for name in ("events", "transactions"):
        assert_audited(before[name], stored(warehouse, name), audit(warehouse, name), result.run_id)
    deleted_events = {row[0] for row in audit(warehouse, "events")}
    with read_lake(warehouse) as conn:
        # A deleted event's transactions are audited with it, under its id.
        orphaned = conn.execute(
            "SELECT count(*) FROM meta.transactions_deleted WHERE event_id IN "
            "(SELECT unnest(?::VARCHAR[]))",
            [sorted(deleted_events)],
        ).fetchone()[0]
    assert orphaned > 0
    assert audit(warehouse, "event_groups") == []  # event groups only grew


def test_analysts_tables_exclude_deleted_rows(demo_server, tmp_path):
    warehouse = make_warehouse(tmp_path)
    assets = [*RAW_ASSETS, *core_assets()]
    assert refresh(demo_server, tmp_path, warehouse, assets=assets).success
    demo_server.dataset.delete_event(5)
    assert refresh(demo_server, tmp_path, warehouse, assets=assets).success
    with read_lake(warehouse) as conn:
        (event_id,) = conn.execute("SELECT id FROM meta.events_deleted").fetchone()
        left = conn.execute(
            "SELECT (SELECT count(*) FROM core.events WHERE event_id = $e), "
            "(SELECT count(*) FROM core.transactions WHERE event_id = $e), "
            "(SELECT count(*) FROM meta.transactions_deleted WHERE event_id = $e)",
            {"e": event_id},
        ).fetchone()
    assert left[:2] == (0, 0) and left[2] > 0


def test_a_reappearing_id_closes_its_audit_row_and_a_second_deletion_opens_another(
    demo_server, tmp_path
):
    warehouse = make_warehouse(tmp_path)
    assert refresh(demo_server, tmp_path, warehouse).success
    views = demo_server.dataset.views
    listed = {name: views[name].segments for name in ("events", "transactions")}

    demo_server.dataset.delete_event(5)
    deleting = refresh(demo_server, tmp_path, warehouse)
    assert deleting.success
    gone = {name: {row[0] for row in audit(warehouse, name)} for name in listed}
    assert len(gone["events"]) == 1 and gone["transactions"]

    for name, segments in listed.items():  # the server lists them again, same ids, same items
        views[name].segments = segments
    back = refresh(demo_server, tmp_path, warehouse)
    assert back.success
    for name in listed:
        assert gone[name] <= set(stored(warehouse, name))
        rows = audit(warehouse, name)
        assert {row[0] for row in rows} == gone[name]
        assert all(row[4] == deleting.run_id and row[6] == back.run_id for row in rows)
        assert all(row[5] is not None and row[5] >= row[3] for row in rows)

    demo_server.dataset.delete_event(5)
    again = refresh(demo_server, tmp_path, warehouse)
    assert again.success
    rows = audit(warehouse, "events")
    assert [(row[0], row[4], row[6]) for row in rows] == [
        (*gone["events"], deleting.run_id, back.run_id),
        (*gone["events"], again.run_id, None),
    ]


@pytest.mark.parametrize("mode", ["full", "incremental"])
def test_a_failed_run_leaves_the_audit_and_the_table_as_they_were(
    demo_server, tmp_path, monkeypatch, mode
):
    warehouse = make_warehouse(tmp_path)
    assert refresh(demo_server, tmp_path, warehouse, mode="full").success
    demo_server.dataset.delete_event(5)
    assert refresh(demo_server, tmp_path, warehouse, mode=mode).success
    audited = audit(warehouse, "transactions")
    assert audited
    before = stored(warehouse, "transactions")

    demo_server.behaviour.evolve(1)
    recorded: list[int] = []
    real_record = raw_load.record_deletions

    def record_then_fail(conn, endpoint, **kwargs):
        recorded.append(real_record(conn, endpoint, **kwargs))
        if endpoint.name == "transactions":
            raise RuntimeError("disk full (simulated) after the audit, before the swap")
        return recorded[-1]

    monkeypatch.setattr(raw_load, "record_deletions", record_then_fail)
    monkeypatch.setattr(incremental, "record_deletions", record_then_fail)
    result = refresh(demo_server, tmp_path, warehouse, mode=mode, raise_on_error=False)

    assert not result.success and recorded and recorded[-1] > 0
    assert audit(warehouse, "transactions") == audited
    assert stored(warehouse, "transactions") == before


@settings(max_examples=60, deadline=None)
@given(
    stored=st.dictionaries(st.integers(0, 12), st.integers(0, 3), max_size=12),
    events=st.sets(st.integers(0, 3)),
    listed=st.dictionaries(st.integers(0, 15), st.booleans()),
)
def test_a_merge_audits_its_events_stored_rows_the_list_lacks_and_closes_those_listed_again(
    stored, events, listed
):
    """A merge compares the re-fetched rows' digests with those of the rows it replaces (its
    events' rows, and re-fetched ids stored under another event): the audit records, as stored,
    exactly the rows of its events whose ids the list lacks, and closes the open audit rows of
    ids listed again (13-15: deleted before, stored nowhere)."""
    scope = [f"e-{e}" for e in sorted(events)]
    at, before = datetime(2026, 1, 2), datetime(2026, 1, 1)
    conn = duckdb.connect()
    conn.execute(
        "CREATE SCHEMA raw; CREATE SCHEMA meta; CREATE TABLE raw.transactions "
        "(id VARCHAR, event_id VARCHAR, payload JSON, loaded_at TIMESTAMP); CREATE TABLE "
        "meta.transactions_deleted (id VARCHAR, payload JSON, loaded_at TIMESTAMP, event_id "
        "VARCHAR, deleted_at TIMESTAMP, run_id VARCHAR, reappeared_at TIMESTAMP, "
        "reappeared_run_id VARCHAR)"
    )
    for t, e in stored.items():
        row = [f"t-{t}", f"e-{e}", f'{{"n": {t}}}', before]
        conn.execute("INSERT INTO raw.transactions VALUES (?, ?, ?, ?)", row)
    for t in (13, 14, 15):
        row = [f"t-{t}", "{}", before, "e-0", before, "old"]
        conn.execute(
            "INSERT INTO meta.transactions_deleted VALUES (?, ?, ?, ?, ?, ?, NULL, NULL)", row
        )
    conn.execute(  # the stored rows' digests are 0
        f"CREATE TEMP TABLE {raw_load.STAGED_DIGESTS} AS "
        "SELECT unnest($ids::VARCHAR[]) AS id, unnest($edited::BIGINT[]) AS digest",
        {"ids": [f"t-{t}" for t in listed], "edited": [int(e) for e in listed.values()]},
    )
    replaced = (
        f"SELECT id, 0 AS digest FROM raw.transactions WHERE {OF_EVENTS} "
        f"OR id IN (SELECT id FROM {raw_load.STAGED_DIGESTS})"
    )
    raw_load.compare_digests(conn, replaced, {"events": scope})
    count = record_deletions(
        conn, TRANSACTIONS, changes=raw_load.CHANGES, events=scope, run_id="r", at=at
    )

    gone = [
        (f"t-{t}", f'{{"n": {t}}}', before, f"e-{e}", at, "r", None, None)
        for t, e in stored.items()
        if f"e-{e}" in scope and t not in listed
    ]
    again = [
        (
            f"t-{t}",
            "{}",
            before,
            "e-0",
            before,
            "old",
            *((at, "r") if t in listed else (None, None)),
        )
        for t in (13, 14, 15)
    ]
    rows = "SELECT * REPLACE (payload::VARCHAR AS payload) FROM meta.transactions_deleted"
    assert count == len(gone)
    assert sorted(conn.execute(rows).fetchall()) == sorted(again + gone)
