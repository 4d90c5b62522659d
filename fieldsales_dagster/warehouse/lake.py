"""The warehouse's storage: a DuckLake, opened offline from the extension wheels (docs/storage.md).

Every commit is a snapshot marked a complete refresh or not (``_mark_refresh``); readers attach
the last complete one (``reader_statements``). A SQLite catalog is kept in ``journal_mode=WAL``:
in the rollback journal a reader holding a snapshot made 60 of 60 commits fail with "database is
locked" (none in WAL). A PostgreSQL password reaches DuckDB as a temporary secret, never in the
connection string (DuckDB's errors quote it). DuckLake has no keys, indexes, stored macros or
``ENUM``: state tables are keyed by delete-then-insert, and every macro is ``TEMP``.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import importlib.util
import os
import random
import re
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
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

EXTENSION_VERSION = "v1.5.5"
DEFAULT_DATA_PATH = "data/lake"
CATALOG_VARIABLE = "FIELDSALES_DUCKLAKE_CATALOG"
DATA_PATH_VARIABLE = "FIELDSALES_DUCKLAKE_DATA_PATH"
S3_PREFIX = "s3://"
ENDPOINT_VARIABLE = "FIELDSALES_S3_ENDPOINT"
AWS_KEY_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
TENANT_TABLE = "meta.lake_tenant"
BUILDS_TABLE = "meta.lake_builds"
#: Commit messages (``_mark_refresh``).
COMPLETE = "complete refresh"
INCOMPLETE = "incomplete refresh"
SNAPSHOT_VARIABLE = "fieldsales_snapshot"
#: Pauses of 0.1-0.5 s times the attempt: about 20 s in all.
CONFLICT_ATTEMPTS = 12

T = TypeVar("T")


@dataclass
class _Open:
    """A transaction ``run_transaction`` opened: whether a nested call joined it, the snapshot it
    reads (asked once: ~2.5 ms a query) and the evaluations recorded in it, written at its commit
    (``record_evaluation``)."""

    joined: bool = False
    snapshot: int | None = None
    evaluations: dict[tuple[str, str | None], tuple] = field(default_factory=dict)


#: Open transactions, by connection.
_OPEN: dict[int, _Open] = {}
_TENANT_READ: set[Lake] = set()


class LakeError(RuntimeError):
    """The lake could not be opened."""


class LakeConflictError(RuntimeError):
    """A table's transaction kept conflicting with another writer's."""


def default_data_path(catalog: str) -> str:
    """No data path set: ``lake/`` beside a SQLite catalog."""
    file = Lake(catalog).catalog_file
    return str(file.parent / "lake") if file else DEFAULT_DATA_PATH


@dataclass(frozen=True)
class ObjectStore:
    """Where ``s3://`` is served (``None``: AWS's defaults); the keys' variables, never keys."""

    endpoint: str | None = None
    region: str | None = None
    url_style: str | None = None
    key_id_env_var: str = "FIELDSALES_S3_ACCESS_KEY_ID"
    secret_env_var: str = "FIELDSALES_S3_SECRET_ACCESS_KEY"

    def or_aws(self) -> ObjectStore:
        """``AWS_ENDPOINT_URL`` and ``AWS_REGION`` stand in for an endpoint and region not set."""
        aws = os.environ.get("AWS_ENDPOINT_URL", "").strip()
        endpoint = self.endpoint or (endpoint_origin(aws, "AWS_ENDPOINT_URL") if aws else None)
        region = self.region or os.environ.get("AWS_REGION", "").strip() or None
        return replace(self, endpoint=endpoint, region=region)

    def key_variables(self) -> tuple[str, ...]:
        """Ours if either is set, else the AWS ones."""
        ours = (self.key_id_env_var, self.secret_env_var)
        return ours if any(os.environ.get(variable) for variable in ours) else AWS_KEY_VARIABLES

    def secret_sql(self, keys: tuple[str, ...] = ()) -> str:
        """The connection's default secret for ``s3://`` (``keys``, else their variables')."""
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
    """Where a DuckLake lives. A default data path is created for a new lake; one the user set
    must exist (``prepare``). ``tenant``: ``None`` checks nothing (``check_tenant``)."""

    catalog: str = DEFAULT_CATALOG
    data_path: str = DEFAULT_DATA_PATH
    schema: str | None = None
    password_env_var: str = "FIELDSALES_DUCKLAKE_PASSWORD"
    alias: str = "fieldsales"
    data_path_is_default: bool = True
    tenant: str | None = None
    store: ObjectStore = field(default_factory=ObjectStore)
    #: What errors call the shipped variables (a tenant's own names).
    variables: Mapping[str, str] = field(default_factory=dict, compare=False)

    def named(self, variable: str) -> str:
        return self.variables.get(variable, variable)

    @property
    def is_postgres(self) -> bool:
        return self.catalog.startswith(POSTGRES_PREFIX)

    @property
    def catalog_file(self) -> Path | None:
        sqlite = self.catalog.startswith(SQLITE_PREFIX)
        return Path(self.catalog.removeprefix(SQLITE_PREFIX)) if sqlite else None

    @property
    def is_local(self) -> bool:
        return "://" not in self.data_path

    @property
    def is_s3(self) -> bool:
        return self.data_path.startswith(S3_PREFIX)

    @property
    def data_folder(self) -> str:
        """Absolute when local: DuckLake compares paths as text (the upkeep's orphan search)."""
        base = str(Path(self.data_path).absolute()) if self.is_local else self.data_path
        return f"{base.rstrip('/')}/{self.schema}" if self.schema else base

    def attach_sql(self, read_only: bool = False, snapshot: str | None = None) -> str:
        """No password in it (see ``connect``); ``snapshot``: an expression of the id to attach."""
        # A lake whose folder moved (copied, a volume mounted elsewhere) opens from the setting.
        options = [f"DATA_PATH {sql_literal(self.data_folder)}", "OVERRIDE_DATA_PATH true"]
        options += [f"METADATA_SCHEMA {sql_literal(self.schema)}"] if self.schema else []
        options += ["READ_ONLY"] if read_only else []
        options += [f"SNAPSHOT_VERSION {snapshot}"] if snapshot else []
        return (
            f"ATTACH {sql_literal('ducklake:' + self.catalog)} AS {quote_ident(self.alias)} "
            f"({', '.join(options)})"
        )


