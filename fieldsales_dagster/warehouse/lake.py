"""``storage: ducklake``: the warehouse as a DuckLake, opened offline from the extension wheels.

A DuckLake keeps its catalog (schemas, tables, snapshots, the list of data files) in a SQL
database and the rows in immutable Parquet files under a data path. Every commit is a snapshot:
a reader sees the last committed one, never half a refresh, and never makes a writer wait; writers
of different tables do not block each other. So on a lake there is no working copy and no publish:
assets write the lake directly, each table change in one transaction (``run_transaction``).

The catalog is one of:

* ``postgres:dbname=… host=… user=…`` (a libpq connection string without the password): several
  machines. The password is read from an environment variable and handed to DuckDB as a
  temporary secret, never put in the connection string (DuckDB's connection errors quote it);
* ``sqlite:<file>`` or a DuckDB file (``<file>.ducklake``): one host.

``schema`` puts one tenant's catalog tables in their own schema of the catalog database
(DuckLake's ``METADATA_SCHEMA``), so several tenants share one PostgreSQL database and each sees
its own ``raw``/``core``/``mart``/``meta``; its files go under ``<data_path>/<schema>/``.

The extension binaries come from the ``duckdb-extension-*`` wheels (``INSTALL ducklake`` would
need the network). They are built for one DuckDB release, the one ``pyproject.toml`` pins.
``ducklake`` is loaded from the wheel's file; ``postgres`` and ``sqlite`` are installed under their
own extension names (``postgres_scanner``, ``sqlite_scanner``, the names DuckLake loads them by)
into a per-user ``extension_directory``, then loaded.

What DuckLake does not support, and how the project's SQL avoids it on both storages: no
``PRIMARY KEY``/``UNIQUE``/indexes (state tables are keyed by a delete-then-insert), no macros
stored in the catalog (every macro is ``TEMP``, per connection), no ``ENUM`` columns, and
``CHECKPOINT`` is DuckLake's upkeep rather than a flush (``checkpoint`` skips it on a lake).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import duckdb
import filelock

from fieldsales_dagster.warehouse.rows import one_row

#: The DuckDB release the extension wheels serve; duckdb itself is pinned to the same release.
EXTENSION_VERSION = "v1.5.5"
#: Extension -> (wheel module, name to install it under; ``None``: loaded from the file).
EXTENSIONS: dict[str, tuple[str, str | None]] = {
    "ducklake": ("duckdb_extension_ducklake", None),
    "postgres": ("duckdb_extension_postgres", "postgres_scanner"),
    "sqlite": ("duckdb_extension_sqlite", "sqlite_scanner"),
}
POSTGRES_PREFIX = "postgres:"
SQLITE_PREFIX = "sqlite:"
#: The lake's name in every connection: DuckDB names a file's catalog after its stem, and the lake
#: takes the stem of the file backend's default path, so ``fieldsales.raw.events`` means the
#: same table on both storages.
DEFAULT_ALIAS = "fieldsales"
#: How often a commit that lost a conflict with another writer is tried again.
CONFLICT_ATTEMPTS = 5

T = TypeVar("T")

#: Connections (by id) inside ``run_transaction``'s body.
_IN_TRANSACTION: set[int] = set()


class LakeError(RuntimeError):
    """The lake could not be opened: an extension, the catalog or its password is missing."""


class LakeConflictError(RuntimeError):
    """A table's transaction kept conflicting with another writer's."""


@dataclass(frozen=True)
class Lake:
    """Where a DuckLake lives: its catalog database, its data path, and the tenant's schema."""

    catalog: str
    data_path: str
    schema: str | None = None
    password_env_var: str = "FIELDSALES_DUCKLAKE_PASSWORD"
    alias: str = DEFAULT_ALIAS

    @property
    def is_postgres(self) -> bool:
        return self.catalog.startswith(POSTGRES_PREFIX)

    @property
    def is_sqlite(self) -> bool:
        return self.catalog.startswith(SQLITE_PREFIX)

    @property
    def catalog_file(self) -> Path | None:
        """The catalog's file on this host (sqlite or DuckDB); ``None`` for PostgreSQL."""
        if self.is_postgres:
            return None
        return Path(self.catalog.removeprefix(SQLITE_PREFIX))

    @property
    def data_folder(self) -> str:
        """The tenant's data files: ``data_path``, or ``<data_path>/<schema>`` for a tenant."""
        if not self.schema:
            return self.data_path
        return f"{self.data_path.rstrip('/')}/{self.schema}"

    @property
    def key(self) -> str:
        """A short name of this tenant's lake, for local folders (spools) that must not mix."""
        return hashlib.sha256(f"{self.catalog}\0{self.schema or ''}".encode()).hexdigest()[:16]

    def attach_sql(self, read_only: bool = False) -> str:
        """The ATTACH statement (no password in it: see ``connect``)."""
        options = [f"DATA_PATH {sql_literal(self.data_folder)}"]
        if self.schema:
            options.append(f"METADATA_SCHEMA {sql_literal(self.schema)}")
        if read_only:
            options.append("READ_ONLY")
        return (
            f"ATTACH {sql_literal('ducklake:' + self.catalog)} AS {quote(self.alias)} "
            f"({', '.join(options)})"
        )


