"""The warehouse resource: settings and connections; the lake itself is ``warehouse/lake.py``."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import dagster as dg
import duckdb
from pydantic import Field, PrivateAttr, field_validator, model_validator

from fieldsales_dagster.catalogs import DEFAULT_CATALOG
from fieldsales_dagster.heap import release_free_memory
from fieldsales_dagster.paths import check_file_setting, check_folder_setting, setting_error
from fieldsales_dagster.settings import (
    PiiSettings,
    RefreshSettings,
    StorageSettings,
    memory_megabytes,
    settings_resource,
    variables_named,
)
from fieldsales_dagster.warehouse.lake import (
    S3_PREFIX,
    DuckDBConfig,
    Lake,
    ObjectStore,
    check_tenant,
    connect,
    default_data_path,
    export_snapshot,
    record_evaluation,
    run_transaction,
    writer_connection,
)
from fieldsales_dagster.warehouse.lake import table_exists as table_exists  # its users' import
from fieldsales_dagster.warehouse.pii import check_hash_key
from fieldsales_dagster.warehouse.quoting import qualified, quote_ident, sql_literal
from fieldsales_dagster.warehouse.rows import one_row

T = TypeVar("T")
CATALOG = "ducklake_catalog"
WAREHOUSE_SETTINGS = (StorageSettings, PiiSettings, RefreshSettings)

#: A ``pid-<pid>`` folder per process in ``local_folder``, so a killed process's spills are found
#: and removed.
PROCESS_DIR_PREFIX = "pid-"
#: An in-memory database: what a run's steps share (a schema per run), never the lake.
SHARED_DATABASE = "fieldsales_shared"
_CLEANED: set[Path] = set()


def remove_dead_processes_files(folder: Path) -> list[str]:
    """Remove gone processes' ``pid-<pid>`` folders; returns those that held files (a killed
    run's spills: a normal end leaves its folder empty)."""
    removed = []
    for path in sorted(folder.glob(f"{PROCESS_DIR_PREFIX}*")):
        pid = path.name.removeprefix(PROCESS_DIR_PREFIX)
        if not pid.isdigit() or int(pid) == os.getpid() or _alive(int(pid)):
            continue
        if any(item.is_file() for item in path.rglob("*")):
            removed.append(str(path))
        shutil.rmtree(path, ignore_errors=True)
    return removed


def _alive(pid: int) -> bool:
    try:
        with contextlib.suppress(PermissionError):  # another user's process
            os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def release_step_memory(
    conn: duckdb.DuckDBPyConnection, memory_limit: str, limit_bytes: float
) -> None:
    """Empty DuckDB's pool of what ended steps left above a quarter of the limit (below it,
    loading the pool again costs more than it frees: every step of the 88k run, ~1 s in 14).

    Lowering the limit evicts what no running query holds (1M: peak 630 -> 584 MiB;
    docs/performance.md); the limit is then set back. Asked in a new cursor, whose database is
    not the lake: a query there reads the lake's catalog first (~3 ms, at every step).
    """
    with conn.cursor() as memory:
        query = "SELECT coalesce(sum(memory_usage_bytes), 0) FROM duckdb_memory()"
        (cached,) = one_row(memory, query)
    if cached > 0.25 * limit_bytes:
        with contextlib.suppress(duckdb.OutOfMemoryException):  # pinned by a running query
            conn.execute("SET memory_limit = '1MB'")
        conn.execute(f"SET memory_limit = {sql_literal(memory_limit)}")
    release_free_memory()