def extension_directory() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "fieldsales_dagster" / "duckdb_extensions"


def extension_file(name: str) -> Path:
    spec = importlib.util.find_spec(f"duckdb_extension_{name}")
    folder = next(iter(spec.submodule_search_locations or []), "") if spec else ""
    path = Path(folder, "extensions", EXTENSION_VERSION, f"{name}.duckdb_extension")
    if not folder or not path.is_file():
        raise LakeError(
            f"The lake needs the DuckDB extension {name!r} from the package duckdb-extension-"
            f"{name}=={EXTENSION_VERSION[1:]}, a dependency: pip install the project again."
        )
    return path


DuckDBConfig = dict[str, str | bool | int | float | list[str]]


def lake_config() -> DuckDBConfig:
    """No extension download, ever; no insertion order (``LAKE_OPTIONS``' row groups need it).

    Extension signatures stay checked (~0.65 s a process, measured): a swapped file is refused.
    Background allocator threads return freed pages (1M: peak RSS 633 -> 620 MiB;
    docs/performance.md). An internal error (a lone surrogate) would invalidate the instance and
    abort the process before the step's failure is recorded; a failed transaction is rolled back
    anyway, so ``disable_database_invalidation`` lets the error reach the step."""
    return {
        "extension_directory": str(extension_directory()),
        "autoinstall_known_extensions": False,
        "autoload_known_extensions": False,
        "preserve_insertion_order": False,
        "allocator_background_threads": True,
        "disable_database_invalidation": True,
    }


def load_extensions(conn: duckdb.DuckDBPyConnection, lake: Lake) -> None:
    """``ducklake`` from its wheel's file; the catalog's ``<name>_scanner`` installed once."""
    conn.execute(f"LOAD {sql_literal(str(extension_file('ducklake')))}")
    scanner = "postgres" if lake.is_postgres else "sqlite"
    try:  # (asking first, duckdb_extensions(), reads every installed file: ~0.7 s a process)
        conn.execute(f"LOAD {scanner}_scanner")
    except duckdb.IOException:  # not installed for this user yet (the lock makes its folder)
        with filelock.FileLock(str(extension_directory() / ".install.lock"), timeout=120):
            conn.execute(f"INSTALL {sql_literal(str(extension_file(scanner)))}")
        conn.execute(f"LOAD {scanner}_scanner")
    if lake.is_s3:
        conn.execute(f"LOAD {sql_literal(str(extension_file('httpfs')))}")


def connect(
    lake: Lake, config: DuckDBConfig | None = None, read_only: bool = False
) -> duckdb.DuckDBPyConnection:
    conn = _instance(lake, config)
    try:
        if not read_only:
            prepare(lake, conn)
        _attach(conn, lake, read_only)
        if not read_only:
            check_writable(conn, lake)
            set_options(conn, lake)
            upgrade(conn, lake)
            check_tenant(conn, lake)
    except BaseException:
        conn.close()
        raise
    return conn


def _store_failure(lake: Lake, exc: duckdb.Error) -> LakeError:
    variable = lake.named(DATA_PATH_VARIABLE)
    if _says(exc, "nosuchbucket", "http 404"):
        why = f"its bucket does not exist: create it, or set {variable} to another"
    elif _says(exc, "http 403", "http 401"):
        keys = " and ".join(lake.store.key_variables()[:2])
        why = f"the object store refused the keys in {keys}: set keys that may list, read, write"
    else:
        why = (
            f"the object store at {lake.store.endpoint or 'AWS S3'} could not be reached: check "
            f"{lake.named(ENDPOINT_VARIABLE)} (or AWS_ENDPOINT_URL) and the server"
        )
    return LakeError(
        f"The lake's data path {lake.data_folder} ({variable}) cannot be used, so nothing was "
        f"written; {why} (DuckDB: {str(exc).splitlines()[0]})."
    )


def _instance(lake: Lake, config: DuckDBConfig | None = None) -> duckdb.DuckDBPyConnection:
    conn = duckdb.connect(config={**(config or {}), **lake_config()})
    # The bar goes to stdout, where a script's $(python -c ...) would take it for the value.
    conn.execute("SET enable_progress_bar = false")
    load_extensions(conn, lake)
    if lake.is_s3:
        try:  # DuckDB's error would quote the statement, keys and all
            conn.execute(lake.store.secret_sql())
        except duckdb.Error:
            variables = ", ".join(lake.store.key_variables())
            raise LakeError(f"DuckDB refused the object store's keys in {variables}.") from None
    if lake.is_postgres and (password := os.environ.get(lake.password_env_var)):
        # The unnamed secret: the default of every connection string without a password.
        conn.execute(
            f"CREATE OR REPLACE TEMPORARY SECRET (TYPE postgres, PASSWORD {sql_literal(password)})"
        )
    return conn


@functools.cache
def postgres_identity(lake: Lake) -> tuple[Any, ...]:
    """The cluster and database ``lake``'s catalog reaches, however spelled; once per process."""
    query = "SELECT system_identifier::text, current_database() FROM pg_control_system()"
    dsn = sql_literal(lake.catalog.removeprefix(POSTGRES_PREFIX))
    try:
        with contextlib.closing(_instance(lake)) as conn:
            conn.execute(f"ATTACH {dsn} AS catalog (TYPE postgres, READ_ONLY)")
            return one_row(conn, f"SELECT * FROM postgres_query('catalog', {sql_literal(query)})")
    except duckdb.Error as exc:
        raise LakeError(
            f"Could not ask the PostgreSQL catalog {lake.catalog!r} ({CATALOG_VARIABLE}) which "
            f"database it is. DuckDB: {exc}"
        ) from exc


