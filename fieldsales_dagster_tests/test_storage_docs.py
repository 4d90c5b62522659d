"""docs/storage.md's analyst lines, exactly as written, against a lake a test run made.

The Python block runs as a script from a folder whose ``data/`` holds the lake at its default
place; the CLI block's first line writes ``open_lake.sql``, which DuckDB runs (the Python
client's engine; the ``duckdb`` CLI too where one is installed); the time-travel lines run on it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import dagster as dg
import duckdb
import pytest

from fieldsales_dagster.warehouse.warehouse import FieldSalesWarehouse
from fieldsales_dagster_tests.conftest import make_api
from fieldsales_dagster_tests.processes import clean_env
from fieldsales_dagster_tests.project import core_assets, mart_assets, raw_assets

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "storage.md"


def block(heading: str, language: str) -> str:
    """The first ``language`` code block after ``heading`` in docs/storage.md."""
    text = DOC.read_text().split(heading, 1)[1]
    match = re.search(rf"```{language}\n(.*?)```", text, re.S)
    assert match, f"no {language} block under {heading}"
    return match.group(1)


@pytest.fixture(scope="module")
def project_folder(tmp_path_factory) -> Path:
    """A folder whose data/ holds a lake at the default place, made by a test run."""
    from fieldsales_dagster.demo_api import DemoConfig, DemoServer

    folder = tmp_path_factory.mktemp("analyst")
    catalog = folder / "data" / "fieldsales.ducklake.sqlite"
    with DemoServer(DemoConfig(transactions=300, seed=2), host="127.0.0.1", port=0) as server:
        result = dg.materialize(
            [*raw_assets(), *core_assets(), *mart_assets()],
            resources={
                "fieldsales_api": make_api(server, folder),
                "warehouse": FieldSalesWarehouse(ducklake_catalog=f"sqlite:{catalog}"),
            },
        )
    assert result.success
    return folder


def test_the_python_lines_read_the_lake(project_folder):
    script = project_folder / "read.py"
    script.write_text(block("### From Python", "python"))
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=project_folder,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "300" in done.stdout and "transactions" in done.stdout


def test_the_cli_lines_open_the_lake_read_only_and_time_travel_works(project_folder, monkeypatch):
    make_sql, open_cli = block("### From the DuckDB CLI", "sh").strip().splitlines()
    argv = make_sql.split(">")[0].split()
    assert argv[0] == ".venv/bin/python" and open_cli == "duckdb -readonly -init open_lake.sql"
    done = subprocess.run(
        [sys.executable, *argv[1:]],
        cwd=project_folder,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    (project_folder / "open_lake.sql").write_text(done.stdout)
    travel = [line for line in block("### Time travel", "sql").splitlines() if line.strip()]
    monkeypatch.chdir(project_folder)  # where the CLI runs: the project folder
    with duckdb.connect() as conn:
        conn.execute(done.stdout)
        assert conn.execute("SELECT count(*) FROM core.transactions").fetchone() == (300,)
        (version,) = conn.execute("SELECT max(snapshot_id) FROM fieldsales.snapshots()").fetchone()
        assert conn.execute(travel[0]).fetchall()
        assert conn.execute(travel[1].replace("42", str(version))).fetchone() == (300,)
        with pytest.raises(duckdb.Error, match="snapshot"):
            conn.execute(travel[2])  # a day ago this lake did not exist yet: DuckDB says so
        with pytest.raises(duckdb.Error):
            conn.execute("CREATE TABLE core.x AS SELECT 1")  # read-only
    cli = shutil.which("duckdb")
    if cli:  # a DuckDB CLI on this machine: the second line as written
        done = subprocess.run(
            [*open_cli.split(), "-c", "SELECT count(*) FROM core.transactions"],
            cwd=project_folder,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0 and "300" in done.stdout, done.stderr
