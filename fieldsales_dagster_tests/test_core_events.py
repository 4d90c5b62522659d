"""Event decoding: events, status history, points of sale, projects, areas and users."""

from __future__ import annotations

import pytest

from fieldsales_dagster_tests import core_payloads as p

GOOGLE_PLACES = {
    "formatted_address": "Main St 1, 10115 Berlin",
    "formatted_phone_number": "030 1",
    "international_phone_number": "+49 30 1",
    "place_id": "ChIJ-place",
    "website": "https://shop.example.com",
    "rating": 4.5,
    "user_ratings_total": 321,
    "geometry": {"location": {"lat": 52.52, "lng": 13.41}},
}

EVENTS = [
    # Two events at pos-moved: the later planned start carries the newer copy.
    p.event(
        "e-early",
        starts=("2025-03-01T08:00:00.000Z",),
        stops=("2025-03-01T16:00:00.000Z",),
        pos=p.point_of_sale("pos-moved", name="Old Name", location=[1.0, 2.0]),
        users=[p.user("u-1", first_name="Old")],
    ),
    p.event(
        "e-late",
        starts=("2025-04-01T08:00:00.000Z",),
        stops=("2025-04-01T16:00:00.000Z",),
        pos=p.point_of_sale("pos-moved", name="New Name", location=[13.4, 52.5]),
        users=[p.user("u-1", first_name="New"), p.user("u-2")],
    ),
    p.event(
        "e-times",
        starts=("2025-05-02T10:00:00.000Z", "2025-05-01T09:00:00.000Z", "2025-05-03T08:00:00.000Z"),
        stops=("2025-05-02T18:00:00.000Z", "2025-05-04T20:00:00.000Z", "2025-05-03T16:00:00.000Z"),
        pos=p.point_of_sale("pos-google", googleResult=GOOGLE_PLACES),
        history=[
            p.history_entry("h-3", "Published", "Accepted", "2025-04-03T00:00:00.000Z"),
            p.history_entry("h-1", "", "Planned", "2025-04-01T00:00:00.000Z"),
            p.history_entry("h-2", "Planned", "Published", "2025-04-02T00:00:00.000Z"),
        ],
    ),
    p.event(
        "e-other-provider",
        pos=p.point_of_sale("pos-osm", osmResult={"place_id": "osm-1", "formatted_address": "X"}),
    ),
    p.event(
        "e-bare",
        pos={"_id": "pos-bare"},
        project_id={"_id": "proj-bare"},
        pointOfSaleProjectStructure={},
        times=[],
        eventUser=[],
        eventStateHistory=[],
        customReportResult=[],
    ),
]


@pytest.fixture(scope="module")
def database(tmp_path_factory):
    path = tmp_path_factory.mktemp("events") / "t.duckdb"
    p.materialize_core(path, events=EVENTS)
    return path


def one(database, sql: str, params: list | None = None) -> tuple:
    rows = p.query(database, sql, params)
    assert len(rows) == 1, rows
    return rows[0]


def test_event_references_and_state_are_decoded(database):
    row = one(
        database,
        "SELECT project_id, project_name, pos_id, area_id, event_state, assigned_user_ids "
        "FROM core.events WHERE event_id = 'e-late'",
    )
    assert row == ("proj1", "Summer Promo", "pos-moved", "area1", "Published", ["u-1", "u-2"])


def test_planned_start_is_the_earliest_start_and_planned_stop_the_latest_stop(database):
    start, stop = one(
        database,
        "SELECT strftime(planned_start, '%Y-%m-%d %H:%M'), "
        "strftime(planned_stop, '%Y-%m-%d %H:%M') "
        "FROM core.events WHERE event_id = 'e-times'",
    )
    assert (start, stop) == ("2025-05-01 09:00", "2025-05-04 20:00")