def check_writable(conn: duckdb.DuckDBPyConnection, lake: Lake) -> None:
    """Refuse a PostgreSQL catalog this connection can only read, before a run's first request."""
    if not lake.is_postgres:
        return
    table = sql_literal(f"{quote_ident(lake.schema or 'public')}.ducklake_snapshot")
    query = f"SELECT NOT pg_is_in_recovery() AND has_table_privilege({table}, 'INSERT')"
    metadata = sql_literal(f"__ducklake_metadata_{lake.alias}")
    (writable,) = one_row(conn, f"SELECT * FROM postgres_query({metadata}, {sql_literal(query)})")
    if not writable:
        raise LakeError(
            f"The lake's PostgreSQL catalog {lake.catalog!r} ({CATALOG_VARIABLE}) can only be read "
            "by its user here (a read-only role, a standby): grant it INSERT, or use the primary."
        )


def _attach(conn: duckdb.DuckDBPyConnection, lake: Lake, read_only: bool) -> None:
    """Retried while another process is creating the same new lake."""
    retrying = _retrying(lambda exc: is_conflict(exc) or _says(exc, "already exists"))
    try:
        for statement in reader_statements(lake) if read_only else [lake.attach_sql()]:
            retrying(conn.execute, statement)
    except duckdb.Error as exc:
        password = f" and the password in {lake.password_env_var}" if lake.is_postgres else ""
        raise LakeError(
            f"Could not open the DuckLake {lake.catalog!r} at {lake.data_folder!r}: check "
            f"{lake.named(CATALOG_VARIABLE)}, {lake.named(DATA_PATH_VARIABLE)}{password}. {exc}"
        ) from exc
    conn.execute(f"USE {quote_ident(lake.alias)}")


def reader_statements(lake: Lake) -> list[str]:
    """Attach ``lake`` read-only at its last complete refresh, never one half done."""
    latest = replace(lake, alias=f"{lake.alias}_latest")
    return [
        latest.attach_sql(read_only=True),
        f"SET VARIABLE {SNAPSHOT_VARIABLE} = ({last_complete_snapshot(latest.alias)})",
        f"DETACH {quote_ident(latest.alias)}",
        lake.attach_sql(read_only=True, snapshot=f"getvariable({sql_literal(SNAPSHOT_VARIABLE)})"),
    ]


def last_complete_snapshot(alias: str) -> str:
    """The snapshot before the first ``INCOMPLETE`` commit after the last ``COMPLETE``."""
    return (
        f"WITH s AS (SELECT snapshot_id AS id, commit_message AS said FROM "
        f"{quote_ident(alias)}.snapshots()), "
        f"broken AS (SELECT min(id) AS id FROM s WHERE said = {sql_literal(INCOMPLETE)} AND "
        f"id > (SELECT coalesce(max(id), -1) FROM s WHERE said = {sql_literal(COMPLETE)})) "
        "SELECT coalesce(max(id) FILTER (id < (SELECT id FROM broken)), max(id)) FROM s"
    )


def _says(exc: BaseException, *texts: str) -> bool:
    message = str(exc).lower()
    return any(text in message for text in texts)


def prepare(lake: Lake, conn: duckdb.DuckDBPyConnection | None = None) -> None:
    """Check where a writer's lake lives before it attaches; then put a SQLite catalog in WAL.

    An ``s3://`` data path is listed (one request). A data path the user set, or the default of a
    lake with a catalog, must exist: an unmounted volume re-created empty would get snapshots
    unreadable once the volume is back.
    """
    catalog, folder = lake.catalog_file, Path(lake.data_path)
    if lake.is_s3 and conn is not None:
        probe = sql_literal(f"{lake.data_folder.rstrip('/')}/.fieldsales-preflight*")
        try:
            conn.execute(f"SELECT count(*) FROM glob({probe})").fetchall()
        except duckdb.Error as exc:
            raise _store_failure(lake, exc) from None
    elif lake.is_local and not folder.is_dir():
        if lake.data_path_is_default and (catalog is None or not catalog.exists()):
            folder.mkdir(parents=True, exist_ok=True)
        else:
            why = "an unmounted volume or a mistyped path"
            if lake.data_path_is_default:
                why = f"the lake's catalog {catalog} lists its files there"
            variable = lake.named(DATA_PATH_VARIABLE)
            raise LakeError(
                f"The lake's data path {folder} ({variable}) does not exist ({why}), so nothing "
                f"was written: mount, restore or create it, or set {variable} to the right folder."
            )
    if catalog is not None:
        catalog.parent.mkdir(parents=True, exist_ok=True)
        use_wal(catalog.resolve(), lake.named(CATALOG_VARIABLE))


#: Once per file: closing the file again drops this process's POSIX locks, DuckDB's too
#: (SQLite's "how to corrupt", 2.2), so a checkpoint could pull the WAL away ("disk I/O error").
@functools.cache
def use_wal(path: Path, variable: str) -> None:
    """``journal_mode=WAL`` (see the module docstring); ``path`` resolved. SQLite refuses it at
    once while another process writes the file (``timeout`` aside): asked again, as a commit is."""
    with contextlib.closing(sqlite3.connect(path, timeout=60)) as db:
        (mode,) = _retrying(is_conflict)(db.execute, "PRAGMA journal_mode=WAL").fetchone()
    if str(mode).lower() != "wal":
        raise LakeError(
            f"Could not put the lake's SQLite catalog {path} ({variable}) in journal_mode=WAL "
            f"(SQLite says {mode!r}): keep it on a local disk, or use a PostgreSQL catalog."
        )


