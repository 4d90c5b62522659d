"""The static checks CI runs as part of the suite: the type check, ruff's lint and format
checks, and the Layout of docs/development.md.

The type check is the command of docs/development.md (``.venv/bin/mypy`` from the project's
root: its ``[tool.mypy]`` in pyproject.toml says what to check and how strictly), run as a
subprocess so that it reads the same configuration a developer's run does.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "fieldsales_dagster"
DEVELOPMENT = ROOT / "docs" / "development.md"
#: A cold run (a fresh clone) takes about half a minute alone; the bound leaves room for a
#: loaded machine without letting a hung checker hold the suite.
MYPY_TIMEOUT_S = 600


def mypy(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mypy", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=MYPY_TIMEOUT_S,
    )


def test_the_package_passes_the_type_check():
    result = mypy()
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"mypy found problems (run .venv/bin/mypy):\n{output}"
    # The configuration's files: the whole package, not whatever mypy found by default.
    checked = re.search(r"no issues found in (\d+) source files", output)
    modules = len(list(PACKAGE.rglob("*.py")))
    assert checked and int(checked[1]) == modules, output


@pytest.mark.parametrize(
    ("line", "complaint"),
    [
        ("x: int = 1  # type: ignore[assignment]", 'Unused "type: ignore" comment'),
        ('x: int = "one"  # type: ignore', '"type: ignore" comment without error code'),
    ],
    ids=["unneeded", "without-code"],
)
def test_the_type_check_refuses_a_type_ignore_that_is_not_specific_and_needed(
    tmp_path, line, complaint
):
    # A file named on the command line replaces the configuration's files, nothing else: the
    # check reads the project's configuration and only this line (and a few stdlib modules).
    snippet = tmp_path / "snippet.py"
    snippet.write_text(line + "\n")
    result = mypy(str(snippet))
    assert result.returncode == 1, result.stdout + result.stderr
    assert complaint in result.stdout, result.stdout + result.stderr


def ruff(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=MYPY_TIMEOUT_S,
    )


@pytest.mark.parametrize(
    "command", [("check", "."), ("format", "--check", ".")], ids=["check", "format"]
)
def test_the_project_passes_ruff(command):
    # The commands of docs/development.md, with the project's [tool.ruff] in pyproject.toml.
    result = ruff(*command)
    assert result.returncode == 0, (
        f"ruff {' '.join(command)} found problems (run .venv/bin/ruff {' '.join(command)}; "
        f"`ruff check --fix .` and `ruff format .` mend most):\n{result.stdout}{result.stderr}"
    )


@pytest.mark.parametrize(
    ("command", "source", "complaint"),
    [
        (("check",), "import os\n", "F401"),
        (("format", "--check"), "x = {  'a':1 }\n", "would be reformatted"),
    ],
    ids=["check", "format"],
)
def test_ruff_refuses_a_file_it_should(tmp_path, command, source, complaint):
    # Only this file, checked with the project's configuration.
    snippet = tmp_path / "snippet.py"
    snippet.write_text(source)
    result = ruff(*command, "--config", str(ROOT / "pyproject.toml"), str(snippet))
    assert result.returncode == 1, result.stdout + result.stderr
    assert complaint in result.stdout + result.stderr


def layout_entries(readme: str) -> dict[str, str]:
    """docs/development.md's Layout block: each entry's name (``client/``, ``names.py``) -> its
    text."""
    section = readme.split("\n## Layout\n", 1)[1]
    block = section.split("```", 2)[1]
    entries: dict[str, str] = {}
    name = ""
    for line in block.splitlines():
        if re.match(r"^  \S", line):  # an entry of fieldsales_dagster/ ...
            name, _, text = line.strip().partition(" ")
            entries[name] = text
        elif re.match(r"^ {3,}\S", line) and name:  # ... or its continuation
            entries[name] += " " + line.strip()
        else:
            name = ""
    return entries


def unlisted_modules(readme: str) -> list[str]:
    entries = layout_entries(readme)
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE)
        if module.name == "__init__.py":
            continue
        if len(module.parts) == 1:
            listed = module.name in entries
        else:
            folder = "/".join(module.parts[:-1]) + "/"
            text = entries.get(folder, "")
            listed = re.search(rf"(?<![\w.]){re.escape(module.name)}\b", text) is not None
        if not listed:
            missing.append(str(module))
    return missing


def test_the_readme_layout_lists_every_module_of_the_package():
    missing = unlisted_modules(DEVELOPMENT.read_text())
    assert not missing, (
        f"docs/development.md's Layout section does not list {missing}: add each beside its folder "
        "(one line, what it does)."
    )


def test_the_layout_check_sees_a_module_left_out():
    readme = DEVELOPMENT.read_text()
    assert unlisted_modules(readme.replace("follow.py (", "(")) == ["assets/follow.py"]


#: The package's private Dagster imports, each with its reason (docs/development.md, "Private
#: Dagster APIs"): none.
PRIVATE_TYPE_IMPORTS: dict[str, str] = {}


def private_dagster_imports(source: str) -> list[tuple[str, bool]]:
    """Each ``dagster._...`` module ``source`` imports, and whether only under TYPE_CHECKING."""
    import ast

    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, typing_only: bool) -> None:
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names.append(node.module)
            found.extend((name, typing_only) for name in names if name.startswith("dagster._"))
        for child in ast.iter_child_nodes(node):
            guarded = (
                isinstance(node, ast.If)
                and child in node.body
                and isinstance(node.test, ast.Name)
                and node.test.id == "TYPE_CHECKING"
            )
            visit(child, typing_only or guarded)

    visit(ast.parse(source), False)
    return found


def test_the_package_imports_no_private_dagster_api_but_the_listed_annotations():
    found = {
        str(module.relative_to(PACKAGE)): private_dagster_imports(module.read_text("utf-8"))
        for module in sorted(PACKAGE.rglob("*.py"))
    }
    found = {module: imports for module, imports in found.items() if imports}
    assert found == {module: [(name, True)] for module, name in PRIVATE_TYPE_IMPORTS.items()}, (
        "a private Dagster import: use the public API, or list it with its reason"
    )
    assert "Private Dagster APIs" in DEVELOPMENT.read_text()
    for module in PRIVATE_TYPE_IMPORTS:
        assert module in DEVELOPMENT.read_text()


def test_the_private_import_check_sees_one_that_runs():
    source = "import dagster as dg\nfrom dagster._core.storage.db_io_manager import TableSlice\n"
    assert private_dagster_imports(source) == [("dagster._core.storage.db_io_manager", False)]


def test_the_repository_tracks_no_symbolic_link():
    """A link committed by mistake (a `.venv` pointing at one machine's virtualenv) makes a fresh
    clone depend on that machine: `make` then finds a Python that exists only there."""
    tracked = subprocess.run(
        ["git", "ls-files", "--stage"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert tracked, "git ls-files listed nothing: not run from a clone?"
    links = [line.split("\t", 1)[1] for line in tracked if line.startswith("120000 ")]
    assert links == []