def test_event_without_optional_fields_gives_nulls(database):
    row = one(
        database,
        "SELECT project_name, pos_id, area_id, planned_start, planned_stop, assigned_user_ids "
        "FROM core.events WHERE event_id = 'e-bare'",
    )
    assert row == (None, "pos-bare", None, None, None, [])


def test_status_history_seq_follows_date_order_whatever_the_array_order(database):
    rows = p.query(
        database,
        "SELECT seq, history_id, state_new FROM core.event_status_history "
        "WHERE event_id = 'e-times' ORDER BY seq",
    )
    assert rows == [(1, "h-1", "Planned"), (2, "h-2", "Published"), (3, "h-3", "Accepted")]


def test_empty_state_old_becomes_null(database):
    row = one(
        database,
        "SELECT state_old, user_id, history_type, strftime(changed_at, '%Y-%m-%dT%H:%M') "
        "FROM core.event_status_history WHERE history_id = 'h-1'",
    )
    assert row == (None, "u1", "eventState", "2025-04-01T00:00")


def test_point_of_sale_comes_from_the_event_with_the_latest_planned_start(database):
    assert one(database, "SELECT name FROM core.dim_point_of_sale WHERE pos_id = 'pos-moved'") == (
        "New Name",
    )


def test_location_is_read_as_longitude_then_latitude(database):
    assert one(
        database,
        "SELECT longitude, latitude FROM core.dim_point_of_sale WHERE pos_id = 'pos-moved'",
    ) == (13.4, 52.5)


def test_point_of_sale_address_and_location_groups_are_decoded(database):
    row = one(
        database,
        "SELECT number, company, street_number, postal, city, additional, email, "
        "location_group_ids, location_group_names "
        "FROM core.dim_point_of_sale WHERE pos_id = 'pos-google'",
    )
    assert row == (
        "0042",
        "Corner Shop GmbH",
        "Main St 1",
        "10115",
        "Berlin",
        None,  # "" from the API: empty means NULL in core.*
        "shop@example.com",
        ["lg1", "lg2"],
        ["North", "Urban"],
    )


def test_places_object_under_the_providers_key_is_found_by_its_shape(database):
    row = one(
        database,
        "SELECT place_id, formatted_address, rating, user_ratings_total, place_lat, place_lng "
        "FROM core.dim_point_of_sale WHERE pos_id = 'pos-google'",
    )
    assert row == ("ChIJ-place", "Main St 1, 10115 Berlin", 4.5, 321, 52.52, 13.41)


def test_places_object_of_another_provider_is_found_too(database):
    assert one(
        database,
        "SELECT place_id, formatted_address FROM core.dim_point_of_sale WHERE pos_id = 'pos-osm'",
    ) == ("osm-1", "X")


def test_point_of_sale_without_places_object_has_null_places_fields(database):
    assert one(
        database,
        "SELECT place_id, rating, place_lat FROM core.dim_point_of_sale WHERE pos_id = 'pos-moved'",
    ) == (None, None, None)


def test_users_are_one_row_per_id_from_the_latest_event(database):
    rows = p.query(
        database,
        "SELECT user_id, first_name, last_name, email, language, usertype "
        "FROM core.users ORDER BY user_id",
    )
    assert rows == [
        ("u-1", "New", "Lovelace", "u-1@example.com", "de", "agency"),
        ("u-2", "Ada", "Lovelace", "u-2@example.com", "de", "agency"),
        ("u1", "Ada", "Lovelace", "u1@example.com", "de", "agency"),
    ]


def test_projects_are_one_row_per_project_id(database):
    rows = p.query(database, "SELECT project_id, project_name FROM core.projects ORDER BY 1")
    assert rows == [("proj-bare", None), ("proj1", "Summer Promo")]


def test_areas_are_one_row_per_area_id(database):
    rows = p.query(database, "SELECT area_id, name, number, project_id, active FROM core.areas")
    assert rows == [("area1", "Berlin North", "007", "proj1", True)]
