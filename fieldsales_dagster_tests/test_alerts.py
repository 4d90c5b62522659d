"""Alerts: a failed run, a failed renewal and a failed ERROR check reach a real webhook receiver
and a real SMTP server on 127.0.0.1; a receiver that is down is logged and fails nothing; no
secret is ever in a message."""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import subprocess
import sys
import threading
from email import message_from_bytes, policy
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import dagster as dg
import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult

from fieldsales_dagster.automation.alerts import (
    Alert,
    AlertSettings,
    build_alert_sensors,
    send_alert,
)
from fieldsales_dagster.names import InstanceNames
from fieldsales_dagster.settings import AlertsSettings
from fieldsales_dagster.token.secret import MASK
from fieldsales_dagster_tests.conftest import lake_paths
from fieldsales_dagster_tests.processes import clean_env
from fieldsales_dagster_tests.project import load_failure, load_project_defs

WEBHOOK_PATH = "/services/T0001/B0002/webhook-secret-part-0123456789"
UI = "http://dagster.example:3000"
ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


class Receiver:
    """A webhook receiver: every POST's JSON body, kept in order."""

    def __init__(self) -> None:
        received: list[dict] = []
        paths: list[str] = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                received.append(json.loads(body))
                paths.append(self.path)
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: object) -> None:
                pass

        self.received, self.paths = received, paths
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}{WEBHOOK_PATH}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Mailbox:
    """aiosmtpd's handler: every message the SMTP server accepted."""

    def __init__(self) -> None:
        self.messages: list = []

    async def handle_DATA(self, server, session, envelope) -> str:  # noqa: N802 (aiosmtpd's name)
        self.messages.append(
            (envelope.rcpt_tos, message_from_bytes(envelope.content, policy=policy.default))
        )
        return "250 Message accepted for delivery"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def receiver():
    receiver = Receiver()
    yield receiver
    receiver.close()


@pytest.fixture
def mailbox():
    mailbox = Mailbox()
    controller = Controller(mailbox, hostname="127.0.0.1", port=free_port())
    controller.start()
    mailbox.port = controller.port
    yield mailbox
    controller.stop()


@pytest.fixture
def alerts_on(monkeypatch, receiver, mailbox):
    monkeypatch.setenv("FIELDSALES_ALERT_WEBHOOK_URL", receiver.url)
    monkeypatch.setenv("FIELDSALES_ALERT_EMAIL_TO", "data@example.com, oncall@example.com")
    monkeypatch.setenv("FIELDSALES_ALERT_EMAIL_FROM", "dagster@example.com")
    monkeypatch.setenv("FIELDSALES_ALERT_SMTP_HOST", "127.0.0.1")
    monkeypatch.setenv("FIELDSALES_ALERT_SMTP_PORT", str(mailbox.port))
    monkeypatch.setenv("FIELDSALES_UI_BASE_URL", UI + "/")


@pytest.fixture
def instance(tmp_path):
    (tmp_path / "dagster_home").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "dagster_home")) as instance:
        yield instance


def settings_to(
    monkeypatch, webhook_url: str, smtp_port: int, ui: str = UI, **overrides
) -> AlertSettings:
    """Alerts to ``webhook_url`` (read from its variable, as deployed) and the SMTP port, linking
    to runs in the UI at ``ui``."""
    monkeypatch.setenv("FIELDSALES_ALERT_WEBHOOK_URL", webhook_url)
    alerts = AlertsSettings(
        email_to="data@example.com", smtp_host="127.0.0.1", smtp_port=smtp_port, ui_base_url=ui
    )
    return AlertSettings(alerts=alerts, **overrides)


def core_events_sensors(monkeypatch, receiver, mailbox) -> list[dg.SensorDefinition]:
    """The default tenant's two alert sensors, owning ``core_events``, to receiver and mailbox."""
    return list(
        build_alert_sensors(
            InstanceNames(),
            settings_to(monkeypatch, receiver.url, mailbox.port),
            job_names=["refresh_all"],
            asset_keys=[dg.AssetKey("core_events")],
        )
    )