def check_tenant(conn: duckdb.DuckDBPyConnection, lake: Lake, record: bool = False) -> None:
    """Refuse a lake recorded for another tenant; with ``record``, record an unrecorded one.

    The record in the lake, not the settings' text, decides (two spellings of one catalog are one
    lake). It is written with the first commit, after the server answered, so a mistyped URL
    leaves no record that blocks the next run.
    """
    if lake.tenant is None or lake in _TENANT_READ:
        return
    recorded = recorded_tenant(conn)
    if recorded == lake.tenant:
        _TENANT_READ.add(lake)  # changes only by move_tenant
    elif recorded is None and record:
        _write_tenant(conn, lake.tenant)
    elif recorded is not None:
        raise LakeError(
            f"The lake with catalog {lake.catalog!r} (schema {lake.schema or 'main'}) belongs to "
            f"{recorded!r}, not to {lake.tenant!r}, so nothing was written: give this instance a "
            f"lake of its own ({lake.named(CATALOG_VARIABLE)} or ducklake_schema; docs/storage.md)."
        )


def recorded_tenant(conn: duckdb.DuckDBPyConnection) -> str | None:
    try:  # one query: a missing table is no record (and leaves an open transaction whole)
        return one_row(conn, f"SELECT max(tenant) FROM {TENANT_TABLE}")[0]
    except duckdb.CatalogException:
        return None


def table_exists(conn: duckdb.DuckDBPyConnection, table: str) -> bool:
    """In the current database; cheaper than ``duckdb_tables()``, and aborts no transaction."""
    try:
        conn.execute(f"SELECT 1 FROM {qualified(table)} LIMIT 0")
    except duckdb.CatalogException:
        return False
    return True


@dataclass(frozen=True)
class _Changes:
    """What DuckLake records of ``lake``'s commits, as of its snapshot ``last``."""

    last: int
    #: Each live table's id (``schema.name`` -> id as text).
    ids: dict[str, str]
    #: Each snapshot still listed -> the tables it created (by name), wrote or altered (by id).
    touched: dict[int, frozenset[str]]
    #: Each snapshot still listed -> its commit time (ISO 8601).
    times: dict[int, str]


#: Per lake and name, a ``per_snapshot`` read and the snapshot it was read at.
_READ_AT: dict[tuple[Lake, str], tuple[int, Any]] = {}


def per_snapshot(
    conn: duckdb.DuckDBPyConnection, lake: Lake, name: str, read: Callable[[], T]
) -> T:
    """``read()`` of ``lake``, kept under ``name`` until a commit (this process's or another's)
    makes a new snapshot: one run's unchanged steps read once what a written one reads again. A
    commit during ``read()`` is in what it returns, which is read again at the next call."""
    if (current := getattr(opened := _OPEN.get(id(conn)), "snapshot", None)) is None:
        (current,) = one_row(conn, "SELECT id FROM current_snapshot()")
        if opened is not None:
            opened.snapshot = current
    found = _READ_AT.get((lake, name))
    if found is None or found[0] != current:
        found = _READ_AT[lake, name] = (current, read())
    return found[1]


#: An entry of a snapshot's ``changes_made`` in the catalog (DuckLake's specification): its kind,
#: then a table's id or a quoted name (``created_table:"meta"."x"``).
_CHANGE = re.compile(r'\w+:(\d+|"(?:[^"]|"")*"(?:\."(?:[^"]|"")*")*)')


def _changes(conn: duckdb.DuckDBPyConnection, lake: Lake) -> _Changes:
    """``lake``'s changes as DuckLake records them in its catalog, each snapshot's parsed once a
    process (``snapshots()`` parses every one at each call, about once a step: 62 ms at 4,000
    snapshots, what a week of hourly runs keeps); a table a commit during the read created counts
    as changed (missing from ``ids``, read first)."""
    metadata = f"{quote_ident(f'__ducklake_metadata_{lake.alias}')}."
    metadata += quote_ident(lake.schema or ("public" if lake.is_postgres else "main"))
    ids = conn.execute(
        f"SELECT s.schema_name || '.' || t.table_name, t.table_id::VARCHAR "
        f"FROM {metadata}.ducklake_table AS t JOIN {metadata}.ducklake_schema AS s USING "
        "(schema_id) WHERE t.end_snapshot IS NULL AND s.end_snapshot IS NULL"
    ).fetchall()
    listed = conn.execute(
        f"SELECT snapshot_id, snapshot_time::VARCHAR, changes_made FROM {metadata}."
        f"ducklake_snapshot LEFT JOIN {metadata}.ducklake_snapshot_changes USING (snapshot_id)"
    ).fetchall()
    before: _Changes | None = _READ_AT.get((lake, "changes"), (0, None))[1]
    touched = {}
    for snapshot, when, made in listed:  # by id and time: a lake made again reuses ids
        if before is None or before.times.get(snapshot) != when:
            found = [m.group(1) for m in _CHANGE.finditer(made or "")]
            touched[snapshot] = frozenset(map(_unquoted, found))
        else:
            touched[snapshot] = before.touched[snapshot]
    return _Changes(max(touched), dict(ids), touched, {s: when for s, when, _ in listed})


def _unquoted(value: str) -> str:
    """``"meta"."x"`` as ``meta.x`` (as ``snapshots()`` names it); an id as it is."""
    parts = re.findall(r'"((?:[^"]|"")*)"', value)
    return ".".join(part.replace('""', '"') for part in parts) if parts else value


def changed_since(
    conn: duckdb.DuckDBPyConnection,
    lake: Lake,
    snapshot: int,
    tables: list[str],
    created: bool = False,
) -> list[str]:
    """Of ``tables`` (``schema.name``, in ``lake``, the current database), those missing, or
    created, written or altered by a commit after ``snapshot`` (``created``: created only; a table
    replaced whole is one renamed, which DuckLake records as created), as DuckLake records each
    commit's changes (``snapshots()``: a created table by name, a written or altered one by its
    id); all of them where a snapshot since ``snapshot`` was expired."""
    known = per_snapshot(conn, lake, "changes", lambda: _changes(conn, lake))
    since = range(snapshot + 1, known.last + 1)
    if snapshot not in known.touched or any(s not in known.touched for s in since):
        return list(tables)  # expired (upkeep): changes not known
    touched = frozenset().union(*(known.touched[s] for s in since))
    written = frozenset() if created else touched
    return [t for t in tables if t not in known.ids or t in touched or known.ids[t] in written]


