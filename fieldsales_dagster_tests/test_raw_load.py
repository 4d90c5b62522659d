"""The raw load against the demo API over real HTTP: every item, whatever the server does."""

from __future__ import annotations

import logging
from typing import Any

import duckdb
import pydantic
import pytest

from fieldsales_dagster.client.api import FieldSalesAPI
from fieldsales_dagster.client.endpoints import EVENT_GROUPS, EVENTS, TRANSACTIONS, ListEndpoint
from fieldsales_dagster.client.errors import (
    AuthenticationError,
    FieldSalesAPIError,
    NotJSONError,
    PageFormatError,
)
from fieldsales_dagster.loading import raw_load
from fieldsales_dagster.loading.deletions import audit_table
from fieldsales_dagster.loading.lists import IncompleteListError
from fieldsales_dagster.loading.raw_load import RawLoadError, load_list
from fieldsales_dagster.urls import InsecureURLError
from fieldsales_dagster.warehouse.lake import changed_since, table_exists
from fieldsales_dagster.warehouse.pii import PII_VALUE
from fieldsales_dagster_tests.conftest import (
    attach_again,
    lake_at,
    make_api,
    make_warehouse,
    read_lake,
)
from fieldsales_dagster_tests.hostile_lists import HostileServer
from fieldsales_dagster_tests.project import materialize, raw_assets
from fieldsales_dagster_tests.test_hostile_paging import hostile_api

TX = TRANSACTIONS.path
EV = EVENTS.path


def load(api: FieldSalesAPI, warehouse, endpoint: ListEndpoint = TRANSACTIONS, **kwargs):
    with warehouse.get_connection() as conn:
        return load_list(api, conn, endpoint, **kwargs)


def table_ids(warehouse, table: str) -> list[str]:
    with read_lake(warehouse) as conn:
        return [row[0] for row in conn.execute(f"SELECT id FROM {table} ORDER BY id").fetchall()]


def server_ids(server, name: str) -> list[str]:
    return sorted(server.dataset.ids(name))


def assert_table_matches_server(warehouse, server, endpoint: ListEndpoint) -> None:
    ids = table_ids(warehouse, endpoint.raw_table)
    assert len(ids) == len(set(ids))
    assert ids == server_ids(server, endpoint.name)


def test_every_transaction_lands_once_with_pages_in_flight(demo_server, api, warehouse):
    report = load(api, warehouse)
    assert report.rows == report.api_total == demo_server.dataset.count("transactions") == 1200
    # 100, then windows of 99 (each re-reads the item before it): 1 + ceil(1100 / 99) pages,
    # and the same pages once more to read the list again.
    assert report.pages == 2 * 13 and report.retries == 0 and report.passes == 1
    assert_table_matches_server(warehouse, demo_server, TRANSACTIONS)


def test_raw_transactions_keep_payload_and_event_id(demo_server, api, warehouse):
    load(api, warehouse)
    with read_lake(warehouse) as conn:
        columns = conn.execute(
            "SELECT column_name, data_type FROM information_schema.columns "
            "WHERE table_schema = 'raw' AND table_name = 'transactions' ORDER BY ordinal_position"
        ).fetchall()
        assert dict(columns) == {
            "id": "VARCHAR",
            "payload": "JSON",
            "loaded_at": "TIMESTAMP",
            "event_id": "VARCHAR",
        }
        mismatched = conn.execute(
            "SELECT count(*) FROM raw.transactions "
            "WHERE id <> (payload->>'_id') OR event_id IS DISTINCT FROM (payload->>'eventId')"
        ).fetchone()[0]
        assert mismatched == 0


def test_capped_limit_still_loads_every_transaction(demo_server, api, warehouse):
    demo_server.behaviour.limit_cap = 37
    report = load(api, warehouse)
    assert report.rows == 1200
    assert_table_matches_server(warehouse, demo_server, TRANSACTIONS)


def test_capped_limit_without_totals_loads_every_item(demo_server, api, warehouse):
    demo_server.behaviour.limit_cap = 37
    demo_server.behaviour.omit_totals = True
    report = load(api, warehouse)
    assert report.api_total is None
    assert report.rows == 1200
    assert_table_matches_server(warehouse, demo_server, TRANSACTIONS)


