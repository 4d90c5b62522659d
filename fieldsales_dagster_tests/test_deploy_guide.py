"""deploy/README.md's "On one machine, step by step", executed line by line.

Against a real PostgreSQL (from the pgserver wheel) and the demo API: the guide's SQL creates the
role and the database, its install line runs (against this venv: a fresh one per test would take
minutes; the line is a no-op once satisfied), its exports build the environment, and each of the
two processes starts with exactly the variables the guide's table "Environment and secrets" lists
for it. The webserver's code location must load (GraphQL on loopback); a `refresh_all` run
launched through it waits in the queue until the daemon starts it, and must succeed; then the
analysts' file and the token store are where the guide says.

The only substitutions: the guide's placeholders (`/srv/fieldsales`, the PostgreSQL port, the
instance URL and token, the webserver port) become this test's folders, ports and demo API.

"Several machines: no shared disk" is followed the same way: its PostgreSQL block (two roles, two
databases), its bucket (made with boto3 on moto's S3 server, which checks every signature), its
environment block (the placeholders: the database host and port, the object store's address and
key pair, the instance URL and token, the folders), its daemon and webserver; the run's Parquet
files must be in the bucket, none on local disk, and the token in its row of the catalog database.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import duckdb
import psycopg2
import pytest

from fieldsales_dagster.warehouse.warehouse import FieldSalesWarehouse
from fieldsales_dagster_tests.object_store import running_object_store
from fieldsales_dagster_tests.postgres import Postgres, _free_port, running_postgres
from fieldsales_dagster_tests.processes import process_group, tail
from fieldsales_dagster_tests.test_doc_commands import shell_blocks
from fieldsales_dagster_tests.test_lake_s3 import listed_files

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
GUIDE = ROOT / "deploy" / "README.md"
#: A guard against a hang, not a timing (the test's phases are printed; see the report).
DEADLINE_S = 360.0
DEMO_TRANSACTIONS = 300
Background = list[tuple[list[str], str]]


def guide_section(title: str) -> str:
    text = GUIDE.read_text()
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def guide_lines(test: str) -> list[str]:
    """The lines of the guide's blocks marked as run by ``test`` (of this file), in page order,
    but blank lines and comment lines."""
    marker = f"<!-- run by: {Path(__file__).name}::{test} -->"
    blocks = [b for b in shell_blocks(GUIDE, "deploy/README.md") if b.marker == marker]
    assert blocks, f"no block of deploy/README.md is marked {marker}"
    lines = [line for block in blocks for line in block.text.splitlines()]
    return [line for line in lines if line.strip() and not line.lstrip().startswith("#")]


def variables_for(process: str) -> set[str]:
    """The variables the table "Environment and secrets" lists for ``process``."""
    names = set()
    for row in guide_section("Environment and secrets").splitlines():
        cells = [cell.strip() for cell in row.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`"):
            continue
        processes = {p.strip() for p in cells[1].split(",")}
        if "all" in processes or process in processes:
            names |= set(re.findall(r"`([A-Z0-9_]+)`", cells[0]))
    return names


def graphql(port: int, query: str, variables: dict | None = None) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql",
        data=json.dumps({"query": query, "variables": variables or {}}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())["data"]


LOCATIONS = """{ workspaceOrError { ... on Workspace { locationEntries { name
  locationOrLoadError { __typename ... on PythonError { message } } } } } }"""
LAUNCH = """mutation($params: ExecutionParams!) { launchRun(executionParams: $params) {
  __typename ... on LaunchRunSuccess { run { runId status } }
  ... on PythonError { message } ... on InvalidSubsetError { message } } }"""
STATUS = """query($id: ID!) { runOrError(runId: $id) { ... on Run { status } } }"""


def wait_for(what: str, probe, started: float, logs: list[Path]):
    while time.monotonic() - started < DEADLINE_S:
        try:
            value = probe()
        except OSError:
            value = None
        if value:
            return value
        time.sleep(1)
    pytest.fail(f"{what} within {DEADLINE_S:.0f} s:\n" + "\n".join(tail(log) for log in logs))


@contextmanager
def demo_api(folder: Path) -> Iterator[dict]:
    """The bundled demo API (``DEMO_TRANSACTIONS``) on an ephemeral port: its URL and token."""
    argv = [str(BIN / "fieldsales-demo-api"), "--port", "0"]
    argv += ["--transactions", str(DEMO_TRANSACTIONS)]
    with process_group(argv, folder / "demo_api.log", _base_env(), stdout=subprocess.PIPE) as demo:
        yield json.loads(demo.stdout.readline())


def follow_guide(
    lines: list[str], substitutions: dict[str, str], admin: Postgres
) -> tuple[dict[str, str], Background]:
    """Run the guide's ``lines``, each with ``substitutions`` made, from the project folder: the
    PostgreSQL client lines as ``admin`` (the guide's superuser), the exports into the returned
    environment, the others by bash in it. The background processes' lines (the daemon, the
    webserver) are returned, with each process's name, not run."""
    exported: dict[str, str] = {}
    background: Background = []
    for line in lines:
        for placeholder, value in substitutions.items():
            line = line.replace(placeholder, value)
        argv = shlex.split(line, comments=True)
        if not argv:
            continue
        if argv[:3] == ["python3", "-m", "venv"]:
            continue  # the suite runs in the project's venv already (see the docstring)
        if argv[0] == "export":
            for assignment in argv[1:]:
                name, value = assignment.split("=", 1)
                exported[name] = os.path.expandvars(value)
        elif argv[0] in ("psql", "createdb"):
            # As the guide says: a PostgreSQL superuser, here the test server's.
            subprocess.run(
                [str(admin.bin_dir / argv[0]), *argv[1:]],
                env={**_base_env(), **admin.client_env()},
                check=True,
                capture_output=True,
                timeout=60,
            )
        elif argv[-1] == "&" or "dagster-webserver" in argv[0]:
            process = Path(argv[0]).name.removeprefix("dagster-")
            background.append(([a for a in argv if a != "&"], process))
        else:
            subprocess.run(
                ["bash", "-c", line],
                cwd=ROOT,
                env={**_base_env(), **exported},
                check=True,
                capture_output=True,
                timeout=600,
            )
    assert [process for _, process in background] == ["daemon", "webserver"]
    home = Path(exported["DAGSTER_HOME"])
    assert (home / "dagster.yaml").read_text() == (ROOT / "deploy" / "dagster.yaml").read_text()
    # Dagster's role and database, owned by the role, reachable by its URL.
    with psycopg2.connect(exported["DAGSTER_POSTGRES_URL"]) as conn, conn.cursor() as cur:
        cur.execute("SELECT current_user, current_database()")
        assert cur.fetchone() == ("dagster", "dagster")
    return exported, background


