"""Refresh modes, for real: the demo API evolves between runs, the second run goes incremental,
and every raw.* and core.* table must equal a fresh full load of the evolved data."""

from __future__ import annotations

import collections
import dataclasses
import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import duckdb
import pytest

from fieldsales_dagster.assets import follow
from fieldsales_dagster.loading import incremental
from fieldsales_dagster.loading.refresh_mode import (
    IncrementalRefreshError,
    PreviousLoad,
    choose_mode,
)
from fieldsales_dagster.warehouse.warehouse import FieldSalesWarehouse, table_exists
from fieldsales_dagster_tests.conftest import attach_again, make_api, make_warehouse, read_lake
from fieldsales_dagster_tests.project import core_assets, materialize, raw_assets
from fieldsales_dagster_tests.test_demo_api import TX, get

RAW_ASSETS = raw_assets()
ALL_ASSETS = [*RAW_ASSETS, *core_assets()]
NOW = datetime(2026, 6, 1, tzinfo=UTC)
#: The row of ``meta.refresh_state`` recording raw.transactions' last load.
TRANSACTIONS_STATE = "table_name = 'raw.transactions'"


def _warehouse(tmp_path, name: str, **settings) -> FieldSalesWarehouse:
    return make_warehouse(tmp_path, Path(name).stem, **settings)


def _materialize(server, tmp_path, warehouse, assets=RAW_ASSETS, mode=None, **kwargs):
    run_config = {"ops": {"raw_transactions": {"config": {"refresh_mode": mode}}}} if mode else None
    return materialize(
        assets,
        resources={"fieldsales_api": make_api(server, tmp_path), "warehouse": warehouse},
        run_config=run_config,
        **kwargs,
    )


def _refresh_metadata(result) -> dict[str, object]:
    (event,) = result.asset_materializations_for_node("raw_transactions")
    return {key: value.value for key, value in event.metadata.items()}


def _tables(conn: duckdb.DuckDBPyConnection, database: str) -> list[tuple[str, str]]:
    return conn.execute(
        "SELECT schema_name, table_name FROM duckdb_tables() WHERE database_name = ? "
        "AND schema_name IN ('raw', 'core') AND table_name NOT LIKE '\\_%' ESCAPE '\\' "
        "ORDER BY ALL",
        [database],
    ).fetchall()


def assert_same_tables(a: FieldSalesWarehouse, b: FieldSalesWarehouse) -> None:
    """Every raw.* and core.* table of lake a equals b's, row for row, ``loaded_at`` aside."""
    with read_lake(a) as conn:
        conn.execute(dataclasses.replace(b.lake, alias="other").attach_sql(read_only=True))
        here = conn.execute("SELECT current_database()").fetchone()[0]
        tables = _tables(conn, here)
        assert tables == _tables(conn, "other")
        assert ("raw", "transactions") in tables
        for schema, table in tables:
            columns = [
                row[0]
                for row in conn.execute(
                    "SELECT column_name FROM duckdb_columns() WHERE database_name = ? "
                    "AND schema_name = ? AND table_name = ? AND column_name <> 'loaded_at' "
                    "ORDER BY column_index",
                    [here, schema, table],
                ).fetchall()
            ]
            cols = ", ".join(f'"{c}"::VARCHAR' for c in columns)
            a, b = f'{here}."{schema}"."{table}"', f'other."{schema}"."{table}"'
            only_a, only_b, rows = conn.execute(
                f"SELECT (SELECT count(*) FROM (SELECT {cols} FROM {a} EXCEPT ALL "
                f"SELECT {cols} FROM {b})), (SELECT count(*) FROM (SELECT {cols} FROM {b} "
                f"EXCEPT ALL SELECT {cols} FROM {a})), (SELECT count(*) FROM {a})"
            ).fetchone()
            assert (only_a, only_b) == (0, 0), f"{schema}.{table}: {only_a} rows only in the "
            f"incremental load, {only_b} only in the full load (of {rows})"


def _snapshot(warehouse: FieldSalesWarehouse) -> tuple[list, list]:
    with read_lake(warehouse) as conn:
        rows = conn.execute(
            "SELECT id, event_id, payload::VARCHAR, loaded_at FROM raw.transactions ORDER BY id"
        ).fetchall()
        state = conn.execute(
            f"SELECT * FROM meta.refresh_state WHERE {TRANSACTIONS_STATE}"
        ).fetchall()
    return rows, state


