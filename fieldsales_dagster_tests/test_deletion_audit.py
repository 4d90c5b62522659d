"""The deletion audit (docs/tables.md, "Deletions"), for real: the demo API deletes events and
transactions between runs, and every row a refresh removes from ``raw.*`` is in
``meta.<list>_deleted`` as it was stored, with the time it was found gone and the run that found
it; the analysts' tables hold none of them; an id that comes back is marked reappeared; a failed
run leaves the audit and the tables as they were."""

from __future__ import annotations

from datetime import UTC, datetime

import dagster as dg
import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fieldsales_dagster.client.endpoints import TRANSACTIONS
from fieldsales_dagster.loading import incremental, raw_load
from fieldsales_dagster.loading.deletions import record_deletions
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
    stored=st.lists(st.tuples(st.integers(0, 12), st.integers(0, 3)), max_size=12),
    events=st.sets(st.integers(0, 3)),
    kept=st.sets(st.integers(0, 15)),
)
def test_the_audit_of_ids_a_merge_knows_gone_records_what_finding_them_records(
    stored, events, kept
):
    """The merge read the re-fetched events' stored rows: given the ids of those the server no
    longer lists, the audit records the rows it records comparing every stored row with the
    list (an id stored under another event too, or listed again elsewhere, included)."""
    scope = [f"e-{e}" for e in sorted(events)]
    listed = "SELECT unnest($kept::VARCHAR[]) AS id"
    at = datetime(2026, 1, 2, tzinfo=UTC)

    def audited(**known) -> list[tuple]:
        conn = duckdb.connect()
        conn.execute(
            "CREATE SCHEMA raw; CREATE TABLE raw.transactions "
            "(id VARCHAR, event_id VARCHAR, payload JSON, loaded_at TIMESTAMP)"
        )
        for i, (transaction, event) in enumerate(stored):
            row = [f"t-{transaction}", f"e-{event}", f'{{"n": {i}}}']
            conn.execute("INSERT INTO raw.transactions VALUES (?, ?, ?, '2026-01-01')", row)
        conn.execute(f"CREATE TEMP TABLE kept AS {listed}", {"kept": [f"t-{k}" for k in kept]})
        count = record_deletions(
            conn, TRANSACTIONS, kept="FROM kept", events=scope, run_id="r", at=at, **known
        )
        rows = conn.execute("FROM meta.transactions_deleted ORDER BY ALL").fetchall()
        return [count, *rows]

    of_events = {f"t-{t}" for t, e in stored if f"e-{e}" in scope}
    gone = of_events - {f"t-{k}" for k in kept}
    assert audited(gone=gone) == audited()
