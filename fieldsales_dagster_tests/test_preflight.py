"""A run that cannot write the lake sends no request: the preflight refuses it first, and its
error, naming the setting, its variable and the path, is the last line a user sees.

Each test launches the shipped code location with ``dg launch`` against the demo API on
127.0.0.1 and counts the requests the demo server received. A read-only folder is a real one: a
tmpfs mounted read-only in a private mount namespace (``namespaces.py``; root writes through
permissions, not through a read-only mount).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import dagster as dg
import psycopg2

from fieldsales_dagster.demo_api import DemoServer
from fieldsales_dagster.warehouse.warehouse import FieldSalesWarehouse
from fieldsales_dagster_tests.conftest import lake_paths, make_api
from fieldsales_dagster_tests.namespaces import private_tmpfs
from fieldsales_dagster_tests.postgres import running_postgres
from fieldsales_dagster_tests.project import raw_assets
from fieldsales_dagster_tests.test_first_contact import BIN, ROOT, dagster_home


def launch_env(server: DemoServer, tmp_path: Path, **settings: str) -> dict[str, str]:
    """The default instance's environment: the demo API, a lake of its own under ``tmp_path``
    unless ``settings`` say otherwise."""
    catalog, data_path = lake_paths(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FIELDSALES_", "DAGSTER_"))}
    return {
        **env,
        "DAGSTER_HOME": str(dagster_home(tmp_path)),
        "FIELDSALES_BASE_URL": server.base_url,
        "FIELDSALES_API_TOKEN": server.token,
        "FIELDSALES_TOKEN_STORE": str(tmp_path / "token.json"),
        "FIELDSALES_DUCKLAKE_CATALOG": catalog,
        "FIELDSALES_DUCKLAKE_DATA_PATH": data_path,
        **settings,
    }


def last_line_of_a_refused_launch(argv: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(
        argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode != 0, done.stderr[-3000:]
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    return lines[-1]


LAUNCH = [str(BIN / "dg"), "launch", "--assets", "*"]


def test_a_catalog_that_is_a_folder_is_refused_before_the_first_request(demo_server, tmp_path):
    folder = tmp_path / "catalogs"
    folder.mkdir()
    env = launch_env(demo_server, tmp_path, FIELDSALES_DUCKLAKE_CATALOG=f"sqlite:{folder}")
    last = last_line_of_a_refused_launch(LAUNCH, env)
    assert (
        "storage.ducklake_catalog (from FIELDSALES_DUCKLAKE_CATALOG) is invalid: "
        f"{folder} is a directory, not a file. Give the path of a file in it, e.g. "
        f"{folder / 'fieldsales.ducklake.sqlite'}"
    ) in last
    assert demo_server.requests == []


def test_a_read_only_data_folder_is_refused_before_the_first_request(demo_server, tmp_path):
    volume = tmp_path / "volume"
    env = launch_env(demo_server, tmp_path, FIELDSALES_DUCKLAKE_DATA_PATH=str(volume))
    with private_tmpfs(volume, "1m", read_only=True) as fs:
        last = last_line_of_a_refused_launch(fs.enter(LAUNCH, ROOT), env)
    assert demo_server.requests == []
    assert (
        "storage.ducklake_data_path (from FIELDSALES_DUCKLAKE_DATA_PATH) is invalid: "
        f"{volume} is in a folder this user cannot write ({volume}: a read-only file system). "
        f"Mount {volume} read-write"
    ) in last


def test_a_temporary_folder_without_room_for_the_spill_is_refused_before_the_first_request(
    demo_server, tmp_path
):
    """The temporary folder is beside the SQLite catalog: here on a 4 MB volume, where DuckDB
    could not spill what its default memory limit (192MB) lets it."""
    volume = tmp_path / "volume"
    env = launch_env(
        demo_server, tmp_path, FIELDSALES_DUCKLAKE_CATALOG=f"sqlite:{volume / 'lake.sqlite'}"
    )
    with private_tmpfs(volume, "4m") as fs:
        last = last_line_of_a_refused_launch(fs.enter(LAUNCH, ROOT), env)
    assert (
        "storage.duckdb_memory_limit (from FIELDSALES_DUCKDB_MEMORY_LIMIT) is invalid: DuckDB may "
        f"spill up to 192MB to the lake's temporary folder {volume}/.fieldsales_tmp/"
    ) in last
    assert f"Free space in {volume}, lower the limit" in last
    assert demo_server.requests == []


def refused_raw_run(
    server: DemoServer, tmp_path: Path, warehouse: FieldSalesWarehouse
) -> list[str]:
    """The raw assets run in this process with ``warehouse``: every step must fail, the server
    must get no request; the steps' error messages."""
    result = dg.materialize(
        raw_assets(),
        resources={"fieldsales_api": make_api(server, tmp_path), "warehouse": warehouse},
        raise_on_error=False,
    )
    failures = result.get_step_failure_events()
    assert failures and not result.success
    assert server.requests == []
    return [failure.step_failure_data.error.to_string() for failure in failures]


def test_a_process_that_opens_the_lake_checks_it_first(demo_server, tmp_path):
    """A warehouse built in code (no definitions loaded): its first connection checks the same,
    so the step fails naming the setting, not with SQLite's bare "unable to open"."""
    folder = tmp_path / "catalogs"
    folder.mkdir()
    warehouse = FieldSalesWarehouse(
        ducklake_catalog=f"sqlite:{folder}", ducklake_data_path=str(tmp_path)
    )
    for message in refused_raw_run(demo_server, tmp_path, warehouse):
        assert f"(from FIELDSALES_DUCKLAKE_CATALOG) is invalid: {folder} is a directory" in message


def test_a_postgresql_catalog_its_user_can_only_read_is_refused_before_the_first_request(
    demo_server, tmp_path, monkeypatch
):
    """Opening the catalog needs a connection: the check runs as the raw step opens the lake,
    before it pages anything."""
    with running_postgres("lake") as pg:
        catalog = f"postgres:dbname=lake host={pg.host} port={pg.port} user={pg.user}"
        monkeypatch.setenv("FIELDSALES_DUCKLAKE_PASSWORD", pg.password)
        with FieldSalesWarehouse(
            ducklake_catalog=catalog, ducklake_data_path=str(tmp_path)
        ).get_connection():
            pass  # the lake exists, made by its owner
        admin = psycopg2.connect(pg.url.rsplit("/", 1)[0] + "/lake")
        admin.autocommit = True
        with admin.cursor() as cur:
            cur.execute("CREATE ROLE reader LOGIN PASSWORD 'reader-password'")
            cur.execute("GRANT SELECT ON ALL TABLES IN SCHEMA public TO reader")
        admin.close()
        monkeypatch.setenv("FIELDSALES_DUCKLAKE_PASSWORD", "reader-password")
        reader = FieldSalesWarehouse(
            ducklake_catalog=catalog.replace(f"user={pg.user}", "user=reader"),
            ducklake_data_path=str(tmp_path),
        )
        for message in refused_raw_run(demo_server, tmp_path, reader):
            assert "(FIELDSALES_DUCKLAKE_CATALOG) can only be read by its user here" in message
