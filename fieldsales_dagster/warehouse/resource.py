"""The DuckDB files: the pipeline's working database, and the analysts' copy it publishes.

DuckDB allows one read-write process per file, or any number of read-only ones, never both. So
the pipeline never opens the file analysts read (``database``, FIELDSALES_DUCKDB_PATH): every
asset writes its own working database beside it (``working_database``, by default
``<name>.working.duckdb``), one writer at a time behind a lock file. The run's publish step
(``assets/publish.py``), after its last writer, publishes the working database: checkpointed,
copied to a temporary file beside ``database``, fsynced, and renamed over ``database`` in one
atomic step. A reader holding the old file keeps its consistent snapshot (the old inode); a
connection opened after the rename sees the new tables; no reader ever makes a refresh wait, or
sees a mix of old and new tables.

A MotherDuck database (``md:...``) is shared by the service itself: assets connect to it directly,
without the local lock, the working copy or the publish step.

``storage: ducklake`` keeps the warehouse in a DuckLake instead (``warehouse/lake.py``): a catalog
database (PostgreSQL for several machines) and Parquet files under ``ducklake_data_path``. Readers
see the last committed snapshot, so there is no working copy and no publish either: every asset
writes the lake directly, each table change in one transaction retried on a conflict
(``run_transaction``), and the asset pools keep one writer per table.
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal, TypeVar

import dagster as dg
import duckdb
import filelock
import tenacity
from pydantic import Field, field_validator, model_validator

from fieldsales_dagster.paths import PathSettingError, check_file_setting, resolved
from fieldsales_dagster.pause import pause_at
from fieldsales_dagster.settings import setting_field
from fieldsales_dagster.warehouse.lake import (
    DuckDBConfig,
    Lake,
    run_transaction,
    writer_connection,
)
from fieldsales_dagster.warehouse.refresh_mode import RefreshMode, validate_refresh_mode
from fieldsales_dagster.warehouse.rows import one_row

T = TypeVar("T")

MOTHERDUCK_PREFIX = "md:"
#: Suffix of the working database's stem: ``fieldsales.duckdb`` -> ``fieldsales.working.duckdb``.
WORKING_SUFFIX = ".working"
#: The schemas the project writes and rebuilds. Anything else in the database (``analytics``, a
#: team's own schema) belongs to its users: carried along by every publish, never dropped.
PROJECT_SCHEMAS = frozenset({"raw", "core", "mart", "meta"})
#: Temporary files, named so the next run recognises a dead run's: the working database being
#: seeded (``<working>.seeding``) and a publish's copy (``.<database>.publish-<hex>``).
SEEDING_SUFFIX = ".seeding"
PUBLISH_INFIX = ".publish-"
#: Spool files of raw loads: ``<folder>/.fieldsales_spool/<working database's name>/``.
SPOOL_DIR_NAME = ".fieldsales_spool"
#: A lake's local folder beside duckdb_path (``lake_local_folder``).
LAKE_LOCAL_DIR_NAME = ".duckdb_tmp"


def lake_local_folder(database: str) -> Path:
    """``storage: ducklake``: where ``database`` (duckdb_path) places the only local files, DuckDB's
    spills and the raw loads' spools: ``<its folder>/.duckdb_tmp``. No DuckDB file is written."""
    return Path(database).parent / LAKE_LOCAL_DIR_NAME


class WarehouseBusyError(RuntimeError):
    """Another program holds the DuckDB file."""


class WarehousePathError(ValueError):
    """``database`` points somewhere the pipeline cannot write (see ``paths.py``)."""


class PublishError(RuntimeError):
    """The analysts' copy could not be replaced; it is left as it was."""


def is_motherduck(database: str) -> bool:
    return database.startswith(MOTHERDUCK_PREFIX)


def _is_lock_conflict(exc: BaseException) -> bool:
    return isinstance(exc, duckdb.IOException) and "lock" in str(exc).lower()


@dataclass(frozen=True)
class Publication:
    """One publish of the working database over the analysts' copy."""

    path: Path
    published_at: datetime
    seconds: float
    bytes: int
    copy_method: str

    def metadata(self) -> dict[str, dg.MetadataValue]:
        return {
            "fieldsales/published_path": dg.MetadataValue.path(str(self.path)),
            "fieldsales/published_at": dg.MetadataValue.timestamp(self.published_at),
            "fieldsales/publish_seconds": dg.MetadataValue.float(round(self.seconds, 3)),
            "fieldsales/published_bytes": dg.MetadataValue.int(self.bytes),
            "fieldsales/published_megabytes": dg.MetadataValue.float(round(self.bytes / 1e6, 1)),
            "fieldsales/publish_copy_method": dg.MetadataValue.text(self.copy_method),
        }


