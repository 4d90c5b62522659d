"""A second tenant added as docs/tenants.md adds it (``dg scaffold defs ... acme``): every error
about its settings names the variables its ``defs.yaml`` reads (``ACME_FIELDSALES_*``), a tenant
whose settings are wrong leaves the other tenants loaded and fails its own runs, and the page's
commands, run as written, give the new tenant a first run that succeeds."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import dagster as dg
import pytest
import yaml

from fieldsales_dagster.automation.alerts import Alert, send_alert
from fieldsales_dagster.component import FieldSalesComponent, tenant_defs_yaml
from fieldsales_dagster.demo_api import DemoConfig, DemoServer
from fieldsales_dagster.warehouse.warehouse import FieldSalesWarehouse
from fieldsales_dagster_tests.conftest import read_lake
from fieldsales_dagster_tests.processes import clean_env
from fieldsales_dagster_tests.project import error_chain, load_project, write_project
from fieldsales_dagster_tests.test_alerts import free_port
from fieldsales_dagster_tests.test_dg_tooling import (
    BIN,
    COMPONENT,
    DEFS_YAML,
    REPO_ROOT,
    project_copy,
)
from fieldsales_dagster_tests.test_dg_tooling import dg as run_dg

TENANTS_PAGE = REPO_ROOT / "docs" / "tenants.md"
NOT_CONFIGURED = dg.AssetKey(["acme", "not_configured"])
#: The first tenant's variables, set: it loads.
FIRST_TENANT = {
    "FIELDSALES_BASE_URL": "http://127.0.0.1:9",
    "FIELDSALES_API_TOKEN": "first-tenant-token-0123456789",
}
#: A variable of the first tenant's (``FIELDSALES_BASE_URL``), not one of acme's.
FIRST_TENANTS_VARIABLE = re.compile(r"(?<![A-Z_])FIELDSALES_[A-Z_]+")
ACME_URL = {"ACME_FIELDSALES_BASE_URL": "http://127.0.0.1:9"}
ACME = {**ACME_URL, "ACME_FIELDSALES_API_TOKEN": "acme-tenant-token-0123456789"}


def two_tenants(root: Path) -> Path:
    """A project whose defs/ holds the shipped tenant and a scaffolded ``acme``."""
    package = write_project(root, {})
    for folder, text in [
        ("fieldsales", DEFS_YAML.read_text()),
        ("acme", tenant_defs_yaml(COMPONENT, "acme")),
    ]:
        (package / "defs" / folder).mkdir()
        (package / "defs" / folder / "defs.yaml").write_text(text)
    return package


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ({}, "api.base_url (from ACME_FIELDSALES_BASE_URL) is invalid: it is not set"),
        (
            {"ACME_FIELDSALES_BASE_URL": "ftp://acme.example.com"},
            "api.base_url (from ACME_FIELDSALES_BASE_URL) is invalid: it must be",
        ),
        (ACME_URL, "the environment variable ACME_FIELDSALES_API_TOKEN is not set"),
        (
            {**ACME, "ACME_FIELDSALES_TOKEN_STORE": "{tmp_path}"},
            "api.token_store_path (from ACME_FIELDSALES_TOKEN_STORE) is invalid",
        ),
        (
            {**ACME, "ACME_FIELDSALES_TOKEN_STORE": "{tmp_path}/missing/token.json"},
            "api.token_store_path (from ACME_FIELDSALES_TOKEN_STORE) is invalid",
        ),
        (
            {**ACME, "ACME_FIELDSALES_DUCKLAKE_CATALOG": "mysql:acme"},
            "storage.ducklake_catalog (from ACME_FIELDSALES_DUCKLAKE_CATALOG) is invalid",
        ),
        (
            {**ACME, "ACME_FIELDSALES_DUCKLAKE_CATALOG": "postgres:dbname=acme host=db user=a"},
            "storage.ducklake_data_path (from ACME_FIELDSALES_DUCKLAKE_DATA_PATH) is invalid",
        ),
    ],
    ids=[
        "no base url",
        "not a url",
        "no token",
        "store a folder",
        "store's folder missing",
        "catalog",
        "no data path",
    ],
)
def test_a_tenants_bad_setting_names_its_variable_and_leaves_the_other_tenant_loaded(
    tmp_path, monkeypatch, given, named
):
    for variable, value in {**FIRST_TENANT, **given, "DAGSTER_HOME": str(tmp_path)}.items():
        monkeypatch.setenv(variable, value.format(tmp_path=tmp_path))
    defs = load_project(two_tenants(tmp_path / "project"), monkeypatch)
    # The first tenant whole: its jobs, schedules and sensors.
    assert {"refresh_all", "lake_upkeep"} <= {job.name for job in defs.jobs}
    assert {"refresh_all_schedule"} <= {schedule.name for schedule in defs.schedules}
    assert {"token_renewal_sensor"} <= {sensor.name for sensor in defs.sensors}
    # acme in the UI: its error, naming its own variable, never the first tenant's.
    error = defs.resolve_asset_graph().get(NOT_CONFIGURED).description or ""
    assert named in error
    assert not FIRST_TENANTS_VARIABLE.findall(error), error
    # A run of acme fails with that error (its only step raises it: no request is sent).
    run = defs.resolve_job_def("acme_refresh_all").execute_in_process(raise_on_error=False)
    assert not run.success
    (failure,) = [event for event in run.all_events if event.is_step_failure]
    assert named in str(failure.step_failure_data.error)


def run_said(run: dg.ExecuteInProcessResult, instance: dg.DagsterInstance) -> str:
    """What a run told: its log lines and its errors' messages and causes (not their stacks,
    which quote the project's source)."""
    said = [entry.user_message for entry in instance.all_logs(run.run_id)]
    for event in run.get_step_failure_events():
        error = event.step_failure_data.error
        while error is not None:
            said.append(error.message)
            error = error.cause or error.context
    return "\n".join(said)


