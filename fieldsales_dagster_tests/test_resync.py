"""Re-sync on demand (docs/refresh.md), for real: the demo API changes events and their
transactions, a run re-syncs just some of them through ``raw_transactions``' typed run config, and
their rows equal a full refresh's while every other event's rows stay exactly as they were."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, time, timedelta
from pathlib import Path

import dagster as dg
import pytest

from fieldsales_dagster.demo_run import prepare_dagster_home
from fieldsales_dagster_tests.conftest import lake_paths, make_api, make_warehouse, read_lake
from fieldsales_dagster_tests.project import error_chain, load_project_defs, raw_assets
from fieldsales_dagster_tests.test_incremental_refresh import assert_same_tables

RAW_ASSETS = raw_assets()
ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def run(server, tmp_path, warehouse, config=None, **kwargs):
    run_config = {"ops": {"raw_transactions": {"config": config}}} if config else None
    return dg.materialize(
        RAW_ASSETS,
        resources={"fieldsales_api": make_api(server, tmp_path), "warehouse": warehouse},
        run_config=run_config,
        **kwargs,
    )


def resync(server, tmp_path, warehouse, raise_on_error=True, **config):
    return run(server, tmp_path, warehouse, {"resync": config}, raise_on_error=raise_on_error)


def transactions(warehouse) -> dict[str, tuple]:
    """``raw.transactions``: id -> (event_id, payload, loaded_at)."""
    with read_lake(warehouse) as conn:
        rows = conn.execute(
            "SELECT id, event_id, payload::VARCHAR, loaded_at FROM raw.transactions"
        ).fetchall()
    return {row[0]: row[1:] for row in rows}


def of_events(rows: dict[str, tuple], events: set[str], keep: bool = True) -> dict[str, tuple]:
    """The rows of ``events`` (or of every other event), ``loaded_at`` left out."""
    return {key: row[:2] for key, row in rows.items() if (row[0] in events) == keep}


def metadata(result) -> dict[str, object]:
    (event,) = result.asset_materializations_for_node("raw_transactions")
    return {key: value.value for key, value in event.metadata.items()}


def failure(result) -> str:
    return "\n".join(
        event.step_failure_data.error.to_string() for event in result.get_step_failure_events()
    )


@pytest.fixture
def loaded(demo_server, tmp_path):
    warehouse = make_warehouse(tmp_path, "resynced")
    assert run(demo_server, tmp_path, warehouse).success
    return warehouse


def full_refresh(server, tmp_path) -> dict[str, tuple]:
    """``raw.transactions`` as a full refresh of the server's data now gives it."""
    fresh = make_warehouse(tmp_path, "full")
    assert run(server, tmp_path, fresh, {"refresh_mode": "full"}).success
    return transactions(fresh)


def evolved_event(server) -> tuple[str, int]:
    """An event ``evolve`` changed (a new status, changed transactions): its id and index."""
    index = sorted(server.dataset.event_version)[0]
    return server.dataset.event_id(index), index


def test_resync_of_one_event_equals_a_full_refresh_for_it_and_leaves_the_others(
    demo_server, tmp_path, loaded
):
    before = transactions(loaded)
    demo_server.behaviour.evolve(1)
    event_id, _ = evolved_event(demo_server)
    demo_server.clear_requests()

    result = resync(demo_server, tmp_path, loaded, event_ids=[event_id])

    fetched = [r.query for r in demo_server.requests if r.path.endswith("/transaction/all")]
    assert fetched and {q.get("eventId") for q in fetched} == {event_id}  # that event only
    after, full = transactions(loaded), full_refresh(demo_server, tmp_path)
    assert of_events(after, {event_id}) == of_events(full, {event_id})
    assert of_events(after, {event_id}) != of_events(before, {event_id})  # it did change
    # Every other event's rows are untouched, loaded_at included, though several changed too.
    others = {key: row for key, row in after.items() if row[0] != event_id}
    assert others == {key: row for key, row in before.items() if row[0] != event_id}
    assert of_events(full, {event_id}, keep=False) != of_events(others, {event_id}, keep=False)
    meta = metadata(result)
    assert (meta["refresh_mode"], meta["events_refetched"]) == ("resync", 1)
    assert str(meta["api_total"]).startswith("not asked: a re-sync")
    assert meta["dagster/row_count"] == len(after)

    # The re-sync moved only its event's state: the next refresh still catches the others.
    follow = run(demo_server, tmp_path, loaded)
    assert metadata(follow)["refresh_mode"] == "incremental"
    fresh = make_warehouse(tmp_path, "full")
    assert_same_tables(loaded, fresh)


