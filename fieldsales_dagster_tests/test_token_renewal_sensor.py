"""The token-renewal sensor and the run it requests, against the bundled demo API over real HTTP
on loopback: the sensor only reads the store, the run renews."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import pytest
import requests

from fieldsales_dagster.automation.renewal import RENEWAL_OFF, RenewalPolicy, TokenRenewalError
from fieldsales_dagster.automation.sensors import (
    build_token_renewal_job,
    build_token_renewal_sensor,
)
from fieldsales_dagster.client.api import FieldSalesAPI
from fieldsales_dagster.client.endpoints import CHECK_TOKEN_PATH, GENERATE_TOKEN_PATH
from fieldsales_dagster.client.envelope import ListStats
from fieldsales_dagster.client.errors import AuthenticationError
from fieldsales_dagster.demo_api import DemoConfig, DemoServer
from fieldsales_dagster.names import InstanceNames
from fieldsales_dagster.settings import SETTINGS
from fieldsales_dagster.token.store import FileTokenStore, TokenStoreError
from fieldsales_dagster_tests.project import load_failure, load_project_defs

REPO_ROOT = Path(__file__).resolve().parents[1]
#: The component's default threshold (45 days).
DEFAULT_POLICY = RenewalPolicy(timedelta(days=SETTINGS["token_renew_after_days"].default))


@pytest.fixture
def server():
    with DemoServer(DemoConfig(transactions=50, seed=0), host="127.0.0.1", port=0) as server:
        yield server


@pytest.fixture
def store_path(tmp_path: Path, monkeypatch) -> Path:
    path = tmp_path / "fieldsales_token.json"
    monkeypatch.setenv("FIELDSALES_TOKEN_STORE", str(path))  # anything else lands here too
    monkeypatch.delenv("FIELDSALES_TOKEN_RENEW_AFTER_DAYS", raising=False)
    return path


def make_api(server, store_path: Path, env_token: str | None = None) -> FieldSalesAPI:
    return FieldSalesAPI(
        base_url=server.base_url,
        api_token=env_token or server.token,
        token_store_path=str(store_path),
        max_retries=1,
        backoff_initial_s=0.01,
        backoff_max_s=0.05,
    )


@dataclass(frozen=True)
class Tick:
    """One sensor tick and the renewal run it requested (if any)."""

    message: str
    cursor: str | None
    ran: bool


#: The cursor of a tick a day after the last test (as of this module's import): the daily test is
#: due, so the tick tests the token if it does not renew it.
A_DAY_AFTER_THE_LAST_TEST = (datetime.now(UTC) - timedelta(days=1)).isoformat()


def tick(
    api: FieldSalesAPI,
    cursor: str | None = A_DAY_AFTER_THE_LAST_TEST,
    policy: RenewalPolicy | None = None,
) -> Tick:
    """Evaluate the sensor, which must change nothing, then run the job it requests in process
    (by default a tick at which the daily test is due; ``cursor=None``: the sensor's first)."""
    names = InstanceNames()
    sensor = build_token_renewal_sensor(names, policy or DEFAULT_POLICY)
    path = Path(api.token_store_path)
    before = path.read_bytes() if path.exists() else None
    with dg.build_sensor_context(cursor=cursor, resources={"fieldsales_api": api}) as context:
        result = sensor(context)
    assert (path.read_bytes() if path.exists() else None) == before  # the sensor only decides
    assert isinstance(result, dg.SensorResult)
    if not result.run_requests:
        return Tick(skip_message(result), result.cursor, ran=False)
    (request,) = result.run_requests
    job = build_token_renewal_job(names, policy or DEFAULT_POLICY)
    run = job.execute_in_process(resources={"fieldsales_api": api}, tags=request.tags)
    return Tick(run.output_for_node(names.token_renewal_op), result.cursor, ran=True)


def skip_message(result: dg.SensorResult) -> str:
    assert result.skip_reason is not None
    return result.skip_reason.skip_message or ""


def backdate(store_path: Path, days: float) -> None:
    doc = json.loads(store_path.read_text())
    doc["issued_at"] = (datetime.now(UTC) - timedelta(days=days)).isoformat()
    store_path.write_text(json.dumps(doc))


def stored_token(store_path: Path) -> str:
    return json.loads(store_path.read_text())["token"]


def requests_to(server, path: str) -> int:
    """How many requests for ``path`` the demo server answered."""
    time.sleep(0.05)  # the server records a request just after sending its answer
    return sum(1 for request in list(server.requests) if request.path == path)


def accepted(server, token: str) -> bool:
    resp = requests.get(
        server.base_url + CHECK_TOKEN_PATH, headers={"Authorization": f"Bearer {token}"}, timeout=10
    )
    return resp.status_code == 200


# --- when to renew ---------------------------------------------------------------------------


def test_fresh_token_is_not_renewed(server, store_path):
    env_token = server.token
    message = tick(make_api(server, store_path)).message
    assert message.startswith("not yet due: 45.0 days left before renewal")
    assert requests_to(server, GENERATE_TOKEN_PATH) == 0
    assert server.token == env_token == stored_token(store_path)


def test_token_past_the_threshold_is_renewed_and_stored(server, store_path):
    api = make_api(server, store_path)
    tick(api)
    backdate(store_path, 46)
    message = tick(api).message
    assert message.startswith("token renewed; valid until ")
    assert requests_to(server, GENERATE_TOKEN_PATH) == 1
    assert stored_token(store_path) == server.token


def test_threshold_comes_from_the_policy(server, store_path):
    api = make_api(server, store_path)
    tick(api)
    backdate(store_path, 11)
    assert tick(api).message.startswith("not yet due")
    policy = RenewalPolicy(renew_after=timedelta(days=10))
    assert tick(api, policy=policy).message.startswith("token renewed")


def test_threshold_comes_from_the_environment_through_the_component(server, monkeypatch):
    monkeypatch.setenv("FIELDSALES_BASE_URL", server.base_url)
    monkeypatch.setenv("FIELDSALES_API_TOKEN", server.token)
    monkeypatch.setenv("FIELDSALES_TOKEN_RENEW_AFTER_DAYS", "10")
    sensor = load_project_defs().get_sensor_def("token_renewal_sensor")
    assert "older than 10 days" in sensor.description


def test_threshold_outside_the_token_lifetime_is_refused(server, monkeypatch):
    """The setting checks the range (RenewalPolicy takes what the setting let through)."""
    monkeypatch.setenv("FIELDSALES_BASE_URL", server.base_url)
    monkeypatch.setenv("FIELDSALES_API_TOKEN", server.token)
    message = load_failure(monkeypatch, FIELDSALES_TOKEN_RENEW_AFTER_DAYS="61")
    assert "api.token_renew_after_days (from FIELDSALES_TOKEN_RENEW_AFTER_DAYS)" in message
    assert "above 0 and below 60 (the token's lifetime)" in message


def test_after_renewal_the_old_token_is_refused_and_the_store_holds_the_new_one(server, store_path):
    old_token = server.token
    api = make_api(server, store_path)
    tick(api)
    backdate(store_path, 46)
    tick(api)
    assert not accepted(server, old_token)
    assert stored_token(store_path) != old_token
    assert accepted(server, stored_token(store_path))
    assert api.current_token() == stored_token(store_path)


def test_the_first_tick_of_a_fresh_store_requests_no_run_and_starts_the_day(server, store_path):
    """`dg dev` on a new instance: the token from the environment is new, so nothing is due;
    the daily test counts from this tick."""
    api = make_api(server, store_path)
    first = tick(api, cursor=None)
    assert not first.ran
    assert first.message.startswith("not yet due: 45.0 days left before renewal")
    assert first.message.endswith("; the daily test starts a day from now")
    assert server.requests == [] and not store_path.exists()
    assert not tick(api, cursor=first.cursor).ran  # six hours later, say
    a_day_ago = (datetime.now(UTC) - timedelta(days=1)).isoformat()
    assert tick(api, cursor=a_day_ago).ran
    assert requests_to(server, CHECK_TOKEN_PATH) == 1
    assert tick(api, cursor="not a time").ran  # a last test that does not parse: test now
    assert requests_to(server, CHECK_TOKEN_PATH) == 2


def test_the_first_tick_renews_a_token_that_is_due(server, store_path):
    api = make_api(server, store_path)
    tick(api)
    backdate(store_path, 46)
    first = tick(api, cursor=None)
    assert first.ran and first.message.startswith("token renewed; valid until ")


def test_the_renewal_runs_output_says_where_the_renewed_token_is_stored(server, store_path):
    api = make_api(server, store_path)
    tick(api)
    backdate(store_path, 46)
    assert tick(api).message.endswith(f"; stored in {store_path.resolve()}")


def test_token_is_checked_at_most_once_a_day_when_not_due(server, store_path):
    api = make_api(server, store_path)
    first = tick(api)
    assert requests_to(server, CHECK_TOKEN_PATH) == 1
    tick(api, cursor=first.cursor)  # six hours later, say
    assert requests_to(server, CHECK_TOKEN_PATH) == 1
    a_day_ago = (datetime.now(UTC) - timedelta(days=1)).isoformat()
    tick(api, cursor=a_day_ago)
    assert requests_to(server, CHECK_TOKEN_PATH) == 2


# --- runs holding the old token ---------------------------------------------------------------


def test_run_started_with_the_old_env_token_uses_the_renewed_one(server, store_path):
    old_token = server.token
    sensor_api = make_api(server, store_path)
    tick(sensor_api)
    backdate(store_path, 46)
    tick(sensor_api)
    run_api = make_api(server, store_path, env_token=old_token)
    run_api.check_token()  # the environment still says old_token; the store wins


def test_request_refused_mid_renewal_recovers_by_rereading_the_store(
    server, store_path, monkeypatch
):
    old_token = server.token
    api = make_api(server, store_path)
    tick(api)
    backdate(store_path, 46)
    original = FieldSalesAPI._get_once
    renewed = []

    def renewal_lands_in_flight(self, path, params, token, *limits):
        # The run read the old token; the sensor renews before its request reaches the server.
        if not renewed:
            renewed.append(True)
            tick(make_api(server, store_path, env_token=old_token))
        return original(self, path, params, token, *limits)

    monkeypatch.setattr(FieldSalesAPI, "_get_once", renewal_lands_in_flight)
    stats = ListStats()
    api.get(CHECK_TOKEN_PATH, stats=stats)
    assert stats.token_rereads == 1
    assert requests_to(server, GENERATE_TOKEN_PATH) == 1


# --- concurrency and crashes --------------------------------------------------------------------


def test_concurrent_renewers_in_threads_renew_exactly_once(server, store_path):
    tick(make_api(server, store_path))
    backdate(store_path, 46)
    server.behaviour.latency_s = 0.3  # a slow server: every thread reaches the lock meanwhile
    start = threading.Barrier(6)
    messages: list[str] = []
    errors: list[BaseException] = []

    def renew() -> None:
        api = make_api(server, store_path)
        start.wait()
        try:
            messages.append(tick(api).message)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=renew) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert requests_to(server, GENERATE_TOKEN_PATH) == 1
    assert sum(m.startswith("token renewed;") for m in messages) == 1
    assert stored_token(store_path) == server.token


