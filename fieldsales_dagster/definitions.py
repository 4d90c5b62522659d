"""The code location: every instance under ``defs/``, loaded lazily when Dagster asks for it."""

from __future__ import annotations

import functools
import hashlib
import os
import re
from pathlib import Path

import dagster as dg

from fieldsales_dagster.component import configuration_problems

DEFS_FOLDER = Path(__file__).parent / "defs"
#: What else the definitions read when they load: the queries and their column descriptions.
SQL_FOLDER = Path(__file__).parent / "sql"
#: What Dagster's component loader says first: "Error while loading component fieldsales[0]: ...".
_COMPONENT = re.compile(r"component (?P<folder>[^\s\[:]+)")


class FieldSalesConfigError(Exception):
    """A setting of a Field-Sales instance is wrong: the message is all a user needs to fix it.

    Raised without its chain, so that a command-line traceback ends with the cause (the setting,
    its variable, what it accepts) instead of Dagster's and pydantic's frames around it.
    """


def _component_file(exc: BaseException | None) -> str:
    """The defs.yaml a component load error is about, as a path from the working directory."""
    while exc is not None:
        match = _COMPONENT.search(str(exc).splitlines()[0] if str(exc) else "")
        if match and (DEFS_FOLDER / match["folder"] / "defs.yaml").is_file():
            return _shown(DEFS_FOLDER / match["folder"] / "defs.yaml")
        exc = exc.__cause__
    found = sorted(DEFS_FOLDER.glob("*/defs.yaml"))
    # A load error not tied to a folder (a path setting checked later): name the only one there
    # is, or the folder that holds them all, never a placeholder.
    return _shown(found[0]) if len(found) == 1 else f"one of {_shown(DEFS_FOLDER)}/*/defs.yaml"


def _shown(path: Path) -> str:
    """``path`` from the working directory when it lies below it, else absolute."""
    path = path.resolve()
    try:
        return str(path.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


@dg.definitions
def defs() -> dg.Definitions:
    """The definitions, built once per process for the same inputs (``_inputs``).

    Dagster asks for them several times in one process (a CLI run: to list the job, to execute
    it, for the step's context, ...), each time building every instance's component, resource
    and asset anew: about a second of CPU each. The same environment and files give the same
    definitions, so they are built once; a change to either (a test's variables, an edited
    defs.yaml, a reloaded code location) builds them again.
    """
    return _definitions(_inputs())


def _inputs() -> str:
    """A digest of what the definitions are built from: the environment (every setting's
    variable, the token), and the name, size and modification time of every file of the
    ``defs/`` and ``sql/`` folders. A digest: the token is not kept."""
    digest = hashlib.sha256()
    for name, value in sorted(os.environ.items()):
        digest.update(f"{name}\0{value}\0".encode())
    for folder in (DEFS_FOLDER, SQL_FOLDER):
        for path in sorted(folder.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                stat = path.stat()
                digest.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
    return digest.hexdigest()


@functools.lru_cache(maxsize=4)
def _definitions(inputs: str) -> dg.Definitions:
    try:
        loaded = dg.load_from_defs_folder(path_within_project=Path(__file__).parent)
    except Exception as exc:
        problems = configuration_problems(exc)
        if not problems:
            raise
        raise FieldSalesConfigError(
            f"The Field-Sales instance in {_component_file(exc)} is not configured correctly:\n"
            + "\n".join(f"- {problem}" for problem in problems)
        ) from None
    return dg.Definitions.merge(
        loaded,
        # Steps run in the run's own process: it saves a Python process (and its start-up, and
        # the lake's attach) per step. Separate runs (schedule, UI, CLI) write the lake at once,
        # one writer per table (each table's pool), each table change one snapshot.
        dg.Definitions(executor=dg.in_process_executor),
    )
