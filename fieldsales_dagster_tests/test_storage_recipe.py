"""docs/storage.md's "A catalog on your own machine", executed line by line.

Both recipes run as written against the demo API: the embedded SQLite catalog (no server), and
a PostgreSQL catalog whose role and database the recipe's own ``psql``/``createdb`` lines create
on a real PostgreSQL (from the pgserver wheel, as its superuser, as the page says). Each ends in
the page's ``dg launch --assets '*'``, which must succeed; the lake it wrote is then opened
read-only and holds every demo transaction.

The only substitutions: the recipe's folder ``data/`` becomes this test's, the PostgreSQL server
gets this test's port, and the run's Dagster home is a temporary one (``make demo``'s kind), so
nothing is written into the project folder.
"""

from __future__ import annotations

import os
import re
import shlex
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from fieldsales_dagster.demo_api import DemoConfig, DemoServer
from fieldsales_dagster.warehouse.lake import Lake, connect
from fieldsales_dagster_tests.postgres import running_postgres

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PAGE = ROOT / "docs" / "storage.md"
DEMO_TRANSACTIONS = 300


def recipe_blocks() -> list[list[str]]:
    """The bash blocks of the section, as lines (comments and continuations joined)."""
    text = PAGE.read_text()
    start = text.index("## A catalog on your own machine")
    section = text[start : text.index("\n## ", start + 1)]
    blocks = []
    for block in re.findall(r"```bash\n(.*?)```", section, re.S):
        joined = block.replace("\\\n", " ")
        blocks.append([line for line in joined.splitlines() if line.strip()])
    return blocks


def run_recipe(lines: list[str], tmp_path: Path, server: DemoServer, postgres=None) -> dict:
    """Run the recipe's lines; returns the variables it exported."""
    from fieldsales_dagster.demo_run import prepare_dagster_home

    data = tmp_path / "data"
    exported: dict[str, str] = {}
    env = {
        **os.environ,  # the suite's: FIELDSALES_DUCKDB_PATH and the token store under tmp_path
        "DAGSTER_HOME": str(prepare_dagster_home(tmp_path / "home", ROOT / "dagster.yaml")),
        "FIELDSALES_BASE_URL": server.base_url,
        "FIELDSALES_API_TOKEN": server.token,
    }
    for line in lines:
        line = re.sub(r"(?<![\w/])data/", f"{data}/", line)
        if postgres is not None:
            line = line.replace("host=127.0.0.1", f"host=127.0.0.1 port={postgres.port}")
        argv = shlex.split(line, comments=True)
        if argv[0] == "export":
            for assignment in argv[1:]:
                name, value = assignment.split("=", 1)
                exported[name] = value
        elif argv[0] in ("psql", "createdb"):
            assert postgres is not None, line
            subprocess.run(
                [str(postgres.bin_dir / argv[0]), *argv[1:]],
                env={**os.environ, **postgres.client_env()},
                check=True,
                capture_output=True,
                timeout=60,
            )
        else:
            assert argv[0] in ("mkdir", ".venv/bin/dg"), line
            argv[0] = argv[0].replace(".venv/bin/", f"{BIN}/")
            done = subprocess.run(
                argv,
                cwd=ROOT,
                env={**env, **exported},
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return exported


def lake_transactions(exported: dict[str, str]) -> int:
    lake = Lake(exported["FIELDSALES_DUCKLAKE_CATALOG"], exported["FIELDSALES_DUCKLAKE_DATA_PATH"])
    with connect(lake, read_only=True) as conn:
        (count,) = conn.execute("SELECT count(*) FROM core.transactions").fetchone()
    return count


@pytest.fixture
def server():
    config = DemoConfig(transactions=DEMO_TRANSACTIONS, seed=5)
    with DemoServer(config, host="127.0.0.1", port=0) as server:
        yield server


def test_the_page_gives_an_embedded_recipe_and_a_postgres_one_with_one_role():
    sqlite_recipe, postgres_recipe, docker = recipe_blocks()
    assert "export FIELDSALES_DUCKLAKE_CATALOG=sqlite:data/mylake/catalog.sqlite" in sqlite_recipe
    assert sqlite_recipe[-1] == postgres_recipe[-1] == ".venv/bin/dg launch --assets '*'"
    # One role name, in the recipe, its Docker variant and the deployment guide.
    (catalog,) = [line for line in postgres_recipe if "FIELDSALES_DUCKLAKE_CATALOG" in line]
    assert "dbname=fieldsales_lake" in catalog and "user=fieldsales_lake" in catalog
    (run,) = docker
    assert "POSTGRES_USER=fieldsales_lake" in run and "POSTGRES_DB=fieldsales_lake" in run
    password = re.search(r"PASSWORD '([^']+)'", postgres_recipe[0])[1]
    assert f"export FIELDSALES_DUCKLAKE_PASSWORD={password}" in postgres_recipe
    assert f"POSTGRES_PASSWORD={password}" in run
    guide = (ROOT / "deploy" / "README.md").read_text()
    assert "CREATE ROLE fieldsales_lake LOGIN" in guide
    assert "user=fieldsales_lake" in guide


def test_the_embedded_catalog_recipe_needs_no_server(tmp_path, server):
    sqlite_recipe = recipe_blocks()[0]
    exported = run_recipe(sqlite_recipe, tmp_path, server)
    catalog = tmp_path / "data" / "mylake" / "catalog.sqlite"
    assert exported["FIELDSALES_DUCKLAKE_CATALOG"] == f"sqlite:{catalog}"
    with sqlite3.connect(catalog) as db:  # a real SQLite file holding DuckLake's catalog
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
    assert "ducklake_snapshot" in tables
    assert list((tmp_path / "data" / "mylake" / "files").rglob("*.parquet"))
    assert lake_transactions(exported) == DEMO_TRANSACTIONS


def test_the_postgres_catalog_recipe_creates_its_role_and_database_and_runs(
    tmp_path, server, monkeypatch
):
    postgres_recipe = recipe_blocks()[1]
    with running_postgres(database=None) as admin:
        exported = run_recipe(postgres_recipe, tmp_path, server, postgres=admin)
        monkeypatch.setenv("FIELDSALES_DUCKLAKE_PASSWORD", exported["FIELDSALES_DUCKLAKE_PASSWORD"])
        assert lake_transactions(exported) == DEMO_TRANSACTIONS
        # The catalog is in the database the recipe created, owned by its role.
        import psycopg2

        with (
            psycopg2.connect(
                host="127.0.0.1",
                port=admin.port,
                user="fieldsales_lake",
                password=exported["FIELDSALES_DUCKLAKE_PASSWORD"],
                dbname="fieldsales_lake",
            ) as conn,
            conn.cursor() as cur,
        ):
            cur.execute("SELECT tableowner FROM pg_tables WHERE tablename = 'ducklake_snapshot'")
            assert cur.fetchall() == [("fieldsales_lake",)]