def history_dates(server) -> dict[str, list[datetime]]:
    """Every listed event's status-change dates, as the server sends them."""
    dates = {}
    for position in range(server.dataset.count("events")):
        event = server.dataset.item("events", position)
        dates[event["_id"]] = [
            datetime.fromisoformat(entry["date"].replace("Z", "+00:00"))
            for entry in event["eventStateHistory"]
        ]
    return dates


def test_resync_of_a_window_refetches_the_events_whose_status_changed_in_it(
    demo_server, tmp_path, loaded
):
    before = transactions(loaded)
    demo_server.behaviour.evolve(1)
    event_id, _ = evolved_event(demo_server)
    dates = history_dates(demo_server)
    day = max(dates[event_id]).date()  # the day of its new status
    start = datetime.combine(day, time(), UTC)
    in_window = {
        event
        for event, moments in dates.items()
        if any(start <= moment < start + timedelta(days=1) for moment in moments)
    }
    assert event_id in in_window and len(in_window) < len(dates)

    result = resync(
        demo_server,
        tmp_path,
        loaded,
        changed_from=day.isoformat(),
        changed_to=day.isoformat(),  # a day as the end counts whole
    )

    assert metadata(result)["events_refetched"] == len(in_window)
    after, full = transactions(loaded), full_refresh(demo_server, tmp_path)
    assert of_events(after, in_window) == of_events(full, in_window)
    others = {key: row for key, row in after.items() if row[0] not in in_window}
    assert others == {key: row for key, row in before.items() if row[0] not in in_window}


def test_resync_of_an_event_the_server_deleted_audits_its_transactions(
    demo_server, tmp_path, loaded
):
    before = transactions(loaded)
    gone = demo_server.dataset.event_id(5)
    removed = demo_server.dataset.delete_event(5)

    result = resync(demo_server, tmp_path, loaded, event_ids=[gone])

    meta = metadata(result)
    assert (meta["events_removed"], meta["transactions_removed"]) == (1, removed)
    after = transactions(loaded)
    assert of_events(after, {gone}) == {}
    with read_lake(loaded) as conn:
        audited = conn.execute(
            "SELECT id, run_id FROM meta.transactions_deleted WHERE event_id = ?", [gone]
        ).fetchall()
    assert sorted(audited) == sorted((key, result.run_id) for key in of_events(before, {gone}))


def test_an_unknown_event_id_fails_naming_it_and_changes_nothing(demo_server, tmp_path, loaded):
    before = transactions(loaded)
    known = demo_server.dataset.event_id(3)
    result = resync(
        demo_server, tmp_path, loaded, raise_on_error=False, event_ids=[known, "no-such-event"]
    )
    assert not result.success
    text = failure(result)
    assert "resync.event_ids" in text and "'no-such-event'" in text and repr(known) not in text
    assert transactions(loaded) == before


@pytest.mark.parametrize(
    ("config", "named"),
    [
        ({"resync": {}}, "resync needs either event_ids"),
        (
            {"resync": {"event_ids": ["a"], "changed_from": "2026-11-01"}},
            "resync needs either event_ids",
        ),
        ({"resync": {"changed_from": "2026-13-01"}}, "resync.changed_from is '2026-13-01'"),
        (
            {"resync": {"changed_from": "2026-11-02", "changed_to": "2026-11-01T00:00:00Z"}},
            "resync.changed_to (2026-11-01T00:00:00Z) is not after resync.changed_from",
        ),
        ({"resync": {"event_ids": ["a", " "]}}, "resync.event_ids holds an empty id"),
        (
            {"refresh_mode": "full", "resync": {"event_ids": ["a"]}},
            "refresh_mode (full) and resync exclude each other",
        ),
    ],
)
def test_bad_resync_config_fails_naming_the_field(demo_server, tmp_path, config, named):
    warehouse = make_warehouse(tmp_path)
    with pytest.raises(Exception) as raised:
        run(demo_server, tmp_path, warehouse, config)
    assert named in error_chain(raised.value)


