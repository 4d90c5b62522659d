"""The token store as a row of the lake's PostgreSQL catalog (``FIELDSALES_TOKEN_STORE=catalog``),
against a real PostgreSQL and the demo API over real HTTP: "hosts" that share nothing but those
two servers (folders, working directories, Dagster homes of their own) renew once, keep working
through each other's renewal, and never show the token."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg2
import psycopg2.errors
import pytest

from fieldsales_dagster.automation.alerts import AlertSettings
from fieldsales_dagster.client.api import FieldSalesAPI
from fieldsales_dagster.client.endpoints import GENERATE_TOKEN_PATH
from fieldsales_dagster.token.catalog import CatalogTokenStore, open_token_store
from fieldsales_dagster.token.store import TokenStoreError
from fieldsales_dagster_tests.conftest import make_warehouse, read_lake
from fieldsales_dagster_tests.postgres import Postgres, running_postgres
from fieldsales_dagster_tests.project import load_failure, load_project_defs
from fieldsales_dagster_tests.test_doc_commands import run_block, shell_blocks
from fieldsales_dagster_tests.test_token_renewal_sensor import (
    REPO_ROOT,
    accepted,
    host_env,
    requests_to,
    start_renewers,
    tick,
)
from fieldsales_dagster_tests.test_token_renewal_sensor import (
    backdate as backdate_file,
)

PASSWORD_VARIABLE = "FIELDSALES_DUCKLAKE_PASSWORD"
CATALOG = Path("catalog")  # what FIELDSALES_TOKEN_STORE holds, as start_renewers takes a path


@pytest.fixture(scope="module")
def postgres() -> Iterator[Postgres]:
    with running_postgres("tokens") as pg:
        yield pg


@contextlib.contextmanager
def connected(dsn: str, password: str, autocommit: bool = False):
    """A connection that commits what it did and is closed."""
    with contextlib.closing(psycopg2.connect(dsn, password=password)) as conn:
        conn.autocommit = autocommit
        with conn.cursor() as cur:
            yield cur
        conn.commit()


def admin(postgres: Postgres):
    dsn = (
        f"dbname={postgres.database} host={postgres.host} port={postgres.port} user={postgres.user}"
    )
    return connected(dsn, postgres.password, autocommit=True)


@pytest.fixture
def catalog(postgres, monkeypatch, tmp_path) -> str:
    """A database of this test's own, owned by a login role of its own (not a superuser) that the
    catalog string connects as, its password in the environment."""
    name = f"lake_{tmp_path.name.lower()[-40:].replace('-', '_')}"
    password = secrets.token_hex(8)
    with admin(postgres) as cur:
        cur.execute(f'CREATE ROLE "{name}" LOGIN PASSWORD %s', (password,))
        cur.execute(f'CREATE DATABASE "{name}" OWNER "{name}"')
    monkeypatch.setenv(PASSWORD_VARIABLE, password)
    value = f"postgres:dbname={name} host={postgres.host} port={postgres.port} user={name}"
    monkeypatch.setenv("FIELDSALES_DUCKLAKE_CATALOG", value)
    return value


def connect(catalog: str):
    return connected(catalog.removeprefix("postgres:"), os.environ[PASSWORD_VARIABLE])


def make_api(server, catalog: str, env_token: str | None = None, **settings) -> FieldSalesAPI:
    return FieldSalesAPI(
        base_url=server.base_url,
        api_token=env_token or server.token,
        token_store_path="catalog",
        ducklake_catalog=catalog,
        max_retries=1,
        backoff_initial_s=0.01,
        backoff_max_s=0.05,
        **settings,
    )


def row(catalog: str) -> dict:
    with connect(catalog) as cur:
        cur.execute("SELECT record FROM fieldsales_token.token_store WHERE lake = 'public'")
        (record,) = cur.fetchone()
    return json.loads(record)


def backdate(catalog: str, days: float) -> None:
    issued = (datetime.now(UTC) - timedelta(days=days)).isoformat()
    with connect(catalog) as cur:
        cur.execute(
            "UPDATE fieldsales_token.token_store SET record = "
            "jsonb_set(record::jsonb, '{issued_at}', to_jsonb(%s::text))::text",
            (issued,),
        )


# --- (a) the client reads the row ---------------------------------------------------------------


def test_the_client_reads_the_token_from_the_catalog_row(demo_server, catalog, tmp_path):
    old_token = demo_server.token
    assert tick(make_api(demo_server, catalog)).message.startswith("not yet due")
    assert row(catalog)["token"] == old_token  # seeded once the server accepted it
    backdate(catalog, 46)
    assert tick(make_api(demo_server, catalog)).message.startswith("token renewed;")
    assert row(catalog)["token"] == demo_server.token != old_token
    # Another process, FIELDSALES_API_TOKEN still the old token: the row's token is used.
    api = make_api(demo_server, catalog, env_token=old_token)
    assert api.current_token() == demo_server.token
    api.check_token()
    assert list(tmp_path.glob("**/*.json")) == []  # no file store anywhere


def test_the_row_names_its_server_and_another_servers_client_sends_nothing(demo_server, catalog):
    make_api(demo_server, catalog).check_token()
    record = row(catalog)
    assert record["origin"] == str(make_api(demo_server, catalog).origin)
    with connect(catalog) as cur:
        elsewhere = json.dumps({**record, "origin": "http://127.0.0.1:1"})
        cur.execute("UPDATE fieldsales_token.token_store SET record = %s", (elsewhere,))
    before = len(demo_server.requests)
    with pytest.raises(TokenStoreError, match="holds the token of http://127.0.0.1:1"):
        make_api(demo_server, catalog, env_token="another-token-0123456789").check_token()
    assert len(demo_server.requests) == before


# --- (b) two hosts due at once ------------------------------------------------------------------


def test_two_hosts_due_at_once_renew_once_and_both_keep_the_accepted_token(
    demo_server, catalog, tmp_path
):
    old_token = demo_server.token
    tick(make_api(demo_server, catalog))
    backdate(catalog, 46)
    hosts = [tmp_path / "host_a", tmp_path / "host_b"]
    outcomes = start_renewers(demo_server, CATALOG, old_token, n=2, mode="meet", hosts=hosts)
    errors = [line for _, _, err in outcomes for line in err.splitlines() if "Error:" in line]
    assert [code for code, _, _ in outcomes] == [0, 0], errors
    assert requests_to(demo_server, GENERATE_TOKEN_PATH) == 1
    # Each run tested the token it ended with on the demo_server (renew_or_check), and succeeded.
    assert sum(out.startswith("token renewed;") for _, out, _ in outcomes) == 1, outcomes
    assert row(catalog)["token"] == demo_server.token != old_token
    assert accepted(demo_server, demo_server.token)
    for _, out, err in outcomes:
        assert old_token not in out + err and demo_server.token not in out + err


# --- (c) a refresh on one host, the renewal on another ------------------------------------------

REFRESH_SCRIPT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path

    from fieldsales_dagster.client.api import FieldSalesAPI
    from fieldsales_dagster_tests.conftest import make_warehouse
    from fieldsales_dagster_tests.project import materialize, raw_assets

    base_url, env_token, catalog, go_file = sys.argv[1:]
    real_get_once, calls = FieldSalesAPI._get_once, []

    def get_once(self, path, params, token, *limits):
        calls.append(path)
        if len(calls) != 2:
            return real_get_once(self, path, params, token, *limits)
        # Mid-refresh, with the token read before the other host's renewal rotated it.
        Path(f"{go_file}.paging").touch()
        deadline = time.monotonic() + 60
        while not Path(f"{go_file}.rotated").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        try:
            return real_get_once(self, path, params, token, *limits)
        finally:
            Path(f"{go_file}.refused").touch()

    FieldSalesAPI._get_once = get_once
    api = FieldSalesAPI(
        base_url=base_url, api_token=env_token, token_store_path="catalog",
        ducklake_catalog=catalog, page_size=100, concurrency=1, max_retries=1,
        backoff_initial_s=0.01, backoff_max_s=0.05,
    )
    resources = {"fieldsales_api": api, "warehouse": make_warehouse(Path.cwd())}
    result = materialize(raw_assets(), resources=resources, selection=["raw_transactions"])
    events = "\\n".join(str(event) for event in result.all_events)
    Path("events.txt").write_text(events + str(result.dagster_run.run_config))
    print("refreshed" if result.success else "failed")
    """
)