def snapshot_stamp(
    conn: duckdb.DuckDBPyConnection, lake: Lake, snapshot: int | None = None
) -> str | None:
    """``<id> of <commit time>`` of ``snapshot`` (default: the last) in ``lake``, ``None`` where it
    is no longer listed: an id alone may be another lake's snapshot (a lake made again)."""
    known = per_snapshot(conn, lake, "changes", lambda: _changes(conn, lake))
    at = known.last if snapshot is None else snapshot
    return f"{at} of {known.times[at]}" if at in known.times else None


def ensure_table(conn: duckdb.DuckDBPyConnection, table: str, columns: str) -> None:
    """``table`` (``schema.name``) with ``columns``, and its schema, unless they exist."""
    conn.execute(
        f"CREATE SCHEMA IF NOT EXISTS {quote_ident(table.partition('.')[0])}; "
        f"CREATE TABLE IF NOT EXISTS {qualified(table)} ({columns})"
    )


def _write_tenant(conn: duckdb.DuckDBPyConnection, tenant: str) -> None:
    ensure_table(conn, TENANT_TABLE, "tenant VARCHAR, since TIMESTAMPTZ")
    conn.execute(f"DELETE FROM {TENANT_TABLE}")
    conn.execute(f"INSERT INTO {TENANT_TABLE} VALUES (?, now())", [tenant])


def move_tenant(lake: Lake) -> str | None:
    """Record ``lake.tenant`` in place of the lake's (its instance moved); returns the old one."""
    tenant = lake.tenant
    if tenant is None:
        return None
    with contextlib.closing(connect(replace(lake, tenant=None))) as conn:

        def move() -> str | None:
            recorded = recorded_tenant(conn)
            if recorded not in (None, tenant):
                _write_tenant(conn, tenant)
            _TENANT_READ.clear()
            return recorded

        return run_transaction(conn, TENANT_TABLE, move)


#: name -> (value set, value as stored). Row groups by bytes: by rows, a 100 MB spool's group ran
#: out of 192MB; a reader buffers a group in the next power of two, so 16MB groups took 32 MiB
#: and ran out of 64MB (test_core_memory.py). Needs ``preserve_insertion_order=false``.
LAKE_OPTIONS = {
    "parquet_compression": ("zstd", "zstd"),
    "parquet_row_group_size_bytes": ("8MB", "8000000"),
}


def set_options(conn: duckdb.DuckDBPyConnection, lake: Lake) -> None:
    """Read first: only a lake that lacks one takes the transaction (~0.3 s a connection); the
    lake is the current database (``_attach``)."""
    stored = dict(conn.execute("SELECT option_name, value FROM options()").fetchall())
    missing = [(n, value) for n, (value, kept) in LAKE_OPTIONS.items() if stored.get(n) != kept]

    def write() -> None:
        for name, value in missing:
            conn.execute(f"CALL set_option({sql_literal(name)}, {sql_literal(value)})")

    if missing:
        run_transaction(conn, lake.alias, write)


#: One instance per process and lake (loading, attaching: ~1 s); connections are its cursors.
_INSTANCES: dict[tuple[object, ...], duckdb.DuckDBPyConnection] = {}
_INSTANCES_LOCK = threading.Lock()


def writer_connection(lake: Lake, config: DuckDBConfig) -> duckdb.DuckDBPyConnection:
    """A cursor of this process's instance; ``prepare`` runs each time (a volume unmounted)."""
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
    """A DuckLake "Transaction conflict", or a SQLite catalog's "database is locked" (from DuckDB,
    or from switching it to WAL: ``use_wal``)."""
    errors = (duckdb.Error, sqlite3.OperationalError)
    return isinstance(exc, errors) and _says(exc, "conflict", "database is locked")


def _retrying(retryable: Callable[[BaseException], bool]) -> tenacity.Retrying:
    return tenacity.Retrying(
        retry=tenacity.retry_if_exception(retryable),
        stop=tenacity.stop_after_attempt(CONFLICT_ATTEMPTS),
        wait=lambda state: random.uniform(0.1, 0.5) * state.attempt_number,
        reraise=True,
    )


def run_transaction(
    conn: duckdb.DuckDBPyConnection, table: str, body: Callable[[], T], reading: bool = False
) -> T:
    """Run ``body`` in one transaction, run again on a conflict, so it must be safe to repeat.

    Nested, it joins the outer transaction (one snapshot per asset write); a failed BEGIN would
    abort the open one, so open ones are tracked. ``reading``: ``body`` reads, and writes only by
    nested calls; if none joined, its commit makes no snapshot and is not judged (``_mark_refresh``
    reads every record: ~10 ms).
    """
    if (opened := _OPEN.get(id(conn))) is not None:
        opened.joined = True
        return body()
    try:
        return _retrying(is_conflict)(_transaction, conn, body, reading)
    except duckdb.Error as exc:
        if not is_conflict(exc):
            raise
        raise LakeConflictError(
            f"Writing {table} conflicted with another writer {CONFLICT_ATTEMPTS} times, so it was "
            f"given up and {table} left as it was: keep one writer per table, run again. {exc}"
        ) from exc


def _transaction(conn: duckdb.DuckDBPyConnection, body: Callable[[], T], reading: bool) -> T:
    conn.execute("BEGIN TRANSACTION")
    opened = _OPEN[id(conn)] = _Open()
    try:
        result = body()
        if opened.evaluations:
            _write_evaluations(conn, list(opened.evaluations.values()))
        if not reading or opened.joined:
            _mark_refresh(conn)
        conn.execute("COMMIT")
        return result
    except BaseException:
        with contextlib.suppress(duckdb.TransactionException):  # a failed COMMIT ended it already
            conn.execute("ROLLBACK")
        raise
    finally:
        _OPEN.pop(id(conn), None)


@dataclass(frozen=True)
class Evaluation:
    """The last build of a table, or evaluation of one of its checks (``record_evaluation``):
    the tables it ``reads``, at snapshot ``read``, the code it ran and a check's ``result``."""

    reads: tuple[str, ...]
    read: int
    fingerprint: str
    result: str | None


