"""The warehouse's storage: a DuckLake, opened offline from the extension wheels.

A DuckLake keeps its catalog (schemas, tables, snapshots, the list of data files) in a SQL
database and the rows in immutable Parquet files under a data path. Every commit is a snapshot,
marked as a complete refresh or not (``record_build``, ``_mark_refresh``): a reader attaches the
last complete refresh (``reader_statements``), never half a refresh, and never makes a writer
wait; writers of different tables do not block each other. Assets write the lake directly, each
table change in one transaction (``run_transaction``), retried on a conflict with another writer.

The catalog is one of:

* ``sqlite:<file>`` (the default, ``sqlite:data/fieldsales.ducklake.sqlite``): one host, any
  number of processes. The file is kept in SQLite's ``journal_mode=WAL``: in the default rollback
  journal a reader holding a snapshot (``BEGIN TRANSACTION``) made every commit of a refresh fail
  with "database is locked" (measured: 60 of 60 commits failed; in WAL none of 60);
* ``postgres:dbname=… host=… user=…`` (a libpq connection string without the password): several
  machines. The password is read from an environment variable and handed to DuckDB as a
  temporary secret, never put in the connection string (DuckDB's connection errors quote it).

``schema`` puts one tenant's catalog tables in their own schema of the catalog database
(DuckLake's ``METADATA_SCHEMA``), so several tenants share one PostgreSQL database and each sees
its own ``raw``/``core``/``mart``/``meta``; its files go under ``<data_path>/<schema>/``. Which
tenant a lake belongs to is recorded in it on first use (``TENANT_TABLE``), and a different one
is refused, however the catalog is spelled.

The extensions come from the ``duckdb-extension-*`` wheels, built for the DuckDB release
``pyproject.toml`` pins (``INSTALL ducklake`` would need the network): see ``load_extensions``.

A data path on object storage (``s3://bucket/prefix/``) is read and written through ``httpfs``
(from its wheel too), the object store's keys handed to DuckDB as a temporary secret, read from
their variables when a connection is made (``ObjectStore``); a writer lists the data path before
it attaches (``prepare``), so a missing bucket, refused keys or an endpoint out of
reach fail before anything is written.

What DuckLake does not support, and how the project's SQL avoids it: no
``PRIMARY KEY``/``UNIQUE``/indexes (state tables are keyed by a delete-then-insert), no macros
stored in the catalog (every macro is ``TEMP``, per connection), no ``ENUM`` columns.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import importlib.util
import os
import random
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import duckdb
import filelock
import tenacity

from fieldsales_dagster.catalogs import (
    DEFAULT_CATALOG,
    POSTGRES_PREFIX,
    SQLITE_PREFIX,
    check_catalog,
)
from fieldsales_dagster.pause import pause_at
from fieldsales_dagster.urls import endpoint_origin
from fieldsales_dagster.warehouse.quoting import qualified, quote_ident, sql_literal
from fieldsales_dagster.warehouse.rows import one_row

#: The DuckDB release the extension wheels serve; duckdb itself is pinned to the same release.
EXTENSION_VERSION = "v1.5.5"
#: Each extension comes from the wheel ``duckdb-extension-<name>``; ``ducklake`` is loaded from
#: its file, a catalog's scanner installed under the name DuckLake loads it by.
SCANNERS = {"postgres": "postgres_scanner", "sqlite": "sqlite_scanner"}
#: The embedded default's folder of Parquet files, under ``data/`` beside its SQLite catalog.
DEFAULT_DATA_PATH = "data/lake"
CATALOG_VARIABLE = "FIELDSALES_DUCKLAKE_CATALOG"
DATA_PATH_VARIABLE = "FIELDSALES_DUCKLAKE_DATA_PATH"
S3_PREFIX = "s3://"
ENDPOINT_VARIABLE = "FIELDSALES_S3_ENDPOINT"
#: The standard variables of the object store's keys, read when neither of ours is set.
AWS_KEY_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
#: The lake's name in every connection, so ``fieldsales.raw.events`` names one table everywhere.
DEFAULT_ALIAS = "fieldsales"
#: Which tenant the lake belongs to, recorded on first use (``check_tenant``).
TENANT_TABLE = "meta.lake_tenant"
#: Each table write of ``FieldSalesWarehouse.one_commit`` records here the tables it read and the
#: snapshot it read them at (``record_build``).
BUILDS_TABLE = "meta.lake_builds"
#: The commit message of a commit after which every table ``BUILDS_TABLE`` lists was built after
#: the last write of each table it reads (its raw, core and mart tables agree), and of one after
#: which some table is older than a table it reads (``_mark_refresh``). Readers attach the
#: snapshot before the first incomplete commit that follows the last complete one
#: (``reader_statements``).
COMPLETE = "complete refresh"
INCOMPLETE = "incomplete refresh"
#: The DuckDB variable in which the readers' statements keep that snapshot's id.
SNAPSHOT_VARIABLE = "fieldsales_snapshot"
#: How often a commit that lost a conflict with another writer is tried again (after pauses of
#: 0.1-0.5 s times the attempt: about 20 s in all).
CONFLICT_ATTEMPTS = 12

T = TypeVar("T")

#: Connections (by id) inside ``run_transaction``'s body.
_IN_TRANSACTION: set[int] = set()
#: Lakes this process has read its own tenant in (``check_tenant``): read once per process.
_TENANT_READ: set[Lake] = set()


class LakeError(RuntimeError):
    """The lake could not be opened: an extension, the catalog, its password or the data path is
    missing, or the lake belongs to another tenant."""


class LakeConflictError(RuntimeError):
    """A table's transaction kept conflicting with another writer's."""


def default_data_path(catalog: str) -> str:
    """Where a lake's files go when no data path is set: ``lake/`` beside a SQLite catalog
    (``data/lake`` for the default one)."""
    if catalog.startswith(SQLITE_PREFIX):
        return str(Path(catalog.removeprefix(SQLITE_PREFIX)).parent / "lake")
    return DEFAULT_DATA_PATH


@dataclass(frozen=True)
class ObjectStore:
    """Where an ``s3://`` data path is served: the endpoint (an ``https://`` URL, or ``http://``
    on loopback; ``None``: AWS S3), the region (``None``: us-east-1), the URL style (``None``:
    path with an endpoint, else vhost), and the variables holding the keys (never the keys)."""

    endpoint: str | None = None
    region: str | None = None
    url_style: str | None = None
    key_id_env_var: str = "FIELDSALES_S3_ACCESS_KEY_ID"
    secret_env_var: str = "FIELDSALES_S3_SECRET_ACCESS_KEY"

    @classmethod
    def or_aws(
        cls, endpoint: str | None, region: str | None, url_style: str | None, **keys: str
    ) -> ObjectStore:
        """The store as set, the standard ``AWS_ENDPOINT_URL`` (checked as the setting is) and
        ``AWS_REGION`` standing in for an endpoint and a region not set; ``keys``: their
        variables."""
        aws = os.environ.get("AWS_ENDPOINT_URL", "").strip()
        endpoint = endpoint or (endpoint_origin(aws, "AWS_ENDPOINT_URL") if aws else None)
        region = region or os.environ.get("AWS_REGION", "").strip() or None
        return cls(endpoint, region, url_style, **keys)

    def key_variables(self) -> tuple[str, ...]:
        """The variables the keys are read from: ours if either is set, else the AWS ones."""
        ours = (self.key_id_env_var, self.secret_env_var)
        return ours if any(os.environ.get(variable) for variable in ours) else AWS_KEY_VARIABLES

    def secret_sql(self, keys: tuple[str, ...] = ()) -> str:
        """The statement that hands DuckDB the keys (``keys``, else those in their variables),
        as the default secret of every ``s3://`` path of the connection (``duckdb_secrets()``
        shows it redacted)."""
        keys = keys or tuple(os.environ.get(variable) or "" for variable in self.key_variables())
        named = zip(("KEY_ID", "SECRET", "SESSION_TOKEN"), keys, strict=False)
        options = {"TYPE": "s3"} | {option: sql_literal(value) for option, value in named if value}
        options["REGION"] = sql_literal(self.region or "us-east-1")  # DuckDB's is '' here
        if self.endpoint:
            url = urlsplit(self.endpoint)
            options["ENDPOINT"] = sql_literal(url.netloc)
            options["USE_SSL"] = str(url.scheme == "https").lower()
        if self.url_style or self.endpoint:
            options["URL_STYLE"] = sql_literal(self.url_style or "path")
        listed = ", ".join(f"{option} {value}" for option, value in options.items())
        return f"CREATE OR REPLACE TEMPORARY SECRET ({listed})"


@dataclass(frozen=True)
class Lake:
    """Where a DuckLake lives: its catalog database, its data path, and the tenant's schema.

    ``data_path_is_default``: the data path is the default folder, created when the lake is new;
    a data path the user set must exist (``prepare``). ``tenant``: who the lake belongs to,
    recorded in it on first use (``check_tenant``); ``None`` checks nothing.
    """

    catalog: str = DEFAULT_CATALOG
    data_path: str = DEFAULT_DATA_PATH
    schema: str | None = None
    password_env_var: str = "FIELDSALES_DUCKLAKE_PASSWORD"
    alias: str = DEFAULT_ALIAS
    data_path_is_default: bool = True
    tenant: str | None = None
    store: ObjectStore = field(default_factory=ObjectStore)
    #: What errors call the shipped variables (a tenant's own: the warehouse's ``variables``).
    variables: Mapping[str, str] = field(default_factory=dict, compare=False)

    def named(self, variable: str) -> str:
        return self.variables.get(variable, variable)

    @property
    def is_postgres(self) -> bool:
        return self.catalog.startswith(POSTGRES_PREFIX)

    @property
    def catalog_file(self) -> Path | None:
        """The SQLite catalog's file; ``None`` for PostgreSQL."""
        sqlite = self.catalog.startswith(SQLITE_PREFIX)
        return Path(self.catalog.removeprefix(SQLITE_PREFIX)) if sqlite else None

    @property
    def is_local(self) -> bool:
        """Whether the data files are in a local folder (not object storage)."""
        return "://" not in self.data_path

    @property
    def is_s3(self) -> bool:
        return self.data_path.startswith(S3_PREFIX)

    @property
    def data_folder(self) -> str:
        """The tenant's data files: ``data_path``, or ``<data_path>/<schema>`` for a tenant; a
        local folder as an absolute path (DuckLake compares file paths as text: the upkeep's
        orphan search must see the same spelling the catalog lists)."""
        base = str(Path(self.data_path).absolute()) if self.is_local else self.data_path
        return f"{base.rstrip('/')}/{self.schema}" if self.schema else base

    @property
    def key(self) -> str:
        """A short name of this tenant's lake, for local folders (spools) that must not mix."""
        return hashlib.sha256(f"{self.catalog}\0{self.schema or ''}".encode()).hexdigest()[:16]

    def attach_sql(self, read_only: bool = False, snapshot: str | None = None) -> str:
        """The ATTACH statement (no password in it: see ``connect``); ``snapshot``: an expression
        of the snapshot id to attach (read-only) instead of the latest."""
        # The setting is where the files are: a lake whose folder moved (the project folder
        # copied, a volume mounted elsewhere) opens from there. (A missing one fails first.)
        options = [f"DATA_PATH {sql_literal(self.data_folder)}", "OVERRIDE_DATA_PATH true"]
        options += [f"METADATA_SCHEMA {sql_literal(self.schema)}"] if self.schema else []
        options += ["READ_ONLY"] if read_only else []
        options += [f"SNAPSHOT_VERSION {snapshot}"] if snapshot else []
        return (
            f"ATTACH {sql_literal('ducklake:' + self.catalog)} AS {quote_ident(self.alias)} "
            f"({', '.join(options)})"
        )