def sql_literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def extension_directory() -> Path:
    """Where ``postgres_scanner``/``sqlite_scanner`` are installed: a per-user cache folder."""
    configured = os.environ.get("FIELDSALES_DUCKDB_EXTENSION_DIR")
    if configured:
        return Path(configured)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "fieldsales_dagster" / "duckdb_extensions"


def extension_file(name: str) -> Path:
    """The binary the wheel of extension ``name`` carries for ``EXTENSION_VERSION``."""
    module, _ = EXTENSIONS[name]
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise LakeError(
            f"storage: ducklake needs the DuckDB extension {name!r} from the Python package "
            f"{module.replace('_', '-')}=={EXTENSION_VERSION[1:]}, which is not installed: "
            "pip install the project again (it is a dependency)."
        )
    path = (
        Path(next(iter(spec.submodule_search_locations)))
        / "extensions"
        / EXTENSION_VERSION
        / f"{name}.duckdb_extension"
    )
    if not path.is_file():
        raise LakeError(f"The DuckDB extension {name!r} is missing from its package at {path}.")
    return path


#: What ``duckdb.connect(config=...)`` takes.
DuckDBConfig = dict[str, str | bool | int | float | list[str]]


def lake_config() -> DuckDBConfig:
    """Connection settings of a lake connection: no download of extensions, ever; and no
    insertion order kept, which the lake's row groups by size (``LAKE_OPTIONS``) need to write."""
    return {
        "extension_directory": str(extension_directory()),
        "autoinstall_known_extensions": False,
        "autoload_known_extensions": False,
        "preserve_insertion_order": False,
    }


def load_extensions(conn: duckdb.DuckDBPyConnection, lake: Lake) -> None:
    """Load ``ducklake`` and the catalog's scanner from the wheels, installing it once per user."""
    conn.execute(f"LOAD {sql_literal(str(extension_file('ducklake')))}")
    scanner = "postgres" if lake.is_postgres else "sqlite" if lake.is_sqlite else None
    if scanner is None:
        return
    installed_as = EXTENSIONS[scanner][1]
    assert installed_as is not None
    (installed,) = one_row(
        conn,
        "SELECT count(*) FROM duckdb_extensions() WHERE extension_name = ? AND installed",
        [installed_as],
    )
    if not installed:
        directory = extension_directory()
        directory.mkdir(parents=True, exist_ok=True)
        # Two processes installing at once would write the same file.
        with filelock.FileLock(str(directory / ".install.lock"), timeout=120):
            conn.execute(f"INSTALL {sql_literal(str(extension_file(scanner)))}")
    conn.execute(f"LOAD {installed_as}")


def connect(
    lake: Lake, config: DuckDBConfig | None = None, read_only: bool = False
) -> duckdb.DuckDBPyConnection:
    """A connection whose current database is the lake (``USE <alias>``).

    Temporary objects (``TEMP`` tables and macros) live in the connection's memory as usual.
    """
    if not read_only:
        if lake.catalog_file is not None:
            lake.catalog_file.parent.mkdir(parents=True, exist_ok=True)
        if "://" not in lake.data_folder:
            Path(lake.data_folder).mkdir(parents=True, exist_ok=True)
    conn = duckdb.connect(config={**(config or {}), **lake_config()})
    try:
        load_extensions(conn, lake)
        if lake.is_postgres:
            password = os.environ.get(lake.password_env_var)
            if password:
                # The unnamed secret is the postgres extension's default for every connection
                # string without a password; duckdb_secrets() shows it redacted.
                conn.execute(
                    f"CREATE OR REPLACE TEMPORARY SECRET (TYPE postgres, PASSWORD "
                    f"{sql_literal(password)})"
                )
        try:
            conn.execute(lake.attach_sql(read_only))
        except duckdb.Error as exc:
            hint = (
                f" Check the catalog's connection string and the password in "
                f"{lake.password_env_var}."
                if lake.is_postgres
                else ""
            )
            raise LakeError(
                f"Could not open the DuckLake with catalog {lake.catalog!r} and data path "
                f"{lake.data_folder!r} (FIELDSALES_DUCKLAKE_CATALOG, "
                f"FIELDSALES_DUCKLAKE_DATA_PATH).{hint} DuckDB: {exc}"
            ) from exc
        conn.execute(f"USE {quote(lake.alias)}")
        if not read_only:
            _set_options(conn, lake)
    except BaseException:
        conn.close()
        raise
    return conn


