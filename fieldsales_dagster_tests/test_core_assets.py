"""How core assets build, swap and describe their tables."""

from __future__ import annotations

import json
import re

import dagster as dg
import duckdb

from fieldsales_dagster.assets import decode, follow
from fieldsales_dagster.assets.follow import fingerprint
from fieldsales_dagster.assets.metadata import PREVIEW_CELL_CHARS, markdown_preview
from fieldsales_dagster.assets.tables import derived_tables
from fieldsales_dagster.warehouse.rows import one_row
from fieldsales_dagster.warehouse.warehouse import replace_table
from fieldsales_dagster_tests import core_payloads as p
from fieldsales_dagster_tests.conftest import attach_again, lake_at
from fieldsales_dagster_tests.project import core_assets, materialize


def test_every_core_table_has_an_asset_in_group_core_following_its_raw_parents():
    specs = {spec.key.to_user_string(): spec for a in core_assets() for spec in a.specs}
    assert sorted(specs) == sorted(t.asset_name for t in derived_tables() if t.schema == "core")
    for spec in specs.values():
        assert spec.group_name == "core"
        assert spec.kinds == {"ducklake"}
        assert spec.description
        assert spec.automation_condition == dg.AutomationCondition.eager()
    assert all(a.op.pool == f"fieldsales_duckdb_{a.key.path[-1]}" for a in core_assets())
    results_deps = {d.asset_key.to_user_string() for d in specs["core_custom_report_results"].deps}
    assert results_deps == {"raw_transactions", "raw_events", "core_custom_report_fields"}


def test_materialization_reports_schema_row_count_and_preview(tmp_path):
    database = tmp_path / "t.duckdb"
    result = p.materialize_core(database, transactions=[p.transaction("t-1")])
    (materialization,) = [
        m
        for m in result.get_asset_materialization_events()
        if m.asset_key.path == ["core_transactions"]
    ]
    metadata = materialization.materialization.metadata
    assert metadata["dagster/row_count"].value == 1
    columns = {c.name: c.type for c in metadata["dagster/column_schema"].value.columns}
    assert columns["invoice_ids"] == "VARCHAR[]"
    assert columns["total_value"] == "DOUBLE"
    # A markdown table: the header row, then the row.
    assert re.search(r"^\|\s*transaction_id\s*\|", metadata["preview"].value, re.M)
    assert re.search(r"^\|\s*t-1\s*\|", metadata["preview"].value, re.M)
    assert metadata["dagster/table_name"].value == "fieldsales.core.transactions"


def test_preview_cells_stay_in_their_column_and_are_shortened():
    with duckdb.connect() as conn:
        conn.execute("CREATE TABLE t (id VARCHAR, note VARCHAR, amount DOUBLE, secret VARCHAR)")
        conn.execute(
            "INSERT INTO t VALUES ('a|b', 'line one' || chr(10) || 'line two', NULL, 's'), "
            "('c', repeat('x', 60), 1.5, 's')"
        )
        preview = markdown_preview(conn, "main.t", hidden=("secret",))
    assert preview.splitlines() == [
        "| id | note | amount |",
        "| --- | --- | --- |",
        "| a\\|b | line one line two |  |",
        f"| c | {'x' * (PREVIEW_CELL_CHARS - 1)}… | 1.5 |",
    ]


def test_failing_query_leaves_the_previous_table_intact(tmp_path):
    database = tmp_path / "t.duckdb"
    p.materialize_core(database, transactions=[p.transaction("t-old")])
    with lake_at(database).get_connection() as conn:
        # A raw table without its payload column makes the core query fail to bind.
        conn.execute(
            "CREATE OR REPLACE TABLE raw.transactions "
            "(id VARCHAR, event_id VARCHAR, loaded_at TIMESTAMP)"
        )
        conn.execute("INSERT INTO raw.transactions VALUES ('t-new', 'e1', now()::TIMESTAMP)")

    result = materialize(
        [*p.RAW_STAND_INS, *core_assets()],
        selection=["core_transactions"],
        resources={"warehouse": lake_at(database)},
        raise_on_error=False,
    )

    assert not result.success
    (failure,) = [e for e in result.all_events if e.is_step_failure]
    assert "Building core.transactions failed" in str(failure.event_specific_data.error)
    assert p.query(database, "SELECT transaction_id FROM core.transactions") == [("t-old",)]
    assert p.query(
        database,
        "SELECT count(*) FROM information_schema.tables WHERE table_name LIKE '%staging%'",
    ) == [(0,)]