@pytest.mark.parametrize(
    ("given", "named"),
    [
        (
            {"ACME_FIELDSALES_API_TOKEN": "acme-wrong-token-0123456789"},
            "(HTTP 401): it is invalid, expired or was replaced by a renewal. Regenerate it in "
            "your Field-Sales user profile (API tab, refresh button) and set "
            "ACME_FIELDSALES_API_TOKEN to the new token.",
        ),
        (ACME_URL, "Check ACME_FIELDSALES_BASE_URL (http://127.0.0.1:9)"),
        (
            {"ACME_FIELDSALES_DUCKLAKE_DATA_PATH": "{tmp_path}/unmounted"},
            "The lake's data path {tmp_path}/unmounted (ACME_FIELDSALES_DUCKLAKE_DATA_PATH) does "
            "not exist",
        ),
        (
            {"ACME_FIELDSALES_TOKEN_STORE": "{tmp_path}/token.json"},
            "Delete it and restart: the store is seeded again from ACME_FIELDSALES_API_TOKEN",
        ),
    ],
    ids=["wrong token", "nobody listens", "data path missing", "token store corrupt"],
)
def test_a_run_of_the_scaffolded_tenant_names_its_variables_in_every_error(
    tmp_path, monkeypatch, demo_server, given, named
):
    acme = {
        "ACME_FIELDSALES_BASE_URL": demo_server.base_url,
        "ACME_FIELDSALES_API_TOKEN": demo_server.token,
        # Its own path: a process keeps what it learnt of a lake by its catalog's spelling.
        "ACME_FIELDSALES_DUCKLAKE_CATALOG": "sqlite:{tmp_path}/acme.sqlite",
        **given,
    }
    for variable, value in {**FIRST_TENANT, **acme, "DAGSTER_HOME": str(tmp_path)}.items():
        monkeypatch.setenv(variable, value.format(tmp_path=tmp_path))
    monkeypatch.chdir(tmp_path)  # the first tenant's files, under data/
    (tmp_path / "token.json").write_text("not a token store")
    (tmp_path / "token.json").chmod(0o600)
    defs = load_project(two_tenants(tmp_path / "project"), monkeypatch)
    with dg.instance_for_test() as instance:
        job = defs.resolve_job_def("acme_refresh_all")
        run = job.execute_in_process(instance=instance, raise_on_error=False)
        said = run_said(run, instance)
    assert not run.success
    assert named.format(tmp_path=tmp_path) in said
    assert not FIRST_TENANTS_VARIABLE.findall(said), said
    assert demo_server.token not in said and acme["ACME_FIELDSALES_API_TOKEN"] not in said