def _first_load(server, tmp_path, assets) -> FieldSalesWarehouse:
    warehouse = _warehouse(tmp_path, "incremental.duckdb")
    first = _materialize(server, tmp_path, warehouse, assets=assets)
    assert first.success
    assert _refresh_metadata(first)["refresh_mode"] == "full"
    return warehouse


@pytest.fixture
def loaded(demo_server, tmp_path):
    """A warehouse after a first (full) refresh of the raw assets."""
    return _first_load(demo_server, tmp_path, RAW_ASSETS)


@pytest.fixture
def loaded_all(demo_server, tmp_path):
    """A warehouse after a first (full) refresh of every raw and core asset."""
    return _first_load(demo_server, tmp_path, ALL_ASSETS)


def _full_load_of_current_data(server, tmp_path, assets=RAW_ASSETS) -> FieldSalesWarehouse:
    fresh = _warehouse(tmp_path, "full.duckdb")
    assert _materialize(server, tmp_path, fresh, assets=assets, mode="full").success
    return fresh


def test_incremental_refresh_after_evolve_equals_a_fresh_full_load(
    demo_server, tmp_path, loaded_all
):
    loaded = loaded_all
    changes = demo_server.behaviour.evolve(1)
    assert min(changes.values()) > 0  # every kind of change happened

    second = _materialize(demo_server, tmp_path, loaded, assets=ALL_ASSETS)

    assert second.success
    meta = _refresh_metadata(second)
    assert meta["refresh_mode"] == "incremental"
    assert meta["events_new"] == changes["events_added"]
    assert meta["events_changed"] == changes["events_evolved"]
    assert meta["events_removed"] == changes["events_deleted"]
    assert meta["events_refetched"] == changes["events_added"] + changes["events_evolved"]
    assert meta["transactions_added"] == changes["transactions_added"]
    assert meta["transactions_changed"] == changes["transactions_changed"]
    assert meta["transactions_removed"] == changes["transactions_deleted"]
    assert meta["dagster/row_count"] == demo_server.dataset.count("transactions")
    assert meta["bytes_fetched"] > 0
    # The core tables parse only the transactions this load wrote: those of re-fetched events.
    (core,) = second.asset_materializations_for_node("core_transactions")
    parsed = core.metadata["fieldsales/decode_payloads_parsed"].value
    assert core.metadata["fieldsales/decode"].value.endswith(
        f"incremental ({parsed:,} payloads parsed)"
    )
    assert (
        meta["transactions_added"] + meta["transactions_changed"]
        <= parsed
        < meta["dagster/row_count"]
    )
    # core.custom_report_results follows: only the changed transactions' rows are replaced.
    (results,) = second.asset_materializations_for_node("core_custom_report_results")
    assert results.metadata["fieldsales/build"].value.startswith("incremental: ")
    assert core.metadata["fieldsales/build"].value.startswith("incremental: ")
    fresh = _full_load_of_current_data(demo_server, tmp_path, ALL_ASSETS)
    with read_lake(loaded) as conn:
        core = conn.execute(
            "SELECT count(*) FROM duckdb_tables() WHERE schema_name = 'core'"
        ).fetchone()[0]
    assert core == len(core_assets())
    assert_same_tables(loaded, fresh)


def test_incremental_refresh_fetches_only_the_changed_events_transactions(
    demo_server, tmp_path, loaded
):
    demo_server.behaviour.evolve(1)
    demo_server.clear_requests()

    assert _materialize(demo_server, tmp_path, loaded, assets=RAW_ASSETS).success

    queries = [r.query for r in demo_server.requests if r.path.endswith("/transaction/all")]
    unfiltered = [q for q in queries if "eventId" not in q]
    assert [q["limit"] for q in unfiltered] == ["1"]  # the global count, nothing else
    refetched = {q["eventId"] for q in queries if "eventId" in q}
    assert len(refetched) == 4  # 3 evolved events and 1 new one (1200 transactions, 30 events)


def test_second_generation_is_incremental_again_and_still_equal(demo_server, tmp_path, loaded):
    for generation in (1, 2):
        demo_server.behaviour.evolve(generation)
        result = _materialize(demo_server, tmp_path, loaded)
        assert _refresh_metadata(result)["refresh_mode"] == "incremental"
    fresh = _full_load_of_current_data(demo_server, tmp_path)
    assert_same_tables(loaded, fresh)


