"""Long-lived processes in tests (the demo API, dagster-daemon, dagster-webserver), each in its
own process group that the test ends, and the environment they start with."""

from __future__ import annotations

import os
import signal
import subprocess
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def process_group(argv: list[str], log: Path, env: dict[str, str], **kwargs):
    """Start ``argv`` in its own process group; on exit, end that group (and only it)."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv,
            stdout=kwargs.pop("stdout", out),
            stderr=out,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            **kwargs,
        )
    try:
        yield proc
    finally:
        for sig, wait_s in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(wait_s)
                break
            except subprocess.TimeoutExpired:
                continue


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FIELDSALES_", "DAGSTER_"))}
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


def tail(path: Path, lines: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