RENEWER_SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    from datetime import timedelta
    from pathlib import Path

    import dagster as dg

    from fieldsales_dagster.automation.sensors import build_token_renewal_job
    from fieldsales_dagster.names import InstanceNames
    from fieldsales_dagster.automation import renewal
    from fieldsales_dagster.settings import SETTINGS
    from fieldsales_dagster.automation.renewal import RenewalPolicy
    from fieldsales_dagster.client.api import FieldSalesAPI
    from fieldsales_dagster.token.store import TokenStore

    base_url, env_token, store_path, go_file, mode = sys.argv[1:]
    real_generate_token = renewal.generate_token

    def slow_generate_token(api, old_token):
        new_token = real_generate_token(api, old_token)
        time.sleep(0.3)  # a slow answer widens the window two renewers could share
        return new_token

    def await_file(suffix):
        deadline = time.monotonic() + 60
        while not Path(f"{go_file}.{suffix}").exists() and time.monotonic() < deadline:
            time.sleep(0.01)

    def holding_generate_token(api, old_token):
        # Once another host's refresh is paging, renew; that refresh then sends the old token
        # and is refused while this renewal holds the lock.
        await_file("paging")
        new_token = real_generate_token(api, old_token)
        Path(f"{go_file}.rotated").touch()
        await_file("refused")
        time.sleep(0.5)  # that host waits for this lock meanwhile
        return new_token

    def meeting_generate_token(api, old_token):
        # Renewers due at once meet here, unless a lock lets one in at a time (then: 3 s).
        Path(f"{go_file}.due.{os.getpid()}").touch()
        deadline = time.monotonic() + 3
        while len(list(Path(go_file).parent.glob("go.due.*"))) < 2:
            if time.monotonic() > deadline:
                break
            time.sleep(0.01)
        return slow_generate_token(api, old_token)

    modes = {"hold": holding_generate_token, "meet": meeting_generate_token}
    renewal.generate_token = modes.get(mode, slow_generate_token)
    if mode == "crash":
        real_write = TokenStore._write_atomically

        def write_then_die(self, stored, *prepared):
            real_write(self, stored, *prepared)
            if stored.source == "renewal":
                os._exit(3)  # the process dies right after the store write

        TokenStore._write_atomically = write_then_die

    # With store_path "catalog", the token's row is in the database of the lake's catalog.
    catalog = os.environ["FIELDSALES_DUCKLAKE_CATALOG"]
    api = FieldSalesAPI(
        base_url=base_url, api_token=env_token, token_store_path=store_path,
        ducklake_catalog=catalog,
    )
    Path(f"{go_file}.ready.{os.getpid()}").touch()
    while not Path(go_file).exists():
        time.sleep(0.01)
    policy = RenewalPolicy(timedelta(days=SETTINGS["token_renew_after_days"].default))
    job = build_token_renewal_job(InstanceNames(), policy)
    run = job.execute_in_process(resources={"fieldsales_api": api})
    print(run.output_for_node(InstanceNames().token_renewal_op))
    """
)


def host_env(host: Path) -> dict[str, str]:
    """The environment of a process on a "host" of its own: its Dagster home and temporary folder
    under ``host``, which is its working directory too."""
    for folder in ("dagster_home", "tmp"):
        (host / folder).mkdir(parents=True, exist_ok=True)
    return {"DAGSTER_HOME": str(host / "dagster_home"), "TMPDIR": str(host / "tmp")}


def start_renewers(
    server, store_path: Path, env_token: str, n: int, mode: str, hosts: list[Path] | None = None
):
    """``n`` renewal runs in processes of their own, started at once; ``hosts``: the folder of
    each (``host_env``), else all in the store's folder."""
    go_dir = hosts[0].parent if hosts else store_path.parent
    go_file = go_dir / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RENEWER_SCRIPT, server.base_url, env_token, str(store_path),
             str(go_file), mode],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT),
                 **(host_env(hosts[i]) if hosts else {})},
            cwd=hosts[i] if hosts else store_path.parent,
        )
        for i in range(n)
    ]  # fmt: skip
    deadline = time.monotonic() + 60
    while len(list(go_dir.glob("go.ready.*"))) < n:
        assert time.monotonic() < deadline, "renewer processes did not start"
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        time.sleep(0.05)
    go_file.touch()
    return [(p.wait(timeout=60), *p.communicate()) for p in procs]