def test_a_refresh_on_one_host_keeps_working_through_a_renewal_on_another(
    demo_server, catalog, tmp_path
):
    old_token = demo_server.token
    tick(make_api(demo_server, catalog))
    backdate(catalog, 46)
    host_a, host_b = tmp_path / "host_a", tmp_path / "host_b"
    refresh = subprocess.Popen(
        [sys.executable, "-c", REFRESH_SCRIPT, demo_server.base_url, old_token, catalog,
         str(tmp_path / "go")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **host_env(host_b)},
        cwd=host_b,
    )  # fmt: skip
    # Host A renews; host B's request with the old token is refused while A holds the row.
    [(code, out, err)] = start_renewers(
        demo_server, CATALOG, old_token, n=1, mode="hold", hosts=[host_a]
    )
    refresh_out, refresh_err = refresh.communicate(timeout=120)
    assert refresh.returncode == 0, refresh_err[-1500:]
    assert code == 0, err[-4000:]
    assert out.startswith("token renewed;")
    assert refresh_out.strip() == "refreshed", refresh_err
    assert requests_to(demo_server, GENERATE_TOKEN_PATH) == 1
    assert any(request.status == 401 for request in demo_server.requests)  # B met the renewal
    with read_lake(make_warehouse(host_b)) as conn:
        (rows,) = conn.execute("SELECT count(*) FROM raw.transactions").fetchone()
    assert rows == 1200  # the demo's transactions, all of them
    assert row(catalog)["token"] == demo_server.token != old_token
    # (d) neither token in either host's logs, nor in the refresh's events, metadata, run config
    shown = out + err + refresh_out + refresh_err + (host_b / "events.txt").read_text()
    assert old_token not in shown and demo_server.token not in shown