# --- off by default -----------------------------------------------------------------------------


def test_alerts_are_off_by_default(demo_env, monkeypatch):
    for variable in ("FIELDSALES_ALERT_WEBHOOK_URL", "FIELDSALES_ALERT_EMAIL_TO"):
        monkeypatch.delenv(variable, raising=False)
    names = {sensor.name for sensor in load_project_defs().sensors}
    assert names == {"token_renewal_sensor", "core_automation_sensor"}


def test_one_variable_turns_them_on(demo_env, monkeypatch, receiver):
    monkeypatch.delenv("FIELDSALES_ALERT_EMAIL_TO", raising=False)
    monkeypatch.setenv("FIELDSALES_ALERT_WEBHOOK_URL", receiver.url)
    names = {sensor.name for sensor in load_project_defs().sensors}
    assert {"run_failure_alert_sensor", "check_failure_alert_sensor"} <= names


# --- a failed refresh -----------------------------------------------------------------------


def failed_refresh(instance: dg.DagsterInstance, demo_server) -> tuple[dg.Definitions, object]:
    """A real run of refresh_all that fails: the server refuses the token."""
    defs = load_project_defs()
    demo_server.expire_token()
    result = defs.resolve_job_def("refresh_all").execute_in_process(
        instance=instance, raise_on_error=False
    )
    assert not result.success
    return defs, result


def evaluate_failure_sensor(sensor, instance, result=None, *, run_id=None, failure=None):
    """``sensor`` on a failed run: an in-process ``result``'s, or ``run_id``'s ``failure``."""
    context = dg.build_run_status_sensor_context(
        sensor_name=sensor.name,
        dagster_event=failure or result.get_run_failure_event(),
        dagster_instance=instance,
        dagster_run=instance.get_run_by_id(run_id or result.run_id),
    ).for_run_failure()
    return sensor(context)


def test_a_failed_refresh_is_posted_and_mailed_with_tenant_asset_cause_and_run_link(
    demo_env, alerts_on, receiver, mailbox, instance
):
    token = demo_env.token
    defs, result = failed_refresh(instance, demo_env)
    evaluate_failure_sensor(defs.get_sensor_def("run_failure_alert_sensor"), instance, result)

    (posted,) = receiver.received
    text = posted["text"]
    lines = text.splitlines()
    assert lines[0] == "Field-Sales [default]: run of refresh_all failed"
    assert lines[1].startswith("Failed: ") and "raw_events" in lines[1]
    # The root cause, not Dagster's wrapper around it.
    assert lines[2].startswith("Cause: AuthenticationError: GET /public/v1/api/")
    assert "refused the API token (HTTP 401)" in lines[2] and len(lines[2]) <= 340
    assert lines[3] == f"Run: {UI}/runs/{result.run_id}"
    assert receiver.paths == [WEBHOOK_PATH]

    (recipients, mail) = mailbox.messages[0]
    assert recipients == ["data@example.com", "oncall@example.com"]
    assert mail["Subject"] == lines[0]
    assert mail["From"] == "dagster@example.com"
    assert mail.get_content().replace("\r\n", "\n").strip() == text

    for sent in (text, mail.as_string()):
        assert token not in sent
        assert WEBHOOK_PATH not in sent


def test_a_run_of_another_tenant_is_not_alerted(
    demo_env, alerts_on, receiver, mailbox, instance, monkeypatch
):
    defs, result = failed_refresh(instance, demo_env)
    other = build_alert_sensors(
        InstanceNames("acme"),
        settings_to(monkeypatch, receiver.url, mailbox.port),
        job_names=["acme_refresh_all"],
        asset_keys=[dg.AssetKey(["acme", "raw_events"])],
    )[0]
    skipped = evaluate_failure_sensor(other, instance, result)
    assert isinstance(skipped, dg.SkipReason) and "not a run of acme" in skipped.skip_message
    assert receiver.received == [] and mailbox.messages == []