def test_a_scaffolded_tenants_missing_pii_key_names_its_variables(tmp_path, monkeypatch):
    for variable, value in {**FIRST_TENANT, **ACME, "DAGSTER_HOME": str(tmp_path)}.items():
        monkeypatch.setenv(variable, value)
    package = two_tenants(tmp_path / "project")
    acme = package / "defs" / "acme" / "defs.yaml"
    acme.write_text(acme.read_text().replace("  pii:\n", "  pii:\n    mode: hash\n"))
    error = load_project(package, monkeypatch).resolve_asset_graph().get(NOT_CONFIGURED).description
    assert "pii: hash needs a secret key in ACME_FIELDSALES_PII_HASH_KEY" in (error or "")
    assert not FIRST_TENANTS_VARIABLE.findall(error or ""), error


def test_a_code_location_with_one_tenant_still_fails_its_load_on_its_bad_setting(
    tmp_path, monkeypatch
):
    package = write_project(tmp_path / "project", {})
    (package / "defs" / "acme").mkdir()
    (package / "defs" / "acme" / "defs.yaml").write_text(tenant_defs_yaml(COMPONENT, "acme"))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    with pytest.raises(Exception) as failure:
        load_project(package, monkeypatch)
    said = error_chain(failure.value)
    assert "api.base_url (from ACME_FIELDSALES_BASE_URL) is invalid: it is not set" in said