def _materialize_results_only(database) -> dg.ExecuteInProcessResult:
    return materialize(
        [*p.RAW_STAND_INS, *core_assets()],
        selection=["core_custom_report_results"],
        resources={"warehouse": lake_at(database)},
    )


def _report_transactions(database) -> list[tuple]:
    return p.query(
        database,
        "SELECT DISTINCT transaction_id FROM core.custom_report_results "
        "WHERE source = 'transaction' ORDER BY 1",
    )


REPORT_CONFIG = p.config("cfg-1", [p.field("f-1", "number")])


def _reported(transaction_id: str, value: int) -> dict[str, object]:
    """A transaction whose custom report answers field f-1 with ``value``."""
    return p.transaction(
        transaction_id, report_config=REPORT_CONFIG, report_results=p.results(**{"f-1": value})
    )


def test_results_alone_read_raw_transactions_changed_since_core_transactions(tmp_path):
    database = tmp_path / "t.duckdb"
    p.materialize_core(
        database,
        transactions=[_reported("t-old", 1)],
    )
    p.write_raw_tables(
        database,
        transactions=[_reported("t-new", 2)],
    )

    assert _materialize_results_only(database).success
    assert _report_transactions(database) == [("t-new",)]


def test_results_alone_decode_raw_transactions_when_no_decode_is_stored(tmp_path):
    database = tmp_path / "t.duckdb"
    p.materialize_core(
        database,
        transactions=[_reported("t-1", 1)],
    )
    with lake_at(database).get_connection() as conn:
        conn.execute("DROP TABLE meta.transactions_decoded")

    assert _materialize_results_only(database).success
    assert _report_transactions(database) == [("t-1",)]


def test_a_decode_stored_with_another_layout_is_parsed_again_whole(tmp_path):
    # A decode written by an earlier release (here: one column fewer, and no record of the code
    # its tables were built with) is rebuilt, not read as current because its rows match
    # raw.transactions.
    database = tmp_path / "t.duckdb"
    p.materialize_core(database, transactions=[_reported(f"t-{i}", i) for i in range(3)])
    with lake_at(database).get_connection() as conn:
        conn.execute("ALTER TABLE meta.transactions_decoded DROP COLUMN report_results")
        conn.execute("ALTER TABLE meta.lake_builds DROP COLUMN fingerprint")
    attach_again(lake_at(database))  # as the next release's process finds it

    result = _materialize_results_only(database)

    assert result.success
    metadata = _core_metadata(result, "core_custom_report_results")
    assert metadata["fieldsales/decode"] == (
        "meta.transactions_decoded: full (3 payloads parsed); "
        "temp.events_decoded: current (0 payloads parsed)"
    )
    assert p.query(
        database,
        "SELECT transaction_id, value_number FROM core.custom_report_results ORDER BY ALL",
    ) == [("t-0", 0.0), ("t-1", 1.0), ("t-2", 2.0)]


def _core_metadata(result: dg.ExecuteInProcessResult, asset: str) -> dict[str, object]:
    (event,) = [m for m in result.get_asset_materialization_events() if m.asset_key.path == [asset]]
    return {key: value.value for key, value in event.materialization.metadata.items()}


def _rows(database, table: str) -> list[tuple]:
    columns = [
        name
        for (name,) in p.query(
            database,
            "SELECT column_name FROM duckdb_columns() WHERE schema_name || '.' || table_name = ? "
            "AND column_name <> 'loaded_at' ORDER BY column_index",
            [table],
        )
    ]
    select = ", ".join(f'"{c}"::VARCHAR' for c in columns)
    return p.query(database, f"SELECT {select} FROM {table} ORDER BY ALL")