# --- (d) errors and alerts ----------------------------------------------------------------------


def test_store_errors_name_the_settings_and_never_a_secret(demo_server, catalog, monkeypatch):
    make_api(demo_server, catalog).check_token()
    monkeypatch.setenv(PASSWORD_VARIABLE, "wrong-password-4711")
    with pytest.raises(TokenStoreError) as excinfo:
        make_api(demo_server, catalog).check_token()
    message = str(excinfo.value)
    assert "FIELDSALES_DUCKLAKE_CATALOG" in message and PASSWORD_VARIABLE in message
    assert "wrong-password-4711" not in message and demo_server.token not in message


def test_alerts_mask_the_token_of_the_row(demo_server, catalog):
    make_api(demo_server, catalog).check_token()
    store = open_token_store("catalog", ducklake_catalog=catalog)
    settings = AlertSettings(token_store=store)
    assert demo_server.token in settings.secrets()
    assert demo_server.token not in settings.scrub(f"401 for Bearer {demo_server.token}")


# --- (e) the row is its role's only -------------------------------------------------------------


def test_only_the_catalog_role_can_read_the_row(demo_server, catalog, postgres):
    make_api(demo_server, catalog).check_token()
    database = catalog.split()[0].removeprefix("postgres:dbname=")
    other, password = f"other_{database}"[:60], secrets.token_hex(8)
    with admin(postgres) as cur:
        cur.execute(f'CREATE ROLE "{other}" LOGIN PASSWORD %s', (password,))
    with connect(catalog) as cur:
        cur.execute("SELECT tableowner FROM pg_tables WHERE schemaname = 'fieldsales_token'")
        assert cur.fetchall() == [(database,)]
    dsn = f"dbname={database} host={postgres.host} port={postgres.port} user={other}"
    with connected(dsn, password) as cur, pytest.raises(psycopg2.errors.InsufficientPrivilege):
        cur.execute("SELECT record FROM fieldsales_token.token_store")