class FieldSalesWarehouse(dg.ConfigurableResource):
    """The project's DuckDB database: a working file the assets write, and the analysts' copy.

    Assets call ``get_connection()``, which opens the working database; assets of this project
    queue on a lock file beside it (``<working database>.lock``) so that Dagster may run them in
    parallel processes. ``publish()`` replaces ``database`` with the working database (see the
    module docstring); every run that wrote calls it in its publish step.
    """

    database: str = setting_field("duckdb_path")
    working_database: str | None = Field(
        default=None,
        description=(
            "The pipeline's own DuckDB file, never to be opened by another program; default: "
            "beside database, named <name>.working.duckdb. Must be on the same file system as "
            "database for a cheap copy."
        ),
    )
    storage: Literal["file", "ducklake"] = setting_field("storage")
    ducklake_catalog: str | None = setting_field("ducklake_catalog")
    ducklake_data_path: str | None = setting_field("ducklake_data_path")
    ducklake_schema: str | None = setting_field("ducklake_schema")
    ducklake_password_env_var: str = setting_field("ducklake_password_env_var")
    memory_limit: str = setting_field("duckdb_memory_limit")
    threads: int | None = Field(
        default=None, ge=1, le=256, description="DuckDB threads (default: all cores)."
    )
    lock_timeout_s: float = Field(
        default=3600.0,
        gt=0,
        description="How long an asset waits for another asset of this project to finish writing.",
    )
    busy_timeout_s: float = Field(
        default=30.0,
        ge=0,
        description=(
            "How long to retry when a program outside this project holds the working database."
        ),
    )
    pii: Literal["keep", "hash", "drop"] = setting_field("pii")
    pii_hash_key: str | None = Field(
        default=None,
        description=(
            "FIELDSALES_PII_HASH_KEY: the secret key of pii=hash, at least 16 characters. Give it "
            "as an environment variable, never in YAML; a new key gives every value a new hash."
        ),
    )
    redact_pii_in_raw: bool = setting_field("redact_pii_in_raw")
    create_dirs: bool = setting_field("create_dirs")
    # Refresh modes of raw.transactions (see warehouse/incremental.py and the README).
    refresh_mode: RefreshMode = setting_field("refresh_mode")
    full_refresh_every_days: float = setting_field("full_refresh_every_days")
    lookback_days: float = setting_field("lookback_days")
    max_shrink_fraction: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description=(
            "Largest share of a raw table's rows a full refresh may drop (0.5: half). A refresh "
            "that would shrink it more, or empty a non-empty table, fails and keeps the old one."
        ),
    )

    @field_validator("refresh_mode", mode="before")
    @classmethod
    def _check_refresh_mode(cls, value: object) -> object:
        return validate_refresh_mode(value)

    @model_validator(mode="after")
    def _hash_needs_a_key(self) -> FieldSalesWarehouse:
        if self.pii == "hash" and not self.pii_hash_key:
            raise ValueError(
                "pii='hash' (FIELDSALES_PII=hash) needs pii_hash_key: set "
                "FIELDSALES_PII_HASH_KEY to a secret of at least 16 characters, or choose "
                "pii='keep' or 'drop'."
            )
        return self

    @model_validator(mode="after")
    def _lake_needs_a_place(self) -> FieldSalesWarehouse:
        if self.storage == "ducklake" and not (self.ducklake_catalog and self.ducklake_data_path):
            raise ValueError(
                "storage='ducklake' (FIELDSALES_STORAGE=ducklake) needs ducklake_catalog "
                "(FIELDSALES_DUCKLAKE_CATALOG) and ducklake_data_path "
                "(FIELDSALES_DUCKLAKE_DATA_PATH): set both, or choose storage='file'."
            )
        return self

    # --- where things live --------------------------------------------------------------------

    @property
    def is_motherduck(self) -> bool:
        return is_motherduck(self.database)

    @property
    def is_lake(self) -> bool:
        return self.storage == "ducklake"

    @property
    def lake(self) -> Lake | None:
        """Where the DuckLake lives (storage: ducklake); ``None`` for a DuckDB file."""
        if not self.is_lake:
            return None
        assert self.ducklake_catalog and self.ducklake_data_path
        return Lake(
            catalog=self.ducklake_catalog,
            data_path=self.ducklake_data_path,
            schema=self.ducklake_schema,
            password_env_var=self.ducklake_password_env_var,
            alias=Path(self.database).stem,
        )

    @property
    def published_path(self) -> Path | None:
        """The analysts' file, symlinks followed: a publish replaces the link's target, and the
        link stays. ``None`` for MotherDuck and DuckLake (written in place)."""
        return None if self.is_motherduck or self.is_lake else resolved(self.database)

    @property
    def working_path(self) -> Path | None:
        """The file assets write, beside the analysts' file; ``None`` for MotherDuck."""
        published = self.published_path
        if published is None:
            return None
        if self.working_database:
            return Path(self.working_database)
        return published.with_name(f"{published.stem}{WORKING_SUFFIX}{published.suffix}")

    @property
    def lock_path(self) -> Path | None:
        """The lock file writers of this project queue on; ``None`` for MotherDuck, and for a
        lake whose catalog several processes may open at once (PostgreSQL, SQLite)."""
        here = self.lake
        if here is not None:
            only_one = here.catalog_file is not None and not here.is_sqlite
            return Path(f"{here.catalog_file}.lock") if only_one else None
        working = self.working_path
        return None if working is None else Path(f"{working}.lock")

    # --- connections --------------------------------------------------------------------------

    def one_commit(self, conn: duckdb.DuckDBPyConnection, table: str, write: Callable[[], T]) -> T:
        """An asset's ``write`` of ``table`` and its state: on a lake one transaction, so one
        snapshot, retried whole on a conflict (``run_transaction``); on a file as it is, since
        the run's publish shows a run's writes to analysts at once."""
        return run_transaction(conn, table, write) if self.is_lake else write()

    @contextmanager
    def get_connection(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A read-write connection to the working database (MotherDuck: to ``database``)."""
        here = self.lake
        if here is not None:
            with self._writer_lock() if self.lock_path is not None else nullcontext():
                conn = writer_connection(here, self._config(self._lake_tmp(here)))
                try:
                    yield conn
                finally:
                    conn.close()
            return
        working = self.working_path
        if working is None:
            conn = duckdb.connect(self.database, config=self._config(None))
            try:
                yield conn
            finally:
                conn.close()
            return
        with self._writer_lock():
            self._seed_from_published(working)
            conn = self._connect(working)
            try:
                if removed := drop_stale_stages(conn):
                    dg.get_dagster_logger().info(
                        f"Removed what an interrupted run left in {working}: {', '.join(removed)}"
                    )
                yield conn
            finally:
                conn.close()

    def _lake_tmp(self, here: Lake) -> Path:
        """A local folder for a lake's spills and spools, one per tenant's lake."""
        return lake_local_folder(self.database) / f"lake-{here.key}" / "db"

    @contextmanager
    def _writer_lock(self) -> Iterator[None]:
        lock_path = self.lock_path
        assert lock_path is not None
        working = self.working_path
        is_file = working is not None
        if working is None:  # a lake's DuckDB-file catalog: the lock sits beside it
            lock_path.parent.mkdir(parents=True, exist_ok=True)
            working = lock_path.with_suffix("")
        else:
            self._check_folders(working)
        lock = filelock.FileLock(str(lock_path), timeout=self.lock_timeout_s)
        try:
            lock.acquire()
        except filelock.Timeout as exc:
            raise WarehouseBusyError(
                f"Waited {self.lock_timeout_s:.0f} s for another asset to finish writing "
                f"{working}; raise lock_timeout_s or look for a stuck run holding {lock_path}."
            ) from exc
        try:
            # A dead run's working-copy and publish files exist only beside a DuckDB file.
            if is_file and (removed := self._remove_dead_runs_files(working)):
                dg.get_dagster_logger().info(
                    f"Removed what an interrupted run left: {', '.join(removed)}"
                )
            yield
        finally:
            lock.release()

    def _remove_dead_runs_files(self, working: Path) -> list[str]:
        """The files dead runs left, by their own name patterns; returns what went.

        Called holding the writer lock: a live run writes these only while it holds the lock
        (seeding, loading, building, publishing), so every one found now is a dead run's.
        """
        published = self.published_path
        assert published is not None
        stale = [
            working.with_name(f"{working.name}{SEEDING_SUFFIX}"),
            *published.parent.glob(f".{published.name}{PUBLISH_INFIX}*"),
        ]
        if not working.exists():  # a log without its database: a seeding cut short
            stale.append(Path(f"{working}.wal"))
        for folder in (self._temp_directory(working), spool_folder(working)):
            if folder.is_dir():
                stale.extend(folder.iterdir())
        removed = []
        for path in stale:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)  # a leftover that cannot be removed fails the step, named
            elif path.exists() or path.is_symlink():
                path.unlink(missing_ok=True)
            else:
                continue
            removed.append(str(path))
        return removed

    def _temp_directory(self, working: Path) -> Path:
        """Where DuckDB spills: one folder per working database, so it is cleaned under its lock."""
        return working.with_name(f"{working.name}.tmp")

    def _check_folders(self, working: Path) -> None:
        """Fail at once, naming the setting, unless the analysts' folder can take the file."""
        try:
            check_file_setting(
                self.database,
                setting="duckdb_path",
                variable="FIELDSALES_DUCKDB_PATH",
                create_dirs=self.create_dirs,
                create=True,
            )
        except PathSettingError as exc:
            raise WarehousePathError(str(exc)) from None
        if self.working_database and self.create_dirs:
            working.parent.mkdir(parents=True, exist_ok=True)

    def _config(self, path: Path | None) -> DuckDBConfig:
        config: DuckDBConfig = {
            "memory_limit": self.memory_limit,
            "preserve_insertion_order": False,
        }
        if path is not None:
            config["temp_directory"] = str(self._temp_directory(path))
        if self.threads:
            config["threads"] = self.threads
        return config

    def _connect(self, path: Path) -> duckdb.DuckDBPyConnection:
        """Open ``path``, retrying while another program holds it, for ``busy_timeout_s``."""
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception(_is_lock_conflict),
            stop=tenacity.stop_after_delay(self.busy_timeout_s),
            wait=tenacity.wait_exponential(multiplier=0.1, max=2.0),
            reraise=True,
        )
        try:
            return retrying(_open_database, path, self._config(path))
        except duckdb.IOException as exc:
            if not _is_lock_conflict(exc):
                raise
            raise WarehouseBusyError(
                f"Another program holds the pipeline's working DuckDB file {path} (DuckDB: "
                f"{exc}). Only this project may open it: close that program (analysts read "
                f"{self.database} instead), then run again."
            ) from exc

    def _seed_from_published(self, working: Path) -> None:
        """First run after the single-file layout: start from the analysts' existing file.

        Copies the file (and its write-ahead log, if the old layout left one) rather than moving
        it, so readers holding it keep reading. The stale log is removed afterwards: the next
        publish replaces the file it belonged to.
        """
        published = self.published_path
        assert published is not None
        if working.exists() or not published.exists():
            return
        partial = working.with_name(f"{working.name}{SEEDING_SUFFIX}")
        _copy_file(published, partial)
        pause_at("seeding")
        wal = Path(f"{published}.wal")
        if wal.exists():
            _copy_file(wal, Path(f"{working}.wal"))
        os.replace(partial, working)
        _fsync_dir(working.parent)

    # --- publishing ---------------------------------------------------------------------------

    def publish(self) -> Publication | None:
        """Replace ``database`` with a checkpointed copy of the working database.

        Holds the writer lock while it checkpoints and copies, so the copy is one consistent
        state. Returns ``None`` for MotherDuck (nothing to publish) or when there is no working
        database yet. Raises ``PublishError`` (naming the file, the reason and the space a
        publish needs) when ``database`` could not be replaced; it is then left as it was.
        """
        working = self.working_path
        if working is None:
            return None
        published = self.published_path
        assert published is not None
        temporary = published.with_name(f".{published.name}{PUBLISH_INFIX}{secrets.token_hex(4)}")
        started = time.monotonic()
        with self._writer_lock():
            if not working.exists():
                return None
            conn = self._connect(working)
            try:
                conn.execute("CHECKPOINT")
            except duckdb.Error as exc:
                raise PublishError(
                    f"Publishing {working} to {published} failed: checkpointing the working "
                    f"database failed (DuckDB: {exc}); analysts keep the previous {published}. "
                    f"Free space beside {working} and run the refresh again."
                ) from exc
            finally:
                conn.close()
            try:
                method = _copy_file(working, temporary)
                size = temporary.stat().st_size
                pause_at("publish")
                # A log left by the single-file layout would be replayed onto the new file.
                Path(f"{published}.wal").unlink(missing_ok=True)
                os.replace(temporary, published)
                _fsync_dir(published.parent)
            except OSError as exc:
                temporary.unlink(missing_ok=True)
                raise PublishError(_publish_failure(working, published, exc)) from exc
        return Publication(
            path=published,
            published_at=datetime.now(UTC),
            seconds=time.monotonic() - started,
            bytes=size,
            copy_method=method,
        )


