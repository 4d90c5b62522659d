"""Odd but valid values from the API: ids of any content, NaN and infinity, values that cannot be
typed. Raw tables keep what was sent; core and mart tables hold typed values or NULL, and checks
count what was NULLed."""

from __future__ import annotations

import datetime as dt
import json

import dagster as dg

from fieldsales_dagster.client.endpoints import EVENTS, TRANSACTIONS
from fieldsales_dagster.loading.raw_load import load_list
from fieldsales_dagster_tests import core_payloads as p
from fieldsales_dagster_tests.conftest import lake_at, read_lake
from fieldsales_dagster_tests.hostile_lists import HostileServer
from fieldsales_dagster_tests.test_hostile_paging import hostile_api

#: Ids with every kind of character a JSON string can carry.
ODD_EVENT_IDS = ["ev-cr\rhere", "ev-line\nbreak", 'ev-"quoted"', "ev-tab\tand\\backslash"]
ODD_TRANSACTION_IDS = [
    "tx-line\nbreak",
    "tx-crlf\r\n",
    "tx-ctl\x00\x01\x02\x1f",
    '\x02"escaped-looking"',
    "tx-'single' \"double\"",
    "tx-unicode é✓😀\u2028",
    "tx-plain",
]


def _served(documents: dict[str, list[dict]]):
    """A server answering the event and transaction lists with ``documents``' items."""

    def answer(path: str, skip: int, limit: int) -> object:
        if path.endswith("/transaction/all"):
            items = documents["transactions"]
            if isinstance(items, bytes):  # a whole list as sent: one page
                return items if skip == 0 else {"transactions": [], "count": None}
            return {"transactions": items[skip : skip + limit], "count": len(items)}
        if path.endswith("/event/all"):
            return documents["events"][skip : skip + limit]
        return {"data": [], "total": 0}

    return HostileServer(answer)


def test_ids_of_any_content_are_stored_verbatim_in_raw_and_core(tmp_path):
    events = [p.event(event_id) for event_id in ODD_EVENT_IDS]
    transactions = [
        p.transaction(tx_id, event_id=ODD_EVENT_IDS[i % len(ODD_EVENT_IDS)])
        for i, tx_id in enumerate(ODD_TRANSACTION_IDS)
    ]
    documents = {"events": events, "transactions": transactions}
    database = tmp_path / "odd_ids.duckdb"
    warehouse = lake_at(database)
    with _served(documents) as server:
        api = hostile_api(server, page_size=1000)
        with warehouse.get_connection() as conn:
            load_list(api, conn, EVENTS)
            load_list(api, conn, TRANSACTIONS)
    p.materialize_core_only(database)

    expected_pairs = sorted((t["_id"], t["eventId"]) for t in transactions)
    assert p.query(database, "SELECT id FROM raw.events ORDER BY id") == [
        (i,) for i in sorted(ODD_EVENT_IDS)
    ]
    assert p.query(database, "SELECT id, event_id FROM raw.transactions ORDER BY id") == (
        expected_pairs
    )
    assert p.query(database, "SELECT event_id FROM core.events ORDER BY event_id") == [
        (i,) for i in sorted(ODD_EVENT_IDS)
    ]
    assert (
        p.query(
            database,
            "SELECT transaction_id, event_id FROM core.transactions ORDER BY transaction_id",
        )
        == expected_pairs
    )
    # Every transaction finds its event.
    assert p.query(
        database,
        "SELECT count(*) FROM core.transactions JOIN core.events USING (event_id)",
    ) == [(len(transactions),)]
    with read_lake(database) as conn:
        assert conn.execute(
            "SELECT count(*) FROM raw.transactions WHERE id = md5(payload::VARCHAR)"
        ).fetchone() == (0,)


def _evaluations(result) -> dict[tuple[str, str], object]:
    return {
        (e.asset_key.to_user_string(), e.check_name): e
        for e in result.get_asset_check_evaluations()
    }


