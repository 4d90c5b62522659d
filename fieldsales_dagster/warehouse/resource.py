"""The DuckDB file every asset writes: one writer at a time, clear errors, atomic table swaps."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb
import filelock
from dagster_duckdb import DuckDBResource
from pydantic import Field

DEFAULT_DUCKDB_PATH = "data/fieldsales.duckdb"


class WarehouseBusyError(RuntimeError):
    """Another program holds the DuckDB file."""


def default_duckdb_path() -> str:
    return os.environ.get("FIELDSALES_DUCKDB_PATH") or DEFAULT_DUCKDB_PATH


class FieldSalesWarehouse(DuckDBResource):
    """The project's DuckDB file.

    DuckDB allows one writing process per file. Assets of this project queue on a lock file beside
    the database (``<database>.lock``) so that Dagster may run them in parallel processes; another
    program that holds the file makes the connection fail with an error naming the file once
    ``busy_timeout_s`` has passed.
    """

    database: str = Field(
        default_factory=default_duckdb_path,
        description="DuckDB file (FIELDSALES_DUCKDB_PATH, default data/fieldsales.duckdb).",
    )
    memory_limit: str = Field(
        default="192MB",
        description=(
            "DuckDB memory_limit; larger work spills to temp_directory. Kept small so a nightly "
            "refresh of millions of rows runs in well under a gigabyte."
        ),
    )
    threads: int | None = Field(default=None, description="DuckDB threads (default: all cores).")
    lock_timeout_s: float = Field(
        default=3600.0,
        description="How long an asset waits for another asset of this project to finish writing.",
    )
    busy_timeout_s: float = Field(
        default=30.0,
        description="How long to retry when a program outside this project holds the file.",
    )
    max_shrink_fraction: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description=(
            "Largest share of a raw table's rows a full refresh may drop (0.5: half). A refresh "
            "that would shrink it more, or empty a non-empty table, fails and keeps the old one."
        ),
    )

    @property
    def lock_path(self) -> Path:
        return Path(f"{self.database}.lock")

    @contextmanager
    def get_connection(self) -> Iterator[duckdb.DuckDBPyConnection]:
        path = Path(self.database)
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = filelock.FileLock(str(self.lock_path), timeout=self.lock_timeout_s)
        try:
            lock.acquire()
        except filelock.Timeout as exc:
            raise WarehouseBusyError(
                f"Waited {self.lock_timeout_s:.0f} s for another asset to finish writing "
                f"{path}; raise lock_timeout_s or look for a stuck run holding {self.lock_path}."
            ) from exc
        try:
            conn = self._connect(path)
            try:
                yield conn
            finally:
                conn.close()
        finally:
            lock.release()

    def _connect(self, path: Path) -> duckdb.DuckDBPyConnection:
        config: dict[str, object] = {
            "memory_limit": self.memory_limit,
            "temp_directory": str(path.parent / ".duckdb_tmp"),
            "preserve_insertion_order": False,
        }
        if self.threads:
            config["threads"] = self.threads
        deadline = time.monotonic() + self.busy_timeout_s
        delay = 0.1
        while True:
            try:
                return duckdb.connect(str(path), config=config)
            except duckdb.IOException as exc:
                if "lock" not in str(exc).lower():
                    raise
                if time.monotonic() >= deadline:
                    raise WarehouseBusyError(
                        f"Another program holds the DuckDB file {path} (DuckDB: {exc}). Close it "
                        "(a DuckDB shell, a notebook, a BI tool) or point FIELDSALES_DUCKDB_PATH "
                        "at another file, then run again."
                    ) from exc
                time.sleep(delay)
                delay = min(delay * 2, 2.0)


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def qualified(table: str) -> str:
    """``schema.table`` -> ``"schema"."table"``."""
    schema, _, name = table.partition(".")
    return f"{quote_ident(schema)}.{quote_ident(name)}"


def replace_table(conn: duckdb.DuckDBPyConnection, staged: str, target: str) -> None:
    """Swap a fully built staging table in for ``target`` in one transaction.

    Both are ``schema.table`` names in the same schema; readers see the old table or the new one,
    never a half-written one, and a failure before this call leaves the old table untouched.
    """
    schema, _, name = target.partition(".")
    conn.execute("BEGIN TRANSACTION")
    try:
        conn.execute(f"DROP TABLE IF EXISTS {qualified(target)}")
        conn.execute(f"ALTER TABLE {qualified(staged)} RENAME TO {quote_ident(name)}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