def test_a_lake_of_an_earlier_release_refreshes_incrementally_on(demo_server, tmp_path, loaded):
    """It recorded when each list was last loaded whole in a table of its own (meta.list_checks),
    which is dropped: the run's load of raw.events records it again for raw.transactions."""
    with loaded.get_connection() as conn:
        listed = f"FROM meta.refresh_state WHERE NOT {TRANSACTIONS_STATE}"
        conn.execute(
            "CREATE TABLE IF NOT EXISTS meta.list_checks AS "
            f"SELECT table_name, last_full_at AS checked_at {listed}"
        )
        conn.execute(f"DELETE {listed}")
    attach_again(loaded)
    demo_server.behaviour.evolve(1)
    result = _materialize(demo_server, tmp_path, loaded)
    assert _refresh_metadata(result)["refresh_mode"] == "incremental"
    with read_lake(loaded) as conn:
        assert not table_exists(conn, "meta.list_checks")
    assert_same_tables(loaded, _full_load_of_current_data(demo_server, tmp_path))


#: The core tables that follow their decoded table's changes (``follows:`` in their YAML).
FOLLOWING = (
    "core_transactions",
    "core_custom_report_results",
    "core_events",
    "core_event_status_history",
    "core_event_state_durations",
)


def test_core_tables_follow_two_incremental_generations_and_still_equal(
    demo_server, tmp_path, loaded_all
):
    for generation in (1, 2):
        demo_server.behaviour.evolve(generation)
        result = _materialize(demo_server, tmp_path, loaded_all, assets=ALL_ASSETS)
        for node in FOLLOWING:
            (event,) = result.asset_materializations_for_node(node)
            assert event.metadata["fieldsales/build"].value.startswith("incremental: "), (
                node,
                event.metadata["fieldsales/build"].value,
            )
    fresh = _full_load_of_current_data(demo_server, tmp_path, ALL_ASSETS)
    assert_same_tables(loaded_all, fresh)


def test_a_lake_of_an_earlier_release_builds_its_following_tables_whole_once_then_follows(
    demo_server, tmp_path, loaded_all
):
    """Their states had a table of their own (meta.core_follow_state), and the rows each
    reflected one of its own (meta.core_events_inputs, ...): they are dropped, none of their
    states is read, and each following table is built whole once."""
    states = f"FROM meta.lake_builds WHERE check_name = '{follow.FOLLOWED}'"
    with loaded_all.get_connection() as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS meta.core_follow_state AS SELECT table_name, "
            f"fingerprint AS query_fingerprint, result AS inputs_fingerprint {states}; "
            "CREATE TABLE meta.core_events_inputs AS SELECT id, loaded_at FROM raw.events"
        )
        conn.execute(f"DELETE {states}")
    attach_again(loaded_all)
    for generation, how in ((1, "full: no record of a previous build"), (2, "incremental: ")):
        demo_server.behaviour.evolve(generation)
        result = _materialize(demo_server, tmp_path, loaded_all, assets=ALL_ASSETS)
        builds = {
            node: event.metadata["fieldsales/build"].value
            for node in FOLLOWING
            for event in result.asset_materializations_for_node(node)
        }
        assert len(builds) == len(FOLLOWING) and all(b.startswith(how) for b in builds.values()), (
            builds
        )
    with read_lake(loaded_all) as conn:
        assert not table_exists(conn, "meta.core_follow_state")
        assert not table_exists(conn, "meta.core_events_inputs")


def test_durations_built_before_the_history_they_read_follows_are_whole_until_it_does(
    demo_server, tmp_path, loaded_all
):
    demo_server.behaviour.evolve(1)
    alone = ["raw_events", "raw_transactions", "core_event_state_durations"]
    first = _materialize(demo_server, tmp_path, loaded_all, assets=ALL_ASSETS, selection=alone)
    (event,) = first.asset_materializations_for_node("core_event_state_durations")
    assert event.metadata["fieldsales/build"].value == (
        "full: a table it reads does not reflect temp.events_decoded yet "
        "(core.event_status_history)"
    )
    # The history now follows the events; the durations built from its old rows must too.
    assert _materialize(demo_server, tmp_path, loaded_all, assets=ALL_ASSETS).success
    fresh = _full_load_of_current_data(demo_server, tmp_path, ALL_ASSETS)
    assert_same_tables(loaded_all, fresh)