def process_envs(exported: dict[str, str]) -> dict[str, dict[str, str]]:
    """The daemon's and the webserver's environments: of the guide's exports, exactly the
    variables the table "Environment and secrets" lists for each."""
    return {
        process: {
            **_base_env(),
            **{k: v for k, v in exported.items() if k in variables_for(process)},
        }
        for process in ("daemon", "webserver")
    }


def refresh_through_the_webserver(
    background: Background,
    envs: dict[str, dict[str, str]],
    web_port: int,
    folder: Path,
    started: float,
    phases: dict[str, float],
) -> None:
    """Start the guide's daemon and webserver (in the project folder, with ``envs``), wait for
    the webserver's code location, launch a ``refresh_all`` run through its GraphQL API, and
    wait until the daemon has dequeued and run it: it must succeed. ``phases`` gets the times."""
    logs = {process: folder / f"{process}.log" for _, process in background}
    every_log = list(logs.values())
    (daemon_argv, _), (web_argv, _) = background
    with (
        process_group(daemon_argv, logs["daemon"], envs["daemon"], cwd=ROOT),
        process_group(web_argv, logs["webserver"], envs["webserver"], cwd=ROOT),
    ):

        def location_status():
            entries = graphql(web_port, LOCATIONS)["workspaceOrError"]["locationEntries"]
            loaded = entries and entries[0]["locationOrLoadError"]
            return loaded if loaded else None

        phases["processes started"] = time.monotonic() - started
        status = wait_for(
            "the webserver did not load its code", location_status, started, every_log
        )
        assert status["__typename"] == "RepositoryLocation", status.get("message")

        phases["code location loaded"] = time.monotonic() - started
        launched = graphql(
            web_port,
            LAUNCH,
            {
                "params": {
                    "selector": {
                        "repositoryLocationName": "fieldsales_dagster",
                        "repositoryName": "__repository__",
                        "jobName": "refresh_all",
                    },
                    "runConfigData": {},
                }
            },
        )["launchRun"]
        assert launched["__typename"] == "LaunchRunSuccess", launched
        run_id = launched["run"]["runId"]
        # The instance queues it (deploy/dagster.yaml); the daemon dequeues and starts it.
        assert launched["run"]["status"] in ("QUEUED", "NOT_STARTED")

        def finished():
            run = graphql(web_port, STATUS, {"id": run_id})["runOrError"]
            return run["status"] if run["status"] in ("SUCCESS", "FAILURE", "CANCELED") else None

        final = wait_for("the queued refresh_all did not finish", finished, started, every_log)
        assert final == "SUCCESS", "\n".join(tail(log) for log in every_log)
        phases["run succeeded"] = time.monotonic() - started