def test_the_refresh_job_takes_the_resync_config_from_the_launchpad_and_dg_launch(
    demo_server, tmp_path, monkeypatch
):
    monkeypatch.setenv("FIELDSALES_BASE_URL", demo_server.base_url)
    monkeypatch.setenv("FIELDSALES_API_TOKEN", demo_server.token)
    monkeypatch.setenv("FIELDSALES_TOKEN_STORE", str(tmp_path / "token.json"))
    job = load_project_defs().resolve_job_def("refresh_all")
    config = job.run_config_schema.config_type.fields["ops"].config_type.fields
    resync_fields = (
        config["raw_transactions"].config_type.fields["config"].config_type.fields["resync"]
    )
    resync_type = resync_fields.config_type.inner_type  # optional: Noneable
    assert set(resync_type.fields) == {"event_ids", "changed_from", "changed_to"}
    ok = {"ops": {"raw_transactions": {"config": {"resync": {"event_ids": ["x"]}}}}}
    assert dg.validate_run_config(job, ok)
    typo = {"ops": {"raw_transactions": {"config": {"resync": {"event_id": ["x"]}}}}}
    with pytest.raises(dg.DagsterInvalidConfigError) as raised:
        dg.validate_run_config(job, typo)
    assert "event_id" in str(raised.value)


def test_dg_launch_re_syncs_an_event_as_documented(demo_server, tmp_path):
    """``dg launch`` from the project folder, the run config of docs/refresh.md, on a lake a full
    refresh filled: the re-sync runs in its own process and merges one event."""
    loaded = make_warehouse(tmp_path)
    assert run(demo_server, tmp_path, loaded).success
    before = transactions(loaded)
    demo_server.behaviour.evolve(1)
    event_id, _ = evolved_event(demo_server)
    catalog, data_path = lake_paths(tmp_path)
    config = {"ops": {"raw_transactions": {"config": {"resync": {"event_ids": [event_id]}}}}}
    done = subprocess.run(
        [str(BIN / "dg"), "launch", "--assets", "raw_events,raw_transactions"]
        + ["--config-json", json.dumps(config)],
        cwd=ROOT,
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("FIELDSALES_")},
            "DAGSTER_HOME": str(
                prepare_dagster_home(tmp_path / "dagster_home", ROOT / "dagster.yaml")
            ),
            "FIELDSALES_BASE_URL": demo_server.base_url,
            "FIELDSALES_API_TOKEN": demo_server.token,
            "FIELDSALES_TOKEN_STORE": str(tmp_path / "dg_token.json"),
            "FIELDSALES_DUCKLAKE_CATALOG": catalog,
            "FIELDSALES_DUCKLAKE_DATA_PATH": data_path,
        },
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    after = transactions(loaded)
    assert of_events(after, {event_id}) != of_events(before, {event_id})
    assert {k: r for k, r in after.items() if r[0] != event_id} == {
        k: r for k, r in before.items() if r[0] != event_id
    }
    with read_lake(loaded) as conn:
        state = "SELECT last_mode FROM meta.refresh_state WHERE table_name = 'raw.transactions'"
        assert conn.execute(state).fetchall() == [("resync",)]


def test_error_chain_names_each_exception_once_when_its_causes_loop():
    """The helper these tests read failures with ends on a cause that loops back."""
    first, second = ValueError("first"), RuntimeError("second")
    first.__cause__, second.__context__ = second, first
    assert error_chain(first) == "first\nsecond"