def test_failure_mid_core_update_leaves_the_core_tables_and_their_state_as_they_were(
    demo_server, tmp_path, loaded_all, monkeypatch
):
    def core_rows() -> list:
        with read_lake(loaded_all) as conn:
            return [
                conn.execute(f"SELECT * FROM {table} ORDER BY ALL").fetchall()
                for table in (
                    "core.custom_report_results",
                    "meta.lake_builds WHERE table_name = 'core.custom_report_results'",
                )
            ]

    before = core_rows()
    demo_server.behaviour.evolve(1)

    def fail(conn, table, *args):
        raise duckdb.IOException("disk full (simulated) after the rows were replaced")

    monkeypatch.setattr(follow, "write_state", fail)
    results_only = ["raw_events", "raw_transactions", "raw_event_groups"]
    results_only += ["core_custom_report_fields", "core_custom_report_results"]
    failed = _materialize(
        demo_server,
        tmp_path,
        loaded_all,
        assets=ALL_ASSETS,
        selection=results_only,
        raise_on_error=False,
    )

    assert not failed.success
    (failure,) = [e for e in failed.all_events if e.is_step_failure]
    assert "Updating core.custom_report_results failed" in str(failure.event_specific_data.error)
    assert core_rows() == before
    monkeypatch.undo()
    assert _materialize(demo_server, tmp_path, loaded_all, assets=ALL_ASSETS).success
    fresh = _full_load_of_current_data(demo_server, tmp_path, ALL_ASSETS)
    assert_same_tables(loaded_all, fresh)


def test_incremental_refresh_with_raw_redaction_equals_a_fresh_full_load(demo_server, tmp_path):
    warehouse = _warehouse(tmp_path, "incremental.duckdb", redact_pii_in_raw=True)
    assert _materialize(demo_server, tmp_path, warehouse).success
    changes = demo_server.behaviour.evolve(1)

    meta = _refresh_metadata(_materialize(demo_server, tmp_path, warehouse))

    assert meta["refresh_mode"] == "incremental"
    assert meta["transactions_changed"] == changes["transactions_changed"]
    assert meta["transactions_added"] == changes["transactions_added"]
    fresh = _warehouse(tmp_path, "full.duckdb", redact_pii_in_raw=True)
    assert _materialize(demo_server, tmp_path, fresh, mode="full").success
    assert_same_tables(warehouse, fresh)


def test_server_ignoring_event_id_falls_back_to_full_with_a_warning(demo_server, tmp_path, loaded):
    demo_server.behaviour.evolve(1)
    demo_server.behaviour.ignore_event_filter = True

    instance = dg.DagsterInstance.ephemeral()

    result = _materialize(demo_server, tmp_path, loaded, mode="incremental", instance=instance)

    assert result.success
    meta = _refresh_metadata(result)
    assert meta["refresh_mode"] == "full"
    assert "ignores the eventId filter" in meta["refresh_reason"]
    warnings = [
        entry.user_message
        for entry in instance.all_logs(result.run_id)
        if entry.level == logging.WARNING
    ]
    assert any("ignores the eventId filter" in message for message in warnings)
    demo_server.behaviour.ignore_event_filter = False
    fresh = _full_load_of_current_data(demo_server, tmp_path)
    assert_same_tables(loaded, fresh)


def test_numeric_event_ids_stay_incremental_and_equal_a_full_refresh(tmp_path):
    # Events' _id are JSON numbers (1002); transactions carry eventId as 1002 or "1002".
    from fieldsales_dagster.demo_api import DemoConfig, DemoServer

    config = DemoConfig(transactions=400, events=20, seed=4, numeric_event_ids=True)
    with DemoServer(config, host="127.0.0.1", port=0) as server:
        warehouse = _first_load(server, tmp_path, ALL_ASSETS)
        server.behaviour.evolve(1)

        second = _materialize(server, tmp_path, warehouse, assets=ALL_ASSETS)

        assert second.success
        meta = _refresh_metadata(second)
        assert meta["refresh_mode"] == "incremental", meta["refresh_reason"]
        assert meta["events_refetched"] > 0
        fresh = _full_load_of_current_data(server, tmp_path, ALL_ASSETS)
    assert_same_tables(warehouse, fresh)
    with read_lake(warehouse) as conn:
        # The ids are the numbers' text, and every transaction finds its event.
        assert conn.execute("SELECT min(id) FROM raw.events").fetchone() == ("1000",)
        assert conn.execute(
            "SELECT count(*) FROM core.transactions WHERE event_id NOT IN "
            "(SELECT event_id FROM core.events)"
        ).fetchone() == (len([i for i in range(400) if server.dataset.is_orphan(i)]),)


