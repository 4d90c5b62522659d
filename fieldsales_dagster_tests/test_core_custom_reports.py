"""Custom report decoding: configurations, field resolution, typed values, slider validity.

One dataset is materialized once for the module; each test reads the rows of the transaction or
event written for its behaviour.
"""

from __future__ import annotations

import pytest

from fieldsales_dagster_tests import core_payloads as p

SLIDER_TENTHS = p.field("f-tenths", "Slider", minimum=0, maximum=1, step=0.1)
SLIDER_FROM_ONE = p.field("f-odd", "Slider", minimum=1, maximum=9, step=2)
NUMBER = p.field("f-number", "number")
TEXT = p.field("f-text", "text")
UPLOAD = p.field("f-upload", "upload")
UNKNOWN = p.field("f-colour", "colourPicker")

MAIN_CONFIG = p.config("cfg-main", [SLIDER_TENTHS, SLIDER_FROM_ONE, NUMBER, TEXT, UPLOAD, UNKNOWN])
NESTED_CONFIG = p.config("cfg-nested", [p.field("f-nested", "number")])
# The same field id in two configurations, with different slider bounds.
SHARED_OLD = p.config("cfg-old", [p.field("f-shared", "Slider", minimum=0, maximum=5, step=1)])
SHARED_NEW = p.config("cfg-new", [p.field("f-shared", "Slider", minimum=0, maximum=100, step=10)])


def main(transaction_id: str, **values) -> dict:
    return p.transaction(
        transaction_id, report_config=MAIN_CONFIG, report_results=p.results(**values)
    )


TRANSACTIONS = [
    main("t-tenth", **{"f-tenths": 0.3}),
    main("t-off-tenth", **{"f-tenths": 0.35}),
    main("t-out-of-range", **{"f-tenths": 1.5}),
    main("t-odd-step", **{"f-odd": 5}),
    main("t-even-step", **{"f-odd": 4}),
    main("t-slider-string", **{"f-tenths": "0.5"}),
    main("t-number-string", **{"f-number": "12.5"}),
    main("t-number", **{"f-number": 7}),
    main("t-digits", **{"f-text": "00123"}),
    main("t-upload", **{"f-upload": "file-77"}),
    main("t-unknown-type", **{"f-colour": "#ff0000"}),
    main("t-undefined-field", **{"f-nowhere": "x"}),
    p.transaction(
        "t-no-field-id",
        report_config=MAIN_CONFIG,
        report_results={"f-number": {"value": 3, "name": "Count"}},
    ),
    p.transaction(
        "t-config-not-embedded",
        _customReport={
            "_customReportConfig": "cfg-main",
            "reportResults": p.results(**{"f-odd": 3}),
        },
    ),
    p.transaction(
        "t-nested",
        report_config=NESTED_CONFIG,
        nested_config=True,
        report_results=p.results(**{"f-nested": 42}),
    ),
    p.transaction(
        "t-shared-old",
        report_config=SHARED_OLD,
        report_results=p.results(**{"f-shared": 4}),
        created="2025-01-01T00:00:00.000Z",
    ),
    p.transaction(
        "t-shared-new",
        report_config=SHARED_NEW,
        report_results=p.results(**{"f-shared": 40}),
        created="2025-06-01T00:00:00.000Z",
    ),
]
# Copies of one configuration that differ: the copy of the latest created transaction is kept,
# then the greatest transaction id; one without a creation time comes last.
COPIES = [
    ("t-copy-old", "2025-01-01T00:00:00.000Z", 5),
    ("t-copy-b", "2025-06-01T00:00:00.000Z", 50),
    ("t-copy-a", "2025-06-01T00:00:00.000Z", 7),
    ("t-copy-undated", None, 9),
]
TRANSACTIONS += [
    p.transaction(
        transaction_id,
        report_config=p.config("cfg-copies", [p.field("f-copy", "Slider", maximum=maximum)]),
        report_results=p.results(**{"f-copy": 1}),
        created=created,
    )
    for transaction_id, created, maximum in COPIES
]
EVENTS = [
    p.event(
        "e1",
        report_results=[
            p.event_report("r-text", "e1", {"f-text": "0815"}),
            p.event_report("r-shared", "e1", {"f-shared": 50}),
            p.event_report("r-unknown", "e1", {"f-not-configured": 3}),
        ],
    )
]


@pytest.fixture(scope="module")
def database(tmp_path_factory):
    path = tmp_path_factory.mktemp("custom_reports") / "t.duckdb"
    p.materialize_core(path, transactions=TRANSACTIONS, events=EVENTS)
    return path


def result(database, report_id: str, field_id: str) -> dict:
    rows = p.query(
        database,
        "SELECT * FROM core.custom_report_results WHERE report_id = ? AND field_id = ?",
        [report_id, field_id],
    )
    assert len(rows) == 1, rows
    columns = [
        r[0]
        for r in p.query(
            database,
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_name = 'custom_report_results' ORDER BY ordinal_position",
        )
    ]
    return dict(zip(columns, rows[0], strict=True))


def test_configuration_at_the_top_location_defines_its_fields(database):
    rows = p.query(
        database,
        "SELECT field_id, field_type, slider_min, slider_max, slider_step "
        "FROM core.custom_report_fields WHERE config_id = 'cfg-main' ORDER BY field_id",
    )
    assert rows == [
        ("f-colour", "colourPicker", None, None, None),
        ("f-number", "number", None, None, None),
        ("f-odd", "Slider", 1.0, 9.0, 2.0),
        ("f-tenths", "Slider", 0.0, 1.0, 0.1),
        ("f-text", "text", None, None, None),
        ("f-upload", "upload", None, None, None),
    ]