def test_after_an_incremental_raw_load_only_the_rows_it_wrote_are_parsed(tmp_path):
    database = tmp_path / "t.duckdb"
    kept = [_reported(f"t-{i:02}", i) for i in range(20)]
    first = p.materialize_core(database, transactions=kept)
    assert _core_metadata(first, "core_transactions")["fieldsales/decode_payloads_parsed"] == 20
    # What an incremental raw load does: the rows of re-fetched events are replaced by rows with
    # the new load's loaded_at (t-05 with a new value), removed ones deleted (t-06), new appended.
    changed, added = _reported("t-05", 500), _reported("t-new", 7)
    with lake_at(database).get_connection() as conn:
        conn.execute("DELETE FROM raw.transactions WHERE id IN ('t-05', 't-06')")
        for item in (changed, added):
            conn.execute(
                "INSERT INTO raw.transactions VALUES (?, ?, ?, now()::TIMESTAMP)",
                [item["_id"], item["eventId"], json.dumps(item)],
            )

    second = materialize(
        [*p.RAW_STAND_INS, *core_assets()],
        selection=["core_transactions", "core_custom_report_fields", "core_custom_report_results"],
        resources={"warehouse": lake_at(database)},
    )

    assert second.success
    metadata = _core_metadata(second, "core_transactions")
    assert metadata["fieldsales/decode"] == (
        "meta.transactions_decoded: incremental (2 payloads parsed)"
    )
    results = _core_metadata(second, "core_custom_report_results")
    assert results["fieldsales/decode"] == (
        "meta.transactions_decoded: current (0 payloads parsed); "
        "temp.events_decoded: current (0 payloads parsed)"
    )
    assert results["fieldsales/build"] == (
        "incremental: only meta.transactions_decoded and temp.events_decoded changed since the "
        "previous build; meta.transactions_decoded: replaced the rows of its 2 new and 2 gone "
        "rows; temp.events_decoded: replaced the rows of its 0 new and 0 gone rows"
    )
    assert metadata["fieldsales/build"] == (
        "incremental: only meta.transactions_decoded changed since the previous build; replaced "
        "the rows of its 2 new and 2 gone rows"
    )
    fresh = tmp_path / "fresh.duckdb"
    now_raw = [t for t in kept if t["_id"] not in ("t-05", "t-06")] + [changed, added]
    p.materialize_core(fresh, transactions=now_raw)
    for table in ("meta.transactions_decoded", "core.transactions", "core.custom_report_results"):
        assert _rows(database, table) == _rows(fresh, table), table
    assert ("t-05", "500.0") in [
        (r[0], r[1])
        for r in p.query(
            database,
            "SELECT transaction_id, value_number::VARCHAR FROM core.custom_report_results",
        )
    ]


def _reporting_events(values: dict[str, int], named: dict[str, str] | None = None) -> list[dict]:
    """Events each submitting one event-level report answering f-1 with its value; ``named``:
    events whose report names another event as ``_event``."""
    return [
        p.event(e, report_results=[p.event_report(f"r-{e}", (named or {}).get(e, e), {"f-1": v})])
        for e, v in values.items()
    ]


def _change_event(database, item: dict) -> int:
    """What a raw load does to a changed event; returns the snapshot before it."""
    with lake_at(database).get_connection() as conn:
        (before,) = one_row(conn, "SELECT id FROM current_snapshot()")
        conn.execute(
            "UPDATE raw.events SET payload = ?, loaded_at = now()::TIMESTAMP WHERE id = ?",
            [json.dumps(item), item["_id"]],
        )
    return before


def _same_as_a_full_build(tmp_path, database, events: list[dict]) -> None:
    fresh = tmp_path / "fresh.duckdb"
    p.materialize_core(fresh, transactions=[_reported("t-0", 0)], events=events)
    table = "core.custom_report_results"
    assert _rows(database, table) == _rows(fresh, table)