def record_evaluation(
    conn: duckdb.DuckDBPyConnection,
    table: str,
    reads: Sequence[str] = (),
    fingerprint: str | None = None,
    check: str | None = None,
    result: str | None = None,
    read: int | None = None,
) -> None:
    """Record, at the commit of the open transaction (one is opened where none is), ``table``'s
    build, or the evaluation of its ``check`` with its ``result`` (or a following table's state,
    follow.py): what it ``reads`` at snapshot ``read`` (default: the current one) and ran besides
    its inputs (``fingerprint``), for ``still_valid``. A later record of the same build or check
    in the transaction replaces it."""
    row = (table, list(reads), fingerprint, check, result, read)
    run_transaction(conn, table, lambda: _OPEN[id(conn)].evaluations.update({(table, check): row}))


def _write_evaluations(conn: duckdb.DuckDBPyConnection, rows: list[tuple]) -> None:
    """In the current database, the lake (``_mark_refresh``): one row per table, its last build,
    so that the check at every commit reads as much after years of runs as after the first, and
    one per check of it, its last evaluation with its result. One statement each to delete and
    insert a transaction's records (~8 ms a statement)."""
    columns = "table_name VARCHAR, reads VARCHAR[], read_snapshot BIGINT, fingerprint VARCHAR"
    ensure_table(conn, BUILDS_TABLE, f"{columns}, check_name VARCHAR, result VARCHAR")
    row = "(?::VARCHAR, ?::VARCHAR[], ?::VARCHAR, ?::VARCHAR, ?::VARCHAR, ?::BIGINT)"
    given = f"(VALUES {', '.join([row] * len(rows))}) AS e(t, reads, fingerprint, c, result, read)"
    params = [value for r in rows for value in r]
    conn.execute(
        f"DELETE FROM {BUILDS_TABLE} AS b USING {given} "
        "WHERE b.table_name = e.t AND b.check_name IS NOT DISTINCT FROM e.c",
        params,
    )
    conn.execute(
        f"INSERT INTO {BUILDS_TABLE} BY NAME SELECT e.t AS table_name, e.reads, coalesce(e.read, "
        "s.id) AS read_snapshot, e.fingerprint, e.c AS check_name, e.result "
        f"FROM {given}, current_snapshot() AS s",
        params,
    )


#: The meta tables of earlier releases, which ``upgrade`` drops, with every ``meta.*_inputs``: the
#: rows a following table reflected (follow.py reads DuckLake's change feed instead). Events'
#: states are kept with their digests now (raw_load.digest_columns).
_DROPPED = (
    "build_fingerprints",
    "check_evaluations",
    "core_follow_state",
    "event_states",
    "list_checks",
)


def upgrade(conn: duckdb.DuckDBPyConnection, lake: Lake) -> None:
    """Bring the meta tables of a lake of an earlier release (the current database) to this one's,
    in one commit where there is anything to change, as a writer attaches it (``connect``): before
    anything reads a record, and once per process, not at every commit. Fingerprints, then check
    results and the states of following tables, had tables of their own, and so had the times
    each list was last loaded whole (``meta.list_checks``): no record of theirs matches, so each
    table is built (a following one whole) and each check evaluated once, and the next load of
    ``raw.events`` records its time again (incremental.py)."""

    def run() -> None:
        if table_exists(conn, BUILDS_TABLE):
            for column in ("fingerprint", "check_name", "result"):
                conn.execute(f"ALTER TABLE {BUILDS_TABLE} ADD COLUMN IF NOT EXISTS {column} TEXT")
        # By the catalog's list of tables (``_changes``, read anyway): duckdb_tables() reads
        # every table of the lake (~0.3 CPU-s a process).
        for name in per_snapshot(conn, lake, "changes", lambda: _changes(conn, lake)).ids:
            schema, _, table = name.partition(".")
            if schema == "meta" and (table in _DROPPED or table.endswith("_inputs")):
                conn.execute(f"DROP TABLE {qualified(name)}")

    run_transaction(conn, BUILDS_TABLE, run)


def _last_evaluation(
    conn: duckdb.DuckDBPyConnection, lake: Lake, table: str, check: str | None = None
) -> Evaluation | None:
    """``table``'s last build (or its ``check``'s last evaluation) recorded, by any code."""

    def read() -> dict[tuple[str, str | None], Evaluation]:
        try:
            rows = conn.execute(
                "SELECT table_name, check_name, reads, read_snapshot, fingerprint, result "
                f"FROM {BUILDS_TABLE}"
            ).fetchall()
        except duckdb.CatalogException:  # none recorded yet
            return {}
        return {(row[0], row[1]): Evaluation(tuple(row[2]), *row[3:]) for row in rows}

    return per_snapshot(conn, lake, BUILDS_TABLE, read).get((table, check))


#: ``still_valid``'s fingerprint of any code, one that recorded none (``None``) too.
ANY_CODE = "*"


def still_valid(
    conn: duckdb.DuckDBPyConnection,
    lake: Lake,
    table: str,
    fingerprint: str | None,
    check: str | None = None,
    *,
    judged: bool = True,
) -> Evaluation | None:
    """``table``'s last build (or its ``check``'s last evaluation) where it ran ``fingerprint``
    (``ANY_CODE``: whatever it ran) and no table it read changed since the snapshot it read
    (``changed_since``; unless not ``judged``); else ``None``: none recorded, another
    fingerprint, or ``fingerprint`` ``None`` (nothing compares)."""
    found = _last_evaluation(conn, lake, table, check)
    if found is None or fingerprint is None or fingerprint not in (ANY_CODE, found.fingerprint):
        return None
    return None if judged and changed_since(conn, lake, found.read, list(found.reads)) else found