@pytest.mark.parametrize("envelope", ["list", "events_total", "data_count", "items_only"])
def test_event_list_envelopes_all_load(demo_server, api, warehouse, envelope):
    demo_server.behaviour.event_envelope = envelope
    report = load(api, warehouse, EVENTS)
    assert report.rows == demo_server.dataset.count("events")
    assert_table_matches_server(warehouse, demo_server, EVENTS)


def test_event_groups_load_from_data_and_total(demo_server, api, warehouse):
    report = load(api, warehouse, EVENT_GROUPS)
    assert report.api_total == demo_server.dataset.count("event_groups") == report.rows
    assert_table_matches_server(warehouse, demo_server, EVENT_GROUPS)


@pytest.mark.parametrize(
    "kind, options",
    [
        ("status", {"status": 429, "retry_after": "0"}),
        ("status", {"status": 500}),
        ("status", {"status": 502}),
        ("status", {"status": 503}),
        ("truncate", {}),
        ("drop", {}),
        ("close", {}),
    ],
)
def test_passing_faults_are_retried_and_nothing_is_lost(demo_server, api, warehouse, kind, options):
    demo_server.behaviour.inject(TX, kind, times=2, skip_first=3, **options)
    report = load(api, warehouse)
    assert report.retries == 2
    assert_table_matches_server(warehouse, demo_server, TRANSACTIONS)


def test_429_storm_is_ridden_out_honouring_retry_after(demo_server, tmp_path, warehouse):
    api = make_api(demo_server, tmp_path, max_retries=12)
    demo_server.behaviour.inject(TX, "status", times=10, status=429, retry_after="0")
    report = load(api, warehouse)
    assert report.retries == 10
    assert_table_matches_server(warehouse, demo_server, TRANSACTIONS)


def test_retry_after_longer_than_allowed_stops_with_clear_error(demo_server, tmp_path, warehouse):
    api = make_api(demo_server, tmp_path, max_retry_after_s=5)
    demo_server.behaviour.inject(TX, "status", times=1, status=429, retry_after="3600")
    with pytest.raises(FieldSalesAPIError, match="Retry-After"):
        load(api, warehouse)


def test_persistent_5xx_fails_naming_the_endpoint_and_keeps_yesterdays_table(
    demo_server, api, warehouse
):
    load(api, warehouse)
    before = table_ids(warehouse, "raw.transactions")
    demo_server.behaviour.inject(TX, "status", times=1000, skip_first=6, status=503)
    with pytest.raises(FieldSalesAPIError, match=r"GET /public/v1/api/transaction/all.*503"):
        load(api, warehouse)
    assert table_ids(warehouse, "raw.transactions") == before
    with read_lake(warehouse) as conn:
        tables = conn.execute("SELECT table_name FROM information_schema.tables").fetchall()
    assert ("_stage_transactions",) not in tables


def test_complete_html_body_fails_at_once_naming_endpoint_and_content_type(
    demo_server, api, warehouse
):
    """A 200 that is an HTML page (a login page, a proxy's error page) is not a network failure:
    no retry, and the error says what came back. (It used to be retried 7 times.)"""
    demo_server.behaviour.inject(TX, "non_json", times=1000)
    with pytest.raises(NotJSONError) as raised:
        load(api, warehouse)
    message = str(raised.value)
    assert TX in message and "text/html" in message and "502 Bad Gateway" in message
    assert demo_server.behaviour.request_counts["transactions"] == 1


def test_page_that_is_not_a_list_fails_naming_the_page(demo_server, api, warehouse):
    demo_server.behaviour.inject(TX, "not_list", times=1, skip_first=2)
    # Named as every other error of its request is: the page, and the host it came from.
    on = r"transaction/all \(skip=\d+\) on 127\.0\.0\.1:\d+ answered an object with no list"
    with pytest.raises(PageFormatError, match=on):
        load(api, warehouse)


def test_total_that_grows_mid_run_is_repaired_until_complete(demo_server, api, warehouse):
    demo_server.behaviour.mutate("transactions", after_requests=4, insert=25, at=0)
    report = load(api, warehouse)
    assert report.passes == 1 and report.repairs >= 1
    assert demo_server.dataset.count("transactions") == 1225
    assert report.rows == report.api_total == 1225
    assert_table_matches_server(warehouse, demo_server, TRANSACTIONS)