def test_a_failed_run_of_assets_names_them_not_dagsters_hidden_job(
    receiver, mailbox, instance, monkeypatch
):
    """Launched for assets (``dg launch --assets``, the UI's Materialize), a run's job is one
    Dagster hides: the alert names the assets, the failed step and its error's first line."""

    @dg.asset(key="core_events")
    def core_events() -> None:
        raise RuntimeError("Building core.events failed; the previous one is kept.\nDetails...")

    result = dg.materialize([core_events], instance=instance, raise_on_error=False)
    assert result.dagster_run.job_name.startswith("__")
    evaluate_failure_sensor(
        core_events_sensors(monkeypatch, receiver, mailbox)[0], instance, result
    )
    (posted,) = receiver.received
    assert posted["text"].splitlines() == [
        "Field-Sales [default]: run of core_events failed",
        "Failed: core_events",
        "Cause: RuntimeError: Building core.events failed; the previous one is kept.",
        f"Run: {UI}/runs/{result.run_id}",
    ]


def project_env(demo_server, tmp_path, **extra: str) -> dict[str, str]:
    """The project's environment for a command of its own (``dg``, ``dagster``): the demo API, a
    lake and a token store in ``tmp_path``, the venv's commands first on the PATH; and ``extra``."""
    catalog, data_path = lake_paths(tmp_path)
    project = {
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "FIELDSALES_BASE_URL": demo_server.base_url,
        "FIELDSALES_API_TOKEN": demo_server.token,
        "FIELDSALES_DUCKLAKE_CATALOG": catalog,
        "FIELDSALES_DUCKLAKE_DATA_PATH": data_path,
        "FIELDSALES_TOKEN_STORE": str(tmp_path / "token_store.json"),
    }
    return clean_env(**{**project, **extra})


