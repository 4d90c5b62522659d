"""Transaction decoding into core.transactions."""

from __future__ import annotations

import datetime as dt

import pytest

from fieldsales_dagster_tests import core_payloads as p

CONFIG = p.config("cfg-1", [p.field("f-1", "number")])

TRANSACTIONS = [
    p.transaction("t-full", price=2.5, qty=4, report_config=CONFIG, report_results={}),
    p.transaction(
        "t-offset",
        saleTime="2025-03-04T11:30:00.000+02:00",
        created="2025-03-04T09:30:00.000Z",
        date="2025-03-04T09:30:00.000Z",
    ),
    p.transaction(
        "t-config-id-only-embedded",
        _customReport={"reportResults": {}, "_configcreatedTime": {"_id": "cfg-embedded"}},
    ),
    {"_id": "t-minimal", "eventId": "e1"},
]


@pytest.fixture(scope="module")
def database(tmp_path_factory):
    path = tmp_path_factory.mktemp("transactions") / "t.duckdb"
    p.materialize_core(path, transactions=TRANSACTIONS)
    return path


def row(database, transaction_id: str, columns: str) -> tuple:
    rows = p.query(
        database,
        f"SELECT {columns} FROM core.transactions WHERE transaction_id = ?",
        [transaction_id],
    )
    assert len(rows) == 1, rows
    return rows[0]


def test_total_value_is_price_times_qty(database):
    assert row(database, "t-full", "price, qty, total_value") == (2.5, 4.0, 10.0)


def test_references_and_product_are_decoded(database):
    assert row(database, "t-full", "event_id, product_id, proxy_product_name") == (
        "e1",
        "p1",
        "Cola 0.5l",
    )


def test_timestamps_are_utc_timestamps(database):
    expected = dt.datetime(2025, 3, 4, 9, 30)
    assert row(database, "t-full", "sale_time, created, date") == (expected,) * 3
    assert p.query(
        database,
        "SELECT data_type FROM information_schema.columns "
        "WHERE table_name = 'transactions' AND column_name = 'sale_time'",
    ) == [("TIMESTAMP",)]


def test_timestamp_with_an_offset_is_converted_to_utc(database):
    assert row(database, "t-offset", "sale_time") == (dt.datetime(2025, 3, 4, 9, 30),)


def test_invoice_and_credit_state_are_decoded(database):
    assert row(
        database,
        "t-full",
        "invoice_status, invoice_ids, prev_invoice_id, credits, item_credit_state",
    ) == ("ReadyToInvoice", ["inv-1", "inv-2"], "inv-0", 1.5, False)


def test_export_processed_comes_from_export_details(database):
    assert row(database, "t-full", "export_processed") == (True,)


def test_custom_report_config_id_comes_from_custom_report_config(database):
    assert row(database, "t-full", "custom_report_config_id") == ("cfg-1",)


def test_custom_report_config_id_falls_back_to_the_configurations_id(database):
    assert row(database, "t-config-id-only-embedded", "custom_report_config_id") == (
        "cfg-embedded",
    )


def test_missing_optional_fields_give_nulls(database):
    assert row(
        database,
        "t-minimal",
        "event_id, price, total_value, sale_time, invoice_ids, export_processed, "
        "custom_report_config_id",
    ) == ("e1", None, None, None, None, None, None)