def test_global_count_disagreeing_falls_back_to_full_in_auto(demo_server, tmp_path, loaded):
    # A settled event's transaction disappears: no event changed, so only the count can tell.
    demo_server.behaviour.mutate("transactions", delete=1, at=0)

    result = _materialize(demo_server, tmp_path, loaded)

    meta = _refresh_metadata(result)
    assert meta["refresh_mode"] == "full"
    assert "server counts" in meta["refresh_reason"]
    assert meta["dagster/row_count"] == demo_server.dataset.count("transactions")
    fresh = _full_load_of_current_data(demo_server, tmp_path)
    assert_same_tables(loaded, fresh)


def test_global_count_disagreeing_fails_incremental_mode_and_keeps_tables(
    demo_server, tmp_path, loaded
):
    before = _snapshot(loaded)
    demo_server.behaviour.mutate("transactions", delete=1, at=0)

    result = _materialize(
        demo_server, tmp_path, loaded, assets=RAW_ASSETS, mode="incremental", raise_on_error=False
    )

    assert not result.success
    failure = next(e for e in result.all_events if e.is_step_failure)
    error = failure.step_failure_data.error
    message = error.cause.message if error.cause else error.message
    assert "server counts" in message and "refresh_mode=full" in message
    assert _snapshot(loaded) == before


def test_deleted_event_drops_its_transactions(demo_server, tmp_path, loaded):
    gone = demo_server.dataset.item("events", 5)["_id"]
    removed = demo_server.dataset.delete_event(5)
    assert removed > 0

    result = _materialize(demo_server, tmp_path, loaded)

    meta = _refresh_metadata(result)
    assert meta["refresh_mode"] == "incremental"
    assert (meta["events_removed"], meta["transactions_removed"]) == (1, removed)
    with read_lake(loaded) as conn:
        left = conn.execute(
            "SELECT count(*) FROM raw.transactions WHERE event_id = ?", [gone]
        ).fetchone()[0]
    assert left == 0
    fresh = _full_load_of_current_data(demo_server, tmp_path)
    assert_same_tables(loaded, fresh)


def test_failure_mid_merge_leaves_previous_table_and_state_untouched(
    demo_server, tmp_path, loaded, monkeypatch
):
    before = _snapshot(loaded)
    demo_server.behaviour.evolve(1)
    deleted = []
    real_write = incremental.write_rows

    def write(conn, *args, **kwargs):
        deleted.append(real_write(conn, *args, **kwargs))
        return deleted[-1]

    def fail_to_insert(phase):
        if phase == "merge":  # between the rows' write and their digests'
            raise RuntimeError("disk full (simulated) between the rows and their digests")

    monkeypatch.setattr(incremental, "write_rows", write)
    monkeypatch.setattr(incremental, "pause_at", fail_to_insert)

    result = _materialize(demo_server, tmp_path, loaded, assets=RAW_ASSETS, raise_on_error=False)

    assert not result.success and deleted[0]
    assert _snapshot(loaded) == before
    with read_lake(loaded) as conn:
        stages = conn.execute(
            "SELECT count(*) FROM duckdb_tables() WHERE table_name LIKE '\\_stage%' ESCAPE '\\'"
        ).fetchone()[0]
    assert stages == 0


def test_a_merge_writes_only_the_refetched_rows_that_changed(demo_server, tmp_path, loaded):
    """A transaction re-fetched as it is stored keeps its row, ``loaded_at`` and all, as a list
    load's does: the tables built on it follow only the rows that changed."""
    before = {row[0]: row[3] for row in _snapshot(loaded)[0]}
    demo_server.dataset.advance_event(0)  # every other transaction of its changes

    meta = _refresh_metadata(_materialize(demo_server, tmp_path, loaded, assets=RAW_ASSETS))

    assert (meta["refresh_mode"], meta["events_changed"]) == ("incremental", 1)
    assert meta["transactions_changed"] > 0
    after = {row[0]: row[3] for row in _snapshot(loaded)[0]}
    rewritten = [i for i, loaded_at in after.items() if before.get(i) != loaded_at]
    written = meta["transactions_added"] + meta["transactions_changed"]
    assert len(rewritten) == written, f"{len(rewritten)} rows rewritten, {written} changed"