def test_a_row_another_role_may_read_is_refused_before_the_token_is_sent(
    demo_server, catalog, postgres
):
    make_api(demo_server, catalog).check_token()
    with connect(catalog) as cur:
        cur.execute("GRANT SELECT ON fieldsales_token.token_store TO PUBLIC")
    before = len(demo_server.requests)
    with pytest.raises(TokenStoreError) as excinfo:
        make_api(demo_server, catalog).check_token()
    assert "grants rights to PUBLIC" in str(excinfo.value)
    assert "REVOKE ALL ON fieldsales_token.token_store FROM PUBLIC" in str(excinfo.value)
    assert len(demo_server.requests) == before


# --- choosing the store -------------------------------------------------------------------------


def test_catalog_store_with_a_sqlite_catalog_is_refused_at_load(demo_server, monkeypatch):
    message = load_failure(
        monkeypatch,
        FIELDSALES_BASE_URL=demo_server.base_url,
        FIELDSALES_API_TOKEN=demo_server.token,
        FIELDSALES_TOKEN_STORE="catalog",
    )
    assert "api.token_store_path (from FIELDSALES_TOKEN_STORE)" in message
    assert "FIELDSALES_DUCKLAKE_CATALOG" in message


def test_the_component_gives_the_client_the_catalogs_row(demo_server, catalog, monkeypatch):
    monkeypatch.setenv("FIELDSALES_BASE_URL", demo_server.base_url)
    monkeypatch.setenv("FIELDSALES_API_TOKEN", demo_server.token)
    monkeypatch.setenv("FIELDSALES_TOKEN_STORE", "catalog")
    store = load_project_defs().resources["fieldsales_api"].token_store()
    assert isinstance(store, CatalogTokenStore) and store.lake == "public"
    assert catalog.removeprefix("postgres:") in store.where


# --- moving a file store into the row -----------------------------------------------------------


def test_the_documented_move_from_the_file_to_the_catalog_runs_as_written(
    demo_server, catalog, tmp_path
):
    old_token, file = demo_server.token, tmp_path / "fieldsales_token.json"
    file_api = FieldSalesAPI(
        base_url=demo_server.base_url, api_token=old_token, token_store_path=str(file)
    )
    tick(file_api)
    backdate_file(file, 46)
    assert tick(file_api).message.startswith("token renewed;")  # the file holds a renewed token
    before = json.loads(file.read_text())
    page = "docs/token-lifecycle.md"
    test = "test_the_documented_move_from_the_file_to_the_catalog_runs_as_written"
    marker = f"<!-- run by: test_token_catalog.py::{test} -->"
    [block] = [b for b in shell_blocks(REPO_ROOT / page, page) if b.marker == marker]
    output = run_block(block, tmp_path, {**os.environ, "FIELDSALES_TOKEN_STORE": str(file)})
    assert "Imported" in output and before["token"] not in output
    assert row(catalog) == before  # the token, its age, its server
    make_api(demo_server, catalog, env_token=old_token).check_token()  # the row's token is used
    # Once the row has moved on, importing the file again is refused and changes nothing.
    backdate(catalog, 46)
    assert tick(make_api(demo_server, catalog)).message.startswith("token renewed;")
    again = subprocess.run(
        [sys.executable, "-m", "fieldsales_dagster.token.catalog", "import", str(file)],
        capture_output=True,
        text=True,
    )
    assert again.returncode != 0 and "holds another token already" in again.stderr
    assert row(catalog)["token"] == demo_server.token != before["token"]