def in_project(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_the_pages_commands_turn_the_alerts_on_and_list_them(demo_server, tmp_path):
    """docs/alerts.md's commands as written, in one shell in the project's folder."""
    page = (ROOT / "docs" / "alerts.md").read_text()
    script = "".join(re.findall(r"```bash\n(.*?)```", page, re.S))
    shell = in_project(
        ["bash", "-euo", "pipefail", "-c", script], project_env(demo_server, tmp_path)
    )
    assert shell.returncode == 0, shell.stderr[-3000:]
    listed = set(re.findall(r"\w+_alert_sensor", shell.stdout))
    assert listed == {"run_failure_alert_sensor", "check_failure_alert_sensor"}


def documented_message() -> str:
    """The example message of docs/alerts.md ("The message")."""
    page = (ROOT / "docs" / "alerts.md").read_text()
    return re.search(r"## The message.*?```\n(.*?)```", page, re.S).group(1)


def test_a_run_marked_failed_with_no_failed_step_names_its_assets_and_why(
    receiver, mailbox, instance, monkeypatch
):
    """A run whose worker died has no failed step: run monitoring marks it failed with a message;
    the alert names what the run was for and that message."""
    (core_events,) = checked_assets()
    job = dg.Definitions(assets=[core_events]).resolve_implicit_global_asset_job_def()
    run = instance.create_run_for_job(job, asset_selection={dg.AssetKey("core_events")})
    why = f"Detected run worker status UNKNOWN. Marking run {run.run_id} as failed."
    failure = instance.report_run_failed(run, why)
    sensor = core_events_sensors(monkeypatch, receiver, mailbox)[0]
    evaluate_failure_sensor(sensor, instance, run_id=run.run_id, failure=failure)
    (posted,) = receiver.received
    assert posted["text"].splitlines() == [
        "Field-Sales [default]: run of core_events failed",
        "Failed: core_events",
        f"Cause: {why}",
        f"Run: {UI}/runs/{run.run_id}",
    ]


def test_a_run_launched_with_dg_launch_is_alerted_once_as_the_docs_show(
    demo_server, receiver, tmp_path
):
    """``dg launch`` runs in-process: its run has no origin in a code location. The sensor is
    evaluated as the daemon evaluates it, through the code location (``dagster sensor preview``
    from Dagster's cursor before every event), with the UI address the page shows."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    env = project_env(
        demo_server,
        tmp_path,
        DAGSTER_HOME=str(home),
        FIELDSALES_API_TOKEN="a-wrong-token-0123456789",
        FIELDSALES_ALERT_WEBHOOK_URL=receiver.url,
        FIELDSALES_UI_BASE_URL="https://dagster.example.com",
    )

    def run(*argv: str) -> subprocess.CompletedProcess:
        return in_project([str(BIN / argv[0]), *argv[1:]], env)

    assert run("dg", "launch", "--assets", "raw_events").returncode != 0
    with dg.DagsterInstance.from_config(str(home)) as instance:
        (failed,) = instance.get_runs()
    assert failed.status == dg.DagsterRunStatus.FAILURE and failed.remote_job_origin is None
    cursor = '{"__class__": "RunStatusSensorCursor", "record_id": 0}'
    preview = run("dagster", "sensor", "preview", "run_failure_alert_sensor", "--cursor", cursor)
    assert preview.returncode == 0, preview.stderr[-2000:]
    (posted,) = receiver.received
    assert posted["text"] + "\n" == re.sub(
        r"/runs/[0-9a-f-]{36}", f"/runs/{failed.run_id}", documented_message()
    )
    assert env["FIELDSALES_API_TOKEN"] not in posted["text"]


# --- failed checks --------------------------------------------------------------------------


def checked_assets() -> list:
    @dg.asset(
        key=dg.AssetKey("core_events"),
        check_specs=[
            dg.AssetCheckSpec("ids_unique", asset="core_events"),
            dg.AssetCheckSpec("drift", asset="core_events"),
        ],
    )
    def core_events() -> dg.MaterializeResult:
        return dg.MaterializeResult(
            check_results=[
                dg.AssetCheckResult(
                    check_name="ids_unique",
                    passed=False,
                    severity=dg.AssetCheckSeverity.ERROR,
                    description="3 event_id values occur more than once",
                ),
                dg.AssetCheckResult(
                    check_name="drift", passed=False, severity=dg.AssetCheckSeverity.WARN
                ),
            ]
        )

    return [core_events]


def evaluate_check_sensor(sensor, instance, run_id):
    run = instance.get_run_by_id(run_id)
    (success,) = instance.get_records_for_run(
        run_id, of_type=dg.DagsterEventType.RUN_SUCCESS
    ).records
    context = dg.build_run_status_sensor_context(
        sensor_name=sensor.name,
        dagster_event=success.event_log_entry.dagster_event,
        dagster_instance=instance,
        dagster_run=run,
    )
    return sensor(context)


def test_a_failed_error_check_in_a_successful_run_is_alerted_and_a_warning_is_not(
    receiver, mailbox, instance, monkeypatch
):
    result = dg.materialize(checked_assets(), instance=instance)
    assert result.success  # a failed check does not fail the run (dagster #29896)
    evaluate_check_sensor(
        core_events_sensors(monkeypatch, receiver, mailbox)[1], instance, result.run_id
    )
    (posted,) = receiver.received
    assert posted["text"].splitlines() == [
        "Field-Sales [default]: check ids_unique failed (ERROR)",
        "Check: core_events / ids_unique",
        "Cause: 3 event_id values occur more than once",
        f"Run: {UI}/runs/{result.run_id}",
    ]
    assert len(mailbox.messages) == 1


def test_a_receiver_that_is_down_is_logged_and_fails_nothing(instance, caplog, monkeypatch):
    down = f"http://127.0.0.1:{free_port()}{WEBHOOK_PATH}"
    monkeypatch.setenv("FIELDSALES_ALERT_WEBHOOK_URL", down)
    result = dg.materialize(checked_assets(), instance=instance)
    sensors = build_alert_sensors(
        InstanceNames(),
        settings_to(monkeypatch, down, free_port()),
        job_names=[],
        asset_keys=[dg.AssetKey("core_events")],
    )
    with caplog.at_level(logging.WARNING):
        evaluate_check_sensor(sensors[1], instance, result.run_id)  # does not raise
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("the webhook alert" in w and "FIELDSALES_ALERT_WEBHOOK_URL" in w for w in warnings)
    assert any("the email alert" in w and "FIELDSALES_ALERT_SMTP_HOST" in w for w in warnings)
    assert all(WEBHOOK_PATH not in w for w in warnings)
    assert instance.get_run_by_id(result.run_id).status == dg.DagsterRunStatus.SUCCESS


def test_a_refused_smtp_login_names_the_login_variables_not_the_host(monkeypatch, caplog):
    """An SMTP server that wants a login refuses a wrong password: what to check is the login."""

    def authenticate(server, session, envelope, mechanism, auth_data):
        return AuthResult(success=False, handled=False)

    controller = Controller(
        Mailbox(),
        hostname="127.0.0.1",
        port=free_port(),
        auth_require_tls=False,
        authenticator=authenticate,
    )
    controller.start()
    try:
        monkeypatch.setenv("FIELDSALES_ALERT_SMTP_PASSWORD", "a-wrong-smtp-password")
        alerts = AlertsSettings(
            email_to="data@example.com",
            smtp_host="127.0.0.1",
            smtp_port=controller.port,
            smtp_user="alerts",
        )
        delivery = send_alert(AlertSettings(alerts), Alert("default", "x", "y", "z"))
    finally:
        controller.stop()
    (failure,) = delivery.failed
    assert "SMTPAuthenticationError" in failure
    assert "check FIELDSALES_ALERT_SMTP_USER and FIELDSALES_ALERT_SMTP_PASSWORD" in failure
    assert "a-wrong-smtp-password" not in failure


# --- token renewal --------------------------------------------------------------------------


def test_a_failed_token_renewal_is_alerted_without_the_token(
    demo_env, alerts_on, receiver, mailbox, instance
):
    """Renewal is a run of its own job: its failure reaches the run-failure alert."""
    defs = load_project_defs()
    demo_env.expire_token()
    result = defs.resolve_job_def("renew_token").execute_in_process(
        instance=instance, raise_on_error=False
    )
    assert not result.success
    evaluate_failure_sensor(defs.get_sensor_def("run_failure_alert_sensor"), instance, result)
    (posted,) = receiver.received
    lines = posted["text"].splitlines()
    assert lines[0] == "Field-Sales [default]: run of renew_token failed"
    assert lines[2].startswith("Cause: ") and "401" in lines[2]
    assert demo_env.token not in posted["text"]
    assert len(mailbox.messages) == 1


# --- secrets --------------------------------------------------------------------------------


def test_no_secret_the_instance_knows_is_ever_in_a_message(
    receiver, mailbox, monkeypatch, tmp_path
):
    from fieldsales_dagster.token.store import FileTokenStore

    api_token, renewed = "env-token-abcdef0123456789", "renewed-token-9876543210fedcba"
    monkeypatch.setenv("FIELDSALES_API_TOKEN", api_token)
    monkeypatch.setenv("FIELDSALES_ALERT_SMTP_PASSWORD", "smtp-password-xyz")
    monkeypatch.setenv("FIELDSALES_ALERT_WEBHOOK_URL", receiver.url)
    store = FileTokenStore(tmp_path / "token.json")
    from datetime import timedelta

    store.rotate(api_token, lambda current: renewed, renew_after=timedelta(0))
    settings = settings_to(
        monkeypatch,
        receiver.url,
        mailbox.port,
        secret_env_vars=("FIELDSALES_API_TOKEN",),
        token_store=store,
    )
    stored = store.read()
    assert stored is not None and stored.token == renewed
    cause = (
        f"401 for Bearer {api_token} (stored {stored.token}); smtp-password-xyz; "
        f"posted to {receiver.url}"
    )
    delivery = send_alert(settings, Alert("default", "run of refresh_all failed", "x", cause))
    assert delivery.sent == ["webhook", "email"]
    text = receiver.received[0]["text"]
    for secret in (api_token, stored.token, "smtp-password-xyz", WEBHOOK_PATH):
        assert secret not in text
        assert secret not in mailbox.messages[0][1].as_string()
    assert MASK in text


def test_an_alert_never_carries_the_value_of_any_secret_setting(monkeypatch):
    """Every ``*_env_var`` setting names a secret's variable: the component's alerts hide its
    value without a list of their own (a new secret setting is hidden too)."""
    from fieldsales_dagster.settings import SETTINGS
    from fieldsales_dagster_tests.project import component

    variables = {s.default for s in SETTINGS.values() if s.field.endswith("_env_var")}
    assert "FIELDSALES_S3_ACCESS_KEY_ID" in variables and "FIELDSALES_API_TOKEN" in variables
    for variable in variables:
        monkeypatch.setenv(variable, f"value-of-{variable}")
    secrets = component().alert_settings().secrets()
    assert {f"value-of-{variable}" for variable in variables} <= set(secrets)


def test_the_webhook_key_is_masked_but_never_the_run_link_an_address_or_a_word(
    receiver, mailbox, monkeypatch
):
    """The webhook and the UI share ``http://127.0.0.1:`` here (``https://`` and a domain in
    production); the path's words (``services``) are plain words elsewhere."""
    local_ui = f"http://127.0.0.1:{free_port()}"
    settings = settings_to(monkeypatch, receiver.url, mailbox.port, ui=local_ui)
    cause = f"POST {receiver.url} failed: the chat services answered 503"
    send_alert(settings, Alert("default", "run of refresh_all failed", "x", cause, "6a1f-77"))
    (posted,) = receiver.received
    host = receiver.url.removesuffix(WEBHOOK_PATH)
    assert posted["text"].splitlines()[2:] == [
        f"Cause: POST {host}{MASK} failed: the chat services answered 503",
        f"Run: {local_ui}/runs/6a1f-77",
    ]