def test_the_event_rows_of_custom_report_results_follow_the_changed_events(tmp_path):
    """One event changed: the build's commit deletes and writes that event's rows only, as it
    does a changed transaction's; the other events' rows stay as they were."""
    database = tmp_path / "t.duckdb"
    values = {f"e-{i}": i for i in range(10)}
    p.materialize_core(
        database, transactions=[_reported("t-0", 0)], events=_reporting_events(values)
    )
    values["e-3"] = 300
    before = _change_event(database, _reporting_events(values)[3])

    second = _materialize_results_only(database)

    feed = f"'fieldsales', 'core', 'custom_report_results', {before + 1}, {before + 2}"
    assert p.query(
        database,
        f"SELECT 'inserted', event_id, value_raw FROM ducklake_table_insertions({feed}) UNION ALL "
        f"SELECT 'deleted', event_id, value_raw FROM ducklake_table_deletions({feed}) ORDER BY 1",
    ) == [("deleted", "e-3", "3"), ("inserted", "e-3", "300")]
    assert _core_metadata(second, "core_custom_report_results")["fieldsales/build"] == (
        "incremental: only meta.transactions_decoded and temp.events_decoded changed since the "
        "previous build; meta.transactions_decoded: replaced the rows of its 0 new and 0 gone "
        "rows; temp.events_decoded: replaced the rows of its 1 new and 1 gone rows"
    )
    _same_as_a_full_build(tmp_path, database, _reporting_events(values))


def test_custom_report_results_built_whole_for_its_events_reads_every_transaction(tmp_path):
    """More than 20% of the events changed, none of the transactions: the build is whole, and
    reads every transaction too, not only those it would have replaced."""
    database = tmp_path / "t.duckdb"
    values = {f"e-{i}": i for i in range(5)}
    p.materialize_core(
        database, transactions=[_reported("t-0", 0)], events=_reporting_events(values)
    )
    values |= {"e-1": 100, "e-2": 200}
    for item in _reporting_events(values)[1:3]:
        _change_event(database, item)

    second = _materialize_results_only(database)

    assert _core_metadata(second, "core_custom_report_results")["fieldsales/build"] == (
        "full: more than 20% of temp.events_decoded is new"
    )
    _same_as_a_full_build(tmp_path, database, _reporting_events(values))


def test_a_result_naming_another_event_keeps_custom_report_results_whole(tmp_path):
    """An event's result naming another event as _event is stored under that event_id, where a
    change to its own event could not find it: builds are whole while any result does."""
    database = tmp_path / "t.duckdb"
    values, named = {"e-1": 1, "e-2": 2}, {"e-1": "e-2"}
    first = p.materialize_core(
        database, transactions=[_reported("t-0", 0)], events=_reporting_events(values, named)
    )
    values["e-2"] = 200
    _change_event(database, _reporting_events(values, named)[1])

    second = _materialize_results_only(database)

    _same_as_a_full_build(tmp_path, database, _reporting_events(values, named))
    # The second finds the first's build, which recorded no state to follow from.
    again = "no record of a previous build by this query"
    for result, why in ((first, "no previous build"), (second, again)):
        assert _core_metadata(result, "core_custom_report_results")["fieldsales/build"] == (
            f"full: {why}; 1 rows have no key to find them by, so the next build is whole too"
        )


def test_a_raw_table_made_again_since_a_following_build_builds_it_whole(tmp_path):
    """raw.events replaced by a table staged before core.events' last build read the lake: the
    change feed since that snapshot shows none of the new table's rows (inserted before it) and no
    row deleted (they were the old table's), so only knowing it was made again finds e-3 gone."""
    database = tmp_path / "t.duckdb"
    values = {f"e-{i}": i for i in range(10)}
    p.materialize_core(
        database, transactions=[_reported("t-0", 0)], events=_reporting_events(values)
    )
    with lake_at(database).get_connection() as conn:
        conn.execute("CREATE TABLE raw.events_staged AS FROM raw.events WHERE id <> 'e-3'")
    _change_event(database, _reporting_events(values | {"e-5": 500})[5])
    events_only = {"selection": ["core_events"], "resources": {"warehouse": lake_at(database)}}
    first = materialize([*p.RAW_STAND_INS, *core_assets()], **events_only)
    with lake_at(database).get_connection() as conn:
        replace_table(conn, "raw.events_staged", "raw.events")

    second = materialize([*p.RAW_STAND_INS, *core_assets()], **events_only)

    assert _core_metadata(first, "core_events")["fieldsales/build"].startswith("incremental")
    assert _core_metadata(second, "core_events")["fieldsales/build"].startswith(
        "full: raw.events was made again"
    )
    assert p.query(database, "SELECT event_id FROM core.events ORDER BY 1") == [
        (e,) for e in sorted(values) if e != "e-3"
    ]