def report(name: str, started: float, phases: dict[str, float]) -> None:
    phases["stopped"] = time.monotonic() - started
    print(
        f"{name}, seconds from its start: " + ", ".join(f"{k} {v:.0f}" for k, v in phases.items())
    )


def test_the_one_machine_guide_runs_a_queued_refresh_against_postgres(tmp_path):
    started = time.monotonic()
    srv = tmp_path / "srv"
    web_port = _free_port()
    with running_postgres(database=None) as admin, demo_api(tmp_path) as api:
        substitutions = {
            "/srv/fieldsales": str(srv),
            "127.0.0.1:5432": f"127.0.0.1:{admin.port}",
            "https://yourcompany.example.com": api["base_url"],
            "FIELDSALES_API_TOKEN=...": f"FIELDSALES_API_TOKEN={api['token']}",
            "-p 3000": f"-p {web_port}",
            ".venv/bin/": f"{BIN}/",
        }
        lines = guide_lines("test_the_one_machine_guide_runs_a_queued_refresh_against_postgres")
        exported, background = follow_guide(lines, substitutions, admin)
        phases = {"guide steps": time.monotonic() - started}
        envs = process_envs(exported)
        # The table's lists are what the guide's exports hold for these processes.
        assert {k for k in envs["webserver"] if k.startswith(("FIELDSALES_", "DAGSTER_"))} == {
            "DAGSTER_HOME",
            "DAGSTER_POSTGRES_URL",
            "FIELDSALES_BASE_URL",
            "FIELDSALES_API_TOKEN",
            "FIELDSALES_DUCKDB_PATH",
            "FIELDSALES_DUCKLAKE_CATALOG",
            "FIELDSALES_TOKEN_STORE",
        }
        refresh_through_the_webserver(background, envs, web_port, tmp_path, started, phases)

    # The single-file export, where FIELDSALES_DUCKDB_PATH says, complete (the refresh job
    # exports after its tables), and the lake it was exported from.
    with duckdb.connect(exported["FIELDSALES_DUCKDB_PATH"], read_only=True) as conn:
        assert conn.execute("SELECT count(*) FROM raw.transactions").fetchone() == (
            DEMO_TRANSACTIONS,
        )
        assert conn.execute("SELECT count(*) FROM core.transactions").fetchone() == (
            DEMO_TRANSACTIONS,
        )
    lake = FieldSalesWarehouse(ducklake_catalog=exported["FIELDSALES_DUCKLAKE_CATALOG"])
    with lake.read_connection() as conn:
        assert conn.execute("SELECT count(*) FROM core.transactions").fetchone() == (
            DEMO_TRANSACTIONS,
        )
    # The token store, where FIELDSALES_TOKEN_STORE says, owner-only, seeded from the token.
    store = Path(exported["FIELDSALES_TOKEN_STORE"])
    assert store.stat().st_mode & 0o777 == 0o600
    assert json.loads(store.read_text())["token"] == api["token"]
    report("deploy guide test", started, phases)