#: Options of the lake, stored in its catalog: name -> (value set, value as the catalog stores
#: it). zstd suits the raw tables' ~5 KB JSON documents; Parquet row groups of at most 16 MB,
#: since by rows (122,880 by default) one row group of payloads is held in memory whole: a raw
#: load's 100 MB spool of 20,000 transactions ran out of the default memory_limit (192MB). A
#: writer must then run with ``preserve_insertion_order=false`` (DuckDB says so otherwise).
LAKE_OPTIONS = {
    "parquet_compression": ("zstd", "zstd"),
    "parquet_row_group_size_bytes": ("16MB", "16000000"),
}


def _set_options(conn: duckdb.DuckDBPyConnection, lake: Lake) -> None:
    """Set ``LAKE_OPTIONS`` once per lake (each change is a commit of the catalog)."""
    current = dict(
        conn.execute(f"SELECT option_name, value FROM {quote(lake.alias)}.options()").fetchall()
    )
    for name, (value, stored) in LAKE_OPTIONS.items():
        if current.get(name) != stored:
            conn.execute(
                f"CALL {quote(lake.alias)}.set_option({sql_literal(name)}, {sql_literal(value)})"
            )


#: One DuckDB instance per process and lake, with the extensions loaded and the lake attached:
#: loading the DuckLake extension and attaching the catalog take about a second, and an asset
#: opens a connection or two. Connections are its cursors (each its own transaction context and
#: its own TEMP objects).
_INSTANCES: dict[tuple[object, ...], duckdb.DuckDBPyConnection] = {}
_INSTANCES_LOCK = threading.Lock()


def writer_connection(lake: Lake, config: DuckDBConfig) -> duckdb.DuckDBPyConnection:
    """A new read-write connection to ``lake`` (``USE <alias>``), from this process's instance.

    A DuckDB-file catalog, which one process at a time may open, is opened anew each time (and
    closed with the connection) so that other processes get their turn.
    """
    if lake.catalog_file is not None and not lake.is_sqlite:
        return connect(lake, config)
    key = (os.getpid(), lake, tuple(sorted((k, str(v)) for k, v in config.items())))
    with _INSTANCES_LOCK:
        instance = _INSTANCES.get(key)
        if instance is None:
            instance = _INSTANCES[key] = connect(lake, config)
        cursor = instance.cursor()
    try:
        cursor.execute(f"USE {quote(lake.alias)}")  # a cursor starts in the default database
    except BaseException:
        cursor.close()
        raise
    return cursor


def is_conflict(exc: BaseException) -> bool:
    """A commit that lost to another writer's ("Transaction conflict")."""
    return isinstance(exc, duckdb.TransactionException) and "conflict" in str(exc).lower()


def is_lake(conn: duckdb.DuckDBPyConnection) -> bool:
    """Whether the connection's current database is a DuckLake."""
    row = conn.execute(
        "SELECT type FROM duckdb_databases() WHERE database_name = current_database()"
    ).fetchone()
    return row is not None and row[0] == "ducklake"


def run_transaction(
    conn: duckdb.DuckDBPyConnection,
    table: str,
    body: Callable[[], T],
    attempts: int = CONFLICT_ATTEMPTS,
    on_conflict: Callable[[int, BaseException], None] | None = None,
) -> T:
    """Run ``body`` in one transaction; commit, or roll back and re-raise.

    A commit that conflicts with another writer's (only a lake's writers can) runs ``body`` again
    in a new transaction, up to ``attempts`` times in all, after a short random pause; then it
    fails naming ``table``. ``body`` must therefore be safe to run again: it reads and writes the
    database, or (an asset's whole write on a lake) fetches again what it stores.

    Called inside another ``run_transaction``'s body, it runs ``body`` in that transaction: the
    outer one commits, or retries, everything together (one lake snapshot per asset write).
    """
    if in_transaction(conn):
        return body()
    for attempt in range(1, attempts + 1):
        conn.execute("BEGIN TRANSACTION")
        _IN_TRANSACTION.add(id(conn))
        try:
            result = body()
            conn.execute("COMMIT")
            return result
        except BaseException as exc:
            _rollback(conn)
            if not is_conflict(exc):
                raise
            if attempt == attempts:
                raise LakeConflictError(
                    f"Writing {table} conflicted with another writer {attempts} times, so it "
                    f"was given up; {table} is left as it was. Another run is changing the same "
                    "table: keep one writer per table (the asset's pool does) and run again. "
                    f"DuckDB: {exc}"
                ) from exc
            if on_conflict is not None:
                on_conflict(attempt, exc)
            time.sleep(random.uniform(0.05, 0.2) * attempt)
        finally:
            _IN_TRANSACTION.discard(id(conn))
    raise AssertionError("unreachable")