def test_durations_follow_a_history_built_whole_with_hashed_personal_columns(tmp_path):
    """Under pii: hash, core.event_status_history (its client_ip hashed) is built whole with no
    fingerprint recorded; it still read raw.events as it is, so the durations read from it
    follow the changed event, as they do under keep."""
    database = tmp_path / "t.duckdb"
    values, hashed = {f"e-{i}": i for i in range(10)}, {"pii": "hash", "pii_hash_key": "k" * 16}
    p.materialize_core(
        database, transactions=[_reported("t-0", 0)], events=_reporting_events(values), **hashed
    )
    _change_event(database, _reporting_events(values | {"e-5": 500})[5])

    second = p.materialize_core_only(database, **hashed)

    assert _core_metadata(second, "core_event_status_history")["fieldsales/build"].startswith(
        "full: personal columns are hashed"
    )
    assert _core_metadata(second, "core_event_state_durations")["fieldsales/build"].startswith(
        "incremental"
    )


def test_a_new_decode_query_builds_every_table_following_it_whole(tmp_path, monkeypatch):
    """The decode's query changed (a new release): the step that refreshes it first parses every
    row again, and every table following it is built whole, not only that step's: the change feed
    shows a transaction written since, not that every decoded row is made otherwise now."""
    database = tmp_path / "t.duckdb"
    p.materialize_core(database, transactions=[_reported(f"t-{i}", i) for i in range(10)])
    with lake_at(database).get_connection() as conn:  # an incremental raw load's write
        conn.execute("UPDATE raw.transactions SET loaded_at = now()::TIMESTAMP WHERE id = 't-1'")
    released = decode._decode_sql
    monkeypatch.setattr(decode, "_decode_sql", lambda d: f"{released(d)}\n-- a new release")

    result = materialize(
        [*p.RAW_STAND_INS, *core_assets()],
        selection=["core_transactions", "core_custom_report_fields", "core_custom_report_results"],
        resources={"warehouse": lake_at(database)},
    )

    assert result.success
    for node in ("core_transactions", "core_custom_report_results"):
        assert _core_metadata(result, node)["fieldsales/build"] == (
            "full: no record of a previous build by this query"
        ), node


def test_a_decode_whose_source_no_commit_wrote_since_its_refresh_reads_no_key(
    tmp_path, monkeypatch
):
    """The second table of a run reading meta.transactions_decoded finds it current by the
    snapshot its refresh read, not by hashing every key of it and of raw.transactions."""
    database = tmp_path / "t.duckdb"
    p.materialize_core(database, transactions=[_reported(f"t-{i}", i) for i in range(3)])
    scanned: list[str] = []

    def scanning(conn: duckdb.DuckDBPyConnection, table: str, *args: str) -> tuple | None:
        scanned.append(table)
        return fingerprint(conn, table, *args)

    monkeypatch.setattr(decode, "fingerprint", scanning)
    monkeypatch.setattr(decode, "changed_rows", lambda *args: scanned.append("changed_rows"))
    warehouse = lake_at(database)
    with warehouse.get_connection() as conn:
        refreshed = decode.refresh_decoded(conn, decode.TRANSACTIONS_DECODED, warehouse.lake)

    assert (refreshed, scanned) == (decode.DecodeRefresh("current", 0), [])


def test_a_following_table_reading_no_other_tables_inputs_hashes_no_key(tmp_path, monkeypatch):
    """core.transactions reads no other following table's inputs, so it never compares their
    fingerprint with its decoded table's: it hashes no key of either."""
    database = tmp_path / "t.duckdb"
    p.materialize_core(database, transactions=[_reported(f"t-{i}", i) for i in range(10)])
    with lake_at(database).get_connection() as conn:  # an incremental raw load's write
        conn.execute("UPDATE raw.transactions SET loaded_at = now()::TIMESTAMP WHERE id = 't-1'")
    hashed: list[str] = []

    def hashing(conn: duckdb.DuckDBPyConnection, table: str, *args: str) -> tuple | None:
        hashed.append(table)
        return fingerprint(conn, table, *args)

    monkeypatch.setattr(follow, "fingerprint", hashing)
    result = materialize(
        [*p.RAW_STAND_INS, *core_assets()],
        selection=["core_transactions"],
        resources={"warehouse": lake_at(database)},
    )

    assert result.success
    assert _core_metadata(result, "core_transactions")["fieldsales/build"].startswith("incremental")
    assert hashed == []