def test_concurrent_renewers_in_separate_processes_renew_exactly_once(server, store_path):
    env_token = server.token
    tick(make_api(server, store_path))
    backdate(store_path, 46)
    outcomes = start_renewers(server, store_path, env_token, n=2, mode="renew")
    assert [code for code, _, _ in outcomes] == [0, 0], outcomes
    assert requests_to(server, GENERATE_TOKEN_PATH) == 1
    assert sum(out.startswith("token renewed;") for _, out, _ in outcomes) == 1
    assert stored_token(store_path) == server.token
    assert accepted(server, stored_token(store_path))


def test_process_dying_right_after_the_store_write_leaves_the_new_valid_token(server, store_path):
    old_token = server.token
    tick(make_api(server, store_path))
    backdate(store_path, 46)
    [(code, _, _)] = start_renewers(server, store_path, old_token, n=1, mode="crash")
    assert code == 3
    assert stored_token(store_path) == server.token != old_token
    assert accepted(server, stored_token(store_path))
    make_api(server, store_path, env_token=old_token).check_token()


def test_failure_right_after_the_store_write_leaves_the_new_valid_token(
    server, store_path, monkeypatch
):
    old_token = server.token
    api = make_api(server, store_path)
    tick(api)
    backdate(store_path, 46)

    def crash(self, token=None):
        raise RuntimeError("crash after the renewal was stored")

    monkeypatch.setattr(FieldSalesAPI, "check_token", crash)
    with pytest.raises(RuntimeError, match="crash after"):
        tick(api)
    assert stored_token(store_path) == server.token != old_token
    assert accepted(server, stored_token(store_path))


