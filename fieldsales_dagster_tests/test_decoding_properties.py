"""Property-based decoding: generated transaction and event payloads, odd but valid values
included, decoded by the core queries into a real DuckDB file, equal a small, independent Python
decoding of the same payloads (the "Values" rules of docs/tables.md, written again in Python).

Examples are bounded and derandomized, so a run is deterministic and takes seconds.
"""

from __future__ import annotations

import json
import math
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fieldsales_dagster.assets.build import build_described_table
from fieldsales_dagster.assets.tables import derived_tables
from fieldsales_dagster.warehouse.warehouse import FieldSalesWarehouse
from fieldsales_dagster_tests import core_payloads as p

PROPERTY_SETTINGS = settings(
    max_examples=12,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

#: A JSON number too large for a double, written as a literal (json.dumps cannot write one).
TOO_LARGE = "__literal_1e309__"
#: A key left out of the payload.
ABSENT = object()

# --- generated values -----------------------------------------------------------------------

ID_CHARS = st.sampled_from(list("ab7-_ \"'\\\n\r\t\x01\x02é😀"))
ids = st.text(ID_CHARS, min_size=1, max_size=6)

finite_numbers = st.one_of(
    st.integers(-(10**12), 10**12),
    st.floats(allow_nan=False, allow_infinity=False, width=64),
)
numbers = st.one_of(
    finite_numbers,
    finite_numbers.map(lambda x: repr(float(x))),  # a numeric string: "12.5", "1e+300"
    st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", TOO_LARGE]),  # not finite
    st.sampled_from(["abc", "12,5", " 7", "0x10", "", True, [1, 2], {"v": 1}, None, ABSENT]),
)
instants = st.datetimes(datetime(2000, 1, 1), datetime(2030, 12, 31)).map(
    lambda d: d.replace(microsecond=d.microsecond // 1000 * 1000)
)
timestamps = st.one_of(
    instants.map(lambda d: d.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"),
    st.tuples(instants, st.integers(-12, 14)).map(
        lambda pair: pair[0].strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + f"{pair[1]:+03d}:00"
    ),
    st.integers(10**11, 2 * 10**12),  # epoch milliseconds: not decoded
    st.sampled_from(["not a time", "2025-13-45T00:00:00.000Z", "", None, ABSENT]),
)
booleans = st.sampled_from([True, False, "true", "FALSE", "maybe", 1, 0, "", None, ABSENT])
invoice_lists = st.one_of(
    st.lists(st.text("abc-1", min_size=1, max_size=4), max_size=3),
    st.sampled_from(["inv-1", {"id": "x"}, None, ABSENT]),
)
# Report answers: JSON floats aside, since value_raw shows a float as DuckDB renders it
# (5.043e+16 as 50430290912594430.0), not as the text received.
answers = st.one_of(
    st.integers(-(10**12), 10**12),
    numbers.filter(lambda v: v is not ABSENT and not isinstance(v, float)),
    booleans.filter(lambda v: v is not ABSENT),
    st.text("ab1", max_size=3),
)

#: Every generated transaction resolves its results against this configuration.
FIELDS = {"f-num": "number", "f-slider": "Slider", "f-text": "text", "f-check": "checkbox"}
CONFIG = p.config("cfg-1", [p.field(fid, kind) for fid, kind in FIELDS.items()])
report_results = st.one_of(
    st.dictionaries(st.sampled_from(sorted(FIELDS)), answers, max_size=4).map(
        lambda values: {key: {"value": v, "name": key, "fieldId": key} for key, v in values.items()}
    ),
    st.sampled_from([[{"value": 1}], "results", ABSENT]),  # not an object
)


@st.composite
def transactions(draw: st.DrawFn) -> list[dict[str, Any]]:
    tx_ids = draw(st.lists(ids, min_size=1, max_size=4, unique=True))
    out = []
    for tx_id in tx_ids:
        item: dict[str, Any] = {
            "_id": tx_id,
            "eventId": draw(st.one_of(ids, st.integers(1000, 1003))),
            "productId": "p1",
            "price": draw(numbers),
            "qty": draw(numbers),
            "credits": draw(numbers),
            "saleTime": draw(timestamps),
            "created": draw(timestamps),
            "date": draw(timestamps),
            "invoice_status": "ReadyToInvoice",
            "invoice_id": draw(invoice_lists),
            "item_credit_state": draw(booleans),
            "exportDetails": {
                key: value
                for key, value in {"processed": draw(booleans)}.items()
                if value is not ABSENT
            },
        }
        results = draw(report_results)
        if results is not ABSENT:
            item["_customReport"] = {
                "_customReportConfig": "cfg-1",
                "_configcreatedTime": CONFIG,
                "reportResults": results,
            }
        out.append({key: value for key, value in item.items() if value is not ABSENT})
    return out


references = st.one_of(
    st.builds(lambda i: {"_id": i, "name": "n"}, ids),
    ids,
    st.integers(1, 99),
    st.sampled_from([{"name": "no id"}, ["x"], True, None, ABSENT]),
)
lists = st.sampled_from([{"not": "a list"}, "text", None, ABSENT])


@st.composite
def events(draw: st.DrawFn) -> list[dict[str, Any]]:
    event_ids = draw(st.lists(ids, min_size=1, max_size=4, unique=True))
    out = []
    for event_id in event_ids:
        times = draw(
            st.one_of(
                st.lists(
                    st.fixed_dictionaries({"start": timestamps, "stop": timestamps}), max_size=3
                ),
                lists,
            )
        )
        if isinstance(times, list):
            times = [{k: v for k, v in t.items() if v is not ABSENT} for t in times]
        item = {
            "_id": event_id,
            "project_id": draw(references),
            "point_of_sale": draw(references),
            "times": times,
            "eventState": "Published",
            "eventUser": draw(st.one_of(st.just([{"_id": "u1"}]), lists)),
            "eventStateHistory": draw(st.one_of(st.just([]), lists)),
            "customReportResult": draw(
                st.one_of(
                    st.lists(
                        st.builds(
                            lambda r: {"_id": "r", "reportResults": r},
                            st.sampled_from([{}, [], "x", None]),
                        ),
                        max_size=2,
                    ),
                    lists,
                )
            ),
        }
        out.append({key: value for key, value in item.items() if value is not ABSENT})
    return out


# --- the independent decoding ---------------------------------------------------------------

DECIMAL = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
NOT_FINITE_WORDS = {"nan", "infinity", "-infinity", "inf", "-inf", "+inf", "+infinity"}


def present(value: object) -> bool:
    return value is not ABSENT and value is not None and value != ""


def as_text(value: object) -> str:
    """A value as received, as text: a string's characters, else its JSON."""
    if value == TOO_LARGE:
        return "1e309"
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def not_finite(value: object) -> bool:
    if value == TOO_LARGE:
        return True
    if isinstance(value, str):
        return value.lower() in NOT_FINITE_WORDS or (
            DECIMAL.fullmatch(value) is not None and math.isinf(float(value))
        )
    return False


def number(value: object) -> float | None:
    if isinstance(value, bool) or value == TOO_LARGE:
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str) and DECIMAL.fullmatch(value):
        x = float(value)
        return x if math.isfinite(x) else None
    return None


def timestamp(value: object) -> datetime | None:
    if not isinstance(value, str) or not re.match(r"\d{4}-\d\d-\d\d", value):
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed.astimezone(UTC).replace(tzinfo=None)


def boolean(value: object) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return None


def text_list(value: object) -> list[str] | None:
    return list(value) if isinstance(value, list) else None


def reference(value: object) -> str | None:
    if isinstance(value, dict):
        found = value.get("_id")
        return found if isinstance(found, str) else None
    if isinstance(value, str):
        return value
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else None


def untyped(field: str, value: object, typed: object, expected: str) -> tuple | None:
    if typed is not None or not present(value):
        return None
    problem = "not finite" if not_finite(value) else f"not {expected}"
    return (field, as_text(value)[:200], problem)


def untyped_list(entries: list[tuple | None]) -> list[tuple] | None:
    found = sorted(entry for entry in entries if entry is not None)
    return found or None


def empty_is_null(text: str | None) -> str | None:
    return None if text == "" else text


def expected_transaction(item: dict[str, Any]) -> tuple:
    get = item.get
    price, qty, credits = number(get("price")), number(get("qty")), number(get("credits"))
    sale_time, created, date = (timestamp(get(k)) for k in ("saleTime", "created", "date"))
    invoices = text_list(get("invoice_id"))
    credit_state = boolean(get("item_credit_state"))
    processed = boolean(get("exportDetails", {}).get("processed", ABSENT))
    results = get("_customReport", {}).get("reportResults", ABSENT)
    total = price * qty if price is not None and qty is not None else None
    event_id = get("eventId")
    return (
        item["_id"],
        event_id if isinstance(event_id, str) else str(event_id),
        price,
        qty,
        total if total is None or math.isfinite(total) else None,
        sale_time,
        created,
        date,
        invoices,
        credits,
        credit_state,
        processed,
        untyped_list(
            [
                untyped("price", get("price", ABSENT), price, "a number"),
                untyped("qty", get("qty", ABSENT), qty, "a number"),
                untyped("saleTime", get("saleTime", ABSENT), sale_time, "a timestamp"),
                untyped("created", get("created", ABSENT), created, "a timestamp"),
                untyped("date", get("date", ABSENT), date, "a timestamp"),
                untyped("invoice_id", get("invoice_id", ABSENT), invoices, "an array"),
                untyped("credits", get("credits", ABSENT), credits, "a number"),
                untyped(
                    "item_credit_state", get("item_credit_state", ABSENT), credit_state, "a boolean"
                ),
                untyped(
                    "exportDetails.processed",
                    get("exportDetails", {}).get("processed", ABSENT),
                    processed,
                    "a boolean",
                ),
                untyped(
                    "_customReport.reportResults",
                    results,
                    True if isinstance(results, dict) else None,
                    "an object",
                ),
            ]
        ),
    )


BOOLEAN_WORDS = {
    **dict.fromkeys(("true", "yes", "y", "ja", "j", "1", "on", "x", "checked"), True),
    **dict.fromkeys(("false", "no", "n", "nein", "0", "off", "unchecked"), False),
}


def expected_results(item: dict[str, Any]) -> list[tuple]:
    results = item.get("_customReport", {}).get("reportResults")
    if not isinstance(results, dict):
        return []
    out = []
    for field_id, entry in results.items():
        value, kind = entry["value"], FIELDS[field_id]
        raw = empty_is_null(None if value is None else as_text(value))
        value_number = number(value) if kind in ("number", "Slider") else None
        value_bool = None
        if isinstance(value, bool):
            value_bool = value
        elif kind == "checkbox" and raw is not None:
            value_bool = BOOLEAN_WORDS.get(raw.strip().lower())
        typed = {"number": value_number, "Slider": value_number, "checkbox": value_bool}
        expected = "a boolean" if kind == "checkbox" else "a number"
        problem = untyped("value", value, typed[kind], expected) if kind in typed else None
        out.append(
            (
                item["_id"],
                field_id,
                raw,
                value_number,
                empty_is_null(raw) if kind == "text" else None,
                value_bool,
                [problem] if problem else None,
            )
        )
    return out


def expected_event(item: dict[str, Any]) -> tuple:
    get = item.get
    times = get("times", ABSENT)
    starts, stops, time_problems = [], [], []
    if isinstance(times, list):
        for entry in times:
            start, stop = timestamp(entry.get("start")), timestamp(entry.get("stop"))
            starts.append(start)
            stops.append(stop)
            time_problems += [
                untyped("times[].start", entry.get("start", ABSENT), start, "a timestamp"),
                untyped("times[].stop", entry.get("stop", ABSENT), stop, "a timestamp"),
            ]
    project, pos = reference(get("project_id", ABSENT)), reference(get("point_of_sale", ABSENT))

    def shape(key: str, expected: type, what: str) -> tuple | None:
        value = get(key, ABSENT)
        ok = True if isinstance(value, expected) else None
        return untyped(key, value, ok, what) if value != "" else None

    reports = get("customReportResult", ABSENT)
    report_problems = [
        untyped(
            "customReportResult[].reportResults",
            report["reportResults"],
            True if isinstance(report["reportResults"], dict) else None,
            "an object",
        )
        for report in (reports if isinstance(reports, list) else [])
    ]
    return (
        item["_id"],
        empty_is_null(project),
        empty_is_null(reference(get("point_of_sale", ABSENT))),
        min((s for s in starts if s is not None), default=None),
        max((s for s in stops if s is not None), default=None),
        untyped_list(
            [
                untyped("project_id", get("project_id", ABSENT), project, "a reference"),
                untyped("point_of_sale", get("point_of_sale", ABSENT), pos, "a reference"),
                shape("times", list, "an array"),
                shape("eventUser", list, "an array"),
                shape("eventStateHistory", list, "an array"),
                shape("customReportResult", list, "an array"),
                *time_problems,
                *report_problems,
            ]
        ),
    )


# --- the decoding under test ----------------------------------------------------------------

TABLES = {table.table: table for table in derived_tables() if table.schema == "core"}


def payload_text(item: dict[str, Any]) -> str:
    return json.dumps(item).replace(f'"{TOO_LARGE}"', "1e309")


@contextmanager
def core_tables(
    raw_transactions: list[dict], raw_events: list[dict], tables: tuple[str, ...]
) -> Iterator[duckdb.DuckDBPyConnection]:
    """A new DuckDB file whose raw tables hold these payloads, and ``tables`` built from them by
    their asset's own code; yields a connection to it."""
    with tempfile.TemporaryDirectory(prefix="fieldsales-properties-") as folder:
        database = str(Path(folder) / "p.duckdb")
        warehouse = FieldSalesWarehouse(threads=1)  # its settings only: pii
        with duckdb.connect(database) as conn:
            conn.execute("CREATE SCHEMA raw")
            conn.execute("CREATE TABLE raw.events (id VARCHAR, payload JSON, loaded_at TIMESTAMP)")
            conn.execute(
                "CREATE TABLE raw.transactions "
                "(id VARCHAR, event_id VARCHAR, payload JSON, loaded_at TIMESTAMP)"
            )
            for item in raw_events:
                conn.execute(
                    "INSERT INTO raw.events VALUES (?, ?, now()::TIMESTAMP)",
                    [item["_id"], payload_text(item)],
                )
            for item in raw_transactions:
                conn.execute(
                    "INSERT INTO raw.transactions VALUES (?, ?, ?, now()::TIMESTAMP)",
                    [item["_id"], str(item["eventId"]), payload_text(item)],
                )
            for table in tables:
                build_described_table(conn, TABLES[table], warehouse)
            yield conn


def by_key(rows: list[tuple], key_columns: int) -> dict[tuple, tuple]:
    """Rows by their key (the first ``key_columns``); the last column, untyped_values, as sorted
    (field, value, problem) tuples."""
    out = {}
    for row in rows:
        *values, untyped_entries = row
        if untyped_entries is not None and untyped_entries and isinstance(untyped_entries[0], dict):
            untyped_entries = sorted(
                (e["field"], e["value"], e["problem"]) for e in untyped_entries
            )
        out[tuple(values[:key_columns])] = (*values[key_columns:], untyped_entries)
    assert len(out) == len(rows), "duplicate keys"
    return out


@PROPERTY_SETTINGS
@given(transactions())
def test_core_transactions_and_results_equal_an_independent_decoding(items):
    tables = ("core.transactions", "core.custom_report_fields", "core.custom_report_results")
    with core_tables(items, [], tables) as conn:
        rows = conn.execute(
            "SELECT transaction_id, event_id, price, qty, total_value, sale_time, created, date, "
            "invoice_ids, credits, item_credit_state, export_processed, untyped_values "
            "FROM core.transactions"
        ).fetchall()
        results = conn.execute(
            "SELECT transaction_id, field_id, value_raw, value_number, value_text, value_bool, "
            "untyped_values FROM core.custom_report_results"
        ).fetchall()
    assert by_key(rows, 1) == by_key([expected_transaction(item) for item in items], 1)
    expected = [row for item in items for row in expected_results(item)]
    assert by_key(results, 2) == by_key(expected, 2)


@PROPERTY_SETTINGS
@given(events())
def test_core_events_equal_an_independent_decoding(items):
    with core_tables([], items, ("core.events",)) as conn:
        rows = conn.execute(
            "SELECT event_id, project_id, pos_id, planned_start, planned_stop, untyped_values "
            "FROM core.events"
        ).fetchall()
    assert by_key(rows, 1) == by_key([expected_event(item) for item in items], 1)