#: What to do about a failed publish, by the reason the operating system gave.
#: By ``OSError.errno`` (``None`` for an error without one).
_PUBLISH_REMEDIES: dict[int | None, str] = {
    errno.ENOSPC: "Free disk space in {folder} (or grow the volume)",
    errno.EDQUOT: "Raise the disk quota of {folder} or free space in it",
    errno.EACCES: "Let the user running the refresh write to {folder} (and replace {file})",
    errno.EPERM: "Let the user running the refresh write to {folder} (and replace {file})",
    errno.EROFS: "Mount {folder} read-write",
    errno.EXDEV: "Mount the folder {folder}, not the file {file} on its own",
    errno.EBUSY: "Mount the folder {folder}, not the file {file} on its own",
}


def _publish_failure(working: Path, published: Path, exc: OSError) -> str:
    """The message of a failed publish: the file, the reason, the space needed, what to do."""
    folder = published.parent
    needed = working.stat().st_size if working.exists() else 0
    try:
        usage = os.statvfs(folder)
        free = f"{usage.f_bavail * usage.f_frsize / 1e6:,.1f} MB free there now"
    except OSError:
        free = "free space unknown"
    remedy = _PUBLISH_REMEDIES.get(exc.errno, "Fix the cause in {folder}").format(
        folder=folder, file=published.name
    )
    reason = exc.strerror or str(exc)
    return (
        f"Publishing the analysts' file {published} failed: {reason} "
        f"({errno.errorcode.get(exc.errno or 0, 'error')}). A publish needs "
        f"{needed / 1e6:,.1f} MB free in {folder} for a copy of {working} ({free}). Analysts "
        f"keep the previous {published}, unchanged. {remedy}, then run the refresh again: the "
        "next run publishes."
    )


