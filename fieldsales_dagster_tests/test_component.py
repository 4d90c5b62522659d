"""The Field-Sales component: YAML settings, their errors, a second tenant, and the dg CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from fieldsales_dagster.demo_api import DemoConfig, DemoServer
from fieldsales_dagster_tests.conftest import lake_paths, read_lake
from fieldsales_dagster_tests.namespaces import private_tmpfs
from fieldsales_dagster_tests.project import (
    ASSETS,
    TABLES,
    core_check_count,
    error_chain,
    instance_yaml,
    load_failure,
    load_project,
    load_project_defs,
    write_project,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


# --- one settings model --------------------------------------------------------------------------


@pytest.fixture
def project_env(monkeypatch):
    monkeypatch.setenv("FIELDSALES_BASE_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("FIELDSALES_API_TOKEN", "component-test-token")


def test_environment_variables_reach_every_setting(project_env, monkeypatch, tmp_path):
    monkeypatch.setenv("FIELDSALES_PAGE_SIZE", "250")
    monkeypatch.setenv("FIELDSALES_CONCURRENCY", "3")
    monkeypatch.setenv("FIELDSALES_DUCKDB_PATH", str(tmp_path / "x.duckdb"))
    monkeypatch.setenv("FIELDSALES_DUCKDB_MEMORY_LIMIT", "1GB")
    defs = load_project_defs()
    api, warehouse = defs.resources["fieldsales_api"], defs.resources["warehouse"]
    assert (api.page_size, api.concurrency) == (250, 3)
    assert (warehouse.duckdb_path, warehouse.duckdb_memory_limit) == (
        str(tmp_path / "x.duckdb"),
        "1GB",
    )
    assert api.base_url == "http://127.0.0.1:9"


def test_token_reaches_the_resource_as_an_env_var_never_as_its_value(project_env):
    api = load_project_defs().resources["fieldsales_api"]
    assert api.api_token == dg.EnvVar("FIELDSALES_API_TOKEN")
    assert "component-test-token" not in repr(api)


def test_bad_page_size_fails_the_load_naming_setting_variable_and_allowed_values(
    project_env, monkeypatch
):
    message = load_failure(monkeypatch, FIELDSALES_PAGE_SIZE="0")
    assert "api.page_size (from FIELDSALES_PAGE_SIZE) is invalid" in message
    assert "a whole number from 1 to 10000" in message


def test_missing_base_url_fails_the_load_with_what_to_set(project_env, monkeypatch):
    monkeypatch.delenv("FIELDSALES_BASE_URL")
    message = load_failure(monkeypatch)
    assert "api.base_url (from FIELDSALES_BASE_URL) is invalid: it is not set" in message


def test_cleartext_base_url_to_a_remote_host_fails_the_load(project_env, monkeypatch):
    message = load_failure(monkeypatch, FIELDSALES_BASE_URL="http://fieldsales.example.com")
    assert "base_url" in message and "https://" in message


def test_missing_token_fails_the_load_naming_the_variable(project_env, monkeypatch):
    monkeypatch.delenv("FIELDSALES_API_TOKEN")
    message = load_failure(monkeypatch)
    assert "FIELDSALES_API_TOKEN is not set" in message


def test_token_written_into_yaml_is_refused_and_never_echoed(tmp_path, monkeypatch):
    package = write_project(
        tmp_path,
        {"main": "api:\n  base_url: http://127.0.0.1:9\n  api_token: literal-secret-token-123"},
    )
    with pytest.raises(Exception) as failure:
        load_project(package, monkeypatch)
    message = error_chain(failure.value)
    assert "api_token must name an environment variable" in message
    assert "literal-secret-token-123" not in message


# --- a second tenant ---------------------------------------------------------------------------


def test_two_tenants_in_one_code_location_each_load_exactly_their_own_data(tmp_path, monkeypatch):
    with (
        DemoServer(DemoConfig(transactions=400, seed=1), port=0) as first,
        DemoServer(DemoConfig(transactions=600, seed=2), port=0) as second,
    ):
        monkeypatch.setenv("MAIN_TOKEN", first.token)
        monkeypatch.setenv("ACME_TOKEN", second.token)
        package = write_project(
            tmp_path,
            {
                name: instance_yaml(
                    base_url=server.base_url,
                    api_token=f"{{{{ env.{name.upper()}_TOKEN }}}}",
                    ducklake_catalog=lake_paths(tmp_path, name)[0],
                    ducklake_data_path=lake_paths(tmp_path, name)[1],
                    token_store_path=tmp_path / f"{name}_token.json",
                    key_prefix=prefix,
                )
                for name, server, prefix in [("main", first, None), ("acme", second, "acme")]
            },
        )
        defs = load_project(package, monkeypatch)
        graph = defs.get_repository_def().asset_graph
        keys = {key.to_user_string() for key in graph.get_all_asset_keys()}
        assert keys == ASSETS | {f"acme/{asset}" for asset in ASSETS}
        # One pool per table and tenant: one writer per table, the tenants never share one.
        pools = {key: graph.get(key).pools for key in graph.get_all_asset_keys()}
        for key, pool in pools.items():
            tenant = "fieldsales_duckdb_acme_" if key.path[0] == "acme" else "fieldsales_duckdb_"
            assert pool == {tenant + key.path[-1]}, key
        assert {job.name for job in defs.jobs} == {
            "refresh_all",
            "acme_refresh_all",
            "lake_upkeep",
            "acme_lake_upkeep",
            "renew_token",
            "acme_renew_token",
        }

        with dg.instance_for_test() as instance:
            for job_name, tenant in (("refresh_all", "main"), ("acme_refresh_all", "acme")):
                result = defs.resolve_job_def(job_name).execute_in_process(instance=instance)
                assert result.success
                # Each load's log lines say whose lake they wrote, as two tenants share a UI.
                wrote = [
                    entry.user_message
                    for entry in instance.all_logs(result.run_id)
                    if " rows to raw." in entry.user_message
                ]
                label = "acme" if tenant == "acme" else "default"
                assert len(wrote) == 3, wrote
                assert all(
                    line.startswith(f"[{label}: {lake_paths(tmp_path, tenant)[0]}] ")
                    for line in wrote
                ), wrote

    for name, server in (("main", first), ("acme", second)):
        with read_lake(tmp_path / f"{name}.duckdb") as conn:
            for table in ("events", "transactions", "event_groups"):
                ids = {row[0] for row in conn.execute(f"SELECT id FROM raw.{table}").fetchall()}
                assert ids == set(server.dataset.ids(table)), (name, table)
        stored = json.loads((tmp_path / f"{name}_token.json").read_text())
        assert stored["token"] == server.token


# --- the dg CLI --------------------------------------------------------------------------------


def dg_command(*args: str, env: dict[str, str], timeout: float = 180) -> str:
    done = subprocess.run(
        [str(BIN / "dg"), *args],
        cwd=REPO_ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def test_dg_check_and_list_defs_show_every_definition(tmp_path):
    env = {
        "FIELDSALES_BASE_URL": "http://127.0.0.1:9",
        "FIELDSALES_API_TOKEN": "dg-cli-test-token",
        "DAGSTER_HOME": str(tmp_path),
    }
    dg_command("check", "defs", env=env)
    listed = json.loads(dg_command("list", "defs", "--json", env=env))
    assert {asset["asset_key"] for asset in listed["assets"]} == ASSETS
    # The core and mart checks (those their YAML names, the drift checks), the raw tables' row
    # counts, a column-schema check per table; no publish step.
    raw = {table for table in TABLES if table.startswith("raw_")}
    assert len(listed["asset_checks"]) == core_check_count() + len(raw) + len(TABLES)
    assert not [check for check in listed["asset_checks"] if "publish" in json.dumps(check)]
    assert sorted(job["name"] for job in listed["jobs"]) == [
        "lake_upkeep",
        "refresh_all",
        "renew_token",
    ]
    assert sorted(schedule["name"] for schedule in listed["schedules"]) == [
        "lake_upkeep_schedule",
        "refresh_all_schedule",
    ]
    assert sorted(sensor["name"] for sensor in listed["sensors"]) == [
        "core_automation_sensor",
        "token_renewal_sensor",
    ]
    assert "dg-cli-test-token" not in json.dumps(listed)


# --- metadata conventions ------------------------------------------------------------------


def test_every_asset_has_owners_code_references_and_core_tables_a_freshness_policy(
    project_env, monkeypatch
):
    from datetime import timedelta

    monkeypatch.setenv("FIELDSALES_SCHEDULE_CRON", "0 */6 * * *")  # every six hours
    defs = load_project_defs()
    specs = {
        spec.key.to_user_string(): spec
        for assets in defs.assets
        for spec in getattr(assets, "specs", [])
    }
    assert set(specs) == ASSETS
    for key, spec in specs.items():
        assert spec.owners == ["team:data"], key
        assert "dagster/code_references" in spec.metadata, key
        assert spec.kinds == {"ducklake"}, key  # the badge says where the tables are
        if key.startswith(("core_", "mart_")):
            policy = spec.freshness_policy
            assert policy.warn_window.to_timedelta() == timedelta(hours=7), key
            assert policy.fail_window.to_timedelta() == timedelta(hours=13), key
        else:
            assert spec.freshness_policy is None, key


def test_token_a_header_cannot_carry_fails_the_load_without_showing_it(project_env, monkeypatch):
    token = "abcdef\u201cghijkl0123456789"  # a curly quote pasted from a document
    message = load_failure(monkeypatch, FIELDSALES_API_TOKEN=token)
    assert "FIELDSALES_API_TOKEN holds a character outside latin-1" in message
    assert token not in message and "ghijkl0123456789" not in message


def test_token_with_a_trailing_line_break_loads(project_env, monkeypatch):
    monkeypatch.setenv("FIELDSALES_API_TOKEN", "component-test-token\r\n")
    assert load_project_defs().resources["fieldsales_api"].api_token == dg.EnvVar(
        "FIELDSALES_API_TOKEN"
    )


def test_pii_hash_without_a_key_fails_the_load_naming_the_variable(project_env, monkeypatch):
    monkeypatch.delenv("FIELDSALES_PII_HASH_KEY", raising=False)
    message = load_failure(monkeypatch, FIELDSALES_PII="hash")
    assert "pii: hash needs a secret key in FIELDSALES_PII_HASH_KEY" in message


def test_pii_hash_key_reaches_the_warehouse_as_an_env_var(project_env, monkeypatch):
    monkeypatch.setenv("FIELDSALES_PII", "hash")
    monkeypatch.setenv("FIELDSALES_PII_HASH_KEY", "a-secret-key-of-32-characters-xx")
    warehouse = load_project_defs().resources["warehouse"]
    assert warehouse.pii == "hash"
    assert warehouse.pii_hash_key == dg.EnvVar("FIELDSALES_PII_HASH_KEY")


# --- paths as users give them ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("setting", "variable"),
    [("duckdb_path", "FIELDSALES_DUCKDB_PATH"), ("token_store_path", "FIELDSALES_TOKEN_STORE")],
)
def test_a_directory_as_a_file_setting_fails_the_load_naming_it(
    project_env, monkeypatch, tmp_path, setting, variable
):
    message = load_failure(monkeypatch, **{variable: str(tmp_path)})
    assert f"{setting} (from {variable}) is invalid: {tmp_path} is a directory, not a file" in (
        message
    )
    assert f"Give the path of a file in it, e.g. {tmp_path}/" in message


def test_a_parent_that_is_a_file_fails_the_load_naming_it(project_env, monkeypatch, tmp_path):
    blocker = tmp_path / "volume"
    blocker.write_text("")
    message = load_failure(monkeypatch, FIELDSALES_DUCKDB_PATH=str(blocker / "fieldsales.duckdb"))
    assert "duckdb_path (from FIELDSALES_DUCKDB_PATH) is invalid" in message
    assert f"cannot be created: {blocker} is a file, not a folder" in message


def test_a_missing_folder_fails_the_load_unless_create_dirs_asks_for_it(
    project_env, monkeypatch, tmp_path
):
    mistyped = tmp_path / "volumne" / "fieldsales_token.json"
    message = load_failure(monkeypatch, FIELDSALES_TOKEN_STORE=str(mistyped))
    assert "token_store_path (from FIELDSALES_TOKEN_STORE) is invalid" in message
    assert f"is in a folder that does not exist ({mistyped.parent})" in message
    assert f"mkdir -p {mistyped.parent}" in message and "FIELDSALES_CREATE_DIRS=true" in message
    assert not mistyped.parent.exists()

    monkeypatch.setenv("FIELDSALES_CREATE_DIRS", "true")
    defs = load_project_defs()
    assert defs.resources["warehouse"].create_dirs
    assert not mistyped.parent.exists()  # loading creates nothing; the run that needs it does


UNWRITABLE_LOAD = """
from fieldsales_dagster_tests.project import error_chain, load_project_defs
try:
    load_project_defs()