def test_total_that_shrinks_mid_run_is_paged_again_until_complete(demo_server, api, warehouse):
    demo_server.behaviour.mutate("transactions", after_requests=4, delete=30, at=10)
    report = load(api, warehouse)
    assert report.rows == report.api_total == 1170
    assert_table_matches_server(warehouse, demo_server, TRANSACTIONS)


def test_list_that_never_settles_fails_and_keeps_the_old_table(demo_server, tmp_path, warehouse):
    api = make_api(demo_server, tmp_path, max_list_passes=2)
    load(api, warehouse)
    before = table_ids(warehouse, "raw.transactions")
    for after in range(3, 60, 4):  # every pass (12 requests) sees items deleted
        demo_server.behaviour.mutate("transactions", after_requests=after, delete=5, at=10)
    with pytest.raises(IncompleteListError, match="kept changing"):
        load(api, warehouse)
    assert table_ids(warehouse, "raw.transactions") == before


def test_insertions_without_totals_are_paged_again_until_no_id_repeats(demo_server, api, warehouse):
    demo_server.behaviour.omit_totals = True
    demo_server.behaviour.mutate("transactions", after_requests=3, insert=10, at=0)
    report = load(api, warehouse)
    assert report.passes == 2 and report.duplicates_dropped == 0
    assert report.rows == demo_server.dataset.count("transactions") == 1210
    assert_table_matches_server(warehouse, demo_server, TRANSACTIONS)


def test_a_changed_list_writes_only_its_changed_rows_and_the_others_keep_their_loaded_at(
    demo_server, api, warehouse
):
    load(api, warehouse, EVENTS)
    stamps = "SELECT id, loaded_at FROM raw.events"
    with read_lake(warehouse) as conn:
        before = dict(conn.execute(stamps).fetchall())
    demo_server.dataset.advance_event(0)
    demo_server.dataset.delete_event(1)
    report = load(api, warehouse, EVENTS)
    with read_lake(warehouse) as conn:
        after = dict(conn.execute(stamps).fetchall())
    changed, deleted = (demo_server.dataset.event_id(e) for e in (0, 1))
    assert report.written and deleted not in after and after.keys() == before.keys() - {deleted}
    assert after[changed] > before[changed] == before[deleted]
    kept = {i: at for i, at in after.items() if i != changed}
    assert kept == {i: before[i] for i in kept}, "rows listed as stored were stamped anew"
    with read_lake(warehouse) as conn:  # the list was loaded whole then
        checked = "SELECT last_full_at FROM meta.refresh_state WHERE table_name = 'raw.events'"
        assert conn.execute(checked).fetchone() == (after[changed],)
    assert_table_matches_server(warehouse, demo_server, EVENTS)


def _reload_after_one_edit(tmp_path, warehouse) -> tuple[Any, int]:
    """A list of 6,000 transactions loaded, one edited, loaded again at a 48MB memory limit: the
    report and how many distinct ``loaded_at`` the table then holds."""
    from fieldsales_dagster.demo_api import DemoConfig, DemoServer

    with DemoServer(DemoConfig(transactions=6000, seed=3), host="127.0.0.1", port=0) as server:
        api = make_api(server, tmp_path)
        load(api, warehouse)
        server.dataset.edit_transaction(0, 0)
        with warehouse.get_connection() as conn:
            conn.execute("SET threads = 1; SET memory_limit = '48MB'")
            report = load_list(api, conn, TRANSACTIONS)
        assert report.bytes > 48e6, report.bytes  # received, in the list's two reads
        assert report.written
        assert_table_matches_server(warehouse, server, TRANSACTIONS)
    with read_lake(warehouse) as conn:
        stamps = "SELECT count(DISTINCT loaded_at) FROM raw.transactions"
        return report, conn.execute(stamps).fetchone()[0]


def test_a_list_received_in_more_bytes_than_the_memory_limit_rewrites_only_its_changed_row(
    tmp_path, warehouse
):
    # Compared by id and digest (meta.raw_transactions_digests): no payload is read back.
    _, stamps = _reload_after_one_edit(tmp_path, warehouse)
    assert stamps == 2, "only the edited row takes the new loaded_at"


def stored_digests(warehouse, table: str) -> list[tuple]:
    with read_lake(warehouse) as conn:
        return conn.execute(f"FROM {raw_load.digests_table(table)} ORDER BY id").fetchall()