def test_nan_and_infinity_are_null_in_core_and_mart_and_counted_by_a_warning(tmp_path):
    day = "2025-03-04T09:30:00.000Z"
    transactions = [
        p.transaction("t-ok", price=2.5, qty=4, saleTime=day),
        p.transaction("t-nan", price="NaN", saleTime=day),
        p.transaction("t-inf", price="Infinity", saleTime=day),
        p.transaction("t-neg-inf", qty="-Infinity", saleTime=day),
        p.transaction("t-literal", price="__1e309__", credits="__-1e309__", saleTime=day),
    ]
    # 1e309 as a JSON number literal (json.dumps cannot write one): valid JSON, too large.
    body = json.dumps({"transactions": transactions, "count": len(transactions)})
    body = body.replace('"__1e309__"', "1e309").replace('"__-1e309__"', "-1e309")
    database = tmp_path / "nan.duckdb"
    warehouse = lake_at(database)
    documents = {"events": [p.event("e1")], "transactions": body.encode()}
    with _served(documents) as server:
        api = hostile_api(server, page_size=1000)
        with warehouse.get_connection() as conn:
            load_list(api, conn, EVENTS)
            load_list(api, conn, TRANSACTIONS)
    checks = _evaluations(p.materialize_core_only(database, with_checks=True))

    # raw.* keeps what was sent.
    assert (
        p.query(database, "SELECT payload::VARCHAR FROM raw.transactions WHERE id = 't-literal'")[
            0
        ][0].count("1e309")
        == 2
    )
    assert p.query(
        database,
        "SELECT transaction_id, price, qty, total_value, credits FROM core.transactions "
        "ORDER BY transaction_id",
    ) == [
        ("t-inf", None, 4.0, None, 1.5),
        ("t-literal", None, 4.0, None, None),
        ("t-nan", None, 4.0, None, 1.5),
        ("t-neg-inf", 2.5, None, None, 1.5),
        ("t-ok", 2.5, 4.0, 10.0, 1.5),
    ]
    assert p.query(database, "SELECT total_value, transactions FROM mart.daily_sales") == [
        (10.0, 5)
    ]
    assert p.query(database, "SELECT total_value FROM mart.event_summary") == [(10.0,)]
    finite = checks[("core_transactions", "values_finite")]
    assert not finite.passed
    assert finite.severity == dg.AssetCheckSeverity.WARN
    assert finite.metadata["rows_with_nan_or_infinity"].value == 4
    assert finite.metadata["values_by_field"].value == "price: 3, credits: 1, qty: 1"
    sample = finite.metadata["sample"].value
    assert '"t-nan": price = "NaN" (not finite)' in sample
    assert '"t-literal": credits = "-1e309" (not finite)' in sample
    # The totals check now compares numbers, and agrees.
    assert checks[("mart_daily_sales", "daily_sales_match_transactions")].passed
    assert checks[("core_transactions", "values_typed")].passed


