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
SQL_FOLDER = Path(__file__).parent / "sql"
#: As in "Error while loading component fieldsales[0]: ...".
_COMPONENT = re.compile(r"component (?P<folder>[^\s\[:]+)")


class FieldSalesConfigError(Exception):
    """A setting is wrong: raised without its chain, so a traceback ends with what to fix."""


def _component_file(exc: BaseException | None) -> str:
    """The defs.yaml a component load error is about."""
    while exc is not None:
        match = _COMPONENT.search(str(exc).splitlines()[0] if str(exc) else "")
        if match and (DEFS_FOLDER / match["folder"] / "defs.yaml").is_file():
            return _shown(DEFS_FOLDER / match["folder"] / "defs.yaml")
        exc = exc.__cause__
    found = sorted(DEFS_FOLDER.glob("*/defs.yaml"))
    return _shown(found[0]) if len(found) == 1 else f"one of {_shown(DEFS_FOLDER)}/*/defs.yaml"


def _shown(path: Path) -> str:
    path, here = path.resolve(), Path.cwd().resolve()
    return str(path.relative_to(here) if path.is_relative_to(here) else path)


@dg.definitions
def defs() -> dg.Definitions:
    """Built once per process for the same ``_inputs``: Dagster asks several times per process,
    and each build costs about a second of CPU."""
    return _definitions(_inputs())


def _inputs() -> str:
    """A digest (the token is not kept) of the environment and the ``defs/`` and ``sql/`` files."""
    digest = hashlib.sha256(repr(sorted(os.environ.items())).encode())
    for path in sorted([*DEFS_FOLDER.rglob("*"), *SQL_FOLDER.rglob("*")]):
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
    # In-process: saves a Python start-up and the lake's attach per step.
    return dg.Definitions.merge(loaded, dg.Definitions(executor=dg.in_process_executor))
