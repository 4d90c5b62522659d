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
from pathlib import Path

import duckdb
import pytest

from fieldsales_dagster.warehouse.warehouse import FieldSalesWarehouse
from fieldsales_dagster_tests.postgres import _free_port, running_postgres
from fieldsales_dagster_tests.processes import process_group, tail

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
GUIDE = ROOT / "deploy" / "README.md"
#: A guard against a hang, not a timing (the test's phases are printed; see the report).
DEADLINE_S = 360.0
DEMO_TRANSACTIONS = 300


def guide_section(title: str) -> str:
    text = GUIDE.read_text()
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def step_by_step() -> list[str]:
    (block,) = re.findall(r"```bash\n(.*?)```", guide_section("On one machine, step by step"), re.S)
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


def variables_for(process: str) -> set[str]:
    """The variables the table "Environment and secrets" lists for ``process``."""
    names = set()
    for row in guide_section("Environment and secrets").splitlines():
        cells = [cell.strip() for cell in row.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`"):
            continue
        processes = {p.strip() for p in cells[1].split(",")}
        if "all" in processes or process in processes:
            names |= set(re.findall(r"`([A-Z_]+)`", cells[0]))
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


def test_the_one_machine_guide_runs_a_queued_refresh_against_postgres(tmp_path):
    started = time.monotonic()
    srv = tmp_path / "srv"
    web_port = _free_port()
    with (
        running_postgres(database=None) as admin,
        process_group(
            [
                str(BIN / "fieldsales-demo-api"),
                "--port",
                "0",
                "--transactions",
                str(DEMO_TRANSACTIONS),
            ],
            tmp_path / "demo_api.log",
            _base_env(),
            stdout=subprocess.PIPE,
        ) as demo,
    ):
        api = json.loads(demo.stdout.readline())
        substitutions = {
            "/srv/fieldsales": str(srv),
            "127.0.0.1:5432": f"127.0.0.1:{admin.port}",
            "https://yourcompany.example.com": api["base_url"],
            "FIELDSALES_API_TOKEN=...": f"FIELDSALES_API_TOKEN={api['token']}",
            "-p 3000": f"-p {web_port}",
            ".venv/bin/": f"{BIN}/",
        }
        exported: dict[str, str] = {}
        background: list[tuple[list[str], str]] = []
        for line in step_by_step():
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
        phases = {"guide steps": time.monotonic() - started}
        assert [process for _, process in background] == ["daemon", "webserver"]
        home = Path(exported["DAGSTER_HOME"])
        assert (home / "dagster.yaml").read_text() == (ROOT / "deploy" / "dagster.yaml").read_text()

        # The role and database the guide created, owned by the role, reachable by its URL.
        import psycopg2

        with psycopg2.connect(exported["DAGSTER_POSTGRES_URL"]) as conn, conn.cursor() as cur:
            cur.execute("SELECT current_user, current_database()")
            assert cur.fetchone() == ("dagster", "dagster")

        logs = {process: tmp_path / f"{process}.log" for _, process in background}
        envs = {
            process: {
                **_base_env(),
                **{k: v for k, v in exported.items() if k in variables_for(process)},
            }
            for _, process in background
        }
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
        (daemon_argv, _), (web_argv, _) = background
        with (
            process_group(daemon_argv, logs["daemon"], envs["daemon"], cwd=ROOT),
            process_group(web_argv, logs["webserver"], envs["webserver"], cwd=ROOT),
        ):
            every_log = list(logs.values())

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
                return (
                    run["status"] if run["status"] in ("SUCCESS", "FAILURE", "CANCELED") else None
                )

            final = wait_for("the queued refresh_all did not finish", finished, started, every_log)
            assert final == "SUCCESS", "\n".join(tail(log) for log in every_log)
            phases["run succeeded"] = time.monotonic() - started

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
    phases["stopped"] = time.monotonic() - started
    print(
        "deploy guide test, seconds from its start: "
        + ", ".join(f"{k} {v:.0f}" for k, v in phases.items())
    )


def _base_env() -> dict[str, str]:
    """What any service manager gives a process: a PATH, a HOME, a locale; nothing of ours."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/tmp"),
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
    }