def test_auto_runs_full_when_the_last_full_refresh_is_too_old(demo_server, tmp_path, loaded):
    with loaded.get_connection() as conn:
        conn.execute(
            "UPDATE meta.refresh_state SET last_full_at = last_full_at - INTERVAL 8 DAY "
            f"WHERE {TRANSACTIONS_STATE}"
        )

    result = _materialize(demo_server, tmp_path, loaded, assets=RAW_ASSETS)

    meta = _refresh_metadata(result)
    assert meta["refresh_mode"] == "full"
    assert "full_refresh_every_days=7" in meta["refresh_reason"]
    with read_lake(loaded) as conn:
        last_full = conn.execute(
            f"SELECT last_full_at FROM meta.refresh_state WHERE {TRANSACTIONS_STATE}"
        ).fetchone()[0]
    assert datetime.now(UTC).replace(tzinfo=None) - last_full < timedelta(hours=1)


def test_run_config_full_forces_a_full_refresh(demo_server, tmp_path, loaded):
    result = _materialize(demo_server, tmp_path, loaded, assets=RAW_ASSETS, mode="full")

    meta = _refresh_metadata(result)
    assert (meta["refresh_mode"], meta["refresh_reason"]) == (
        "full",
        "refresh_mode=full was asked for",
    )


def test_warehouse_refresh_mode_full_forces_a_full_refresh(demo_server, tmp_path, loaded):
    forced = _warehouse(tmp_path, "incremental.duckdb", refresh_mode="full")

    result = _materialize(demo_server, tmp_path, forced, assets=RAW_ASSETS)

    assert _refresh_metadata(result)["refresh_mode"] == "full"


def test_lookback_refetches_events_whose_last_state_change_is_recent(demo_server, tmp_path, loaded):
    # The demo's history dates lie in 2024-2025: a lookback of 10 years covers every event.
    wide = _warehouse(tmp_path, "incremental.duckdb", lookback_days=3650)

    result = _materialize(demo_server, tmp_path, wide, assets=RAW_ASSETS, mode="incremental")

    meta = _refresh_metadata(result)
    events = demo_server.dataset.count("events")
    assert meta["refresh_mode"] == "incremental"
    assert (meta["events_refetched"], meta["events_recent"]) == (events, events)
    assert (meta["transactions_added"], meta["transactions_changed"]) == (0, 0)
    assert meta["transactions_removed"] == 0


def test_events_without_history_are_dated_by_their_state_timestamps(tmp_path):
    # Half the events come with an empty eventStateHistory; their eventStateTimestamps still date
    # their changes (2024-2025): the second run re-fetches only the new and the changed events.
    from fieldsales_dagster.demo_api import DemoConfig, DemoServer
    from fieldsales_dagster.demo_api.data import Shape

    config = DemoConfig(transactions=1200, seed=3, shape=Shape(undated_events=50))
    with DemoServer(config, host="127.0.0.1", port=0) as server:
        warehouse = _first_load(server, tmp_path, RAW_ASSETS)
        changes = server.behaviour.evolve(1)
        second = _materialize(server, tmp_path, warehouse, mode="incremental")

    meta = _refresh_metadata(second)
    assert (meta["events_new"], meta["events_changed"], meta["events_recent"]) == (
        changes["events_added"],
        changes["events_evolved"],
        0,
    )


def test_an_events_transaction_count_misses_an_edit_in_place(demo_server):
    """Why no cheap check (the list's count, limit=1) can spare re-fetching a recent event's
    transactions: an event whose transactions are edited in place lists as many as before."""
    events = [demo_server.dataset.event_id(e) for e in range(demo_server.dataset.n_events)]

    def listed(event_id: str) -> tuple[int, list]:
        count = get(demo_server, TX, eventId=event_id, limit=1).json()["count"]  # the cheap check
        return count, get(demo_server, TX, eventId=event_id, limit=1000).json()["transactions"]

    before = {e: listed(e) for e in events}
    demo_server.behaviour.evolve(1)
    after = {e: listed(e) for e in events}

    edited = [e for e in events if before[e][0] == after[e][0] and before[e][1] != after[e][1]]
    assert edited