def test_a_scaffolded_tenant_reads_its_secrets_from_variables_of_its_own(monkeypatch):
    monkeypatch.setenv("ACME_FIELDSALES_BASE_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("FIELDSALES_ALERT_WEBHOOK_URL", "https://chat.example.com/hooks/first")
    attributes = yaml.safe_load(tenant_defs_yaml(COMPONENT, "acme"))["attributes"]
    acme = FieldSalesComponent.from_attributes_dict(attributes=attributes)
    assert [
        acme.storage.ducklake_password_env_var,
        acme.pii.hash_key_env_var,
        acme.alerts.webhook_url_env_var,
        acme.alerts.smtp_password_env_var,
    ] == [
        "ACME_FIELDSALES_DUCKLAKE_PASSWORD",
        "ACME_FIELDSALES_PII_HASH_KEY",
        "ACME_FIELDSALES_ALERT_WEBHOOK_URL",
        "ACME_FIELDSALES_ALERT_SMTP_PASSWORD",
    ]
    # The first tenant's webhook is not acme's: acme's alerts stay off until it has its own.
    assert acme.alert_settings().channels == []


def test_a_scaffolded_tenants_alert_that_cannot_be_sent_names_its_settings(monkeypatch):
    monkeypatch.setenv("ACME_FIELDSALES_BASE_URL", "http://127.0.0.1:9")
    attributes = yaml.safe_load(tenant_defs_yaml(COMPONENT, "acme"))["attributes"]
    mail = {"email_to": "data@example.com", "smtp_host": "127.0.0.1", "smtp_port": free_port()}
    attributes["alerts"] |= mail  # written in its defs.yaml: no variable to name
    acme = FieldSalesComponent.from_attributes_dict(attributes=attributes)
    (failure,) = send_alert(acme.alert_settings(), Alert("acme", "x", "y", "z")).failed
    assert "check alerts.smtp_host/alerts.smtp_port and that it is up" in failure
    assert not FIRST_TENANTS_VARIABLE.findall(failure), failure


def test_dg_list_defs_lists_the_first_tenant_and_names_the_scaffolded_tenants_variable(
    tmp_path,
):
    project = project_copy(tmp_path)
    run_dg("scaffold", "defs", COMPONENT, "acme", cwd=project)
    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    # The copy's package first: else `dg` imports the installed one (its registry entry point).
    env = {**FIRST_TENANT, "DAGSTER_HOME": str(tmp_path), "PYTHONPATH": str(project)}
    listed = run_dg("list", "defs", "--json", cwd=project, env=env)
    defs = json.loads(listed)
    assert {"refresh_all", "lake_upkeep", "renew_token", "acme_refresh_all"} == {
        job["name"] for job in defs["jobs"]
    }
    assert {"raw_events", "core_transactions"} <= {a["asset_key"] for a in defs["assets"]}
    assert {"refresh_all_schedule"} <= {schedule["name"] for schedule in defs["schedules"]}
    (acme,) = [a for a in defs["assets"] if a["asset_key"].startswith("acme/")]
    assert "ACME_FIELDSALES_BASE_URL" in acme["description"]
    # The check fails on it; a run of the tenant fails with it.
    checked = run_dg("check", "defs", cwd=project, env=env, fails=True)
    launched = run_dg("launch", "--job", "acme_refresh_all", cwd=project, env=env, fails=True)
    for said in (checked, launched):
        assert "api.base_url (from ACME_FIELDSALES_BASE_URL) is invalid: it is not set" in said
    for said in (listed, checked, launched):
        assert "from FIELDSALES_BASE_URL" not in said


def tenants_page_commands(server: DemoServer) -> list[str]:
    """The command lines of docs/tenants.md, in order; its two ``export`` lines, examples for the
    reader's instance, give the demo API's URL and token instead."""
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", TENANTS_PAGE.read_text(), re.S):
        lines += [line for line in block.splitlines() if line.strip()]
    examples = {
        "ACME_FIELDSALES_BASE_URL": server.base_url,
        "ACME_FIELDSALES_API_TOKEN": server.token,
    }
    for variable, value in examples.items():
        (at,) = [i for i, line in enumerate(lines) if line.startswith(f"export {variable}=")]
        lines[at] = f"export {variable}={value}"
    return lines


def test_the_tenants_page_run_as_written_gives_the_new_tenant_a_successful_first_run(tmp_path):
    """The reader's project has its first tenant configured (``FIELDSALES_*``); the page's
    commands add acme and run its refresh, with only the variables the page sets."""
    project = project_copy(tmp_path)
    (project / ".venv").symlink_to(BIN.parent)  # the page's .venv/bin/dg
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env = clean_env(**FIRST_TENANT, DAGSTER_HOME=str(home), PYTHONPATH=str(project))
    with DemoServer(DemoConfig(transactions=300, seed=7), host="127.0.0.1", port=0) as server:
        script = "set -euo pipefail\n" + "\n".join(tenants_page_commands(server))
        done = subprocess.run(
            ["bash", "-c", script],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert 'RUN_SUCCESS - Finished execution of run for "acme_refresh_all"' in done.stderr
    catalog = project / "data" / "acme" / "ducklake.sqlite"
    with read_lake(FieldSalesWarehouse(ducklake_catalog=f"sqlite:{catalog}")) as conn:
        ids = {row[0] for row in conn.execute("SELECT id FROM raw.events").fetchall()}
    assert ids == set(server.dataset.ids("events"))
    assert (
        server.token
        not in (project / "fieldsales_dagster" / "defs" / "acme" / "defs.yaml").read_text()
    )
