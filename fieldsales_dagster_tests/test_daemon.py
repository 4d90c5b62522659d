"""Production, for real: ``dagster-daemon`` on deploy/dagster.yaml, with PostgreSQL storage.

One bounded end-to-end test (about two minutes): a real PostgreSQL on loopback, the demo API on
loopback, slowed until a schedule tick has fallen inside the refresh (then at full speed), and
``dagster-daemon run`` with the schedule set to every minute. It waits for the schedule to fire and
the refresh to succeed, then reads what the daemon recorded in PostgreSQL.
"""

from __future__ import annotations

import itertools
import json
import shutil
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.scheduler.instigation import TickStatus

from fieldsales_dagster.assets.tables import derived_tables
from fieldsales_dagster.demo_api import DemoConfig, DemoServer
from fieldsales_dagster.token.store import FileTokenStore
from fieldsales_dagster_tests.conftest import lake_paths, read_lake
from fieldsales_dagster_tests.postgres import Postgres, running_postgres
from fieldsales_dagster_tests.processes import clean_env, process_group, tail

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
JOB = "refresh_all"
SCHEDULE = "refresh_all_schedule"
TOKEN_SENSOR = "token_renewal_sensor"
RENEWAL_JOB = "renew_token"
#: The whole test gives up after this long (start-up + up to a minute to the first tick + run).
DEADLINE_S = 360.0
#: 2,000 transactions in pages of 100, one request at a time, 3 s per answer (over 20 requests):
#: the run lasts over a minute, so a second tick of the every-minute schedule falls inside it;
#: once one has, the answers come at full speed.
DEMO = DemoConfig(transactions=2000)
LATENCY_S = 3.0
API_TUNING = {"FIELDSALES_PAGE_SIZE": "100", "FIELDSALES_CONCURRENCY": "1"}


@pytest.fixture
def postgres() -> Iterator[Postgres]:
    with running_postgres() as pg:
        yield pg


def ticks(instance: dg.DagsterInstance, name: str) -> list:
    (state,) = [s for s in instance.all_instigator_state() if s.instigator_name == name]
    return instance.get_ticks(state.instigator_origin_id, state.selector_id)