def test_auto_runs_full_when_most_events_need_refetching(demo_server, tmp_path, loaded):
    wide = _warehouse(tmp_path, "incremental.duckdb", lookback_days=3650)

    result = _materialize(demo_server, tmp_path, wide)

    meta = _refresh_metadata(result)
    assert meta["refresh_mode"] == "full"
    assert "paging the whole list is cheaper" in meta["refresh_reason"]


def test_transactions_alone_without_fresh_events_run_full_in_auto(demo_server, tmp_path, loaded):
    result = _materialize(demo_server, tmp_path, loaded, selection=["raw_transactions"])

    meta = _refresh_metadata(result)
    assert meta["refresh_mode"] == "full"
    assert "raw.events was not reloaded" in meta["refresh_reason"]


def test_every_raw_asset_reports_its_refresh_mode_and_bytes(demo_server, tmp_path, loaded):
    result = _materialize(demo_server, tmp_path, loaded, assets=RAW_ASSETS)

    for key in ("raw_events", "raw_event_groups", "raw_transactions"):
        (event,) = result.asset_materializations_for_node(key)
        assert {"refresh_mode", "refresh_reason", "bytes_fetched"} <= set(event.metadata)


def test_refresh_mode_rejects_unknown_values():
    with pytest.raises(ValueError, match="auto, full, incremental"):
        FieldSalesWarehouse(refresh_mode="sometimes")


# --- choose_mode, the pure decision ----------------------------------------------------------


def _previous(**changes) -> PreviousLoad:
    settings = {
        "last_full_at": NOW - timedelta(days=2),
        "rows_recorded": 100,
        "rows_stored": 100,
        "events_loaded_at_recorded": NOW - timedelta(days=1),
        "events_loaded_at_now": NOW - timedelta(minutes=5),
    }
    return PreviousLoad(**{**settings, **changes})


def _choose(requested, previous):
    return choose_mode(requested, previous, now=NOW, full_refresh_every_days=7)


def test_choose_mode_auto_is_incremental_after_a_recent_full_load():
    assert _choose("auto", _previous()).mode == "incremental"


def test_choose_mode_first_load_is_full_even_when_incremental_is_asked():
    assert _choose("incremental", None).mode == "full"


def test_choose_mode_auto_is_full_at_full_refresh_every_days():
    decision = _choose("auto", _previous(last_full_at=NOW - timedelta(days=7)))
    assert decision.mode == "full" and "7.0 days ago" in decision.reason


def test_choose_mode_incremental_ignores_the_full_refresh_age():
    assert _choose("incremental", _previous(last_full_at=NOW - timedelta(days=70))).mode == (
        "incremental"
    )


def test_choose_mode_full_when_the_table_was_changed_outside_the_loader():
    decision = _choose("auto", _previous(rows_stored=99))
    assert decision.mode == "full" and "changed outside" in decision.reason


def test_choose_mode_incremental_with_stale_events_fails_clearly():
    stale = _previous(events_loaded_at_now=NOW - timedelta(days=1))
    assert _choose("auto", stale).mode == "full"
    with pytest.raises(IncrementalRefreshError, match="Materialize raw_events"):
        _choose("incremental", stale)


def test_a_changed_events_transactions_that_one_page_holds_are_fetched_in_one_request(
    demo_server, tmp_path, loaded
):
    """Issue 48: each re-fetched event's list (40-odd transactions, a page of 100, its count
    equal to its items) is one answer, a set the server held at one instant: it is not read
    again. The run's ``requests`` are those lists, the global count and the whole lists."""
    demo_server.behaviour.evolve(1)
    demo_server.clear_requests()

    meta = _refresh_metadata(_materialize(demo_server, tmp_path, loaded, assets=RAW_ASSETS))

    queries = [r.query for r in demo_server.requests if r.path.endswith("/transaction/all")]
    per_event = collections.Counter(q["eventId"] for q in queries if "eventId" in q)
    assert len(per_event) == meta["events_refetched"] == 4
    assert sorted(per_event.values()) == [1, 1, 1, 1]
    assert meta["requests"] == len(queries) == 4 + 1