def test_lost_renewal_answer_is_not_retried_and_fails_the_tick(server, store_path):
    api = make_api(server, store_path)
    tick(api)
    backdate(store_path, 46)
    before = store_path.read_bytes()
    server.behaviour.inject(GENERATE_TOKEN_PATH, "drop")  # renewed, answer cut off
    with pytest.raises(TokenRenewalError) as excinfo:
        tick(api)
    message = str(excinfo.value)
    assert GENERATE_TOKEN_PATH in message and "FIELDSALES_API_TOKEN" in message
    assert requests_to(server, GENERATE_TOKEN_PATH) == 1
    assert store_path.read_bytes() == before


def test_unwritable_store_stops_the_renewal_before_the_server_rotates(
    server, store_path, monkeypatch
):
    """A full disk (ENOSPC cannot be produced here, so mkstemp is made to fail as it would)."""
    import errno
    import tempfile

    api = make_api(server, store_path)
    tick(api)
    backdate(store_path, 46)
    old_token = server.token

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tempfile, "mkstemp", disk_full)
    with pytest.raises(TokenStoreError, match="cannot be written"):
        tick(api)
    assert requests_to(server, GENERATE_TOKEN_PATH) == 0
    assert server.token == old_token == stored_token(store_path)


def test_mistyped_new_env_token_keeps_the_renewed_stored_token(server, store_path):
    api = make_api(server, store_path)
    tick(api)
    backdate(store_path, 46)
    tick(api)  # renewed: the environment's token is stale now
    renewed = stored_token(store_path)
    mistyped = make_api(server, store_path, env_token="a-mistyped-replacement-token")
    mistyped.check_token()  # uses the stored token: accepted
    assert stored_token(store_path) == renewed == server.token


