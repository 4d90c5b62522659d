"""docs/storage.md's analyst lines, exactly as written, against a lake test runs made.

The lake sits at its default place under a folder's ``data/``: a whole refresh, then the demo
API's data changed and a refresh of the raw tables alone, so its latest snapshot holds new raw
tables beside the core and mart tables of the refresh before. Every way the page opens the lake
reads the last complete refresh, all of one moment: the Python block, the shell line, the DuckDB
CLI of the test extra (the release the page names) with the ``open_lake.sql`` it writes, and
the time-travel lines in it; the page's "latest, on purpose" lines read the raw-only refresh.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import dagster as dg
import pytest

from fieldsales_dagster.demo_api import DemoConfig, DemoServer
from fieldsales_dagster.warehouse.lake import EXTENSION_VERSION
from fieldsales_dagster.warehouse.warehouse import FieldSalesWarehouse
from fieldsales_dagster_tests.conftest import make_api
from fieldsales_dagster_tests.processes import clean_env
from fieldsales_dagster_tests.project import core_assets, mart_assets, raw_assets

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "storage.md"
BIN = Path(sys.executable).parent
#: The demo's transactions: the complete refresh's (raw and core alike), and the raw-only one's.
COMPLETE, RAW_ONLY = 300, 261


def blocks(heading: str, language: str) -> list[str]:
    """The ``language`` code blocks of the section under ``heading`` in docs/storage.md."""
    text = DOC.read_text().split(heading, 1)[1]
    section = re.split(r"\n#{2,3} ", text, maxsplit=1)[0]
    found = re.findall(rf"```{language}\n(.*?)```", section, re.S)
    assert found, f"no {language} block under {heading}"
    return found


def as_written(line: str) -> list[str]:
    """A documented command's argv, the project's ``.venv/bin/`` being this environment's."""
    argv = shlex.split(line)
    return [str(BIN / argv[0].removeprefix(".venv/bin/")), *argv[1:]]


def run(argv: list[str], folder: Path, stdin: str | None = None) -> str:
    done = subprocess.run(
        argv, cwd=folder, env=clean_env(), input=stdin, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout


@pytest.fixture(scope="module")
def project_folder(tmp_path_factory) -> Path:
    """A folder whose data/ holds the lake: a whole refresh, then a refresh of raw alone."""
    folder = tmp_path_factory.mktemp("analyst")
    catalog = folder / "data" / "fieldsales.ducklake.sqlite"
    with DemoServer(DemoConfig(transactions=COMPLETE, seed=2), host="127.0.0.1", port=0) as server:
        resources = {
            "fieldsales_api": make_api(server, folder),
            "warehouse": FieldSalesWarehouse(ducklake_catalog=f"sqlite:{catalog}"),
        }
        everything = [*raw_assets(), *core_assets(), *mart_assets()]
        assert dg.materialize(everything, resources=resources).success
        server.behaviour.evolve(1)
        assert dg.materialize(raw_assets(), resources=resources).success
    return folder


@pytest.fixture(scope="module")
def open_lake(project_folder) -> list[str]:
    """The CLI section's lines, the first two run as written: the CLI is the test extra's, the
    second writes open_lake.sql. Returns the third, which opens the CLI."""
    install, write, open_cli = blocks("### From the DuckDB CLI", "sh")[0].strip().splitlines()
    version = EXTENSION_VERSION.removeprefix("v")
    assert install == f".venv/bin/pip install duckdb-cli=={version}"
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert f"duckdb-cli=={version}" in extras["test"]
    assert run(as_written(".venv/bin/duckdb --version"), project_folder).startswith(f"v{version} ")
    command, target = write.split(" > ")
    (project_folder / target).write_text(run(as_written(command), project_folder))
    return as_written(open_cli)


def numbers(cli_output: str) -> list[int]:
    """The one-number answers in the CLI's boxes, in order."""
    return [int(n) for n in re.findall(r"│\s+(\d+)\s+│", cli_output)]


def test_the_python_lines_read_the_last_complete_refresh(project_folder):
    script = project_folder / "read.py"
    script.write_text(blocks("### From Python", "python")[0])
    out = run([sys.executable, str(script)], project_folder)
    assert numbers(out)[0] == COMPLETE, out
    catalog = project_folder / "data" / "fieldsales.ducklake.sqlite"
    lake = FieldSalesWarehouse(ducklake_catalog=f"sqlite:{catalog}")
    with lake.read_connection() as conn:  # the raw tables of that refresh, not the raw-only one's
        counts = "SELECT (SELECT count(*) FROM raw.transactions), count(*) FROM core.transactions"
        assert conn.execute(counts).fetchone() == (COMPLETE, COMPLETE)


def test_the_shell_line_takes_the_value_and_nothing_else(project_folder):
    (line,) = blocks("### From Python", "sh")[0].strip().splitlines()
    line = line.replace(".venv/bin/python", shlex.quote(sys.executable))
    variable = line.split("=", 1)[0]
    assert run(["bash", "-c", f'{line}; printf %s "${variable}"'], project_folder) == str(COMPLETE)
    # No progress bar either, which DuckDB draws on standard output for a query of over 2 s,
    # in a process like the analyst's (under pytest, DuckDB starts with it off).
    code = (
        "from fieldsales_dagster import FieldSalesWarehouse as W; print(W().read_connection()"
        ".sql(\"SELECT value FROM duckdb_settings() WHERE name = 'enable_progress_bar'\")"
        ".fetchone()[0])"
    )
    assert run([sys.executable, "-c", code], project_folder) == "false\n"


def test_the_cli_reads_the_last_complete_refresh_read_only(project_folder, open_lake):
    assert "-readonly" not in open_lake  # the CLI refuses it for its in-memory database
    out = run(
        open_lake,
        project_folder,
        "SELECT count(*) FROM raw.transactions;\nSELECT count(*) FROM core.transactions;\n"
        "SELECT sum(transactions)::BIGINT FROM mart.daily_sales;\n",
    )
    assert numbers(out) == [COMPLETE, COMPLETE, COMPLETE], out
    done = subprocess.run(
        open_lake,
        cwd=project_folder,
        env=clean_env(),
        input="DROP TABLE core.transactions;\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "read-only" in done.stderr + done.stdout, done.stderr


def test_the_latest_snapshot_on_purpose_holds_the_raw_only_refresh(project_folder, open_lake):
    (latest,) = blocks("### The latest snapshot, on purpose", "sql")
    both = "SELECT count(*) FROM raw.transactions;\n" + latest
    assert numbers(run(open_lake, project_folder, both)) == [COMPLETE, RAW_ONLY]


def test_the_time_travel_lines_work_on_a_young_lake(project_folder, open_lake):
    (travel,) = blocks("### Time travel", "sql")
    out = run(open_lake, project_folder, travel)
    assert "complete refresh" in out and "incomplete refresh" in out
    assert numbers(out)[-1] == COMPLETE
    # The page's example of a time: a day ago, on a lake younger than that, DuckDB's message.
    day_ago = "SELECT count(*) FROM core.transactions AT (TIMESTAMP => now() - INTERVAL 1 DAY);"
    assert day_ago.removeprefix("SELECT count(*) FROM core.transactions ").rstrip(";") in (
        DOC.read_text()
    )
    done = subprocess.run(
        open_lake,
        cwd=project_folder,
        env=clean_env(),
        input=day_ago,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "No snapshot found" in done.stderr + done.stdout