def test_a_following_tables_rows_without_a_key_are_counted_among_the_rows_it_writes(
    tmp_path, monkeypatch
):
    """An incremental build counts the rows with no key in the rows it replaces, not in the
    whole table (5.5M rows of core.custom_report_results at 1M transactions)."""
    database = tmp_path / "t.duckdb"
    p.materialize_core(database, transactions=[_reported(f"t-{i}", i) for i in range(10)])
    with lake_at(database).get_connection() as conn:  # an incremental raw load's write
        conn.execute("UPDATE raw.transactions SET loaded_at = now()::TIMESTAMP WHERE id = 't-1'")
    counted: list[str] = []

    def counting(conn: duckdb.DuckDBPyConnection, sql: str, *args: object) -> tuple:
        counted.append(sql)
        return one_row(conn, sql, *args)

    monkeypatch.setattr(follow, "one_row", counting)
    result = _materialize_results_only(database)

    assert _core_metadata(result, "core_custom_report_results")["fieldsales/build"].startswith(
        "incremental"
    )
    whole = [sql for sql in counted if '"core"."custom_report_results"' in sql]
    assert whole == [], f"the whole table was counted: {whole}"


def test_a_following_table_holding_rows_without_a_key_is_built_whole_next(tmp_path):
    """A row with no key cannot be replaced by key: the build that wrote it records no state."""
    database = tmp_path / "t.duckdb"
    p.write_raw_tables(database, transactions=[_reported(f"t-{i}", i) for i in range(10)])
    with lake_at(database).get_connection() as conn:
        conn.execute("UPDATE raw.transactions SET id = NULL WHERE id = 't-0'")
    p.materialize_core_only(database)
    with lake_at(database).get_connection() as conn:  # an incremental raw load's write
        conn.execute("UPDATE raw.transactions SET loaded_at = now()::TIMESTAMP WHERE id = 't-1'")

    built = _core_metadata(_materialize_results_only(database), "core_custom_report_results")

    assert built["fieldsales/build"].startswith("full: "), built["fieldsales/build"]


def test_a_decode_with_most_rows_to_parse_is_rebuilt_whole(tmp_path):
    database = tmp_path / "t.duckdb"
    p.materialize_core(database, transactions=[_reported(f"t-{i}", i) for i in range(5)])
    # A full raw load stamps every row anew.
    p.write_raw_tables(database, transactions=[_reported(f"t-{i}", i + 1) for i in range(5)])

    result = _materialize_results_only(database)

    metadata = _core_metadata(result, "core_custom_report_results")
    assert metadata["fieldsales/decode"] == (
        "meta.transactions_decoded: full (5 payloads parsed); "
        "temp.events_decoded: current (0 payloads parsed)"
    )
    assert p.query(
        database,
        "SELECT min(value_number), max(value_number) FROM core.custom_report_results",
    ) == [(1.0, 5.0)]


def test_results_are_rebuilt_whole_when_a_field_definition_changes(tmp_path):
    database = tmp_path / "t.duckdb"
    kept = [_reported(f"t-{i:02}", i) for i in range(20)]
    p.materialize_core(database, transactions=kept)
    # A new transaction carries a newer copy of the configuration: field f-1 is now text.
    retyped = p.transaction(
        "t-zz",
        report_config=p.config("cfg-1", [p.field("f-1", "text")]),
        report_results=p.results(**{"f-1": "0042"}),
    )
    with lake_at(database).get_connection() as conn:
        conn.execute(
            "INSERT INTO raw.transactions VALUES (?, ?, ?, now()::TIMESTAMP)",
            [retyped["_id"], retyped["eventId"], json.dumps(retyped)],
        )

    second = p.materialize_core_only(database)

    build = _core_metadata(second, "core_custom_report_results")["fieldsales/build"]
    assert build.startswith("full: core.custom_report_fields (config_id, field_id, ")
    fresh = tmp_path / "fresh.duckdb"
    p.materialize_core(fresh, transactions=[*kept, retyped])
    assert _rows(database, "core.custom_report_results") == _rows(
        fresh, "core.custom_report_results"
    )
    assert p.query(
        database,
        "SELECT count(*) FROM core.custom_report_results WHERE value_kind = 'text'",
    ) == [(21,)]