# --- refused tokens ----------------------------------------------------------------------------


def test_refused_token_fails_the_tick_with_what_to_do(server, store_path):
    api = make_api(server, store_path)
    tick(api)
    server.expire_token()  # the refresh button in the UI
    with pytest.raises(TokenRenewalError) as excinfo:
        tick(api)  # the daily test
    message = str(excinfo.value)
    assert "API tab" in message and "FIELDSALES_API_TOKEN" in message
    assert "401" in message


def test_refused_renewal_fails_the_tick_with_what_to_do(server, store_path):
    api = make_api(server, store_path)
    tick(api)
    backdate(store_path, 46)
    server.expire_token()  # the refresh button in the UI
    with pytest.raises(TokenRenewalError) as excinfo:
        tick(api)
    message = str(excinfo.value)
    assert GENERATE_TOKEN_PATH in message
    assert "API tab" in message and "FIELDSALES_API_TOKEN" in message


def test_new_env_token_after_regeneration_in_the_ui_reseeds_the_store(server, store_path):
    tick(make_api(server, store_path))
    server.expire_token()  # the refresh button in the UI
    regenerated = server.token
    message = tick(make_api(server, store_path, env_token=regenerated)).message
    assert message.startswith("not yet due")
    assert stored_token(store_path) == regenerated


