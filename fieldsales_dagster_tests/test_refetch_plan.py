"""The incremental refresh's decision is a value (``RefetchPlan``): the events it re-fetches and
why, and the events that disappeared; the merge deletes their stored transactions and records the
current events' fingerprints. The events are loaded by the loader from a server on 127.0.0.1, which
writes their states beside ``raw.events``; real DuckDB files in ``tmp_path``."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import duckdb
import msgspec
import pytest

from fieldsales_dagster.client.endpoints import EVENTS, TRANSACTIONS
from fieldsales_dagster.loading import incremental
from fieldsales_dagster.loading.raw_load import (
    Staging,
    event_state,
    event_states,
    load_list,
    raw_table_ddl,
)
from fieldsales_dagster_tests.hostile_lists import HostileServer
from fieldsales_dagster_tests.test_hostile_paging import hostile_api

NOW = datetime(2026, 6, 1, tzinfo=UTC)
LONG_AGO = "2020-01-01T00:00:00Z"


def event(event_id: str, state: str, last_change: str = LONG_AGO) -> str:
    return json.dumps(
        {
            "_id": event_id,
            "eventState": state,
            "eventStateHistory": [{"state": state, "date": last_change}],
            "eventStateTimestamps": {state: [last_change]},
        }
    )


@pytest.fixture
def store_events():
    """Loads the event list (``load_list``), as a server on 127.0.0.1 now lists ``events``."""
    listed: list[dict] = []
    with HostileServer(lambda path, skip, limit: listed[skip : skip + limit]) as server:

        def store(conn: duckdb.DuckDBPyConnection, events: dict[str, str]) -> None:
            listed[:] = map(json.loads, events.values())
            load_list(hostile_api(server), conn, EVENTS, allow_shrink=True)

        yield store


@pytest.fixture
def conn(tmp_path, store_events):
    """A warehouse whose last load saw events a (unchanged since), b (about to change) and c
    (about to disappear), two transactions each; the event list now also holds a new event d."""
    with duckdb.connect(str(tmp_path / "plan.duckdb")) as conn:
        store_events(conn, {"a": event("a", "done"), "b": event("b", "open"), "c": event("c", "x")})
        conn.execute(raw_table_ddl(TRANSACTIONS, TRANSACTIONS.raw_table))
        conn.executemany(
            f"INSERT INTO {TRANSACTIONS.raw_table} (id, payload, loaded_at, event_id) "
            "VALUES (?, '{}', ?, ?)",
            [(f"{e}{n}", NOW.replace(tzinfo=None), e) for e in "abc" for n in (1, 2)],
        )
        incremental._fingerprint_current_events(conn, NOW)
        incremental._write_state(conn, mode="full", at=NOW, rows=6)
        store_events(
            conn,
            {
                "a": event("a", "done"),
                "b": event("b", "closed"),
                "d": event("d", "open", "2026-05-30T00:00:00Z"),
            },
        )
        yield conn


def test_the_plan_carries_which_events_are_refetched_and_which_disappeared(conn):
    plan = incremental._plan(conn, lookback_days=30, now=NOW)

    assert sorted(plan.event_ids) == ["b", "d"]
    assert plan.removed_ids == ["c"]
    assert (plan.events, plan.why) == (3, {"new": 1, "changed": 1})


def test_an_event_without_a_dated_history_is_recent_only_while_first_seen_in_its_state(
    tmp_path, store_events
):
    """An undated event changed state at or before the load that first saw it in that state: it
    is re-fetched while that load is within lookback_days, then no more, until its state moves."""
    undated = json.dumps({"_id": "u", "eventState": "open", "eventStateHistory": []})
    with duckdb.connect(str(tmp_path / "undated.duckdb")) as conn:
        store_events(conn, {"u": undated})
        incremental._fingerprint_current_events(conn, NOW)
        incremental._write_state(conn, mode="full", at=NOW, rows=0)

        def plan(days: float) -> dict[str, int]:
            at = NOW + timedelta(days=days)
            why = incremental._plan(conn, lookback_days=30, now=at).why
            incremental._write_state(conn, mode="incremental", at=at, rows=0)
            return why

        assert plan(days=5) == {"recent": 1}
        assert plan(days=29) == {"recent": 1}
        assert plan(days=31) == {}  # first seen in this state 31 days ago
        store_events(conn, {"u": undated.replace('"open"', '"closed"')})
        assert plan(days=32) == {"changed": 1}
        assert plan(days=33) == {"recent": 1}  # seen closed since day 32


def test_an_event_without_history_is_dated_by_its_state_timestamps(tmp_path, store_events):
    """An empty eventStateHistory beside dated eventStateTimestamps (the server appends the time
    of every state change there): the event is as recent as its last timestamp, from the first
    load on, not re-fetched for a month as if undated."""

    def stamped(event_id: str, paid: str) -> str:
        stamps = {"Planned": [LONG_AGO], "Paid": [paid]}
        item = {"_id": event_id, "eventState": "Paid", "eventStateHistory": []}
        return json.dumps({**item, "eventStateTimestamps": stamps})

    settled, fresh = stamped("s", "2021-03-01T00:00:00Z"), stamped("f", "2026-05-30T00:00:00Z")
    with duckdb.connect(str(tmp_path / "stamped.duckdb")) as conn:
        store_events(conn, {"s": settled, "f": fresh})
        incremental._fingerprint_current_events(conn, NOW)
        incremental._write_state(conn, mode="full", at=NOW, rows=0)

        plan = incremental._plan(conn, lookback_days=30, now=NOW + timedelta(days=1))

    assert (plan.event_ids, plan.why) == (["f"], {"recent": 1})


def test_the_event_list_load_writes_each_events_state_beside_it(conn):
    """raw.events keeps its columns; its digests hold what the plan compares, per event."""
    states = conn.execute(f"SELECT * FROM {event_states(conn)} ORDER BY event_id").fetchall()
    columns = conn.execute(f"SELECT * FROM {EVENTS.raw_table} LIMIT 0").description

    assert [column[0] for column in columns] == ["id", "payload", "loaded_at"]
    assert [(event_id, changes) for event_id, _, changes in states] == [
        ("a", [datetime(2020, 1, 1, tzinfo=UTC)]),
        ("b", [datetime(2020, 1, 1, tzinfo=UTC)]),
        ("d", [datetime(2026, 5, 30, tzinfo=UTC)]),
    ]
    assert len({fingerprint for _, fingerprint, _ in states}) == 3


def test_an_events_fingerprint_holds_no_personal_value():
    """The fingerprint is an unkeyed hash: a client address in the history must not be guessable
    from it (pii.redact_in_raw nulls it in the payload); a state change still moves it."""

    def fingerprint(state: str, ip: str) -> str:
        history = [{"stateNew": state, "date": LONG_AGO, "ip": ip, "user": "u1"}]
        item = {"_id": "e", "eventState": state, "eventStateHistory": history}
        return event_state(msgspec.Raw(json.dumps(item).encode()))[0]

    assert fingerprint("open", "10.0.0.1") == fingerprint("open", "192.168.7.9")
    assert fingerprint("open", "10.0.0.1") != fingerprint("done", "10.0.0.1")


def test_the_plan_reads_the_states_written_with_the_events_not_their_payloads(conn):
    """Planning parses no event payload: the states were computed as the list was loaded."""
    conn.execute(f"UPDATE {EVENTS.raw_table} SET payload = '{{}}'")

    plan = incremental._plan(conn, lookback_days=30, now=NOW)

    assert (sorted(plan.event_ids), plan.removed_ids, plan.why) == (
        ["b", "d"],
        ["c"],
        {"new": 1, "changed": 1},
    )


def test_the_merge_deletes_the_transactions_of_the_refetched_and_removed_events(conn):
    """b re-fetched (it lists none now) and c removed: their transactions go, a's stay."""
    plan = incremental._plan(conn, lookback_days=30, now=NOW)
    conn.execute(
        f"CREATE TABLE {incremental.DIGESTS_TABLE} AS SELECT id, event_id, 0::BIGINT AS digest "
        f"FROM {TRANSACTIONS.raw_table}"
    )
    staging = Staging(conn, TRANSACTIONS, incremental.STAGE_TABLE, NOW, "event_id", True)
    staging.create()
    staging.seal()  # nothing listed
    run = incremental.Merging(None, conn, print, lambda stage: None, None, 0)  # type: ignore[arg-type]

    rows, counts = incremental._merge(run, "resync", None, 0, plan.replaced)

    assert (rows, counts["transactions_removed"]) == (2, 4)  # b's two, c's two; d had none
    left = conn.execute(f"SELECT id FROM {TRANSACTIONS.raw_table} ORDER BY id").fetchall()
    assert [row[0] for row in left] == ["a1", "a2"]


def test_the_state_records_the_fingerprints_of_the_events_listed_now(conn):
    incremental._plan(conn, lookback_days=30, now=NOW)

    incremental._write_state(conn, mode="incremental", at=NOW, rows=4)

    recorded = conn.execute(
        f"SELECT event_id FROM {incremental.FINGERPRINTS_TABLE} ORDER BY event_id"
    ).fetchall()
    assert [row[0] for row in recorded] == ["a", "b", "d"]


def test_the_staging_table_is_created_temporary_by_its_ddl(conn):
    stage = incremental.STAGE_TABLE
    conn.execute(raw_table_ddl(TRANSACTIONS, stage, temporary=True))

    (temporary,) = conn.execute(
        "SELECT temporary FROM duckdb_tables() WHERE table_name = ?", [stage.partition(".")[2]]
    ).fetchone()
    assert temporary
    columns = conn.execute(f"SELECT * FROM {stage}").description
    assert [column[0] for column in columns] == ["id", "payload", "loaded_at", "event_id"]