#: Rows per row group of the pipeline's tables. DuckDB compresses and writes a row group as soon
#: as an insert fills one, in the inserting thread; with its default (122,880 rows, ~600 MB of raw
#: payloads) a load's rows wait in memory and are compressed in one thread at commit. 16,384 rows
#: (~80 MB of payloads) measured 2.5x faster for 100k transactions (5.5 s -> 2.2 s), and readers
#: get more row groups to scan in parallel. Set on every attach: it is not stored in the file.
ROW_GROUP_SIZE = 16384
#: The storage format a new working database (and so the analysts' copy) is written in; set
#: explicitly so that a newer DuckDB writing the file never silently moves it out of older
#: clients' reach: every DuckDB client from 1.2 on reads it (the CLI, DBeaver's driver, MotherDuck,
#: BI tools). v1.2.0, not v1.0.0: v1.0.0 stores strings longer than a few KB (the raw JSON
#: payloads, most of the file) uncompressed, 5.4 GiB at 1M demo transactions; v1.2.0 compresses
#: them with ZSTD, ~6x smaller (test_ducklake.py). Not v1.4.0: larger again (20k transactions'
#: payloads: v1.0.0 101 MiB, v1.2.0 10 MiB, v1.4.0 48 MiB), and under it the heavy tenant's event
#: decode needed more than 64MB (test_core_memory.py). Kept by an existing file: a file made
#: under v1.0.0 stays in it until it is rebuilt (README, "Storage format of the analysts' file").
STORAGE_VERSION = "v1.2.0"