# --- the token stays secret ----------------------------------------------------------------------


def test_token_never_appears_in_logs_results_or_errors(server, store_path, caplog, capsys):
    caplog.set_level(logging.DEBUG)
    tokens = [server.token]
    api = make_api(server, store_path)
    texts = [tick(api).message]
    backdate(store_path, 46)
    renewed = tick(api)
    tokens.append(server.token)
    texts += [renewed.message, str(renewed.cursor), repr(renewed)]
    texts += [repr(FileTokenStore(store_path).read()), repr(api)]

    server.expire_token()  # the refresh button in the UI
    tokens.append(server.token)
    with pytest.raises(TokenRenewalError) as refused:
        tick(api)
    texts += [str(refused.value), repr(refused.value)]
    with pytest.raises(AuthenticationError) as auth_error:
        api.check_token()
    texts.append(str(auth_error.value))
    store_path.write_text(store_path.read_text()[:-20])  # corrupt: cut off mid-token
    with pytest.raises(Exception) as corrupt:
        tick(api)
    texts.append(str(corrupt.value))

    captured = capsys.readouterr()
    texts += [caplog.text, captured.out, captured.err]
    assert "token renewed" in caplog.text + captured.err  # the sensor did log, without it
    for token in tokens:
        for text in texts:
            assert token not in text


def test_sensor_is_on_by_default_every_few_hours_and_exported(server, monkeypatch):
    monkeypatch.setenv("FIELDSALES_BASE_URL", server.base_url)
    monkeypatch.setenv("FIELDSALES_API_TOKEN", server.token)
    defs = load_project_defs()
    token_renewal_sensor = defs.get_sensor_def("token_renewal_sensor")
    assert token_renewal_sensor.default_status == dg.DefaultSensorStatus.RUNNING
    assert token_renewal_sensor.minimum_interval_seconds >= 3600
    assert token_renewal_sensor.description
    assert sorted(sensor.name for sensor in defs.sensors) == [
        "core_automation_sensor",
        "token_renewal_sensor",
    ]


def test_renewal_under_a_frozen_clock_stores_the_new_token(server, store_path):
    """freezegun's clock hands out a ``datetime`` subclass; the store must still write it.

    The store is seeded now, then the clock jumps 46 days ahead (ticking, so timeouts still
    run): the renewal is due and goes to the demo API's real generatetoken.
    """
    from freezegun import freeze_time

    old_token = server.token
    api = make_api(server, store_path)
    tick(api)
    with freeze_time(datetime.now(UTC) + timedelta(days=46), tick=True):
        message = tick(api).message
    assert message.startswith("token renewed; valid until ")
    assert requests_to(server, GENERATE_TOKEN_PATH) == 1
    assert stored_token(store_path) == server.token != old_token
    assert accepted(server, stored_token(store_path))
    issued = datetime.fromisoformat(json.loads(store_path.read_text())["issued_at"])
    assert issued - datetime.now(UTC) > timedelta(days=45)  # the frozen clock's time


