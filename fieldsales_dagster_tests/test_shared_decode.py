"""The event payloads are parsed once per run, shared by its steps, and gone at its end."""

from __future__ import annotations

import json

import dagster as dg
import duckdb
import pytest

from fieldsales_dagster.assets.decode import (
    EVENTS_DECODED,
    keep_parsed,
    parse_shared,
    share_decoded,
)
from fieldsales_dagster.assets.tables import derived_tables
from fieldsales_dagster_tests import core_payloads as p
from fieldsales_dagster_tests.conftest import lake_at

#: The core tables whose queries read temp.events_decoded.
EVENT_READERS = [t.asset_name for t in derived_tables() if EVENTS_DECODED in t.decoded]


def _decode_of(result: dg.ExecuteInProcessResult) -> dict[str, str]:
    """Each built core table's ``fieldsales/decode`` entry for temp.events_decoded."""
    found = {}
    for event in result.get_asset_materialization_events():
        text = event.materialization.metadata.get("fieldsales/decode")
        if text is None:
            continue
        for part in str(text.value).split("; "):
            if part.startswith("temp.events_decoded"):
                found[event.asset_key.path[-1]] = part
    return found


def _shared_schemas(database) -> list[str]:
    """The run-shared schemas left in this process's DuckDB instance of the lake."""
    with lake_at(database, threads=2).get_connection() as conn:
        return [
            name
            for (name,) in conn.execute(
                "SELECT schema_name FROM duckdb_schemas() "
                "WHERE database_name = 'fieldsales_shared' AND schema_name LIKE 'run_%'"
            ).fetchall()
        ]


def test_a_run_parses_the_events_once_for_every_table_reading_them(tmp_path):
    database = tmp_path / "t.duckdb"
    events = [p.event(f"e{i}", users=[p.user(f"u{i}")]) for i in range(3)]

    result = p.materialize_core(database, events=events, transactions=[p.transaction("t-1")])

    decodes = _decode_of(result)
    assert sorted(decodes) == sorted(EVENT_READERS)
    parsed = [name for name, text in decodes.items() if text.endswith("full (3 payloads parsed)")]
    assert len(parsed) == 1, decodes
    assert {text for name, text in decodes.items() if name not in parsed} == {
        "temp.events_decoded: current (0 payloads parsed)"
    }
    # The run's end dropped the shared decode (it holds personal values).
    assert _shared_schemas(database) == []
    assert p.query(database, "SELECT count(*) FROM core.users") == [(3,)]


def _parse(conn, warehouse, ids: str | None = None) -> tuple[str, int]:
    """One step's parse of ``ids`` into the run's copy of temp.events_decoded, kept for the next."""
    share_decoded(conn, warehouse, EVENTS_DECODED)
    parsed = parse_shared(conn, EVENTS_DECODED, ids)
    keep_parsed(conn, warehouse, EVENTS_DECODED)
    return parsed.mode, parsed.parsed


def test_a_shared_decode_is_parsed_again_when_raw_events_changed(tmp_path):
    database = tmp_path / "t.duckdb"
    p.write_raw_tables(database, events=[p.event("e1")])
    warehouse = lake_at(database, threads=2)
    with warehouse.get_connection() as conn:
        assert _parse(conn, warehouse) == ("full", 1)
        assert _parse(conn, warehouse) == ("current", 0)
        conn.execute(
            "INSERT INTO raw.events VALUES (?, ?, now()::TIMESTAMP)",
            ["e2", json.dumps(p.event("e2"))],
        )
        assert _parse(conn, warehouse) == ("full", 2)
        shared = warehouse.shared_table(EVENTS_DECODED.table)
        assert conn.execute(f"SELECT id FROM {shared} ORDER BY id").fetchall() == [
            ("e1",),
            ("e2",),
        ]
    warehouse.drop_shared()
    assert _shared_schemas(database) == []
    with warehouse.get_connection() as conn, pytest.raises(duckdb.CatalogException):
        conn.execute(f"SELECT * FROM {shared}")