def test_configuration_at_the_nested_location_defines_its_fields(database):
    rows = p.query(
        database,
        "SELECT config_name, config_type, field_id, field_name, field_type, required "
        "FROM core.custom_report_fields WHERE config_id = 'cfg-nested'",
    )
    assert rows == [("Sales report", "sales", "f-nested", "Field f-nested", "number", False)]
    assert result(database, "t-nested", "f-nested")["value_number"] == 42.0


def test_fields_are_one_row_per_configuration_and_field_however_many_transactions_carry_it(
    database,
):
    (count,) = p.query(
        database, "SELECT count(*) FROM core.custom_report_fields WHERE config_id = 'cfg-main'"
    )[0]
    assert count == 6


def test_a_configuration_whose_copies_differ_is_the_copy_of_its_latest_created_carrier(database):
    rows = p.query(
        database,
        "SELECT slider_max, source_transaction_id, config_transaction_count, config_last_used_at "
        "FROM core.custom_report_fields WHERE config_id = 'cfg-copies'",
    )
    assert [row[:3] for row in rows] == [(50.0, "t-copy-b", 4)]
    assert str(rows[0][3]).startswith("2025-06-01 00:00:00")


def test_map_key_is_the_field_id_when_field_id_is_absent(database):
    row = result(database, "t-no-field-id", "f-number")
    assert (row["field_type"], row["value_number"]) == ("number", 3.0)


def test_slider_value_is_a_number(database):
    row = result(database, "t-tenth", "f-tenths")
    assert (row["value_raw"], row["value_number"], row["value_text"]) == ("0.3", 0.3, None)


def test_numeric_string_in_a_slider_field_is_decoded_as_number(database):
    assert result(database, "t-slider-string", "f-tenths")["value_number"] == 0.5


def test_numeric_string_in_a_number_field_is_decoded_as_number(database):
    row = result(database, "t-number-string", "f-number")
    assert (row["value_raw"], row["value_number"], row["in_range"]) == ("12.5", 12.5, None)


def test_number_field_value_is_decoded_as_number(database):
    assert result(database, "t-number", "f-number")["value_number"] == 7.0


def test_text_value_of_digits_stays_text(database):
    row = result(database, "t-digits", "f-text")
    assert (row["value_text"], row["value_number"], row["value_raw"]) == ("00123", None, "00123")


def test_upload_value_is_a_file_ref(database):
    row = result(database, "t-upload", "f-upload")
    assert (row["file_ref"], row["value_text"], row["value_number"]) == ("file-77", None, None)


def test_unknown_field_type_keeps_the_contract_columns_empty_and_is_typed_by_json_type(database):
    row = result(database, "t-unknown-type", "f-colour")
    assert row["field_type"] == "colourPicker"
    assert row["value_raw"] == "#ff0000"
    assert (row["value_number"], row["value_text"], row["file_ref"]) == (None, None, None)
    assert (row["value_kind"], row["value_json_text"]) == ("json_string", "#ff0000")


def test_field_missing_from_the_configuration_is_kept_unresolved(database):
    row = result(database, "t-undefined-field", "f-nowhere")
    assert (row["config_id"], row["field_type"], row["value_raw"]) == ("cfg-main", None, "x")


def test_slider_step_of_a_tenth_accepts_0_3(database):
    row = result(database, "t-tenth", "f-tenths")
    assert (row["in_range"], row["on_step"]) == (True, True)


def test_slider_step_of_a_tenth_rejects_0_35(database):
    row = result(database, "t-off-tenth", "f-tenths")
    assert (row["in_range"], row["on_step"]) == (True, False)


def test_slider_value_above_maximum_is_out_of_range(database):
    row = result(database, "t-out-of-range", "f-tenths")
    assert (row["in_range"], row["on_step"]) == (False, True)


def test_slider_steps_are_counted_from_the_minimum(database):
    # minimum 1, step 2: 5 is on the grid 1, 3, 5, ...; 4 is not.
    assert result(database, "t-odd-step", "f-odd")["on_step"] is True
    assert result(database, "t-even-step", "f-odd")["on_step"] is False


def test_transaction_result_resolves_against_its_own_configuration(database):
    old = result(database, "t-shared-old", "f-shared")
    new = result(database, "t-shared-new", "f-shared")
    assert (old["config_id"], old["slider_max"], old["in_range"]) == ("cfg-old", 5.0, True)
    assert (new["config_id"], new["slider_max"], new["on_step"]) == ("cfg-new", 100.0, True)


def test_transaction_naming_a_configuration_it_does_not_embed_resolves_against_that_one(
    database,
):
    row = result(database, "t-config-not-embedded", "f-odd")
    assert (row["config_id"], row["field_type"], row["value_number"]) == ("cfg-main", "Slider", 3.0)
    assert (row["in_range"], row["on_step"]) == (True, True)


def test_event_result_resolves_through_custom_report_fields(database):
    row = result(database, "r-text", "f-text")
    assert row["source"] == "event"
    assert (row["transaction_id"], row["event_id"], row["config_id"]) == (None, "e1", "cfg-main")
    assert (row["field_type"], row["value_text"]) == ("text", "0815")


def test_event_result_of_a_field_in_several_configurations_uses_the_newest_configuration(
    database,
):
    row = result(database, "r-shared", "f-shared")
    assert (row["config_id"], row["in_range"], row["on_step"]) == ("cfg-new", True, True)


def test_event_result_of_a_field_no_configuration_defines_has_no_field_type(database):
    row = result(database, "r-unknown", "f-not-configured")
    assert (row["field_type"], row["config_id"], row["value_raw"]) == (None, None, "3")
    assert row["value_number"] is None