def test_the_several_machines_guide_writes_the_lake_to_a_bucket_and_the_token_to_postgres(
    tmp_path, monkeypatch
):
    started = time.monotonic()
    web_port = _free_port()
    with (
        running_postgres(database=None) as admin,
        running_object_store(tmp_path) as objects,
        demo_api(tmp_path) as api,
    ):
        substitutions = {
            "/srv/fieldsales": str(tmp_path / "srv"),
            "db.example.internal:5432": f"127.0.0.1:{admin.port}",
            "host=db.example.internal": f"host=127.0.0.1 port={admin.port}",
            "https://objects.example.internal:9000": objects.endpoint,
            "https://yourcompany.example.com": api["base_url"],
            "FIELDSALES_API_TOKEN=...": f"FIELDSALES_API_TOKEN={api['token']}",
            "FIELDSALES_S3_ACCESS_KEY_ID=...": f"FIELDSALES_S3_ACCESS_KEY_ID={objects.key_id}",
            "FIELDSALES_S3_SECRET_ACCESS_KEY=...": (
                f"FIELDSALES_S3_SECRET_ACCESS_KEY={objects.secret}"
            ),
            "-p 3000": f"-p {web_port}",
            ".venv/bin/": f"{BIN}/",
        }
        lines = guide_lines(
            "test_the_several_machines_guide_writes_the_lake_to_a_bucket_and_the_token_to_postgres"
        )
        exported, background = follow_guide(lines, substitutions, admin)
        # Step 2: the bucket of the data path, made as an operator makes it in the store.
        data_path = exported["FIELDSALES_DUCKLAKE_DATA_PATH"]
        bucket = urlsplit(data_path).netloc
        objects.client().create_bucket(Bucket=bucket)
        phases = {"guide steps": time.monotonic() - started}
        envs = process_envs(exported)
        # The table "Environment and secrets" lists every variable of the block for both.
        for env in envs.values():
            assert set(exported) <= set(env), set(exported) - set(env)
        refresh_through_the_webserver(background, envs, web_port, tmp_path, started, phases)

        # The lake: every table's files in the bucket under the data path, none on local disk;
        # read back through the guide's catalog, with the guide's keys.
        for name in ("FIELDSALES_DUCKLAKE_PASSWORD", *(k for k in exported if "_S3_" in k)):
            monkeypatch.setenv(name, exported[name])
        lake = FieldSalesWarehouse(
            ducklake_catalog=exported["FIELDSALES_DUCKLAKE_CATALOG"],
            ducklake_data_path=data_path,
            s3_endpoint=exported["FIELDSALES_S3_ENDPOINT"],
            s3_region=exported["FIELDSALES_S3_REGION"],
        )
        in_bucket = {f"s3://{bucket}/{key}" for key in objects.keys(bucket)}
        listed = listed_files(lake)
        assert listed and listed <= in_bucket
        assert all(key.startswith(data_path) for key in in_bucket)
        assert not list(tmp_path.rglob("*.parquet"))
        with lake.read_connection() as conn:
            assert conn.execute("SELECT count(*) FROM core.transactions").fetchone() == (
                DEMO_TRANSACTIONS,
            )
        # The token: its row in the catalog's database (the lake's, "public": no schema of its
        # own), read as the catalog's role, seeded from the guide's first token.
        catalog = exported["FIELDSALES_DUCKLAKE_CATALOG"].removeprefix("postgres:")
        password = exported["FIELDSALES_DUCKLAKE_PASSWORD"]
        with psycopg2.connect(catalog, password=password) as conn, conn.cursor() as cur:
            cur.execute("SELECT lake, record FROM fieldsales_token.token_store")
            ((row, record),) = cur.fetchall()
        assert row == "public"
        assert json.loads(record)["token"] == api["token"]
        # Neither secret of the block in the processes' logs or the runs' compute logs.
        logs = [tmp_path / "daemon.log", tmp_path / "webserver.log"]
        logs += [path for path in (tmp_path / "srv").rglob("*") if path.is_file()]
        for secret in (objects.secret, password):
            assert [log for log in logs if secret in log.read_text(errors="replace")] == []
    report("several machines guide test", started, phases)


def _base_env() -> dict[str, str]:
    """What any service manager gives a process: a PATH, a HOME, a locale; nothing of ours."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/tmp"),
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
    }