def extension_directory() -> Path:
    """Where ``postgres_scanner``/``sqlite_scanner`` are installed: a per-user cache folder."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "fieldsales_dagster" / "duckdb_extensions"


def extension_file(name: str) -> Path:
    """The binary the wheel of extension ``name`` carries for ``EXTENSION_VERSION``."""
    spec = importlib.util.find_spec(f"duckdb_extension_{name}")
    folder = next(iter(spec.submodule_search_locations or []), "") if spec else ""
    path = Path(folder, "extensions", EXTENSION_VERSION, f"{name}.duckdb_extension")
    if not folder or not path.is_file():
        raise LakeError(
            f"The lake needs the DuckDB extension {name!r} from the package duckdb-extension-"
            f"{name}=={EXTENSION_VERSION[1:]}, a dependency: pip install the project again."
        )
    return path


#: What ``duckdb.connect(config=...)`` takes.
DuckDBConfig = dict[str, str | bool | int | float | list[str]]


def lake_config() -> DuckDBConfig:
    """Connection settings of a lake connection: no download of extensions, ever; and no
    insertion order kept, which the lake's row groups by size (``LAKE_OPTIONS``) need to write.

    DuckDB still checks each extension file's signature on ``LOAD``: hashing the ~78 MB of the
    two files costs about 0.65 s of a process's first connection (0.01 s unsigned, measured), but
    a file swapped under the wheels' folder is then refused instead of run with the lake's access.
    The refresh runs its steps in one process, so a run pays it once.

    DuckDB's allocator returns what its queries freed to the system from a thread of its own
    (``allocator_background_threads``), not only at a later allocation: between a run's steps
    its process held up to ~70 MiB of such pages (1M demo transactions: the run's peak RSS 633 ->
    620 MiB, the same CPU; docs/performance.md).

    An internal error in a transaction (a lone surrogate reaching DuckDB's string code) would
    invalidate the instance, and closing any of its connections then aborted the process before
    the step's failure was recorded: a run left STARTED, its step with no error. The instance
    holds nothing of the lake's but what its transactions commit, and a failed one is rolled
    back (``run_transaction``, or closing the connection), so the instance stays in use
    (``disable_database_invalidation``) and the error reaches the step."""
    return {
        "extension_directory": str(extension_directory()),
        "autoinstall_known_extensions": False,
        "autoload_known_extensions": False,
        "preserve_insertion_order": False,
        "allocator_background_threads": True,
        "disable_database_invalidation": True,
    }


def load_extensions(conn: duckdb.DuckDBPyConnection, lake: Lake) -> None:
    """Load ``ducklake`` from its wheel's file, and the catalog's scanner, installed once per user
    into ``extension_directory`` under the name DuckLake loads it by (``SCANNERS``)."""
    conn.execute(f"LOAD {sql_literal(str(extension_file('ducklake')))}")
    scanner = "postgres" if lake.is_postgres else "sqlite"
    try:  # (asking first, duckdb_extensions(), reads every installed file: ~0.7 s a process)
        conn.execute(f"LOAD {SCANNERS[scanner]}")
    except duckdb.IOException:  # not installed for this user yet
        directory = extension_directory()
        directory.mkdir(parents=True, exist_ok=True)
        # Two processes installing at once would write the same file.
        with filelock.FileLock(str(directory / ".install.lock"), timeout=120):
            conn.execute(f"INSTALL {sql_literal(str(extension_file(scanner)))}")
        conn.execute(f"LOAD {SCANNERS[scanner]}")
    if lake.is_s3:
        conn.execute(f"LOAD {sql_literal(str(extension_file('httpfs')))}")


def connect(
    lake: Lake, config: DuckDBConfig | None = None, read_only: bool = False
) -> duckdb.DuckDBPyConnection:
    """A new DuckDB instance's connection whose current database is the lake (``USE <alias>``)."""
    if read_only and lake.catalog_file is not None and not lake.catalog_file.exists():
        raise LakeError(
            f"There is no lake at {lake.catalog_file} ({lake.named(CATALOG_VARIABLE)}) yet: run a "
            "refresh first (make demo, or the refresh_all job)."
        )
    conn = _instance(lake, config)
    try:
        if not read_only:
            prepare(lake, conn)
        try:
            _attach(conn, lake, read_only)
        except duckdb.Error as exc:
            password = f" and the password in {lake.password_env_var}" if lake.is_postgres else ""
            raise LakeError(
                f"Could not open the DuckLake with catalog {lake.catalog!r} and data path "
                f"{lake.data_folder!r}: check {lake.named(CATALOG_VARIABLE)}, "
                f"{lake.named(DATA_PATH_VARIABLE)}{password}. DuckDB: {exc}"
            ) from exc
        conn.execute(f"USE {quote_ident(lake.alias)}")
        if not read_only:
            check_writable(conn, lake)
            set_options(conn, lake)
            check_tenant(conn, lake)
    except BaseException:
        conn.close()
        raise
    return conn


def _store_failure(lake: Lake, exc: duckdb.Error) -> LakeError:
    """Why listing the ``s3://`` data path failed (``prepare``), and what to set."""
    variable = lake.named(DATA_PATH_VARIABLE)
    if _says(exc, "nosuchbucket", "http 404"):
        why, remedy = "its bucket does not exist", f"create it, or set {variable} to another"
    elif _says(exc, "http 403", "http 401"):
        key_id, secret = lake.store.key_variables()[:2]
        why = f"the object store refused the keys in {key_id} and {secret}"
        remedy = (
            f"set {lake.store.key_id_env_var} and {lake.store.secret_env_var} to keys that may "
            "list, read and write it"
        )
    else:
        why = f"the object store at {lake.store.endpoint or 'AWS S3'} could not be reached"
        remedy = f"check {lake.named(ENDPOINT_VARIABLE)} (or AWS_ENDPOINT_URL) and the server"
    first_line = str(exc).partition("\n")[0]
    return LakeError(
        f"The lake's data path {lake.data_folder} ({variable}) cannot be used: {why}, so nothing "
        f"was written; {remedy} (DuckDB: {first_line})."
    )


def _instance(lake: Lake, config: DuckDBConfig | None = None) -> duckdb.DuckDBPyConnection:
    """A new DuckDB instance with the extensions loaded and, for PostgreSQL, the password (a
    failure here leaves nothing open: its catalog is not attached yet)."""
    conn = duckdb.connect(config={**(config or {}), **lake_config()})
    # DuckDB draws its progress bar on standard output, where a script's $(python -c ...) would
    # take it for the value printed (a connection's setting, not a global one).
    conn.execute("SET enable_progress_bar = false")
    load_extensions(conn, lake)
    if lake.is_s3:
        try:  # DuckDB's error would quote the statement, keys and all
            conn.execute(lake.store.secret_sql())
        except duckdb.Error:
            variables = ", ".join(lake.store.key_variables())
            raise LakeError(f"DuckDB refused the object store's keys in {variables}.") from None
    if lake.is_postgres and (password := os.environ.get(lake.password_env_var)):
        # The unnamed secret is the postgres extension's default for every connection string
        # without a password; duckdb_secrets() shows it redacted.
        conn.execute(
            f"CREATE OR REPLACE TEMPORARY SECRET (TYPE postgres, PASSWORD {sql_literal(password)})"
        )
    return conn


@functools.cache
def postgres_identity(lake: Lake) -> tuple[str, str]:
    """The PostgreSQL cluster (``pg_control_system()``'s system identifier) and database that
    ``lake``'s catalog connects to, however spelled (a host name or its address, the keys in
    another order); asked once per process and lake. A ``LakeError`` if it cannot be asked."""
    query = "SELECT system_identifier::text, current_database() FROM pg_control_system()"
    try:
        with contextlib.closing(_instance(lake)) as conn:
            dsn = sql_literal(lake.catalog.removeprefix(POSTGRES_PREFIX))
            conn.execute(f"ATTACH {dsn} AS catalog (TYPE postgres, READ_ONLY)")
            system, database = one_row(
                conn, f"SELECT * FROM postgres_query('catalog', {sql_literal(query)})"
            )
    except duckdb.Error as exc:
        raise LakeError(
            f"Could not ask the PostgreSQL catalog {lake.catalog!r} ({CATALOG_VARIABLE}) which "
            f"database it is. DuckDB: {exc}"
        ) from exc
    return str(system), str(database)


def check_writable(conn: duckdb.DuckDBPyConnection, lake: Lake) -> None:
    """Refuse, before a run's first request, a PostgreSQL catalog this connection can only read
    (a read-only role, a standby); a SQLite catalog's file is checked before it is opened
    (``FieldSalesWarehouse.preflight``)."""
    if not lake.is_postgres:
        return
    table = sql_literal(f"{quote_ident(lake.schema or 'public')}.ducklake_snapshot")
    query = f"SELECT NOT pg_is_in_recovery() AND has_table_privilege({table}, 'INSERT')"
    metadata = sql_literal(f"__ducklake_metadata_{lake.alias}")
    (writable,) = one_row(conn, f"SELECT * FROM postgres_query({metadata}, {sql_literal(query)})")
    if not writable:
        raise LakeError(
            f"The lake's PostgreSQL catalog {lake.catalog!r} ({CATALOG_VARIABLE}) can only be read "
            "by its user here (a read-only role, a standby), so nothing was fetched: grant it "
            f"INSERT, UPDATE and DELETE on schema {lake.schema or 'public'}'s tables, or point "
            f"{CATALOG_VARIABLE} at the primary server."
        )


def _attach(conn: duckdb.DuckDBPyConnection, lake: Lake, read_only: bool) -> None:
    """ATTACH the lake (a reader: at its last complete refresh, ``reader_statements``), again
    after a pause while another process is creating the same new lake (its catalog tables half
    made: "database is locked", "already exists")."""
    racing = ("database is locked", "already exists")
    retrying = _retrying(lambda exc: isinstance(exc, duckdb.Error) and _says(exc, *racing))
    for statement in reader_statements(lake) if read_only else [lake.attach_sql()]:
        retrying(conn.execute, statement)


def reader_statements(lake: Lake) -> list[str]:
    """The statements that attach ``lake`` read-only at its last complete refresh, found
    through an attach of the latest snapshot: the latest snapshot, unless a commit since the last
    ``COMPLETE`` one was ``INCOMPLETE`` (a refresh under way, failed, or of raw tables alone);
    then the snapshot before the first such commit.

    A reader so opened reads that moment whatever it does (with or without a transaction): the
    raw, core and mart tables of one refresh, never a refresh half done. A new connection reads
    the refresh completed since."""
    latest = replace(lake, alias=f"{lake.alias}_latest")
    return [
        latest.attach_sql(read_only=True),
        f"SET VARIABLE {SNAPSHOT_VARIABLE} = ({last_complete_snapshot(latest.alias)})",
        f"DETACH {quote_ident(latest.alias)}",
        lake.attach_sql(read_only=True, snapshot=f"getvariable({sql_literal(SNAPSHOT_VARIABLE)})"),
    ]


def last_complete_snapshot(alias: str) -> str:
    """The query of the snapshot id readers attach in the lake ``alias`` (``reader_statements``):
    the one before the first ``INCOMPLETE`` commit after the last ``COMPLETE`` one, else the
    latest."""
    return (
        f"WITH s AS (SELECT snapshot_id AS id, commit_message AS said FROM "
        f"{quote_ident(alias)}.snapshots()), "
        f"broken AS (SELECT min(id) AS id FROM s WHERE said = {sql_literal(INCOMPLETE)} AND "
        f"id > (SELECT coalesce(max(id), -1) FROM s WHERE said = {sql_literal(COMPLETE)})) "
        "SELECT coalesce(max(id) FILTER (id < (SELECT id FROM broken)), max(id)) FROM s"
    )


def _says(exc: BaseException, *texts: str) -> bool:
    """Whether ``exc``'s message holds one of ``texts`` (lower case)."""
    message = str(exc).lower()
    return any(text in message for text in texts)


def prepare(lake: Lake, conn: duckdb.DuckDBPyConnection | None = None) -> None:
    """The one check of where a writer's lake lives, before it attaches, and so before anything
    is written; then the SQLite catalog is put in WAL mode. Each failure names the variable.

    An ``s3://`` data path is listed with ``conn`` (one request, for a name no file has): a
    missing bucket, keys the store refuses or an endpoint out of reach fail here. The default
    data folder is created for a new lake. A data path the user set, or the default one of a
    lake that already has a catalog, must exist: an unmounted volume re-created empty would get
    snapshots whose files live under the bare mount point, unreadable once the volume is back.
    (Whether this user may write there, and the temporary folder, is the load's preflight:
    ``FieldSalesWarehouse.preflight``.)
    """
    catalog, folder = lake.catalog_file, Path(lake.data_path)
    if lake.is_s3 and conn is not None:
        probe = sql_literal(f"{lake.data_folder.rstrip('/')}/.fieldsales-preflight*")
        try:
            conn.execute(f"SELECT count(*) FROM glob({probe})").fetchall()
        except duckdb.Error as exc:
            raise _store_failure(lake, exc) from None
    elif lake.is_local and not folder.is_dir():
        if not lake.data_path_is_default or (catalog is not None and catalog.exists()):
            why = (
                f"the lake's catalog {catalog} lists its files there"
                if lake.data_path_is_default
                else "an unmounted volume or a mistyped path"
            )
            variable = lake.named(DATA_PATH_VARIABLE)
            raise LakeError(
                f"The lake's data path {folder} ({variable}) does not exist ({why}), so nothing "
                f"was written: mount or restore it (mkdir -p a new one), or set {variable} to "
                "the right folder."
            )
        folder.mkdir(parents=True, exist_ok=True)
    if catalog is not None:
        catalog.parent.mkdir(parents=True, exist_ok=True)
        use_wal(catalog, lake.named(CATALOG_VARIABLE))


#: Catalogs this process has put in WAL mode. The mode is stored in the file, so each is opened
#: once: opening and closing the catalog file again would release every POSIX lock this process
#: holds on it, those of DuckDB's SQLite connections too (SQLite's "how to corrupt", 2.2), and
#: another process's checkpoint could then pull the WAL from under them ("disk I/O error").
_WAL_CATALOGS: set[str] = set()


def use_wal(path: Path, variable: str = CATALOG_VARIABLE) -> None:
    """Put the SQLite catalog ``path`` in ``journal_mode=WAL`` (creating it if new), once per
    process: a reader holding a snapshot then never makes a refresh's commit fail (see the module
    docstring). On a catalog already in WAL mode the pragma writes nothing."""
    key = str(path.resolve())
    if key in _WAL_CATALOGS:
        return
    with contextlib.closing(sqlite3.connect(path, timeout=60)) as db:
        (mode,) = db.execute("PRAGMA journal_mode=WAL").fetchone()
    if str(mode).lower() != "wal":
        raise LakeError(
            f"Could not put the lake's SQLite catalog {path} ({variable}) in journal_mode=WAL "
            f"(SQLite says {mode!r}): keep it on a local disk, or use a PostgreSQL catalog."
        )
    _WAL_CATALOGS.add(key)


def check_tenant(conn: duckdb.DuckDBPyConnection, lake: Lake, record: bool = False) -> None:
    """Refuse a lake recorded for another tenant, before anything is written; with ``record``
    (inside a write's transaction), record ``lake.tenant`` in a lake that records none yet.

    Two spellings of one PostgreSQL catalog (a host name or its address, another key order)
    are one lake: comparing what is recorded in it, not the settings' text, tells them apart.
    The record is written with the lake's first commit (``FieldSalesWarehouse.one_commit``),
    after the server answered: a run against a mistyped URL leaves no record that blocks the next.
    """
    if lake.tenant is None or lake in _TENANT_READ:
        return
    recorded = recorded_tenant(conn)
    if recorded == lake.tenant:
        _TENANT_READ.add(lake)  # a record changes only by move_tenant: one read per process
    elif recorded is None and record:
        _write_tenant(conn, lake.tenant)
    elif recorded not in (None, lake.tenant):
        raise LakeError(
            f"The lake with catalog {lake.catalog!r} (schema {lake.schema or 'main'}) belongs to "
            f"{recorded!r}, not to {lake.tenant!r}, so nothing was written: give this instance a "
            f"lake of its own ({lake.named(CATALOG_VARIABLE)}, or its own ducklake_schema), or "
            f"empty {TENANT_TABLE} if the lake really moved here (docs/storage.md)."
        )


def recorded_tenant(conn: duckdb.DuckDBPyConnection) -> str | None:
    """The tenant the lake on ``conn`` (its current database) records, if any."""
    try:  # one query: a missing table is no record (and leaves an open transaction whole)
        row = conn.execute(f"SELECT tenant FROM {TENANT_TABLE}").fetchone()
    except duckdb.CatalogException:
        return None
    return None if row is None else str(row[0])


def table_exists(conn: duckdb.DuckDBPyConnection, table: str) -> bool:
    """Whether ``schema.table`` exists in the connection's current database: a query reading
    none of it binds. (Listing a lake's tables, ``duckdb_tables()``, costs several milliseconds
    more; an unknown name does not abort an open transaction.)"""
    try:
        conn.execute(f"SELECT 1 FROM {qualified(table)} LIMIT 0")
    except duckdb.CatalogException:
        return False
    return True


def _write_tenant(conn: duckdb.DuckDBPyConnection, tenant: str) -> None:
    conn.execute(
        f"CREATE SCHEMA IF NOT EXISTS meta; CREATE TABLE IF NOT EXISTS {TENANT_TABLE} "
        f"(tenant VARCHAR, since TIMESTAMPTZ); DELETE FROM {TENANT_TABLE}"
    )
    conn.execute(f"INSERT INTO {TENANT_TABLE} VALUES (?, now())", [tenant])


def move_tenant(lake: Lake) -> str | None:
    """The documented step for a lake whose instance moved (a new URL, the demo API's new port):
    record ``lake.tenant`` in place of the tenant the lake belonged to. Returns that tenant
    (``None``: the lake records none yet, and the first write will record ``lake.tenant``)."""
    tenant = lake.tenant
    if tenant is None:
        return None
    with contextlib.closing(connect(replace(lake, tenant=None))) as conn:

        def move() -> str | None:
            recorded = recorded_tenant(conn)
            if recorded not in (None, tenant):
                _write_tenant(conn, tenant)
            return recorded

        moved_from = run_transaction(conn, TENANT_TABLE, move)
    _TENANT_READ.clear()  # this process reads the record again
    return moved_from


#: Options of the lake, stored in its catalog: name -> (value set, value as the catalog stores
#: it). zstd suits the raw tables' ~5 KB JSON documents; Parquet row groups of about 8 MB,
#: since by rows (122,880 by default) one row group of payloads is held in memory whole: a raw
#: load's 100 MB spool of 20,000 transactions ran out of the default memory_limit (192MB). A
#: reader decompresses a row group's payloads (one page) into a buffer of the next power of two:
#: at 16MB the writer's ~17 MB groups took a 32 MiB buffer, and scanning the heavy tenant's
#: raw.transactions ran out of 64MB (test_core_memory.py); ~8.5 MB groups take 16 MiB. A
#: writer must then run with ``preserve_insertion_order=false`` (DuckDB says so otherwise).
LAKE_OPTIONS = {
    "parquet_compression": ("zstd", "zstd"),
    "parquet_row_group_size_bytes": ("8MB", "8000000"),
}


def set_options(conn: duckdb.DuckDBPyConnection, lake: Lake) -> None:
    """Set ``LAKE_OPTIONS`` once per lake: read first (one query), and only a lake that lacks
    one takes the transaction (each change is a commit of the catalog; ~0.3 s a connection)."""
    alias = quote_ident(lake.alias)
    stored = dict(conn.execute(f"SELECT option_name, value FROM {alias}.options()").fetchall())
    missing = [(n, value) for n, (value, kept) in LAKE_OPTIONS.items() if stored.get(n) != kept]

    def write() -> None:
        for name, value in missing:
            conn.execute(f"CALL {alias}.set_option({sql_literal(name)}, {sql_literal(value)})")

    if missing:
        run_transaction(conn, lake.alias, write)


#: One DuckDB instance per process and lake, with the extensions loaded and the lake attached:
#: loading the DuckLake extension and attaching the catalog take about a second, and an asset
#: opens a connection or two. Connections are its cursors (each its own transaction context and
#: its own TEMP objects).
_INSTANCES: dict[tuple[object, ...], duckdb.DuckDBPyConnection] = {}
_INSTANCES_LOCK = threading.Lock()


def writer_connection(lake: Lake, config: DuckDBConfig) -> duckdb.DuckDBPyConnection:
    """A new read-write connection to ``lake`` (``USE <alias>``), from this process's instance.

    ``prepare`` runs each time (a few file checks): a data path that vanished since the instance
    was made (an unmounted volume) fails here, before the write."""
    key = (os.getpid(), lake, tuple(sorted((k, str(v)) for k, v in config.items())))
    with _INSTANCES_LOCK:
        if (instance := _INSTANCES.get(key)) is None:
            instance = _INSTANCES[key] = connect(lake, config)  # which prepares it
        else:
            prepare(lake)
        cursor = instance.cursor()
    cursor.execute(f"USE {quote_ident(lake.alias)}")  # a cursor starts in the default database
    return cursor


def is_conflict(exc: BaseException) -> bool:
    """A commit that lost to another writer's: a DuckLake "Transaction conflict", or a SQLite
    catalog's "database is locked" (SQLite lets one process commit at a time)."""
    return isinstance(exc, duckdb.Error) and _says(exc, "conflict", "database is locked")


def _retrying(retryable: Callable[[BaseException], bool]) -> tenacity.Retrying:
    """Up to ``CONFLICT_ATTEMPTS`` tries while ``retryable`` says so, after pauses of 0.1-0.5 s
    times the attempt; then the last error is raised."""
    return tenacity.Retrying(
        retry=tenacity.retry_if_exception(retryable),
        stop=tenacity.stop_after_attempt(CONFLICT_ATTEMPTS),
        wait=lambda state: random.uniform(0.1, 0.5) * state.attempt_number,
        reraise=True,
    )


def run_transaction(conn: duckdb.DuckDBPyConnection, table: str, body: Callable[[], T]) -> T:
    """Run ``body`` in one transaction; commit, or roll back and re-raise.

    A commit that conflicts with another writer's runs ``body`` again in a new transaction, up to
    ``CONFLICT_ATTEMPTS`` times in all, after a short random pause; then it fails naming
    ``table``. ``body`` must therefore be safe to run again: it reads and writes the database, or
    (an asset's whole write on a lake) fetches again what it stores.

    Called inside another ``run_transaction``'s body, it runs ``body`` in that transaction: the
    outer one commits, or retries, everything together (one lake snapshot per asset write). (A
    failed BEGIN would abort the open transaction, so open ones are tracked instead.)
    """
    if id(conn) in _IN_TRANSACTION:
        return body()
    try:
        return _retrying(is_conflict)(_transaction, conn, body)
    except duckdb.Error as exc:
        if not is_conflict(exc):
            raise
        raise LakeConflictError(
            f"Writing {table} conflicted with another writer {CONFLICT_ATTEMPTS} times, so it "
            f"was given up and {table} left as it was: keep one writer per table (the asset's "
            f"pool does) and run again. DuckDB: {exc}"
        ) from exc


def _transaction(conn: duckdb.DuckDBPyConnection, body: Callable[[], T]) -> T:
    conn.execute("BEGIN TRANSACTION")
    _IN_TRANSACTION.add(id(conn))
    try:
        result = body()
        _mark_refresh(conn)
        conn.execute("COMMIT")
        return result
    except BaseException:
        try:
            conn.execute("ROLLBACK")
        except duckdb.TransactionException as exc:  # a failed COMMIT has ended it already
            if "no transaction is active" not in str(exc):
                raise
        raise
    finally:
        _IN_TRANSACTION.discard(id(conn))


def record_build(conn: duckdb.DuckDBPyConnection, lake: Lake, table: str, reads: list[str]) -> None:
    """Record, in the transaction writing ``table``, that it read the tables ``reads`` at the
    transaction's snapshot (``BUILDS_TABLE``)."""
    conn.execute(
        f"CREATE SCHEMA IF NOT EXISTS meta; CREATE TABLE IF NOT EXISTS {BUILDS_TABLE} "
        "(table_name VARCHAR, reads VARCHAR[], read_snapshot BIGINT)"
    )
    conn.execute(
        f"INSERT INTO {BUILDS_TABLE} SELECT ?, ?, id FROM "
        f"{quote_ident(lake.alias)}.current_snapshot()",
        [table, reads],
    )


#: How many tables of ``BUILDS_TABLE`` read a table that was written again since; a table no
#: longer in the lake (a table the project stopped building, dropped) is not judged.
_STALE = f"""
    WITH last AS (
        SELECT table_name, arg_max(reads, read_snapshot) AS reads, max(read_snapshot) AS read
        FROM {BUILDS_TABLE} GROUP BY table_name)
    SELECT count(*) FROM (SELECT table_name, read, unnest(reads) AS input FROM last) AS built
    JOIN last AS input ON input.table_name = built.input WHERE input.read >= built.read
    AND built.table_name IN (SELECT schema_name || '.' || table_name FROM duckdb_tables()
        WHERE database_name = current_database())
"""


def _mark_refresh(conn: duckdb.DuckDBPyConnection) -> None:
    """On a lake, give the commit the message ``COMPLETE`` when no table ``BUILDS_TABLE`` lists
    is older than a table it reads (its raw, core and mart tables agree), else ``INCOMPLETE``.

    A table is judged by the snapshot its writer read: a refresh's steps write one after the
    other (and refresh runs never overlap), so a table read after its inputs' last commit. A lake
    whose first refresh is under way is complete with the tables built so far."""
    found = conn.execute(
        "SELECT database_name FROM duckdb_databases() "
        "WHERE database_name = current_database() AND type = 'ducklake'"
    ).fetchone()
    if found is None:
        return
    try:
        (stale,) = one_row(conn, _STALE)
    except duckdb.CatalogException:  # no table write recorded yet
        stale = 0
    message = f"'fieldsales', {sql_literal(INCOMPLETE if stale else COMPLETE)}"
    conn.execute(f"CALL {quote_ident(found[0])}.set_commit_message({message})")


@contextmanager
def cleanup(conn: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """Statements that tidy up after a failure too: inside ``run_transaction``'s body, a DuckDB
    error aborts the transaction, whose rollback undoes everything, so they are skipped there
    (and the first error, not "transaction is aborted", reaches the user)."""
    try:
        yield
    except duckdb.TransactionException as exc:
        if not (id(conn) in _IN_TRANSACTION and "aborted" in str(exc).lower()):
            raise


def drop_table(conn: duckdb.DuckDBPyConnection, table: str) -> None:
    """``DROP TABLE IF EXISTS table`` (a quoted name), also after a failure (``cleanup``)."""
    with cleanup(conn):
        conn.execute(f"DROP TABLE IF EXISTS {table}")


# --- upkeep -------------------------------------------------------------------------------------


def stored_files(conn: duckdb.DuckDBPyConnection, lake: Lake) -> tuple[int, int, str]:
    """Files, bytes, and where they were counted: every Parquet file under a local
    ``data_folder`` ("storage"); for an object store, the data and delete files its catalog
    lists, live or waiting for deletion ("catalog")."""
    if lake.is_local:
        sizes = [p.stat().st_size for p in Path(lake.data_folder).rglob("*.parquet")]
        return len(sizes), sum(sizes), "storage"
    schema = lake.schema or ("public" if lake.is_postgres else "main")
    metadata = f"{quote_ident('__ducklake_metadata_' + lake.alias)}.{quote_ident(schema)}"
    files, size = one_row(
        conn,
        f"SELECT count(*) + (SELECT count(*) FROM {metadata}.ducklake_files_scheduled_for_"
        f"deletion), coalesce(sum(file_size_bytes), 0) FROM (SELECT file_size_bytes FROM "
        f"{metadata}.ducklake_data_file UNION ALL SELECT file_size_bytes FROM "
        f"{metadata}.ducklake_delete_file)",
    )
    return int(files), int(size), "catalog"


#: A file under the data path that no snapshot lists (a killed run's) is deleted once it is older
#: than this: a live write's files are younger, since a run commits within minutes of writing.
ORPHAN_SAFETY_HOURS = 24.0


def upkeep(
    conn: duckdb.DuckDBPyConnection,
    lake: Lake,
    retain_days: float,
    orphan_age_hours: float = ORPHAN_SAFETY_HOURS,
) -> dict[str, Any]:
    """Merge adjacent small files, expire snapshots older than ``retain_days``, delete the files
    no snapshot needs any more, and the files no snapshot ever listed (``orphan_age_hours`` old
    at least). The last snapshot stays readable, and so does the one readers attach (the last
    complete refresh, however old); time travel reaches back ``retain_days``. Returns the counts
    before and after, as the upkeep asset's metadata."""
    name, snapshots = sql_literal(lake.alias), f"{quote_ident(lake.alias)}.snapshots()"
    files_before, bytes_before, counted_in = stored_files(conn, lake)
    (snapshots_before,) = one_row(conn, f"SELECT count(*) FROM {snapshots}")
    retain_us = int(max(0.0, retain_days) * 86400e6)
    orphan_us = int(max(0.0, orphan_age_hours) * 3600e6)

    def run(statement: str) -> list[Any]:
        return run_transaction(conn, lake.alias, lambda: conn.execute(statement).fetchall())

    def expire() -> None:
        # By id: older_than as a timestamp literal (the readers' snapshot's time) expired every
        # snapshot of a SQLite catalog (measured).
        (old,) = one_row(
            conn,
            f"SELECT list(snapshot_id) FROM {snapshots} WHERE snapshot_time < now() - "
            f"to_microseconds({retain_us}) AND snapshot_id <> "
            f"({last_complete_snapshot(lake.alias)}) AND snapshot_id < "
            f"(SELECT max(snapshot_id) FROM {snapshots})",
        )
        if old:
            conn.execute(f"CALL ducklake_expire_snapshots({name}, versions => {old})")

    run(f"CALL ducklake_merge_adjacent_files({name})")
    run_transaction(conn, lake.alias, expire)
    run(f"CALL ducklake_cleanup_old_files({name}, cleanup_all => true)")
    orphans = run(
        f"CALL ducklake_delete_orphaned_files({name}, older_than => now() - "
        f"to_microseconds({orphan_us}))"
    )
    snapshots_after, last = one_row(conn, f"SELECT count(*), max(snapshot_id) FROM {snapshots}")
    files_after, bytes_after, _ = stored_files(conn, lake)
    return {
        "files_before": files_before,
        "files_after": files_after,
        "bytes_before": bytes_before,
        "bytes_after": bytes_after,
        "counted_in": counted_in,
        "snapshots_before": snapshots_before,
        "snapshots_after": snapshots_after,
        "last_snapshot": last,
        "orphans_deleted": len(orphans),
    }


# --- the single-file export ---------------------------------------------------------------------

#: The table that marks a DuckDB file as this project's export: the export replaces a file only
#: if it carries it, so another DuckDB file is never overwritten.
EXPORT_MARKER = "meta.fieldsales_export"
#: A temporary export beside its target: ``.<name>.export-<hex>``.
EXPORT_INFIX = ".export-"
#: The storage format of the export, readable by every DuckDB client from 1.2 on; v1.2.0 also
#: compresses the raw JSON payloads with ZSTD (v1.0.0 stores them uncompressed, ~6x larger).
EXPORT_STORAGE_VERSION = "v1.2.0"
EXPORT_VARIABLE = "FIELDSALES_DUCKDB_PATH"


class ExportError(RuntimeError):
    """The single-file export failed; the lake and the previous export are left as they were."""


def check_export_target(target: Path, lake: Lake) -> None:
    """Fail, naming ``target``, unless the export may replace it: it does not exist, or it is a
    previous export that no process holds read-write."""
    if not target.exists():
        return
    variable = lake.named(EXPORT_VARIABLE)
    # Readers of a file replaced under a program that writes it would fail replaying its log.
    if Path(f"{target}.wal").exists():
        raise ExportError(
            f"Cannot replace the export {target}: its .wal exists, so a program has it open "
            "read-write (or crashed writing it). Close that program (open the export read-only), "
            "delete the .wal if none has it open, and run again."
        )
    try:
        marked = is_export(target)
    except duckdb.Error as exc:
        if "lock" in str(exc).lower():
            raise ExportError(
                f"Cannot replace the export {target}: another process holds it read-write. Open "
                f"it read-only (duckdb -readonly) there, or close that process. DuckDB: {exc}"
            ) from exc
        raise ExportError(
            f"Cannot replace {target} ({variable}): it is not a DuckDB file this project can "
            f"read. Move it away, or set {variable} to another path. DuckDB: {exc}"
        ) from exc
    if not marked:
        raise ExportError(
            f"{target} ({variable}) is a DuckDB file that is not an export of this project (it "
            f"has no table {EXPORT_MARKER}), so the export does not replace it; nothing of it was "
            f"changed. Set {variable} to another path for the export (a new file), or unset "
            "it to write no export."
        )


#: What to do about a failed export, by the reason the operating system gave.
_REMEDIES: dict[int, str] = {
    errno.ENOSPC: "Free disk space in {folder} (or grow the volume)",
    errno.EDQUOT: "Raise the disk quota of {folder} or free space in it",
    **dict.fromkeys(
        (errno.EACCES, errno.EPERM),
        "Let the user running the refresh write to {folder} (and replace {file})",
    ),
    errno.EROFS: "Mount {folder} read-write",
    **dict.fromkeys((errno.EXDEV, errno.EBUSY), "Mount the folder {folder}, not the file {file}"),
    errno.ENOENT: "Create the folder {folder}, or set {variable} to another path",
}


def _failure(target: Path, snapshot: int | None, exc: BaseException, variable: str) -> ExportError:
    # DuckDB reports the reason as text, the system's own (``os.strerror``), not as errno.
    code = (exc.errno if isinstance(exc, OSError) else None) or next(
        (c for c in _REMEDIES if os.strerror(c).lower() in str(exc).lower()), None
    )
    remedy = _REMEDIES.get(code or 0, "Fix the cause in {folder}")
    cause = (exc.strerror if isinstance(exc, OSError) else None) or str(exc)
    name = f" ({errno.errorcode.get(code, code)})" if code else ""
    which = f"snapshot {snapshot} of the lake" if snapshot is not None else "the lake"
    return ExportError(
        f"Exporting {which} to {target} ({variable}) failed: {cause}{name}. The lake's snapshot "
        "stays committed and the previous export whole: "
        + remedy.format(folder=target.parent, file=target.name, variable=variable)
        + ", then run again."
    )


def export_snapshot(lake: Lake, target: Path, config: DuckDBConfig | None = None) -> dict[str, Any]:
    """Write every table of one lake snapshot into a new DuckDB file, then rename it over
    ``target`` atomically (temporary file beside it, fsynced, renamed, folder fsynced).

    Reads through a read-only connection in one transaction, so one snapshot, and never makes
    a lake reader or writer wait. Raises ``ExportError`` naming ``target`` and the cause; the
    previous ``target`` then stays whole, and the temporary file is removed. Returns the export
    asset's metadata.
    """
    started = time.monotonic()
    check_export_target(target, lake)
    sweep_dead_exports(target)
    temporary = target.with_name(f".{target.name}{EXPORT_INFIX}{secrets.token_hex(4)}")
    snapshot: int | None = None
    try:
        with connect(lake, config, read_only=True) as conn:
            conn.execute(
                f"ATTACH {sql_literal(str(temporary))} AS fieldsales_export "
                f"(STORAGE_VERSION {sql_literal(EXPORT_STORAGE_VERSION)}); BEGIN TRANSACTION"
            )
            (snapshot,) = one_row(
                conn, f"SELECT id FROM {quote_ident(lake.alias)}.current_snapshot()"
            )
            tables = _copy_tables(conn, lake, snapshot)
            conn.execute("COMMIT; DETACH fieldsales_export")
        size = _replace_durably(temporary, target, lake)
    except BaseException as exc:
        _remove(temporary)
        if isinstance(exc, duckdb.Error | OSError):  # an ExportError names its cause already
            raise _failure(target, snapshot, exc, lake.named(EXPORT_VARIABLE)) from exc
        raise
    return {
        "fieldsales/export_path": str(target),
        "fieldsales/snapshot_id": int(snapshot),
        "fieldsales/tables": tables,
        "fieldsales/bytes": size,
        "fieldsales/seconds": round(time.monotonic() - started, 3),
    }


def _copy_tables(conn: duckdb.DuckDBPyConnection, lake: Lake, snapshot: int) -> int:
    """Copy every table of the lake (no staging table) into ``fieldsales_export``, and mark it
    with ``snapshot`` (``EXPORT_MARKER``); returns how many tables."""
    found = conn.execute(
        "SELECT schema_name, table_name FROM duckdb_tables() WHERE database_name = ? "
        "AND NOT starts_with(table_name, '_stage_') ORDER BY ALL",
        [lake.alias],
    ).fetchall()
    for schema in sorted({schema for schema, _ in found} | {"meta"}):
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS fieldsales_export.{quote_ident(schema)}")
    for schema, name in found:
        table = f"{quote_ident(schema)}.{quote_ident(name)}"
        conn.execute(
            f"CREATE TABLE fieldsales_export.{table} AS "
            f"SELECT * FROM {quote_ident(lake.alias)}.{table}"
        )
    conn.execute(
        f"CREATE TABLE fieldsales_export.{EXPORT_MARKER} AS SELECT ? AS snapshot_id, "
        "now() AS exported_at, ? AS catalog",
        [snapshot, lake.catalog],
    )
    return len(found)


def _replace_durably(temporary: Path, target: Path, lake: Lake) -> int:
    """fsync ``temporary``, rename it over ``target`` and fsync the folder; returns its size."""
    with open(temporary, "rb") as file:
        os.fsync(file.fileno())
    size = temporary.stat().st_size
    pause_at("export")
    check_export_target(target, lake)  # a program may have opened it meanwhile
    os.replace(temporary, target)
    fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return size


#: A temporary export untouched this long was left by a dead export: a live one writes it
#: continuously, and exports of one target never overlap (the export asset has a pool of its own).
DEAD_EXPORT_AGE_S = 600


def sweep_dead_exports(target: Path) -> None:
    """Remove the temporary files that killed exports of ``target`` left beside it."""
    for temporary in target.parent.glob(f".{target.name}{EXPORT_INFIX}*"):
        with contextlib.suppress(FileNotFoundError):  # another sweep was first
            if time.time() - temporary.stat().st_mtime > DEAD_EXPORT_AGE_S:
                _remove(temporary)


def _remove(temporary: Path) -> None:
    for path in (temporary, Path(f"{temporary}.wal")):
        path.unlink(missing_ok=True)


def is_export(path: Path) -> bool:
    """Whether the DuckDB file ``path`` carries ``EXPORT_MARKER`` (a ``duckdb.Error`` if it is
    held read-write elsewhere or not a DuckDB file)."""
    schema, _, name = EXPORT_MARKER.partition(".")
    with duckdb.connect(str(path), read_only=True) as conn:
        (marked,) = one_row(
            conn,
            "SELECT count(*) FROM duckdb_tables() WHERE schema_name = ? AND table_name = ?",
            [schema, name],
        )
    return bool(marked)


# --- the analysts' lines ------------------------------------------------------------------------


def analyst_sql(lake: Lake) -> str:
    """The SQL that opens ``lake`` read-only in a DuckDB 1.5.5 client (the CLI: ``duckdb -init``),
    offline: the extensions from this project's wheels, by their paths on this machine."""
    scanner = "postgres" if lake.is_postgres else "sqlite"
    lines = [
        "-- Opens the Field-Sales lake read-only (docs/storage.md). Written by",
        "-- python -m fieldsales_dagster.warehouse.lake for this install.",
        "SET autoinstall_known_extensions = false;",
        "SET autoload_known_extensions = false;",
        f"SET extension_directory = {sql_literal(str(extension_directory()))};",
        f"INSTALL {sql_literal(str(extension_file(scanner)))};",
        f"LOAD {SCANNERS[scanner]};",
        f"LOAD {sql_literal(str(extension_file('ducklake')))};",
    ]
    if lake.is_postgres:
        lines.append(
            f"-- the password: CREATE TEMPORARY SECRET (TYPE postgres, PASSWORD '...'); "
            f"(from {lake.password_env_var})"
        )
    if lake.is_s3:
        key_id, secret = lake.store.key_variables()[:2]
        lines += [
            f"LOAD {sql_literal(str(extension_file('httpfs')))};",
            f"-- the object store's keys (from {key_id} and {secret}): "
            f"{lake.store.secret_sql(keys=('...', '...'))};",
        ]
    lines += [
        *(f"{statement};" for statement in reader_statements(lake)),
        f"USE {quote_ident(lake.alias)};",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    """Print ``analyst_sql`` for the lake the environment names (``FIELDSALES_DUCKLAKE_*``, and
    ``FIELDSALES_S3_*`` or ``AWS_ENDPOINT_URL``/``AWS_REGION`` for its object store), or the
    default one."""
    env = {name: value.strip() for name, value in os.environ.items() if value.strip()}
    catalog = env.get(CATALOG_VARIABLE) or DEFAULT_CATALOG
    endpoint = env.get(ENDPOINT_VARIABLE)
    try:
        store = ObjectStore.or_aws(
            endpoint_origin(endpoint, ENDPOINT_VARIABLE) if endpoint else None,
            env.get("FIELDSALES_S3_REGION"),
            env.get("FIELDSALES_S3_URL_STYLE"),
        )
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    data_path = env.get(DATA_PATH_VARIABLE) or default_data_path(catalog)
    print(analyst_sql(Lake(check_catalog(catalog), data_path, store=store)), end="")


if __name__ == "__main__":
    main()
