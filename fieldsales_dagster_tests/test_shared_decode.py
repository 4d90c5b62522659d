"""The event payloads are parsed once per run, shared by its steps, and gone at its end."""

from __future__ import annotations

import json

import dagster as dg
import duckdb
import pytest

from fieldsales_dagster.assets.decode import EVENTS_DECODED, share_decoded
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


def test_a_shared_decode_is_parsed_again_when_raw_events_changed(tmp_path):
    database = tmp_path / "t.duckdb"
    p.write_raw_tables(database, events=[p.event("e1")])
    warehouse = lake_at(database, threads=2)
    with warehouse.get_connection() as conn:
        assert share_decoded(conn, warehouse, EVENTS_DECODED).mode == "full"
        assert share_decoded(conn, warehouse, EVENTS_DECODED).mode == "current"
        conn.execute(
            "INSERT INTO raw.events VALUES (?, ?, now()::TIMESTAMP)",
            ["e2", json.dumps(p.event("e2"))],
        )
        again = share_decoded(conn, warehouse, EVENTS_DECODED)
        assert (again.mode, again.parsed) == ("full", 2)
        shared = warehouse.shared_table(EVENTS_DECODED.table)
        assert conn.execute(f"SELECT id FROM {shared} ORDER BY id").fetchall() == [
            ("e1",),
            ("e2",),
        ]
    warehouse.drop_shared()
    assert _shared_schemas(database) == []
    with warehouse.get_connection() as conn, pytest.raises(duckdb.CatalogException):
        conn.execute(f"SELECT * FROM {shared}")
