"""Analyst-facing rules on hand-written payloads: every column described (Dagster and DuckDB),
empty strings stored as NULL, values typed, drift warned about, history kept, marts that add up."""

from __future__ import annotations

import re

import dagster as dg
import duckdb
import pytest

from fieldsales_dagster.assets.tables import derived_tables
from fieldsales_dagster.client import endpoints
from fieldsales_dagster.loading.raw_load import raw_table_ddl
from fieldsales_dagster_tests import core_payloads as p

CHECKBOX = p.field("f-box", "checkbox")
SLIDER = p.field("f-slider", "Slider", minimum=0, maximum=10, step=1)
COLOUR = p.field("f-colour", "colourPicker")
TEXT = p.field("f-text", "text")
CONFIG = p.config("cfg", [CHECKBOX, SLIDER, COLOUR, TEXT])

TABLES = derived_tables()


def report(transaction_id: str, event_id: str = "e-a", **values) -> dict:
    return p.transaction(
        transaction_id,
        event_id=event_id,
        report_config=CONFIG,
        report_results=p.results(**values),
    )


TRANSACTIONS = [
    report("t-true", **{"f-box": "true"}),
    report("t-yes", **{"f-box": "Yes"}),
    report("t-nein", **{"f-box": "nein"}),
    report("t-json-false", **{"f-box": False}),
    report("t-maybe", **{"f-box": "maybe"}),
    report("t-colour-number", **{"f-colour": 7}),
    report("t-colour-bool", **{"f-colour": True}),
    report("t-colour-text", **{"f-colour": "#fff"}),
    report("t-empty-text", **{"f-text": ""}),
    report("t-slider-bool", **{"f-slider": True}),
    p.transaction(
        "t-day2",
        event_id="e-b",
        saleTime="2025-03-05T10:00:00.000Z",
        price=1.0,
        qty=3,
        productId="p2",
        proxyProductName="",
        invoice_id=["", "inv-9"],
    ),
    p.transaction("t-orphan", event_id="e-never-listed", price=10.0, qty=1),
]

HISTORY = [
    p.history_entry("h-3", "Published", "Accepted", "2025-03-03T12:00:00.000Z", "u-acc"),
    p.history_entry("h-1", "", "Planned", "2025-03-01T00:00:00.000Z", "u-plan"),
    p.history_entry("h-2", "Planned", "Published", "2025-03-02T00:00:00.000Z", "u-plan"),
]


def pos_version(name: str, city: str = "Berlin", location=(13.4, 52.5)) -> dict:
    return p.point_of_sale(
        "pos-1",
        name=name,
        location=list(location),
        address={
            "company": "Shop GmbH",
            "city": city,
            "postal": "10115",
            "streetnumber": "Main St 1",
            "additional": "",
            "phone": "",
            "email": "",
            "fax": "",
            "website": "",
        },
    )


EVENTS = [
    p.event(
        "e-a",
        starts=("2025-03-04T08:00:00.000Z",),
        stops=("2025-03-04T16:00:00.000Z",),
        pos=pos_version("Old Name"),
        history=HISTORY,
        users=[p.user("u-acc"), p.user("u-2", email="")],
    ),
    p.event(
        "e-b",
        starts=("2025-04-01T08:00:00.000Z",),
        stops=("2025-04-01T16:00:00.000Z",),
        pos=pos_version("New Name", location=(13.5, 52.6)),
        eventState="Archived",
        history=[p.history_entry("h-b", "Published", "Archived", "2025-03-20T00:00:00.000Z")],
    ),
    p.event(
        "e-c",
        starts=("2025-05-01T08:00:00.000Z",),
        stops=("2025-05-01T16:00:00.000Z",),
        pos=pos_version("New Name", location=(13.5, 52.6)),
    ),
    p.event(
        "e-d",
        starts=("2025-06-01T08:00:00.000Z",),
        stops=("2025-06-01T16:00:00.000Z",),
        pos=pos_version("Old Name"),
        report_results=[p.event_report("r-1", "e-d", {"f-undefined": 2.5})],
    ),
]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    path = tmp_path_factory.mktemp("analyst") / "t.duckdb"
    result = p.materialize_core(
        path, transactions=TRANSACTIONS, events=EVENTS, with_checks=True, raise_on_error=False
    )
    return path, result