def distinct_loaded_at(warehouse, table: str) -> int:
    with read_lake(warehouse) as conn:
        return conn.execute(f"SELECT count(DISTINCT loaded_at) FROM {table}").fetchone()[0]


def test_a_lake_without_recorded_digests_replaces_a_list_whole_once_then_compares(
    demo_server, api, warehouse
):
    load(api, warehouse)
    with warehouse.get_connection() as conn:  # as a lake from before digests were stored
        conn.execute("DROP TABLE IF EXISTS meta.raw_transactions_digests")
    demo_server.dataset.edit_transaction(0, 0)
    assert load(api, warehouse).written
    assert distinct_loaded_at(warehouse, "raw.transactions") == 1, "compared without digests"
    ids = [row[0] for row in stored_digests(warehouse, "raw.transactions")]
    assert ids == table_ids(warehouse, "raw.transactions")
    demo_server.dataset.edit_transaction(0, 1)
    assert load(api, warehouse).written
    assert distinct_loaded_at(warehouse, "raw.transactions") == 2
    assert_table_matches_server(warehouse, demo_server, TRANSACTIONS)


def test_a_refused_shrink_leaves_the_stored_digests_untouched(demo_server, api, warehouse):
    load(api, warehouse, EVENTS)
    before = stored_digests(warehouse, "raw.events")
    demo_server.dataset.delete_event(0)
    with pytest.raises(raw_load.ShrinkRefusedError, match="raw.events"):
        load(api, warehouse, EVENTS, max_shrink_fraction=0.0)
    assert stored_digests(warehouse, "raw.events") == before
    load(api, warehouse, EVENTS, max_shrink_fraction=0.0, allow_shrink=True)
    after = stored_digests(warehouse, "raw.events")
    assert len(after) == len(before) - 1 == len(table_ids(warehouse, "raw.events"))


def test_items_without_id_are_compared_by_their_content_ids_and_a_gone_one_is_audited(tmp_path):
    groups = [{"name": "a"}, {"name": "a"}, {"name": "b"}]  # no `_id`; a copy of "a" twice

    def answer(path: str, skip: int, limit: int) -> object:
        return {"data": groups[skip : skip + limit], "total": len(groups)}

    warehouse = lake_at(tmp_path / "groups.duckdb")
    with HostileServer(answer) as server:
        api = hostile_api(server, page_size=1000)
        first = load(api, warehouse, EVENT_GROUPS)
        assert first.rows == 2 and first.duplicates_dropped == 1
        assert not load(api, warehouse, EVENT_GROUPS).written
        groups[2] = {"name": "c"}
        assert load(api, warehouse, EVENT_GROUPS).written
    with read_lake(warehouse) as conn:
        rows = "SELECT payload->>'name', id = md5(payload::VARCHAR) FROM raw.event_groups"
        assert sorted(conn.execute(rows).fetchall()) == [("a", True), ("c", True)]
        gone = f"SELECT payload->>'name' FROM {audit_table(EVENT_GROUPS)}"
        assert conn.execute(gone).fetchall() == [("b",)]
    ids = [row[0] for row in stored_digests(warehouse, "raw.event_groups")]
    assert ids == table_ids(warehouse, "raw.event_groups")
    assert distinct_loaded_at(warehouse, "raw.event_groups") == 2, "row listed as stored rewritten"


def test_a_changed_raw_redaction_rewrites_rows_received_the_same(demo_server, tmp_path):
    def run(redact: bool, mode: str) -> None:
        warehouse = make_warehouse(tmp_path, redact_pii_in_raw=redact)
        config = {"ops": {"raw_transactions": {"config": {"refresh_mode": mode}}}}
        api = make_api(demo_server, tmp_path)
        resources = {"fieldsales_api": api, "warehouse": warehouse}
        assert materialize(raw_assets(), resources=resources, run_config=config).success

    def personal_rows() -> int:  # the demo's personal keys are in its events
        with read_lake(make_warehouse(tmp_path)) as conn:
            found = "SELECT count(*) FROM raw.events WHERE regexp_matches(payload::VARCHAR, $pii)"
            return conn.execute(found, {"pii": PII_VALUE}).fetchone()[0]

    run(redact=False, mode="full")
    assert personal_rows() == 30
    run(redact=True, mode="full")  # the same bytes received: stored otherwise
    assert personal_rows() == 0
    run(redact=False, mode="full")
    assert personal_rows() == 30, "rows stored redacted were kept"