def test_values_that_cannot_be_typed_are_null_and_counted_with_ids_and_raw_values(tmp_path):
    number_field = p.field("f-num", "number")
    config = p.config("cfg-1", [number_field])
    transactions = [
        p.transaction("t-ok", report_config=config, report_results=p.results(**{"f-num": 3})),
        p.transaction("t-abc", price="abc"),
        p.transaction("t-epoch", saleTime=1704103200000),
        p.transaction("t-bool", item_credit_state="maybe", invoice_id="inv-9"),
        p.transaction("t-array", report_config=config, report_results=[{"value": 1}]),
        p.transaction(
            "t-answer", report_config=config, report_results=p.results(**{"f-num": "lots"})
        ),
        p.transaction("t-empty", price="", saleTime=None),  # empty and null: not counted
    ]
    events = [
        p.event("e1"),
        p.event("e-times", starts=("not a time",), stops=("2025-03-04T17:30:00.000Z",)),
        p.event("e-reports", customReportResult={"r-1": {"reportResults": {}}}),
        p.event("e-pos", pos=p.point_of_sale("pos-odd", location=["x", 52.5])),
    ]
    database = tmp_path / "untyped.duckdb"
    checks = _evaluations(
        p.materialize_core(database, transactions=transactions, events=events, with_checks=True)
    )

    assert p.query(
        database,
        "SELECT transaction_id, price, sale_time, item_credit_state, invoice_ids "
        "FROM core.transactions WHERE transaction_id IN ('t-abc', 't-epoch', 't-bool') "
        "ORDER BY transaction_id",
    ) == [
        ("t-abc", None, dt.datetime(2025, 3, 4, 9, 30), False, ["inv-1", "inv-2"]),
        ("t-bool", 2.5, dt.datetime(2025, 3, 4, 9, 30), None, None),
        ("t-epoch", 2.5, None, False, ["inv-1", "inv-2"]),
    ]
    typed = checks[("core_transactions", "values_typed")]
    assert (typed.passed, typed.severity) == (False, dg.AssetCheckSeverity.WARN)
    assert typed.metadata["rows_with_untyped_values"].value == 4
    assert typed.metadata["values_by_field"].value == (
        "_customReport.reportResults: 1, invoice_id: 1, item_credit_state: 1, price: 1, saleTime: 1"
    )
    sample = typed.metadata["sample"].value.splitlines()
    assert sample == [
        '"t-abc": price = "abc" (not a number)',
        '"t-array": _customReport.reportResults = "[{\\"value\\":1}]" (not an object)',
        '"t-bool": invoice_id = "inv-9" (not an array)',
        '"t-bool": item_credit_state = "maybe" (not a boolean)',
        '"t-epoch": saleTime = "1704103200000" (not a timestamp)',
    ]

    results = checks[("core_custom_report_results", "values_typed")]
    assert not results.passed
    assert results.metadata["rows_with_untyped_values"].value == 1
    assert results.metadata["sample"].value == (
        '"transaction / t-answer / f-num": value = "lots" (not a number)'
    )

    events_typed = checks[("core_events", "values_typed")]
    assert not events_typed.passed
    assert events_typed.metadata["rows_with_untyped_values"].value == 2
    assert events_typed.metadata["sample"].value.splitlines() == [
        '"e-reports": customReportResult = "{\\"r-1\\":{\\"reportResults\\":{}}}" (not an array)',
        '"e-times": times[].start = "not a time" (not a timestamp)',
    ]
    assert p.query(
        database, "SELECT planned_start FROM core.events WHERE event_id = 'e-times'"
    ) == [(None,)]

    pos = checks[("core_dim_point_of_sale", "values_typed")]
    assert not pos.passed
    assert pos.metadata["sample"].value == (
        '"pos-odd": location = "[\\"x\\",52.5]" (not a [longitude, latitude] pair)'
    )
    assert p.query(
        database, "SELECT longitude, latitude FROM core.dim_point_of_sale WHERE pos_id = 'pos-odd'"
    ) == [(None, 52.5)]


def test_nan_and_infinity_are_null_in_every_typed_core_column(tmp_path):
    slider = p.field("f-slider", "Slider", minimum="NaN", maximum=10, step="Infinity")
    config = p.config("cfg-1", [slider])
    transactions = [
        p.transaction("t-1", report_config=config, report_results=p.results(**{"f-slider": "NaN"}))
    ]
    places = {"place_id": "ChIJ1", "rating": "Infinity", "geometry": {"location": {"lat": "NaN"}}}
    events = [
        p.event(
            "e1",
            pos=p.point_of_sale("pos1", location=["NaN", 52.5], googleResult=places),
            history=[p.history_entry("h-1", "", "Planned", "infinity")],
            starts=("infinity",),
        )
    ]
    database = tmp_path / "finite.duckdb"
    checks = _evaluations(
        p.materialize_core(database, transactions=transactions, events=events, with_checks=True)
    )

    assert p.query(
        database, "SELECT slider_min, slider_max, slider_step FROM core.custom_report_fields"
    ) == [(None, 10.0, None)]
    assert p.query(database, "SELECT value_raw, value_number FROM core.custom_report_results") == [
        ("NaN", None)
    ]
    assert p.query(database, "SELECT changed_at FROM core.event_status_history") == [(None,)]
    assert p.query(database, "SELECT planned_start FROM core.events") == [(None,)]
    assert p.query(
        database, "SELECT longitude, latitude, rating, place_lat FROM core.dim_point_of_sale"
    ) == [(None, 52.5, None, None)]
    assert p.query(database, "SELECT longitude FROM core.dim_point_of_sale_history") == [(None,)]
    for table in ("core_custom_report_results", "core_dim_point_of_sale", "core_events"):
        assert not checks[(table, "values_finite")].passed, table
