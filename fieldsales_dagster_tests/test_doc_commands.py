"""Every shell block of the docs runs as written in a test, or its page says why not (issue 45).

Each fenced ``bash``, ``sh`` or ``console`` block of README.md, docs/*.md and deploy/README.md
has, on the line above it, one of these markers:

    <!-- run by: test_file.py::test_name -->          that test takes the block from the page
                                                      and runs it
    <!-- example: needs your own values (what) -->    the reader's URL, token, server, ...
    <!-- not run by the tests: why -->                a server left running, the suite itself

Tests here run the blocks the marker gives them (``blocks_run_by``), as written, but for the
project's ``.venv/bin/`` (this interpreter's folder here) and a fixed port of the demo API (an
ephemeral one here).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from fieldsales_dagster.demo_api import DemoConfig, DemoServer
from fieldsales_dagster.warehouse.warehouse import FieldSalesWarehouse
from fieldsales_dagster_tests.conftest import read_lake
from fieldsales_dagster_tests.processes import clean_env

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
PAGES = ["README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))]
PAGES.append("deploy/README.md")
FENCE = re.compile(r"^(\s*)```(\w*)\s*$")
SHELL = {"bash", "sh", "console"}
MARKER = re.compile(
    r"<!-- (?:run by: (?P<file>test_\w+\.py)::(?P<test>test_\w+)"
    r"|example: needs your own values \(.+\)|not run by the tests: .+) -->"
)


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # of the opening fence, from 1
    marker: str  # the marker comment above it, or ""
    text: str


def shell_blocks(page: Path, name: str) -> list[Block]:
    """The fenced shell blocks of ``page`` (called ``name``), each with the marker above it."""
    lines = page.read_text().splitlines()
    blocks, at = [], 0
    while at < len(lines):
        fence = FENCE.match(lines[at])
        if not fence:
            at += 1
            continue
        end = next(i for i in range(at + 1, len(lines)) if lines[i].strip() == "```")
        if fence[2] in SHELL:
            above = next((line for line in reversed(lines[:at]) if line.strip()), "")
            marker = MARKER.search(above)
            body = "\n".join(line.removeprefix(fence[1]) for line in lines[at + 1 : end])
            blocks.append(Block(name, at + 1, marker[0] if marker else "", body + "\n"))
        at = end + 1
    return blocks


def unaccounted(root: Path, pages: list[str]) -> list[str]:
    """Each shell block of ``pages`` with no marker, or whose marker names a test that does not
    exist or does not read the page: ``page:line`` and what is wrong."""
    found = []
    for name in pages:
        for block in shell_blocks(root / name, name):
            run_by = MARKER.fullmatch(block.marker)
            if run_by is None:
                found.append(f"{name}:{block.line}: no marker above the block")
            elif run_by["file"]:
                source = TESTS / run_by["file"]
                text = source.read_text() if source.exists() else ""
                if f"def {run_by['test']}(" not in text or Path(name).name not in text:
                    found.append(f"{name}:{block.line}: {block.marker} does not read {name}")
    return found


def blocks_run_by(test: str) -> list[Block]:
    """The blocks whose marker names ``test`` (of this file), in page order."""
    marker = f"<!-- run by: {Path(__file__).name}::{test} -->"
    blocks = [b for n in PAGES for b in shell_blocks(ROOT / n, n) if b.marker == marker]
    assert blocks, f"no block of the docs is marked {marker}"
    return blocks


def run_block(block: Block, cwd: Path, env: dict[str, str]) -> str:
    """``block`` run by bash, stopping at the first failing line; its output."""
    done = subprocess.run(
        ["bash", "-e", "-c", block.text.replace(".venv/bin/", f"{BIN}/")],
        cwd=cwd,
        env={**env, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    where = f"{block.page}:{block.line}"
    assert done.returncode == 0, f"{where} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    return done.stdout


def project_copy(folder: Path) -> Path:
    """A copy of the project (its package and configuration) in ``folder``: blocks that write
    into the project's folder write there."""
    for name in ("pyproject.toml", "dagster.yaml", "workspace.yaml"):
        shutil.copy(ROOT / name, folder / name)
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "fieldsales_dagster", folder / "fieldsales_dagster", ignore=ignore)
    return folder


def test_every_shell_block_is_run_by_a_test_or_marked_as_an_example():
    found = unaccounted(ROOT, PAGES)
    assert not found, "mark each block (see this file's docstring):\n" + "\n".join(found)


def test_the_check_sees_an_unmarked_block_and_a_marker_naming_no_test(tmp_path):
    (tmp_path / "page.md").write_text(
        "# Page\n\n```bash\nmake demo\n```\n\n<!-- run by: test_doc_commands.py::test_gone -->\n"
        "  ```sh\n  ls\n  ```\n\n<!-- example: needs your own values (a token) -->\n"
        "```console\necho $TOKEN\n```\n\n```python\nprint(1)\n```\n"
    )
    assert unaccounted(tmp_path, ["page.md"]) == [
        "page.md:3: no marker above the block",
        "page.md:8: <!-- run by: test_doc_commands.py::test_gone --> does not read page.md",
    ]


def test_the_tenant_commands_run_as_written(tmp_path):
    """docs/tenants.md: list the component, show its docs, scaffold a tenant (in a copy)."""
    project = project_copy(tmp_path)
    listing, scaffolding = blocks_run_by("test_the_tenant_commands_run_as_written")
    listed = run_block(listing, project, clean_env())
    assert "fieldsales_dagster.FieldSalesComponent" in listed
    assert "dg scaffold defs fieldsales_dagster.FieldSalesComponent acme" in listed  # its docs
    run_block(scaffolding, project, clean_env())
    written = project / "fieldsales_dagster" / "defs" / "acme" / "defs.yaml"
    assert "key_prefix: acme" in written.read_text()


def test_the_development_commands_run_as_written():
    """docs/development.md's static checks, from the project's folder."""
    (block,) = blocks_run_by("test_the_development_commands_run_as_written")
    output = run_block(block, ROOT, clean_env())
    assert "Success: no issues found" in output and "All checks passed!" in output


def test_the_web_ui_pages_cli_commands_run_as_written(tmp_path):
    """docs/web-ui.md's commands without the UI, in a copy of the project, against the demo API
    the page starts (its port, 8765 on the page, is an ephemeral one here)."""
    (block,) = blocks_run_by("test_the_web_ui_pages_cli_commands_run_as_written")
    project = project_copy(tmp_path)
    with DemoServer(DemoConfig(transactions=300, seed=0), token="demo-token") as server:
        block = replace(block, text=block.text.replace("http://127.0.0.1:8765", server.base_url))
        output = run_block(block, project, clean_env())
    assert "refresh_all" in output
    lake = FieldSalesWarehouse(
        ducklake_catalog=f"sqlite:{project / 'data/fieldsales.ducklake.sqlite'}"
    )
    with read_lake(lake) as conn:
        assert conn.execute("SELECT count(*) FROM core.transactions").fetchone() == (300,)