def test_an_incremental_merge_keeps_the_digests_a_full_refresh_then_finds_current(
    demo_server, tmp_path
):
    warehouse = make_warehouse(tmp_path)

    def run(mode: str | None = None) -> dict[str, object]:
        config = {"ops": {"raw_transactions": {"config": {"refresh_mode": mode}}}}
        api = make_api(demo_server, tmp_path)
        resources = {"fieldsales_api": api, "warehouse": warehouse}
        result = materialize(raw_assets(), resources=resources, run_config=config)
        (event,) = result.asset_materializations_for_node("raw_transactions")
        return {key: value.value for key, value in event.metadata.items()}

    run()
    changes = demo_server.behaviour.evolve(1)
    merged = run()
    assert merged["refresh_mode"] == "incremental" and changes["transactions_changed"]
    with read_lake(warehouse) as conn:
        rows = "SELECT id, event_id FROM {} ORDER BY id"
        stored = conn.execute(rows.format("raw.transactions")).fetchall()
        assert conn.execute(rows.format("meta.raw_transactions_digests")).fetchall() == stored
    full = run("full")
    assert full["refresh_mode"] == "full" and not full["table_written"], "digests went stale"


def test_a_list_listed_as_stored_rewrites_neither_its_table_nor_its_digests_and_states(
    demo_server, api, warehouse
):
    load(api, warehouse, EVENTS)
    with warehouse.get_connection() as conn:
        (before,) = conn.execute("SELECT id FROM current_snapshot()").fetchone()
        assert not load_list(api, conn, EVENTS).written
        tables = ["raw.events", "meta.raw_events_digests"]
        assert changed_since(conn, warehouse.lake, before, tables) == []


def test_a_list_load_stages_and_redacts_the_payloads_of_new_and_changed_items_only(
    demo_server, api, warehouse
):
    from fieldsales_dagster.warehouse.pii import redact_pii_keys

    staged: list[tuple[int, int, int]] = []  # payloads staged, rows staged, rows redacted
    events = demo_server.dataset.count("events")
    with warehouse.get_connection() as conn:

        def before_swap(stage: str) -> None:
            count = f"SELECT count(payload), count(*) FROM {stage}"
            staged.append((*conn.execute(count).fetchone(), redact_pii_keys(conn, stage)))

        def load_events() -> None:
            load_list(api, conn, EVENTS, before_swap=before_swap, redact_pii_in_raw=True)

        load_events()
        load_events()  # listed as stored
        demo_server.dataset.advance_event(0)
        demo_server.dataset.delete_event(1)
        load_events()
    assert staged == [(events, events, 30), (0, events, 0), (1, events - 1, 1)]
    assert_table_matches_server(warehouse, demo_server, EVENTS)
    with read_lake(warehouse) as conn:
        personal = "SELECT count(*) FROM raw.events WHERE regexp_matches(payload::VARCHAR, $pii)"
        assert conn.execute(personal, {"pii": PII_VALUE}).fetchone() == (0,)


def test_a_list_load_computes_the_state_of_new_and_changed_events_only(
    demo_server, api, warehouse, tmp_path, monkeypatch
):
    """An event listed as stored keeps the state stored with its digest; the digests and states
    stored equal those a first load of the same list computes for every event."""
    computed: list[int] = []

    def counted(item):
        computed.append(1)
        return event_state(item)

    event_state = raw_load.event_state
    load(api, warehouse, EVENTS)
    demo_server.dataset.advance_event(0)
    demo_server.dataset.delete_event(1)
    monkeypatch.setattr(raw_load, "event_state", counted)
    assert load(api, warehouse, EVENTS).written
    assert len(computed) == 1, "the state of an event listed as stored was computed again"
    monkeypatch.undo()
    first = make_warehouse(tmp_path, "first")
    load(api, first, EVENTS)
    states = "SELECT * FROM meta.raw_events_digests ORDER BY id"
    with read_lake(warehouse) as conn, read_lake(first) as fresh:
        assert conn.execute(states).fetchall() == fresh.execute(states).fetchall()