@pytest.fixture(scope="module")
def database(built):
    return built[0]


def evaluation(built, asset: str, check: str):
    (found,) = [
        e
        for e in built[1].get_asset_check_evaluations()
        if e.asset_key.to_user_string() == asset and e.check_name == check
    ]
    return found


def value(database, report_id: str, field_id: str, columns: str) -> tuple:
    (row,) = p.query(
        database,
        f"SELECT {columns} FROM core.custom_report_results WHERE report_id = ? AND field_id = ?",
        [report_id, field_id],
    )
    return row


def columns_of(database, table: str) -> list[tuple[str, str, str | None]]:
    schema, _, name = table.partition(".")
    return p.query(
        database,
        "SELECT column_name, data_type, comment FROM duckdb_columns() "
        "WHERE schema_name = ? AND table_name = ? ORDER BY column_index",
        [schema, name],
    )


# --- every column described -----------------------------------------------------------------


@pytest.mark.parametrize("table", TABLES, ids=lambda t: t.table)
def test_every_column_is_declared_with_a_description_in_table_order(database, table):
    stored = [name for name, _, _ in columns_of(database, table.table)]
    assert stored == [c.name for c in table.doc.columns]
    assert all(len(c.description) >= 8 for c in table.doc.columns)


@pytest.mark.parametrize(
    "endpoint",
    [endpoints.EVENTS, endpoints.TRANSACTIONS, endpoints.EVENT_GROUPS],
    ids=lambda e: e.name,
)
def test_every_raw_column_is_declared(tmp_path, endpoint):
    from fieldsales_dagster.assets.columns import table_doc

    with duckdb.connect(str(tmp_path / "r.duckdb")) as conn:
        conn.execute("CREATE SCHEMA raw")
        conn.execute(raw_table_ddl(endpoint, endpoint.raw_table))
        stored = [r[0] for r in conn.execute(f"DESCRIBE {endpoint.raw_table}").fetchall()]
    doc = table_doc(f"raw_{endpoint.name}")
    assert stored == [c.name for c in doc.columns]
    assert doc.description


@pytest.mark.parametrize("table", TABLES, ids=lambda t: t.table)
def test_descriptions_are_duckdb_comments_on_table_and_columns(database, table):
    schema, _, name = table.table.partition(".")
    ((comment,),) = p.query(
        database,
        "SELECT comment FROM duckdb_tables() WHERE schema_name = ? AND table_name = ?",
        [schema, name],
    )
    assert comment == table.description
    for (column, _, text), declared in zip(
        columns_of(database, table.table), table.doc.columns, strict=True
    ):
        assert text.startswith(declared.description), column


def materialization_metadata(built, asset: str) -> dict:
    (event,) = [
        m for m in built[1].get_asset_materialization_events() if m.asset_key.path == [asset]
    ]
    return event.materialization.metadata


def test_column_schema_describes_every_column_and_tags_personal_ones(built):
    schema = materialization_metadata(built, "core_users")["dagster/column_schema"].value
    tagged = {c.name for c in schema.columns if c.tags and "pii" in c.tags}
    assert tagged == {"first_name", "last_name", "email"}
    assert all(c.description for c in schema.columns)
    email = next(c for c in schema.columns if c.name == "email")
    assert "Personal data" in email.description


def test_personal_columns_are_tagged_where_they_hold_names_emails_and_ips():
    tagged = {(t.table, c.name) for t in TABLES for c in t.doc.columns if c.pii}
    assert tagged == {
        ("core.users", "first_name"),
        ("core.users", "last_name"),
        ("core.users", "email"),
        ("core.dim_point_of_sale", "email"),
        ("core.event_status_history", "client_ip"),
        ("mart.user_activity", "first_name"),
        ("mart.user_activity", "last_name"),
    }


def test_preview_leaves_out_personal_columns(built):
    preview = materialization_metadata(built, "core_users")["preview"].value
    assert re.search(r"^\|\s*user_id\s*\|", preview, re.M)
    assert "first_name" not in preview and "email" not in preview and "@example.com" not in preview