def _open_database(path: Path, config: DuckDBConfig) -> duckdb.DuckDBPyConnection:
    """A connection whose default database is ``path``, attached with ``ROW_GROUP_SIZE`` (and,
    when it creates the file, ``STORAGE_VERSION``).

    The database keeps the file's stem as its name, as ``duckdb.connect(path)`` would.
    """
    conn = duckdb.connect(config=config)
    try:
        conn.execute(
            f"ATTACH '{_sql_string(str(path))}' "
            f"(ROW_GROUP_SIZE {ROW_GROUP_SIZE}, STORAGE_VERSION '{STORAGE_VERSION}')"
        )
        (name,) = one_row(
            conn,
            "SELECT database_name FROM duckdb_databases() "
            "WHERE NOT internal AND database_name <> 'memory'",
        )
        conn.execute(f"USE {quote_ident(name)}")
        conn.execute("DETACH memory")
    except BaseException:
        conn.close()
        raise
    return conn


def same_database_cursor(conn: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """A cursor of ``conn`` whose default database is ``conn``'s.

    A DuckDB 1.5 cursor starts in the connection's original default database (``memory``, which
    ``_open_database`` detached, and which a lake's connection keeps, empty), not in the one
    ``USE`` chose.
    """
    (name,) = one_row(conn, "SELECT current_database()")
    cursor = conn.cursor()
    cursor.execute(f"USE {quote_ident(name)}")
    return cursor


def _sql_string(text: str) -> str:
    return text.replace("'", "''")


#: Why ``copy_file_range`` may refuse where a plain copy works (old kernels, other file systems).
_NO_COPY_FILE_RANGE = {errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL, errno.EBADF}


def _copy_file(source: Path, target: Path) -> str:
    """Copy ``source`` to a new ``target`` and fsync it; returns how the bytes were copied.

    ``os.copy_file_range`` copies inside the kernel, and shares blocks instead of copying them on
    file systems that can (XFS, Btrfs, ZFS); where it is not supported the copy is a plain read
    and write loop.
    """
    chunk = 64 * 1024 * 1024
    with open(source, "rb") as src, open(target, "xb") as dst:
        size = os.fstat(src.fileno()).st_size
        method = "copy_file_range"
        try:
            copied = 0
            while copied < size:
                n = os.copy_file_range(src.fileno(), dst.fileno(), min(chunk, size - copied))
                if n == 0:
                    break
                copied += n
        except OSError as exc:
            if exc.errno not in _NO_COPY_FILE_RANGE:
                raise  # a full disk, say: a plain copy would fail the same way
            method = "read/write"
            src.seek(0)
            dst.seek(0)
            dst.truncate()
            while block := src.read(chunk):
                dst.write(block)
        dst.flush()
        os.fsync(dst.fileno())
    return method


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


#: Prefix of every staging table (raw loads, incremental merges, core builds): a table being
#: built sits beside its target as ``<schema>._stage_<name>`` until it is swapped in, and a
#: leftover of a killed run is recognised by the prefix.
STAGE_PREFIX = "_stage_"


def staging_table(target: str, suffix: str = "") -> str:
    """``schema.table`` -> ``schema._stage_table[suffix]``, where ``target`` is built."""
    schema, _, name = target.partition(".")
    return f"{schema}.{STAGE_PREFIX}{name}{suffix}"


def drop_stale_stages(conn: duckdb.DuckDBPyConnection) -> list[str]:
    """Drop the ``_stage_*`` tables a killed step left (in any schema); returns what went.

    Called holding the writer lock: a live step's staging table exists only while it holds it.
    """
    stale = conn.execute(
        "SELECT schema_name, table_name FROM duckdb_tables() WHERE database_name = "
        "current_database() AND NOT temporary AND starts_with(table_name, ?)",
        [STAGE_PREFIX],
    ).fetchall()
    for schema, name in stale:
        conn.execute(f"DROP TABLE IF EXISTS {quote_ident(schema)}.{quote_ident(name)}")
    return [f"{schema}.{name}" for schema, name in stale]


def spool_folder(database: Path) -> Path:
    """Where raw loads of ``database`` (a working database) spool pages."""
    database = database.resolve()
    return database.parent / SPOOL_DIR_NAME / database.name


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def qualified(table: str) -> str:
    """``schema.table`` -> ``"schema"."table"``."""
    schema, _, name = table.partition(".")
    return f"{quote_ident(schema)}.{quote_ident(name)}"


def table_exists(conn: duckdb.DuckDBPyConnection, table: str) -> bool:
    """Whether ``schema.table`` exists in the connection's current database."""
    schema, _, name = table.partition(".")
    (found,) = one_row(
        conn,
        "SELECT count(*) FROM duckdb_tables() WHERE database_name = current_database() "
        "AND schema_name = ? AND table_name = ?",
        [schema, name],
    )
    return bool(found)


def replace_table(conn: duckdb.DuckDBPyConnection, staged: str, target: str) -> None:
    """Swap a fully built staging table in for ``target`` in one transaction.

    Both are ``schema.table`` names in the same schema; readers see the old table or the new one,
    never a half-written one, and a failure before this call leaves the old table untouched. On a
    lake, a conflict with another writer is retried (``run_transaction``).
    """
    schema, _, name = target.partition(".")

    def swap() -> None:
        conn.execute(f"DROP TABLE IF EXISTS {qualified(target)}")
        conn.execute(f"ALTER TABLE {qualified(staged)} RENAME TO {quote_ident(name)}")

    run_transaction(conn, target, swap)