def test_event_digests_recorded_without_states_replace_the_list_whole_once_with_every_state(
    demo_server, api, warehouse, tmp_path
):
    """An earlier release kept the events' states apart (``meta.event_states``), not with their
    digests: no event is taken as stored then, so every event gets its state, as a first load's;
    the next load compares again (replaces the guard that staged an event with its payload where
    no state was stored beside its digest)."""
    load(api, warehouse, EVENTS)
    with warehouse.get_connection() as conn:  # as the earlier release left the lake
        conn.execute(
            "CREATE TABLE meta.event_states AS SELECT id AS event_id, fingerprint, state_changes "
            "FROM meta.raw_events_digests; CREATE OR REPLACE TABLE meta.raw_events_digests AS "
            "SELECT id, digest FROM meta.raw_events_digests"
        )
    assert load(api, warehouse, EVENTS).written, "digests without states were compared"
    first = make_warehouse(tmp_path, "first")
    load(api, first, EVENTS)
    states = "SELECT * FROM meta.raw_events_digests ORDER BY id"
    with read_lake(warehouse) as conn, read_lake(first) as fresh:
        assert conn.execute(states).fetchall() == fresh.execute(states).fetchall()
    assert not load(api, warehouse, EVENTS).written
    attach_again(warehouse)  # a writer of this release attaching the lake drops the table
    with warehouse.get_connection() as conn:
        assert not table_exists(conn, "meta.event_states")


def test_a_row_written_by_another_load_meanwhile_is_never_replaced_by_a_payload_not_staged(
    demo_server, api, warehouse
):
    """An item whose digest a stored row held when the load began is staged without its
    payload; if that row changed before the swap, the load fails and writes nothing."""
    load(api, warehouse, EVENTS)
    with read_lake(warehouse) as conn:
        before = conn.execute("SELECT id, payload::VARCHAR FROM raw.events ORDER BY id").fetchall()
    with warehouse.get_connection() as conn:

        def another_writer(stage: str) -> None:
            conn.execute(
                "UPDATE meta.raw_events_digests SET digest = digest + 1 "
                "WHERE id = (SELECT min(id) FROM raw.events)"
            )

        with pytest.raises(RawLoadError, match="1 items were stored as received") as failed:
            load_list(api, conn, EVENTS, before_swap=another_writer)
        assert "run again" in str(failed.value)
    with read_lake(warehouse) as conn:
        after = conn.execute("SELECT id, payload::VARCHAR FROM raw.events ORDER BY id").fetchall()
    assert after == before


def test_a_list_whose_stored_columns_differ_is_replaced_whole_with_every_payload(
    demo_server, api, warehouse
):
    load(api, warehouse, EVENTS)
    with warehouse.get_connection() as conn:  # as a table an earlier release commented
        conn.execute("COMMENT ON COLUMN raw.events.payload IS 'the whole item'")
    demo_server.dataset.advance_event(0)
    assert load(api, warehouse, EVENTS).written
    assert distinct_loaded_at(warehouse, "raw.events") == 1, "not replaced whole"
    with read_lake(warehouse) as conn:
        lost = "SELECT count(*) FROM raw.events WHERE (payload->>'_id' = id) IS NOT TRUE"
        assert conn.execute(lost).fetchone() == (0,), "a row listed as stored lost its payload"
    assert_table_matches_server(warehouse, demo_server, EVENTS)


def test_repeated_ids_keep_their_first_copy(tmp_path):
    from fieldsales_dagster.loading.raw_load import _drop_duplicate_ids

    with duckdb.connect(str(tmp_path / "d.duckdb")) as conn:
        conn.execute("CREATE SCHEMA raw")
        conn.execute(
            "CREATE TABLE raw.t AS SELECT * FROM (VALUES ('a', 1), ('b', 2), ('a', 3)) v(id, n)"
        )
        _drop_duplicate_ids(conn, "raw.t")
        assert conn.execute("SELECT id, n FROM raw.t ORDER BY id").fetchall() == [
            ("a", 1),
            ("b", 2),
        ]


def test_refused_token_names_the_endpoint_and_never_the_token(
    demo_server, tmp_path, warehouse, caplog
):
    api = make_api(demo_server, tmp_path, api_token="not-the-token-" + "x" * 20)
    with caplog.at_level(logging.DEBUG), pytest.raises(AuthenticationError) as raised:
        load(api, warehouse)
    message = str(raised.value)
    assert "HTTP 401" in message and TX in message and "FIELDSALES_API_TOKEN" in message
    assert "x" * 20 not in message and "x" * 20 not in caplog.text