# --- empty means NULL -----------------------------------------------------------------------


@pytest.mark.parametrize("table", TABLES, ids=lambda t: t.table)
def test_no_empty_string_is_stored_in_core_or_mart(database, table):
    for column, data_type, text in columns_of(database, table.table):
        if data_type == "VARCHAR":
            sql = f"SELECT count(*) FROM {table.table} WHERE \"{column}\" = ''"
        elif data_type == "VARCHAR[]":
            sql = f"SELECT count(*) FROM {table.table} WHERE list_contains(\"{column}\", '')"
        else:
            continue
        assert p.query(database, sql) == [(0,)], column
        assert "empty string from the API is stored as NULL" in text


def test_empty_address_fields_and_list_items_become_null(database):
    assert p.query(database, "SELECT phone, email, fax, website FROM core.dim_point_of_sale") == [
        (None, None, None, None)
    ]
    assert p.query(
        database,
        "SELECT proxy_product_name, invoice_ids FROM core.transactions "
        "WHERE transaction_id = 't-day2'",
    ) == [(None, [None, "inv-9"])]
    assert p.query(database, "SELECT email FROM core.users WHERE user_id = 'u-2'") == [(None,)]


def test_raw_payload_keeps_empty_strings_as_received(database):
    assert p.query(
        database, "SELECT payload->>'$.point_of_sale.address.fax' FROM raw.events LIMIT 1"
    ) == [("",)]


# --- every value typed ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("report_id", "expected"),
    [("t-true", True), ("t-yes", True), ("t-nein", False), ("t-json-false", False)],
)
def test_checkbox_answers_are_booleans(database, report_id, expected):
    assert value(database, report_id, "f-box", "value_bool, value_kind") == (expected, "boolean")


def test_checkbox_answer_that_is_no_boolean_word_keeps_value_raw_only(database):
    row = value(database, "t-maybe", "f-box", "value_raw, value_bool, value_text")
    assert row == ("maybe", None, None)


def test_unknown_field_type_number_is_typed_by_json_type_outside_value_number(database):
    row = value(
        database, "t-colour-number", "f-colour", "value_kind, value_json_number, value_number"
    )
    assert row == ("json_number", 7.0, None)


def test_unknown_field_type_string_is_typed_by_json_type_outside_value_text(database):
    row = value(database, "t-colour-text", "f-colour", "value_kind, value_json_text, value_text")
    assert row == ("json_string", "#fff", None)


def test_json_boolean_is_value_bool_whatever_the_field_type(database):
    assert value(database, "t-colour-bool", "f-colour", "value_kind, value_bool") == (
        "json_boolean",
        True,
    )
    assert value(database, "t-slider-bool", "f-slider", "value_kind, value_bool") == (
        "number",
        True,
    )


def test_value_of_a_field_no_configuration_defines_is_typed_by_json_type(database):
    row = value(database, "r-1", "f-undefined", "field_type, value_kind, value_json_number")
    assert row == (None, "json_number", 2.5)


def test_empty_text_answer_is_null(database):
    assert value(database, "t-empty-text", "f-text", "value_raw, value_text") == (None, None)


def test_field_types_table_counts_each_type_and_says_whether_it_is_decoded(database):
    rows = p.query(
        database,
        "SELECT field_type, decoded, decoded_as, field_count, result_count, untyped_count "
        "FROM core.custom_report_field_types ORDER BY field_type",
    )
    assert rows == [
        ("Slider", True, "number", 1, 1, 0),
        ("checkbox", True, "boolean", 1, 5, 1),
        ("colourPicker", False, None, 1, 3, 0),
        ("text", True, "text", 1, 1, 0),
    ]


def test_new_field_type_warns(built):
    found = evaluation(built, "core_custom_report_field_types", "field_types_known")
    assert not found.passed
    assert found.severity == dg.AssetCheckSeverity.WARN
    assert found.metadata["new_field_types"].value == "colourPicker"