def test_the_components_alerts_mask_the_webhook_by_its_parts_as_well(monkeypatch):
    """The component hands every secret setting's variable to the alerts: the webhook URL's among
    them must still be masked by its parts, not whole (its host and words stay readable)."""
    from fieldsales_dagster_tests.project import component

    url = "http://127.0.0.1:9/hooks/abc123xyz"
    monkeypatch.setenv("FIELDSALES_ALERT_WEBHOOK_URL", url)
    scrubbed = component().alert_settings().scrub(f"POST {url} failed: the chat services said 503")
    assert scrubbed == f"POST http://127.0.0.1:9{MASK} failed: the chat services said 503"


def test_a_ui_address_set_with_a_trailing_slash_links_the_run_without_doubling_it():
    settings = AlertSettings(AlertsSettings(ui_base_url=f" {UI}/ "))
    text = Alert("default", "run of refresh_all failed", "x", "y", "6a1f-77").text(settings)
    assert text.splitlines()[-1] == f"Run: {UI}/runs/6a1f-77"


def test_a_webhook_that_is_down_is_named_by_its_address_without_its_secret_parts(
    monkeypatch, caplog
):
    port = free_port()
    secrets = ("hook-password-42", "/hooks/abc123xyz", "key=query-secret-7")
    down = f"http://user:{secrets[0]}@127.0.0.1:{port}{secrets[1]}?{secrets[2]}"
    settings = settings_to(monkeypatch, down, free_port())
    with caplog.at_level(logging.WARNING):
        delivery = send_alert(settings, Alert("default", "run of refresh_all failed", "x", "y"))
    webhook_failure, _ = delivery.failed
    assert f"host='127.0.0.1', port={port}" in webhook_failure
    assert not any(secret in record.getMessage() for secret in secrets for record in caplog.records)


def test_the_deploy_guide_lists_every_alert_variable_for_the_processes_that_load_the_code():
    from fieldsales_dagster_tests.test_deploy_guide import variables_for

    variables = {each.variable or each.default for each in AlertsSettings.settings().values()}
    assert len(variables) == 8
    for process in ("webserver", "daemon", "code server"):
        assert variables <= variables_for(process), process


def test_bad_alert_settings_fail_the_load_naming_setting_and_variable(demo_env, monkeypatch):
    message = load_failure(monkeypatch, FIELDSALES_ALERT_EMAIL_TO="data-team")
    assert "alerts.email_to (from FIELDSALES_ALERT_EMAIL_TO) is invalid" in message
    assert "e-mail addresses separated by commas" in message