def test_forbidden_token_says_so(demo_server, api, warehouse):
    demo_server.behaviour.inject(TX, "status", times=1, status=403)
    with pytest.raises(AuthenticationError, match="HTTP 403"):
        load(api, warehouse)
    assert demo_server.token not in str(api)


def test_plain_http_is_refused_for_remote_hosts(tmp_path, warehouse):
    """Refused when the resource is built (its ``api:`` model checks it), before any request."""
    from fieldsales_dagster.urls import validate_base_url

    with pytest.raises(pydantic.ValidationError, match=r"api\.base_url.*fieldsales\.example\.com"):
        FieldSalesAPI(base_url="http://fieldsales.example.com", api_token="t" * 30)
    with pytest.raises(InsecureURLError, match="fieldsales.example.com"):
        validate_base_url("http://fieldsales.example.com")


@pytest.mark.parametrize("host", ["http://127.0.0.1:1", "http://localhost:1", "http://[::1]:1"])
def test_plain_http_is_allowed_on_loopback(host):
    from fieldsales_dagster.urls import validate_base_url

    assert validate_base_url(host + "/") == host


def test_check_token_accepts_current_and_refuses_stale(demo_server, api):
    api.check_token()
    with pytest.raises(AuthenticationError):
        api.check_token(token="stale-token")


def test_pretty_printed_items_and_odd_ids_are_stored_as_received(tmp_path):
    """Line breaks inside items, numeric, missing and control-character ids all land intact."""
    import json
    from datetime import UTC, datetime

    from fieldsales_dagster.client.envelope import Page, split_envelope
    from fieldsales_dagster.loading.raw_load import StagingWriter, raw_table_ddl

    items = [
        {"_id": "a", "eventId": "e1", "note": "line\nbreak", "n": 1},
        {"_id": 42, "eventId": None, "nested": {"x": [1, 2]}},
        {"eventId": "e2", "no": "id"},
        {"_id": "odd\u0001id\nx", "eventId": "e3"},
        {"_id": {"$oid": "abc"}, "eventId": "e4"},
    ]
    body = json.dumps({"transactions": items, "count": 5}, indent=2).encode()
    parsed, total = split_envelope(body, TRANSACTIONS, "test page")
    assert total == 5
    with duckdb.connect(str(tmp_path / "w.duckdb")) as conn:
        conn.execute("CREATE SCHEMA raw")
        conn.execute(raw_table_ddl(TRANSACTIONS, "raw.t", digest=True))
        writer = StagingWriter(conn, TRANSACTIONS, "raw.t", datetime.now(UTC))
        writer.add(Page(skip=0, items=parsed, total=total, nbytes=len(body)))
        writer.finish()
        rows = conn.execute("SELECT id, event_id, payload FROM raw.t ORDER BY rowid").fetchall()
    assert [json.loads(payload) for _, _, payload in rows] == items
    ids = [row[0] for row in rows]
    assert ids[:2] == ["a", "42"]
    assert ids[3] == "odd\u0001id\nx"  # as received, never hashed
    assert all(ids) and len(set(ids)) == 5  # missing ids, or objects: a content hash
    assert [row[1] for row in rows] == ["e1", None, "e2", "e3", "e4"]