def test_new_event_state_warns(built):
    found = evaluation(built, "core_event_status_history", "event_states_known")
    assert not found.passed
    assert found.severity == dg.AssetCheckSeverity.WARN
    assert found.metadata["new_states"].value == "Archived"


# --- history --------------------------------------------------------------------------------


def test_point_of_sale_history_has_a_version_per_change_with_validity(database):
    rows = p.query(
        database,
        "SELECT version, valid_from::VARCHAR, valid_to::VARCHAR, is_current, name, longitude, "
        "event_count, first_event_id FROM core.dim_point_of_sale_history ORDER BY version",
    )
    assert rows == [
        (1, "2025-03-04 08:00:00", "2025-04-01 08:00:00", False, "Old Name", 13.4, 1, "e-a"),
        (2, "2025-04-01 08:00:00", "2025-06-01 08:00:00", False, "New Name", 13.5, 2, "e-b"),
        (3, "2025-06-01 08:00:00", None, True, "Old Name", 13.4, 1, "e-d"),
    ]


def test_current_history_version_is_the_dimension_row(database):
    assert p.query(
        database,
        "SELECT h.name, h.city, h.longitude FROM core.dim_point_of_sale_history AS h "
        "WHERE is_current",
    ) == p.query(database, "SELECT name, city, longitude FROM core.dim_point_of_sale")


def test_state_durations_run_from_entering_to_the_next_change(database):
    rows = p.query(
        database,
        "SELECT state, entered_at::VARCHAR, left_at::VARCHAR, seconds_in_state, next_state, "
        "is_current FROM core.event_state_durations WHERE event_id = 'e-a' ORDER BY seq",
    )
    assert rows == [
        ("Planned", "2025-03-01 00:00:00", "2025-03-02 00:00:00", 86400.0, "Published", False),
        ("Published", "2025-03-02 00:00:00", "2025-03-03 12:00:00", 129600.0, "Accepted", False),
        ("Accepted", "2025-03-03 12:00:00", None, None, None, True),
    ]


# --- marts ----------------------------------------------------------------------------------


def test_daily_sales_groups_by_day_project_pos_and_area(database):
    rows = p.query(
        database,
        "SELECT sale_date::VARCHAR, project_id, pos_id, area_id, transactions, qty, "
        "total_value, distinct_products FROM mart.daily_sales ORDER BY ALL",
    )
    assert rows == [
        ("2025-03-04", "proj1", "pos-1", "area1", 10, 40.0, 100.0, 1),
        ("2025-03-04", None, None, None, 1, 1.0, 10.0, 1),
        ("2025-03-05", "proj1", "pos-1", "area1", 1, 3.0, 3.0, 1),
    ]


def test_event_summary_has_sales_state_times_and_lead_times(database):
    (row,) = p.query(
        database,
        "SELECT transactions, total_value, assigned_user_count, planned_at::VARCHAR, "
        "accepted_at::VARCHAR, hours_planned_to_published, hours_published_to_accepted, "
        "hours_invoiced_to_paid FROM mart.event_summary WHERE event_id = 'e-a'",
    )
    assert row == (10, 100.0, 2, "2025-03-01 00:00:00", "2025-03-03 12:00:00", 24.0, 36.0, None)
    assert p.query(database, "SELECT count(*) FROM mart.event_summary") == [(4,)]


def test_user_activity_counts_status_changes_and_sales_per_user_and_day(database):
    rows = p.query(
        database,
        "SELECT activity_date::VARCHAR, events_planned, status_changes, transactions, "
        "total_value FROM mart.user_activity WHERE user_id = 'u-acc' ORDER BY activity_date",
    )
    assert rows == [
        ("2025-03-03", 0, 1, 0, 0.0),
        ("2025-03-04", 1, 0, 10, 100.0),
    ]


@pytest.mark.parametrize(
    ("asset", "check"),
    [
        ("mart_daily_sales", "daily_sales_match_transactions"),
        ("mart_event_summary", "event_summary_matches_events"),
        ("mart_user_activity", "user_activity_matches_status_changes"),
        ("mart_daily_sales", "ids_unique"),
    ],
)
def test_mart_checks_pass_when_marts_add_up(built, asset, check):
    assert evaluation(built, asset, check).passed