def test_renewal_prepares_the_store_write_before_the_server_rotates(
    server, store_path, monkeypatch
):
    """Encoding the new store file can fail only before generatetoken is called, never after."""
    from fieldsales_dagster.token import store as store_module

    api = make_api(server, store_path)
    tick(api)
    backdate(store_path, 46)
    old_token = server.token

    def broken_encoder(_file):
        raise TypeError("cannot encode the store file")

    monkeypatch.setattr(store_module.msgspec.json, "encode", broken_encoder)
    with pytest.raises(TokenStoreError, match="cannot be encoded"):
        tick(api)
    assert requests_to(server, GENERATE_TOKEN_PATH) == 0
    assert server.token == old_token == stored_token(store_path)


# --- a sensor decides, a run acts ----------------------------------------------------------------


def test_sensor_preview_changes_nothing_and_requests_the_renewal_run(server, store_path):
    api = make_api(server, store_path)
    tick(api)
    backdate(store_path, 46)
    before, token = store_path.read_bytes(), server.token
    server.clear_requests()
    sensor = build_token_renewal_sensor(InstanceNames(), DEFAULT_POLICY)
    for _ in range(3):  # `dagster sensor preview` evaluates it like this, as often as asked
        with dg.build_sensor_context(resources={"fieldsales_api": api}) as context:
            result = sensor(context)
        assert isinstance(result, dg.SensorResult)
        (request,) = result.run_requests
        assert request.tags == {"fieldsales/token": "renewal due"}
    assert sensor.job_name == InstanceNames().token_renewal_job == "renew_token"
    assert store_path.read_bytes() == before
    assert server.token == token
    assert server.requests == []  # not even a test of the token


def test_failed_renewal_is_a_failed_run_and_the_store_is_kept(server, store_path):
    api = make_api(server, store_path)
    tick(api)
    backdate(store_path, 46)
    before = store_path.read_bytes()
    server.expire_token()  # the refresh button in the UI: the stored token is refused
    job = build_token_renewal_job(InstanceNames(), DEFAULT_POLICY)
    run = job.execute_in_process(resources={"fieldsales_api": api}, raise_on_error=False)
    assert not run.success
    (failure,) = [e for e in run.all_events if e.event_type_value == "STEP_FAILURE"]
    cause = failure.event_specific_data.error.cause  # Dagster wraps the op's own error
    assert cause.cls_name == "TokenRenewalError" and "Token renewal refused" in cause.message
    assert store_path.read_bytes() == before


def test_without_a_token_store_the_sensor_skips_and_the_job_fails_saying_renewal_is_off(
    server, store_path
):
    api = FieldSalesAPI(
        base_url=server.base_url,
        api_token=server.token,
        token_store_path=str(store_path),
        use_token_store=False,
    )
    sensor = build_token_renewal_sensor(InstanceNames(), DEFAULT_POLICY)
    with dg.build_sensor_context(resources={"fieldsales_api": api}) as context:
        skipped = sensor(context)
    assert isinstance(skipped, dg.SkipReason)
    assert skipped.skip_message == RENEWAL_OFF
    job = build_token_renewal_job(InstanceNames(), DEFAULT_POLICY)
    run = job.execute_in_process(resources={"fieldsales_api": api}, raise_on_error=False)
    assert not run.success
    (failure,) = [e for e in run.all_events if e.event_type_value == "STEP_FAILURE"]
    assert RENEWAL_OFF in failure.event_specific_data.error.message
    assert not store_path.exists() and server.requests == []


def test_renewal_job_is_in_the_project_definitions(server, monkeypatch):
    monkeypatch.setenv("FIELDSALES_BASE_URL", server.base_url)
    monkeypatch.setenv("FIELDSALES_API_TOKEN", server.token)
    defs = load_project_defs()
    assert defs.get_job_def("renew_token").name == "renew_token"