@pytest.mark.parametrize(
    "items",
    [
        [{"_id": "a", "eventId": "e1"}, {"_id": "b", "eventId": "e2", "x": [1, {"_id": "n"}]}],
        [{"_id": "a"}, {"eventId": "e2"}, {"_id": "", "eventId": ""}],  # absent and empty keys
        [{"_id": 42, "eventId": "e1"}, {"_id": 1.5, "eventId": True}],  # not strings
        [{"_id": "odd\u0001id", "eventId": "e1"}, {"_id": "a\nb", "eventId": "c\rd"}],
        [{"_id": {"$oid": "abc"}, "eventId": ["e"]}],  # objects and lists as keys
        [{"_id": "é✓😀", "eventId": "e\u00e9"}],
    ],
)
def test_a_page_batch_holds_each_items_keys_as_text_and_its_bytes_as_received(items):
    import json

    from fieldsales_dagster.client.envelope import split_envelope
    from fieldsales_dagster.loading.lists import Page, item_digests
    from fieldsales_dagster.loading.raw_load import key_decoder, page_batch, page_schema

    def as_text(value):  # what the table stores for a key: text, or NULL
        if value is None or isinstance(value, bool | dict | list) or value == "":
            return None
        return value if isinstance(value, str) else str(value)

    body = json.dumps({"transactions": items, "count": len(items)}).encode()
    parsed, total = split_envelope(body, TRANSACTIONS, "test page")
    decode = key_decoder(TRANSACTIONS)
    digests = item_digests(parsed)
    page = Page(skip=0, items=parsed, total=total, nbytes=len(body), digests=digests)
    batch = page_batch(page, page_schema(TRANSACTIONS), decode)
    assert batch.schema.names == ["id", "event_id", "payload", "digest"]
    assert batch.column("digest").to_pylist() == list(digests)  # until Staging.seal drops it
    assert batch.column("id").to_pylist() == [as_text(item.get("_id")) for item in items]
    assert batch.column("event_id").to_pylist() == [as_text(item.get("eventId")) for item in items]
    payloads = batch.column("payload").storage.to_pylist()
    assert [p.encode() for p in payloads] == [bytes(item) for item in parsed]
    assert [json.loads(p) for p in payloads] == items


@pytest.mark.parametrize(
    "body, expected_items, expected_total",
    [
        (b'{"transactions": [{"_id": "a"}], "count": 7}', 1, 7),
        (b'{"transactions": [{"_id": "a"}], "count": "7"}', 1, 7),
        (b'{"transactions": [{"_id": "a"}], "count": -1}', 1, None),
        (b'{"transactions": [{"_id": "a"}], "total": 3}', 1, 3),
        (b'{"items": [{"_id": "a"}, {"_id": "b"}], "count": 2, "debug": {"query": {}}}', 2, 2),
        (b'[{"_id": "a"}, {"_id": "b"}]', 2, None),
        (b'{"transactions": [], "count": 0}', 0, 0),
    ],
)
def test_envelope_shapes_split_into_items_and_total(body, expected_items, expected_total):
    from fieldsales_dagster.client.envelope import split_envelope

    items, total = split_envelope(body, TRANSACTIONS, "test page")
    assert (len(items), total) == (expected_items, expected_total)


@pytest.mark.parametrize(
    "body",
    [
        b'{"transactions": [{"_id": "a"}], "count": 1',  # cut off
        b'{"transactions": [{"_id": "a"}, ], "count": 1}',  # malformed inside the list
    ],
)
def test_incomplete_json_is_a_decode_error_for_the_retry_loop(body):
    import msgspec

    from fieldsales_dagster.client.envelope import split_envelope

    with pytest.raises(msgspec.DecodeError):
        split_envelope(body, TRANSACTIONS, "test page")


def test_an_insert_that_fails_names_the_table_and_never_holds_the_pager_up(tmp_path):
    """The writer alone: its table lacks a column the insert writes, so DuckDB fails; every page
    added after that is refused with the error, never left waiting for an insert that ended."""
    import json
    from datetime import UTC, datetime

    from fieldsales_dagster.client.envelope import Page, split_envelope
    from fieldsales_dagster.loading.raw_load import QUEUED_PAGES, StagingWriter

    body = json.dumps({"transactions": [{"_id": "a", "eventId": "e"}], "count": 1}).encode()
    items, total = split_envelope(body, TRANSACTIONS, "test page")
    page = Page(skip=0, items=items, total=total, nbytes=len(body))
    with duckdb.connect(str(tmp_path / "w.duckdb")) as conn:
        conn.execute("CREATE SCHEMA raw")
        conn.execute("CREATE TABLE raw.t (id VARCHAR, payload JSON, loaded_at TIMESTAMP)")
        writer = StagingWriter(conn, TRANSACTIONS, "raw.t", datetime.now(UTC))
        with pytest.raises(RawLoadError, match=r"into raw\.t failed"):
            for _ in range(100 * QUEUED_PAGES):
                writer.add(page)
            writer.finish()
        writer.close()
        assert conn.execute("SELECT count(*) FROM raw.t").fetchone() == (0,)
