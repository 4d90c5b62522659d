"""A real PostgreSQL server on loopback for the tests, from the binaries of the pgserver wheel.

PostgreSQL refuses to run as root; under root (``.ci/run`` on a fresh machine) the server runs as
``nobody`` from a copy of the binaries in a world-readable temporary folder, since the project's
own folder may not be readable by that user.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg2

UNPRIVILEGED_USER = "nobody"
START_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Postgres:
    host: str
    port: int
    user: str
    password: str
    database: str
    #: The server's client programs (psql, createdb, ...).
    bin_dir: Path | None = None

    @property
    def url(self) -> str:
        """What DAGSTER_POSTGRES_URL holds: postgresql://user:password@host:port/dbname."""
        return f"postgresql://{self.user}:{self.password}@{self.host}:{self.port}/{self.database}"

    def connect(self):
        return psycopg2.connect(self.url)

    def client_env(self) -> dict[str, str]:
        """What psql and createdb read to connect as this user (PGHOST, PGPORT, ...)."""
        return {
            "PGHOST": self.host,
            "PGPORT": str(self.port),
            "PGUSER": self.user,
            "PGPASSWORD": self.password,
            "PGDATABASE": self.database,
        }


def _pgserver_install() -> Path:
    spec = importlib.util.find_spec("pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "The PostgreSQL binaries come from the pgserver package: pip install -e '.[test]'."
        )
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running_postgres(database: str | None = "dagster") -> Iterator[Postgres]:
    """Start a throw-away PostgreSQL 16 on 127.0.0.1 with password authentication; stop it after.

    Yields the superuser ``fieldsales`` connected to ``database``, created empty; with ``None``,
    to the ``postgres`` database (the caller creates what it needs).
    """
    root = Path(tempfile.mkdtemp(prefix="fieldsales-pg-"))
    run_as: dict[str, int] = {}
    install = _pgserver_install()
    if os.geteuid() == 0:
        user = pwd.getpwnam(UNPRIVILEGED_USER)
        run_as = {"user": user.pw_uid, "group": user.pw_gid}
        root.chmod(0o755)
        # The binaries find their libraries at $ORIGIN/../../../pgserver.libs: keep that layout.
        site = install.parent.parent
        copy = root / "site"
        shutil.copytree(site / "pgserver.libs", copy / "pgserver.libs", symlinks=True)
        install = Path(shutil.copytree(install, copy / "pgserver" / "pginstall", symlinks=True))
    bin_dir = install / "bin"
    pgdata = root / "pgdata"
    pgdata.mkdir(mode=0o700)
    password = secrets.token_hex(12)
    pwfile = root / "pwfile"
    pwfile.write_text(password)
    if run_as:
        for path in (pgdata, pwfile):
            os.chown(path, run_as["user"], run_as["group"])
    log = (root / "postgres.log").open("wb")
    server: subprocess.Popen | None = None
    try:
        subprocess.run(
            [
                str(bin_dir / "initdb"),
                "-D",
                str(pgdata),
                "-U",
                "fieldsales",
                "--auth=scram-sha-256",
                f"--pwfile={pwfile}",
                "--encoding=UTF8",
                "--no-sync",
            ],
            check=True,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=root,
            **run_as,
        )
        port = _free_port()
        server = subprocess.Popen(
            [
                str(bin_dir / "postgres"),
                "-D",
                str(pgdata),
                "-h",
                "127.0.0.1",
                "-p",
                str(port),
                "-k",
                str(pgdata),
                "-c",
                "fsync=off",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=root,
            **run_as,
        )
        admin = Postgres("127.0.0.1", port, "fieldsales", password, "postgres")
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                conn = admin.connect()
                break
            except psycopg2.OperationalError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"PostgreSQL did not start; see {root / 'postgres.log'}"
                    ) from None
                time.sleep(0.2)
        conn.autocommit = True
        if database is not None:
            with conn.cursor() as cur:
                cur.execute(f'CREATE DATABASE "{database}"')
        conn.close()
        yield Postgres(
            "127.0.0.1", port, "fieldsales", password, database or "postgres", bin_dir=bin_dir
        )
    finally:
        if server is not None:
            server.send_signal(signal.SIGINT)  # fast shutdown: disconnects clients
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        log.close()
        shutil.rmtree(root, ignore_errors=True)