class FieldSalesWarehouse(settings_resource("WarehouseSettings", *WAREHOUSE_SETTINGS)):  # type: ignore[misc]
    """The project's DuckLake: the tables every asset writes and analysts read. It takes every
    ``storage:``, ``pii:`` and ``refresh:`` setting by its flat name (``ducklake_catalog``,
    ``pii``, ``refresh_mode``, ...).
    """

    tenant: str | None = Field(
        None, description="Who the lake belongs to (recorded on first use; None: not checked)."
    )
    threads: int | None = Field(
        default=None,
        ge=1,
        le=256,
        description="DuckDB threads (default: all cores); a step rebuilding a lake table: one.",
    )
    pii_hash_key: str | None = Field(
        default=None,
        description="The secret key of pii=hash (FIELDSALES_PII_HASH_KEY), 16 characters or more.",
    )
    max_shrink_fraction: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description="Largest share of a raw table's rows a full refresh may drop.",
    )

    #: This run's shared tables built so far, each with what it was built from (not a setting).
    _shared: dict[str, object] = PrivateAttr(default_factory=dict)
    _run_schema: str = PrivateAttr(
        default_factory=lambda: f"{SHARED_DATABASE}.run_{uuid.uuid4().hex}"
    )
    _in_run: bool = PrivateAttr(default=False)

    @field_validator("ducklake_catalog")
    @classmethod
    def _blank_catalog_is_unset(cls, value: str | None) -> str | None:
        return value.strip() or None if value else None

    @model_validator(mode="before")
    @classmethod
    def _check_hash_key(cls, given: Any) -> Any:
        # An EnvVar (the component's way) is read now, so that a missing key fails the load.
        if isinstance(given, dict) and given.get("pii") == "hash":
            if isinstance(key := given.get("pii_hash_key"), dg.EnvVar):
                check_hash_key(os.environ.get(key.env_var_name), key.env_var_name)
            else:
                check_hash_key(key)
        return given

    @property
    def lake(self) -> Lake:
        catalog = self.ducklake_catalog or DEFAULT_CATALOG
        keys = (self.s3_access_key_id_env_var, self.s3_secret_access_key_env_var)
        store = ObjectStore(self.s3_endpoint, self.s3_region, self.s3_url_style, *keys)
        return Lake(
            catalog=catalog,
            data_path=self.ducklake_data_path or default_data_path(catalog),
            schema=self.ducklake_schema,
            password_env_var=self.ducklake_password_env_var,
            data_path_is_default=not self.ducklake_data_path,
            tenant=self.tenant,
            store=store.or_aws() if str(self.ducklake_data_path).startswith(S3_PREFIX) else store,
            variables=self.variables,
        )

    @property
    def local_folder(self) -> Path:
        """DuckDB's spills: beside a SQLite catalog, else in the temporary folder; one per lake."""
        here = self.lake
        base = here.catalog_file.parent if here.catalog_file else Path(tempfile.gettempdir())
        key = hashlib.sha256(f"{here.catalog}\0{here.schema or ''}".encode()).hexdigest()[:16]
        return base / ".fieldsales_tmp" / f"lake-{key}"

    def preflight(self) -> None:
        """Check, as the definitions load, that this user can write the catalog, the data folder
        and the temporary folder (room for the memory limit). An ``s3://`` path and a missing
        data folder are checked as a writer connects (``prepare``): they fail the run, not the
        code location."""
        lake, spill, limit = self.lake, self.local_folder, self.duckdb_memory_limit
        if lake.catalog_file is not None:
            catalog = check_file_setting(lake.catalog_file, setting=CATALOG, create_dirs=True)
            if catalog.exists() and not os.access(catalog, os.W_OK):
                why = f"{catalog} is a file this user (uid {os.getuid()}) cannot write"
                raise setting_error(CATALOG, f"{why}. Give it write access")
        if lake.is_local:
            check_folder_setting(lake.data_folder, setting="ducklake_data_path")
        existing = check_folder_setting(spill, setting=CATALOG, what="its temporary folder ")
        if (free := shutil.disk_usage(existing).free) < memory_megabytes(limit) * 1e6:
            raise setting_error(
                "duckdb_memory_limit",
                f"DuckDB may spill up to {limit} to the lake's temporary folder {spill} ({free:,}"
                f" bytes free). Free space in {existing}, lower the limit, or move the catalog",
            )

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        # Once per run with the in-process executor (per step's process with another).
        self._in_run = True

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        self.drop_shared()
        self._in_run = False

    @property
    def in_run(self) -> bool:
        """A run set the resource up: its shared tables last until its end."""
        return self._in_run

    def shared_table(self, name: str) -> str:
        """Where the run's steps share ``name`` (``SHARED_DATABASE``), seen by every cursor."""
        return f"{self._run_schema}.{quote_ident(name)}"

    def share(
        self, conn: duckdb.DuckDBPyConnection, name: str, source: object, query: Callable[[], str]
    ) -> int | None:
        """Build ``name`` from ``query()`` where the run's steps share it, and return its row count;
        ``None`` if this run built it from ``source`` (not ``None``) already."""
        if source is not None and self._shared.get(name) == source:
            return None
        conn.execute(f"ATTACH IF NOT EXISTS ':memory:' AS {SHARED_DATABASE}")
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {self._run_schema}")
        conn.execute(f"CREATE OR REPLACE TABLE {self.shared_table(name)} AS\n{query()}")
        self._shared[name] = source
        return one_row(conn, f"SELECT count(*) FROM {self.shared_table(name)}")[0]

    def drop_shared(self, conn: duckdb.DuckDBPyConnection | None = None) -> None:
        """Drop this run's shared tables (they may hold personal values)."""
        if not self._shared:
            return
        self._shared.clear()
        with contextlib.nullcontext(conn) if conn is not None else self.get_connection() as cursor:
            cursor.execute(f"DROP SCHEMA IF EXISTS {self._run_schema} CASCADE")

    def one_commit(
        self,
        conn: duckdb.DuckDBPyConnection,
        table: str,
        write: Callable[[], T],
        reads: Sequence[str] = (),
        wrote: Callable[[T], bool] = lambda result: True,
        fingerprint: str | None = None,
    ) -> T:
        """``write`` of ``table`` in one transaction (one snapshot), recording the tables it
        ``reads`` and its ``fingerprint`` unless it ``wrote`` nothing to ``table`` (the tables
        built from it stay current), and, on the first commit, the tenant."""

        def write_and_record() -> T:
            result = write()
            if wrote(result):
                record_evaluation(conn, table, reads, fingerprint)
            check_tenant(conn, self.lake, record=True)
            return result

        return run_transaction(conn, table, write_and_record)

    def get_connection(self, builds: str | None = None) -> duckdb.DuckDBPyConnection:
        """A read-write connection whose current database is the lake; ``with`` closes it. It
        works on ``threads``; a project step that ``builds`` a table the lake already holds, on
        one: its statements are small (catalog reads, what changed), and on two threads each
        cost about twice the CPU (docs/performance.md)."""
        if self.local_folder not in _CLEANED:
            self.preflight()
            if removed := remove_dead_processes_files(self.local_folder):
                dg.get_dagster_logger().info(f"Removed what killed runs left: {', '.join(removed)}")
            _CLEANED.add(self.local_folder)
        # Threads are set below, on each connection: warehouses asking others share the instance.
        config = {name: value for name, value in self._config().items() if name != "threads"}
        conn = writer_connection(self.lake, config)
        threads = 1 if builds is not None and table_exists(conn, builds) else self.threads
        conn.execute(f"SET threads = {threads}" if threads else "RESET threads")
        limit = self.duckdb_memory_limit
        release_step_memory(conn, limit, memory_megabytes(limit) * 1e6)
        return conn

    def read_connection(self) -> duckdb.DuckDBPyConnection:
        """Read-only, at the last complete refresh, as an analyst opens it; ``with`` closes it."""
        return connect(self.lake, self._config(), read_only=True)

    def _config(self) -> DuckDBConfig:
        mine = self.local_folder / f"{PROCESS_DIR_PREFIX}{os.getpid()}"
        mine.mkdir(parents=True, exist_ok=True)  # DuckDB makes the last folder of its own only
        options = {"memory_limit": self.duckdb_memory_limit, "threads": self.threads}
        options["temp_directory"] = str(mine / "db.tmp")
        return {k: v for k, v in options.items() if v is not None}

    def export(self) -> dict[str, Any] | None:
        """One snapshot to ``duckdb_path`` (``export_snapshot``); ``None`` when it is not set."""
        if not self.duckdb_path:
            return None
        # As the component checks it, for a warehouse built by hand; resolved, a link stays.
        with variables_named(self.variables):
            dirs = self.create_dirs
            target = check_file_setting(
                self.duckdb_path, setting="duckdb_path", create_dirs=dirs, create=dirs
            )
        return export_snapshot(self.lake, target, self._config())


#: A table being built sits beside its target until swapped in; a killed run's is recognised.
STAGE_PREFIX = "_stage_"


def staging_table(target: str, suffix: str = "") -> str:
    schema, _, name = target.partition(".")
    return f"{schema}.{STAGE_PREFIX}{name}{suffix}"


def replace_table(conn: duckdb.DuckDBPyConnection, staged: str, target: str) -> None:
    """Swap a built staging table (same schema) in for ``target`` in one transaction."""
    drop = f"DROP TABLE IF EXISTS {qualified(target)}"
    rename = f"ALTER TABLE {qualified(staged)} RENAME TO {quote_ident(target.partition('.')[2])}"
    run_transaction(conn, target, lambda: conn.execute(f"{drop}; {rename}"))