def test_a_step_parses_only_the_events_it_reads_that_no_step_before_parsed(tmp_path):
    database = tmp_path / "t.duckdb"
    p.write_raw_tables(database, events=[p.event(f"e{i}") for i in range(4)])
    warehouse = lake_at(database, threads=2)
    with warehouse.get_connection() as conn:
        assert _parse(conn, warehouse, "SELECT 'e1' UNION ALL SELECT 'e2'") == ("incremental", 2)
        assert _parse(conn, warehouse, "SELECT 'e2'") == ("current", 0)
        # A whole parse reads every payload in slices, joined to nothing (for the parser's
        # memory: test_core_memory.py), and keeps only the rows the run's copy lacked.
        assert _parse(conn, warehouse) == ("full", 4)
        shared = warehouse.shared_table(EVENTS_DECODED.table)
        assert conn.execute(f"SELECT id FROM {shared} ORDER BY id").fetchall() == [
            (f"e{i}",) for i in range(4)
        ]
    warehouse.drop_shared()


def test_a_step_parses_rows_of_any_load_time_even_without_one(tmp_path):
    """The payloads are read only from the files whose loaded_at range holds the rows to parse
    (a run's changed rows sit in files of their own), and whole where one has no loaded_at."""
    database = tmp_path / "t.duckdb"
    p.write_raw_tables(database, events=[p.event(f"e{i}") for i in range(3)])
    warehouse = lake_at(database, threads=2)
    with warehouse.get_connection() as conn:
        conn.execute(
            "INSERT INTO raw.events VALUES ('e8', ?, now()::TIMESTAMP + INTERVAL 1 DAY), "
            "('e9', ?, NULL)",
            [json.dumps(p.event("e8")), json.dumps(p.event("e9"))],
        )
        assert _parse(conn, warehouse, "SELECT 'e1' UNION ALL SELECT 'e8'") == ("incremental", 2)
        assert _parse(conn, warehouse, "SELECT unnest(['e2', 'e8', 'e9'])") == ("incremental", 2)
        shared = warehouse.shared_table(EVENTS_DECODED.table)
        assert conn.execute(f"SELECT id FROM {shared} ORDER BY id").fetchall() == [
            ("e1",),
            ("e2",),
            ("e8",),
            ("e9",),
        ]
    warehouse.drop_shared()


def test_a_run_after_one_event_changed_parses_it_and_the_copies_its_ids_keep(tmp_path):
    """Issue 48: the tables of the objects events embed follow the changed event by the ids it
    names, so a run parses it and, of the others, only the events whose copies those ids keep
    (the latest) or, for the point-of-sale history, all of its point of sale's: not every event."""
    database = tmp_path / "t.duckdb"
    events = [
        p.event(f"e{i}", pos=p.point_of_sale(_id=f"pos{i % 5}"), users=[p.user(f"u{i}")])
        for i in range(10)
    ]
    p.materialize_core(database, events=events)
    changed = p.event("e3", pos=p.point_of_sale(_id="pos3"), users=[p.user("u3", "Grace")])
    with lake_at(database).get_connection() as conn:
        conn.execute(
            "UPDATE raw.events SET payload = ?, loaded_at = now()::TIMESTAMP WHERE id = 'e3'",
            [json.dumps(changed)],
        )

    result = p.materialize_core_only(database)

    # e3; e9, the latest (by id: they start alike) of proj1 and area1; e8, pos3's other event.
    decodes = _decode_of(result)
    parsed = {name: int(text.split("(")[1].split()[0]) for name, text in decodes.items()}
    assert sum(parsed.values()) == 3, decodes
    # Two scans of the payloads, not one per table: the first reader of core.events' keys parses
    # the copies every such table reads (read_later); the others find theirs parsed.
    assert len([name for name, count in parsed.items() if count]) == 2, decodes
    assert p.query(database, "SELECT first_name FROM core.users WHERE user_id = 'u3'") == [
        ("Grace",)
    ]


def test_a_step_whose_shared_decode_fails_to_begin_names_that_failure(tmp_path):
    # Here raw.events is gone, so the run's copy cannot begin: the step's error is that, not the
    # missing table of the rows it would have parsed (which its cleanup found absent).
    database = tmp_path / "t.duckdb"
    p.write_raw_tables(database, events=[p.event("e1")])
    with lake_at(database).get_connection() as conn:
        conn.execute("DROP TABLE raw.events")

    result = p.materialize_core_only(database, raise_on_error=False)

    failures = [e.event_specific_data.error for e in result.all_events if e.is_step_failure]
    assert failures
    for error in failures:  # the exception the step raised, not what it raised while handling it
        why = error.cause.message.splitlines()[0]
        assert why.startswith("RuntimeError: Building core"), why
        assert why.endswith(
            "It reads temp.events_decoded: Building temp.events_decoded failed; the previous "
            "temp.events_decoded is left as it was. DuckDB: Catalog Error: Table with name events "
            "does not exist!"
        ), why