def test_daemon_fires_the_schedule_and_never_overlaps_refreshes(postgres, tmp_path, monkeypatch):
    started = time.monotonic()
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(ROOT / "deploy" / "dagster.yaml", home / "dagster.yaml")
    database = tmp_path / "fieldsales.duckdb"

    with DemoServer(DEMO, host="127.0.0.1", port=0) as demo:
        demo.behaviour.latency_s = LATENCY_S
        api = {"base_url": demo.base_url, "token": demo.token}
        # A deployment whose token is 46 days old: the sensor's first tick requests its renewal.
        store = tmp_path / "token_store.json"
        FileTokenStore(store).current(api["token"])
        record = json.loads(store.read_text())
        record["issued_at"] = (datetime.now(UTC) - timedelta(days=46)).isoformat()
        store.write_text(json.dumps(record))
        env = clean_env(
            DAGSTER_HOME=str(home),
            DAGSTER_POSTGRES_URL=postgres.url,
            FIELDSALES_BASE_URL=api["base_url"],
            FIELDSALES_API_TOKEN=api["token"],
            FIELDSALES_DUCKLAKE_CATALOG=lake_paths(tmp_path)[0],
            FIELDSALES_DUCKLAKE_DATA_PATH=lake_paths(tmp_path)[1],
            FIELDSALES_TOKEN_STORE=str(store),
            FIELDSALES_SCHEDULE_CRON="* * * * *",
            **API_TUNING,
        )
        daemon_log = tmp_path / "daemon.log"
        with process_group(
            [str(BIN / "dagster-daemon"), "run", "-w", str(ROOT / "workspace.yaml")],
            daemon_log,
            env,
            cwd=ROOT,
        ):
            monkeypatch.setenv("DAGSTER_POSTGRES_URL", postgres.url)
            with dg.DagsterInstance.from_config(str(home)) as instance:
                first = wait_for_first_refresh(instance, started, daemon_log, demo)
                renewal = wait_for_renewal_run(instance, started, daemon_log)
                schedule_ticks = ticks(instance, SCHEDULE)
                sensor_ticks = ticks(instance, TOKEN_SENSOR)
                runs = instance.get_run_records(dg.RunsFilter(job_name=JOB))
    elapsed = time.monotonic() - started
    print(f"daemon test: first refresh succeeded after {elapsed:.0f} s")

    # The tables are complete, in the lake the run committed them to.
    with read_lake(database) as conn:
        counts = {
            table: conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            for table in ("raw.transactions", "raw.events", "raw.event_groups")
        }
        core = {
            f"{schema}.{name}"
            for schema, name in conn.execute(
                "SELECT table_schema, table_name FROM information_schema.tables "
                "WHERE table_schema = 'core'"
            ).fetchall()
        }
    assert counts == {"raw.transactions": 2000, "raw.events": 50, "raw.event_groups": 5}
    assert core == {t.table for t in derived_tables() if t.schema == "core"}

    # The schedule fired the run; a tick that came while it was in progress was skipped.
    (launching,) = [t for t in schedule_ticks if first.dagster_run.run_id in t.run_ids]
    assert launching.status == TickStatus.SUCCESS
    end = first.end_time
    # The ticks evaluated while it ran (one due before its end but evaluated after may launch).
    during = [
        t
        for t in schedule_ticks
        if launching.timestamp < t.timestamp and t.end_timestamp and t.end_timestamp < end
    ]
    assert during, "no schedule tick fell inside the run: slow the demo API further"
    assert all(t.status == TickStatus.SKIPPED for t in during)
    assert all(first.dagster_run.run_id in t.skip_reason for t in during)
    # ... and no two refreshes ever ran at the same time.
    spans = sorted((r.start_time, r.end_time or float("inf")) for r in runs if r.start_time)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))

    # The token sensor ticked, and its ticks are rows in PostgreSQL.
    assert sensor_ticks and all(t.status != TickStatus.FAILURE for t in sensor_ticks)
    with postgres.connect() as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM job_ticks WHERE type = 'SENSOR'")
        (sensor_rows,) = cur.fetchone()
    assert sensor_rows >= len(sensor_ticks)
    # The sensor only decided: its first tick requested the renewal job (renewal due), which ran
    # as a run of its own, with a log, and succeeded; the store holds the renewed token.
    assert any(renewal.dagster_run.run_id in t.run_ids for t in sensor_ticks)
    assert renewal.dagster_run.status == dg.DagsterRunStatus.SUCCESS
    renewed = json.loads(store.read_text())
    assert renewed["source"] == "renewal" and renewed["token"] != api["token"]


def wait_for_renewal_run(
    instance: dg.DagsterInstance, started: float, daemon_log: Path
) -> dg.RunRecord:
    while time.monotonic() - started < DEADLINE_S:
        records = instance.get_run_records(dg.RunsFilter(job_name=RENEWAL_JOB), ascending=True)
        if records and records[0].dagster_run.is_finished:
            return records[0]
        time.sleep(1)
    pytest.fail(f"no finished renewal run within {DEADLINE_S:.0f} s:\n{tail(daemon_log)}")


def wait_for_first_refresh(
    instance: dg.DagsterInstance, started: float, daemon_log: Path, demo: DemoServer
) -> dg.RunRecord:
    while time.monotonic() - started < DEADLINE_S:
        records = instance.get_run_records(dg.RunsFilter(job_name=JOB), ascending=True)
        if records:
            if any(t.status == TickStatus.SKIPPED for t in ticks(instance, SCHEDULE)):
                demo.behaviour.latency_s = 0.0  # a tick fell inside the run: the rest may be fast
            first = records[0]
            status = first.dagster_run.status
            if status == dg.DagsterRunStatus.SUCCESS:
                return first
            if status in (dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED):
                pytest.fail(f"the scheduled refresh ended {status.value}:\n{tail(daemon_log)}")
        time.sleep(2)
    pytest.fail(f"no successful refresh within {DEADLINE_S:.0f} s; daemon log:\n{tail(daemon_log)}")