except Exception as exc:
    print(error_chain(exc))
"""


def test_an_unwritable_folder_fails_the_load_naming_it(tmp_path):
    """A real read-only file system: a tmpfs mounted read-only in a private mount namespace."""
    volume = tmp_path / "volume"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("FIELDSALES_")},
        "FIELDSALES_BASE_URL": "http://127.0.0.1:9",
        "FIELDSALES_API_TOKEN": "component-test-token",
        "FIELDSALES_DUCKDB_PATH": str(volume / "fieldsales.duckdb"),
        "FIELDSALES_TOKEN_STORE": str(tmp_path / "token.json"),
    }
    with private_tmpfs(volume, "1m", read_only=True) as fs:
        done = subprocess.run(
            fs.enter([sys.executable, "-c", UNWRITABLE_LOAD], REPO_ROOT),
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert "duckdb_path (from FIELDSALES_DUCKDB_PATH) is invalid" in done.stdout, done.stderr
    assert f"is in a folder this user cannot write ({volume}: a read-only file system)" in (
        done.stdout
    )
    assert f"Mount {volume} read-write" in done.stdout


def test_duckdb_file_named_after_a_schema_fails_the_load(project_env, monkeypatch, tmp_path):
    message = load_failure(monkeypatch, FIELDSALES_DUCKDB_PATH=str(tmp_path / "raw.duckdb"))
    assert "duckdb_path (from FIELDSALES_DUCKDB_PATH) is invalid" in message
    assert "raw.duckdb" in message