#: Tables that read a table written again since (``_mark_refresh`` judges those in the lake).
_STALE = f"""
    WITH last AS (
        SELECT table_name, arg_max(reads, read_snapshot) AS reads, max(read_snapshot) AS read
        FROM {BUILDS_TABLE} WHERE check_name IS NULL GROUP BY table_name)
    SELECT DISTINCT built.table_name
    FROM (SELECT table_name, read, unnest(reads) AS input FROM last) AS built
    JOIN last AS input ON input.table_name = built.input WHERE input.read >= built.read
    ORDER BY ALL
"""


def _mark_refresh(conn: duckdb.DuckDBPyConnection) -> None:
    """``COMPLETE`` when no table is older than one it reads, judged by the snapshot its writer
    read (refresh runs never overlap), else ``INCOMPLETE``."""
    found = conn.execute(
        "SELECT database_name FROM duckdb_databases() "
        "WHERE database_name = current_database() AND type = 'ducklake'"
    ).fetchone()
    if found is None:
        return
    try:
        older = [name for (name,) in conn.execute(_STALE).fetchall()]
    except duckdb.CatalogException:  # no table write recorded yet
        older = []
    # A table no longer in the lake is not judged. Probed by name: duckdb_tables() read every
    # table of the lake's new snapshot, ~0.1 CPU-s at each commit of a run.
    stale = any(table_exists(conn, name) for name in older)
    message = f"'fieldsales', {sql_literal(INCOMPLETE if stale else COMPLETE)}"
    conn.execute(f"CALL {quote_ident(found[0])}.set_commit_message({message})")