def in_transaction(conn: duckdb.DuckDBPyConnection) -> bool:
    """Whether ``conn`` is inside ``run_transaction``'s body (which commits or rolls back)."""
    return id(conn) in _IN_TRANSACTION


@contextmanager
def cleanup(conn: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """Statements that tidy up after a failure too: inside ``run_transaction``'s body, a DuckDB
    error aborts the transaction, whose rollback undoes everything, so they are skipped there
    (and the first error, not "transaction is aborted", reaches the user)."""
    try:
        yield
    except duckdb.TransactionException as exc:
        if not (in_transaction(conn) and "aborted" in str(exc).lower()):
            raise


def drop_table(conn: duckdb.DuckDBPyConnection, table: str) -> None:
    """``DROP TABLE IF EXISTS table`` (a quoted name), also after a failure (``cleanup``)."""
    with cleanup(conn):
        conn.execute(f"DROP TABLE IF EXISTS {table}")


@contextmanager
def one_transaction(conn: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """Run the block in a transaction of its own, or in ``run_transaction``'s if one is open.

    (A failed BEGIN would abort the open transaction, so open ones are tracked instead.)
    """
    if in_transaction(conn):
        yield
        return
    conn.execute("BEGIN TRANSACTION")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        _rollback(conn)
        raise


def _rollback(conn: duckdb.DuckDBPyConnection) -> None:
    """Roll back the open transaction, if any (a failed COMMIT has already ended it)."""
    try:
        conn.execute("ROLLBACK")
    except duckdb.TransactionException as exc:
        if "no transaction is active" not in str(exc):
            raise


def checkpoint(conn: duckdb.DuckDBPyConnection) -> None:
    """Flush a DuckDB file's committed changes out of memory; nothing on a lake.

    (A lake's commits are already Parquet files; its CHECKPOINT would run the upkeep instead.)
    """
    if not is_lake(conn):
        conn.execute("CHECKPOINT")


# --- upkeep -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StoredFiles:
    """The lake's data and delete files in storage (a local data path) or in its catalog."""

    files: int
    bytes: int
    where: str


def stored_files(conn: duckdb.DuckDBPyConnection, lake: Lake) -> StoredFiles:
    """What the lake holds in storage now: every Parquet file under a local ``data_folder``;
    for an object store, the files its catalog lists (live, or waiting for deletion)."""
    if "://" not in lake.data_folder:
        sizes = [p.stat().st_size for p in Path(lake.data_folder).rglob("*.parquet")]
        return StoredFiles(len(sizes), sum(sizes), "storage")
    metadata = f"{quote('__ducklake_metadata_' + lake.alias)}.{quote(lake.schema or 'main')}"
    files, size = one_row(
        conn,
        f"SELECT count(*), coalesce(sum(file_size_bytes), 0) FROM (SELECT file_size_bytes FROM "
        f"{metadata}.ducklake_data_file UNION ALL SELECT file_size_bytes FROM "
        f"{metadata}.ducklake_delete_file)",
    )
    (waiting,) = one_row(
        conn, f"SELECT count(*) FROM {metadata}.ducklake_files_scheduled_for_deletion"
    )
    return StoredFiles(int(files) + int(waiting), int(size), "catalog")


@dataclass(frozen=True)
class Upkeep:
    before: StoredFiles
    after: StoredFiles
    snapshots_before: int
    snapshots_after: int
    last_snapshot: int


def upkeep(conn: duckdb.DuckDBPyConnection, lake: Lake, retain_days: float) -> Upkeep:
    """Merge adjacent small files, expire snapshots older than ``retain_days``, delete the files
    no snapshot needs any more. The last snapshot stays readable; time travel reaches back
    ``retain_days``."""
    name = sql_literal(lake.alias)
    before = stored_files(conn, lake)
    snapshots_before = _snapshots(conn, lake)
    seconds = max(0.0, retain_days * 86400.0)

    def call(statement: str) -> list[Any]:
        return conn.execute(statement).fetchall()

    for statement in (
        f"CALL ducklake_merge_adjacent_files({name})",
        f"CALL ducklake_expire_snapshots({name}, older_than => now() - "
        f"to_microseconds({int(seconds * 1e6)}))",
        f"CALL ducklake_cleanup_old_files({name}, cleanup_all => true)",
    ):
        run_transaction(conn, lake.alias, functools.partial(call, statement))
    (last,) = one_row(conn, f"SELECT max(snapshot_id) FROM {quote(lake.alias)}.snapshots()")
    return Upkeep(before, stored_files(conn, lake), snapshots_before, _snapshots(conn, lake), last)


def _snapshots(conn: duckdb.DuckDBPyConnection, lake: Lake) -> int:
    return one_row(conn, f"SELECT count(*) FROM {quote(lake.alias)}.snapshots()")[0]