@contextlib.contextmanager
def cleanup(conn: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """Tidy up after a failure; skipped in an aborted transaction, so the first error shows."""
    try:
        yield
    except duckdb.TransactionException as exc:
        if not (id(conn) in _OPEN and "aborted" in str(exc).lower()):
            raise


def drop_table(conn: duckdb.DuckDBPyConnection, table: str) -> None:
    with cleanup(conn):
        conn.execute(f"DROP TABLE IF EXISTS {table}")


def stored_files(conn: duckdb.DuckDBPyConnection, lake: Lake) -> tuple[int, int, str]:
    """Files, bytes and where counted: local Parquet files, else those the catalog lists."""
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


#: A live write's files are younger: a run commits within minutes of writing.
ORPHAN_SAFETY_HOURS = 24.0


def upkeep(
    conn: duckdb.DuckDBPyConnection,
    lake: Lake,
    retain_days: float,
    orphan_age_hours: float = ORPHAN_SAFETY_HOURS,
) -> dict[str, Any]:
    """Merge, expire snapshots (never the last nor the readers'), delete unneeded files."""
    name, snapshots = sql_literal(lake.alias), f"{quote_ident(lake.alias)}.snapshots()"

    def measured(when: str) -> dict[str, Any]:
        files, size, counted_in = stored_files(conn, lake)
        count, last = one_row(conn, f"SELECT count(*), max(snapshot_id) FROM {snapshots}")
        counts = {f"files_{when}": files, f"bytes_{when}": size, f"snapshots_{when}": count}
        return {**counts, "counted_in": counted_in, "last_snapshot": last}

    before = measured("before")

    def run(statement: str) -> list[Any]:
        return run_transaction(conn, lake.alias, lambda: conn.execute(statement).fetchall())

    def expire() -> None:
        # By id: older_than as a timestamp expired every snapshot of a SQLite catalog (measured).
        (old,) = one_row(
            conn,
            f"SELECT list(snapshot_id) FROM {snapshots} WHERE snapshot_time < now() - "
            f"to_microseconds({int(max(0.0, retain_days) * 86400e6)}) AND snapshot_id <> "
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
        f"to_microseconds({int(max(0.0, orphan_age_hours) * 3600e6)}))"
    )
    return {**before, **measured("after"), "orphans_deleted": len(orphans)}


#: The export replaces only a file that carries it.
EXPORT_MARKER = "meta.fieldsales_export"
EXPORT_INFIX = ".export-"
EXPORT_VARIABLE = "FIELDSALES_DUCKDB_PATH"


#: A live export writes its file continuously, and exports never overlap (a pool of their own).
DEAD_EXPORT_AGE_S = 600


class ExportError(RuntimeError):
    """The single-file export failed; the lake and the previous export are as they were."""


def check_export_target(target: Path, lake: Lake) -> None:
    """Fail unless ``target`` is absent or an export no process holds read-write."""
    if not target.exists():
        return
    variable = lake.named(EXPORT_VARIABLE)
    # Readers of a file replaced under a program that writes it would fail replaying its log.
    held = Path(f"{target}.wal").exists()
    try:
        marked = held or is_export(target)
    except duckdb.Error as exc:
        if not _says(exc, "lock"):
            raise ExportError(
                f"Cannot replace {target} ({variable}): it is not a DuckDB file this project can "
                f"read. Move it away, or set {variable} to another path. DuckDB: {exc}"
            ) from exc
        held = True
    if held:
        raise ExportError(
            f"Cannot replace the export {target}: another process holds it read-write (or crashed, "
            "leaving its .wal): open it read-only (duckdb -readonly), close it or delete the .wal."
        )
    if not marked:
        raise ExportError(
            f"{target} ({variable}) is a DuckDB file that is not an export of this project (it "
            f"has no table {EXPORT_MARKER}), so the export does not replace it; nothing of it was "
            f"changed. Set {variable} to another path for the export (a new file), or unset "
            "it to write no export."
        )


def is_export(path: Path) -> bool:
    with duckdb.connect(str(path), read_only=True) as conn:
        return table_exists(conn, EXPORT_MARKER)


_REMEDIES: dict[int, str] = {
    **dict.fromkeys((errno.ENOSPC, errno.EDQUOT), "Free disk space in {folder}"),
    **dict.fromkeys(
        (errno.EACCES, errno.EPERM), "Let the user running the refresh write to {folder}"
    ),
    errno.EROFS: "Mount {folder} read-write",
    **dict.fromkeys((errno.EXDEV, errno.EBUSY), "Mount the folder {folder}, not the file {file}"),
}


def _failure(target: Path, exc: BaseException, variable: str) -> ExportError:
    # DuckDB reports the reason as text, the system's own (``os.strerror``), not as errno.
    code = getattr(exc, "errno", None) or next(
        (c for c in _REMEDIES if os.strerror(c).lower() in str(exc).lower()), None
    )
    remedy = _REMEDIES.get(code or 0, "Fix the cause in {folder}")
    name = f" ({errno.errorcode.get(code, code)})" if code else ""
    return ExportError(
        f"Exporting the lake to {target} ({variable}) failed: "
        f"{getattr(exc, 'strerror', None) or exc}{name}. The lake's snapshot stays committed and "
        f"the previous export whole: {remedy.format(folder=target.parent, file=target.name)}, "
        "then run again."
    )


def export_snapshot(lake: Lake, target: Path, config: DuckDBConfig | None = None) -> dict[str, Any]:
    """One snapshot into a new DuckDB file, renamed over ``target`` atomically; blocks no one."""
    started = time.monotonic()
    check_export_target(target, lake)
    sweep_dead_exports(target)
    temporary = target.with_name(f".{target.name}{EXPORT_INFIX}{secrets.token_hex(4)}")
    try:
        with connect(lake, config, read_only=True) as conn:
            conn.execute(
                # Read by DuckDB from 1.2 on; compresses the raw payloads (v1.0.0: ~6x larger).
                f"ATTACH {sql_literal(str(temporary))} AS fieldsales_export "
                "(STORAGE_VERSION 'v1.2.0'); BEGIN TRANSACTION"
            )
            (snapshot,) = one_row(conn, "SELECT id FROM current_snapshot()")
            tables = _copy_tables(conn, lake, snapshot)
            conn.execute("COMMIT; DETACH fieldsales_export")
        with open(temporary, "rb") as file:
            os.fsync(file.fileno())
        pause_at("export")
        check_export_target(target, lake)  # a program may have opened it meanwhile
        os.replace(temporary, target)
        fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException as exc:
        _remove(temporary)
        if isinstance(exc, duckdb.Error | OSError):  # an ExportError names its cause already
            raise _failure(target, exc, lake.named(EXPORT_VARIABLE)) from exc
        raise
    return {
        "fieldsales/export_path": str(target),
        "fieldsales/snapshot_id": int(snapshot),
        "fieldsales/tables": tables,
        "fieldsales/bytes": target.stat().st_size,
        "fieldsales/seconds": round(time.monotonic() - started, 3),
    }


def _copy_tables(conn: duckdb.DuckDBPyConnection, lake: Lake, snapshot: int) -> int:
    found = conn.execute(
        "SELECT schema_name || '.' || table_name FROM duckdb_tables() WHERE database_name = ? "
        "AND NOT starts_with(table_name, '_stage_') ORDER BY ALL",
        [lake.alias],
    ).fetchall()
    for (table,) in found:
        conn.execute(
            f"CREATE SCHEMA IF NOT EXISTS fieldsales_export.{quote_ident(table.split('.')[0])}; "
            f"CREATE TABLE fieldsales_export.{qualified(table)} AS "
            f"SELECT * FROM {quote_ident(lake.alias)}.{qualified(table)}"
        )
    conn.execute(
        f"CREATE SCHEMA IF NOT EXISTS fieldsales_export.meta; CREATE TABLE fieldsales_export."
        f"{EXPORT_MARKER} AS SELECT {snapshot} AS snapshot_id, now() AS exported_at, "
        f"{sql_literal(lake.catalog)} AS catalog"
    )
    return len(found)


def sweep_dead_exports(target: Path) -> None:
    for temporary in target.parent.glob(f".{target.name}{EXPORT_INFIX}*"):
        with contextlib.suppress(FileNotFoundError):  # another sweep was first
            if time.time() - temporary.stat().st_mtime > DEAD_EXPORT_AGE_S:
                _remove(temporary)


def _remove(temporary: Path) -> None:
    for path in (temporary, Path(f"{temporary}.wal")):
        path.unlink(missing_ok=True)


def analyst_sql(lake: Lake) -> str:
    """SQL that opens ``lake`` read-only, offline, in a DuckDB client (``duckdb -init``)."""
    scanner = "postgres" if lake.is_postgres else "sqlite"
    lines = [
        "SET autoinstall_known_extensions = false;",
        "SET autoload_known_extensions = false;",
        f"SET extension_directory = {sql_literal(str(extension_directory()))};",
        f"INSTALL {sql_literal(str(extension_file(scanner)))};",
        f"LOAD {scanner}_scanner;",
        f"LOAD {sql_literal(str(extension_file('ducklake')))};",
    ]
    if lake.is_postgres:
        lines.append(
            f"-- the password: CREATE TEMPORARY SECRET (TYPE postgres, PASSWORD '...'); "
            f"(from {lake.password_env_var})"
        )
    if lake.is_s3:
        lines += [
            f"LOAD {sql_literal(str(extension_file('httpfs')))};",
            f"-- the object store's keys (from {' and '.join(lake.store.key_variables()[:2])}): "
            f"{lake.store.secret_sql(keys=('...', '...'))};",
        ]
    lines += [f"{statement};" for statement in reader_statements(lake)]
    return "\n".join([*lines, f"USE {quote_ident(lake.alias)};", ""])


def main() -> None:
    """Print ``analyst_sql`` for the lake the environment names, or the default one."""
    env = {name: value.strip() for name, value in os.environ.items() if value.strip()}
    catalog = env.get(CATALOG_VARIABLE) or DEFAULT_CATALOG
    endpoint = env.get(ENDPOINT_VARIABLE)
    try:
        store = ObjectStore(
            endpoint_origin(endpoint, ENDPOINT_VARIABLE) if endpoint else None,
            env.get("FIELDSALES_S3_REGION"),
            env.get("FIELDSALES_S3_URL_STYLE"),
        ).or_aws()
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    data_path = env.get(DATA_PATH_VARIABLE) or default_data_path(catalog)
    print(analyst_sql(Lake(check_catalog(catalog), data_path, store=store)), end="")


if __name__ == "__main__":
    main()
