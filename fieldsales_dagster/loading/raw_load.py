"""Load one list endpoint into its ``raw.*`` table: stream pages into a staging table, check, swap.

Pages go to DuckDB as bytes. Each item (already validated JSON) becomes one spool line,
``id \x01 [extra columns \x01] payload``, its ids decoded once by the pager; every
``spool_bytes`` a separate thread hands the spool to DuckDB's CSV reader (one column per
``\x01``-separated field: valid JSON never holds a raw control byte) in one ``INSERT``. An id
holding a control character (a line break, the separator) rides escaped as a JSON string and is
decoded back by the insert, so every id is stored exactly as received (``spool_field``). Fetching,
spooling and inserting overlap, and memory holds a few pages whatever the list's size; the spool
waits on disk beside the database (``<db dir>/.fieldsales_spool/``), not in memory.

The paging executor (``client/pager.py``) fills the staging table (``Staging``) and asks it
for the distinct ids after each pass; its completeness rule (``client/completeness.py``) accepts
the pass, repairs it, pages the list again, or fails saying what the server sent. The previous
table is replaced only after that, in one
transaction, and never by one that would empty it or shrink it by more than
``max_shrink_fraction`` unless ``allow_shrink``. A load starts by removing what a killed load left
behind: ``_stage_*`` tables and spool folders.
"""

from __future__ import annotations

import io
import os
import queue
import re
import tempfile
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import cast

import duckdb
import msgspec

from fieldsales_dagster.client.api import FieldSalesAPI
from fieldsales_dagster.client.endpoints import ListEndpoint
from fieldsales_dagster.client.errors import FieldSalesAPIError
from fieldsales_dagster.client.pager import (
    NAMED_IDS,
    ItemKeys,
    Limits,
    ListStats,
    Page,
    PageExecutor,
    Stream,
    id_text,
    item_digest,
    item_keys,
    key_decoder,
)
from fieldsales_dagster.loading.deletions import record_deletions
from fieldsales_dagster.pause import pause_at
from fieldsales_dagster.settings import SETTINGS
from fieldsales_dagster.warehouse.lake import drop_table, in_transaction, run_transaction
from fieldsales_dagster.warehouse.quoting import qualified, quote_ident
from fieldsales_dagster.warehouse.rows import one_row
from fieldsales_dagster.warehouse.warehouse import (
    replace_table,
    spool_folder,
    staging_table,
    table_exists,
)

#: Longest item DuckDB's reader accepts by default (``max_item_mb``): the pager refuses a longer
#: one naming it, and a raised setting gives the reader that size. The reader's buffer is twice
#: that: larger buffers measured slower and took more memory.
MAX_ITEM_BYTES = SETTINGS["max_item_mb"].default << 20
#: Room for an item's id and extra columns on its spool line.
LINE_SLACK = 64 * 1024
FIELD_SEP = b"\x01"
#: Starts a spool field that holds its id as a JSON string (see ``spool_field``).
ESCAPED_FIELD = b"\x02"
#: Characters an id cannot carry in a spool line as it is: the separators, line breaks, and (so
#: that no id that rides as it is starts with ``ESCAPED_FIELD``) every other control character.
_CONTROL = re.compile("[\x00-\x1f]")
#: Bytes of items per insert statement. Larger statements fill DuckDB row groups in the
#: inserting threads (see ``ROW_GROUP_SIZE``); 128 MB measured faster than 32 MB (2.8 -> 2.2 s for
#: 100k transactions). The spool waits on disk, not in memory.
SPOOL_BYTES = 128 * 1024 * 1024
#: Folder beside the database that holds spools while a load runs.


class RawLoadError(RuntimeError):
    """Fetched pages could not be stored."""


class ShrinkRefusedError(RawLoadError):
    """A refresh would have emptied a raw table, or shrunk it beyond the allowed fraction."""


@dataclass
class LoadReport:
    """What a load wrote and what it cost; becomes asset metadata."""

    table: str
    rows: int
    api_total: int | None
    passes: int
    pages: int
    requests: int
    retries: int
    bytes: int
    duplicates_dropped: int
    seconds: float
    #: Lone surrogate escapes replaced by U+FFFD (strings the server cut mid-emoji).
    surrogates_replaced: int = 0
    #: Rounds in which the head and tail of a list that grew were re-fetched.
    repairs: int = 0

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0


def raw_table_ddl(
    endpoint: ListEndpoint, table: str, lake: bool = False, temporary: bool = False
) -> str:
    # zstd suits ~5 KB JSON documents: measured 2.6x faster to write than DuckDB's default
    # dictionary/FSST choice for them, smaller on disk, and faster to read back. A lake's
    # Parquet files take no per-column compression (its files are zstd: see lake.py).
    extra = "".join(f", {quote_ident(col)} VARCHAR" for col, _ in endpoint.extra_columns)
    compression = "" if lake else " USING COMPRESSION zstd"
    kind = "TEMP TABLE" if temporary else "TABLE"
    return (
        f"CREATE OR REPLACE {kind} {qualified(table)} "
        f"(id VARCHAR, payload JSON{compression}, loaded_at TIMESTAMP{extra})"
    )


def _insert_sql(endpoint: ListEndpoint, table: str, max_item_bytes: int = MAX_ITEM_BYTES) -> str:
    extra = [quote_ident(col) for col, _ in endpoint.extra_columns]
    fields = ["id", *extra, "payload"]
    columns = ", ".join(f"'{name.strip(chr(34))}': 'VARCHAR'" for name in fields)
    max_line = max(max_item_bytes, MAX_ITEM_BYTES) + LINE_SLACK
    # `_id` where present; an item without one (event groups' shape is not documented) gets a
    # content hash, so identical copies collapse and distinct items stay distinct.
    return (
        f"INSERT INTO {qualified(table)} (id, payload, loaded_at{''.join(', ' + c for c in extra)})"
        f" SELECT coalesce({_unescaped('id')}, md5(payload)), payload::JSON, $loaded_at"
        f"{''.join(', ' + _unescaped(c) for c in extra)}"
        f" FROM read_csv($path, columns = {{{columns}}}, delim = chr(1), quote = '',"
        f" escape = '', header = false, auto_detect = false, nullstr = '',"
        f" max_line_size = {max_line}, buffer_size = {2 * max_line})"
    )


def _unescaped(column: str) -> str:
    """SQL giving the id a spool field holds (``spool_field``), escaped or not."""
    escaped = ESCAPED_FIELD.decode()
    return (
        f"CASE WHEN starts_with({column}, chr({ord(escaped)})) "
        f"THEN json_extract_string(substr({column}, 2), '$') ELSE {column} END"
    )


def spool_field(value: object) -> bytes:
    """An id (``_id`` or an extra column's key) as one spool field; empty where there is none.

    Ids are text (``id_text``: the JSON number 1002 is "1002"). An id holding a control
    character, a line break or the separator for example, cannot ride a spool line as it is: it
    rides as ``ESCAPED_FIELD`` + the id as a JSON string (which holds no raw control character),
    and the insert decodes it back, so the id is stored exactly as received.
    """
    text = id_text(value)
    if not text:
        return b""
    if _CONTROL.search(text):
        return ESCAPED_FIELD + msgspec.json.encode(text)
    return text.encode()


def _item_lines(items: list[msgspec.Raw], keys: list[ItemKeys]) -> bytes:
    """Spool lines built item by item: any key type, separators in ids, raw line breaks."""
    lines = []
    for item, values in zip(items, keys, strict=True):
        payload = bytes(item)
        if b"\n" in payload or b"\r" in payload:
            # Only whitespace between tokens can hold a raw line break in valid JSON.
            payload = payload.replace(b"\r", b" ").replace(b"\n", b" ")
        lines.append(FIELD_SEP.join((*(spool_field(v) for v in values), payload)))
    lines.append(b"")
    return b"\n".join(lines)


_STR_KEYS = frozenset({str, type(None)})
#: Buffers per ``writev`` call (the system's IOV_MAX is at least 1024 where it is known).
_IOV_MAX = 1024


def _page_parts(page: Page, keys: list[ItemKeys]) -> list[bytes | msgspec.Raw] | None:
    """The same lines as ``_item_lines``, as buffers to write in order, built in a few C-level
    passes over the whole page (no copy of the payloads).

    Only for the usual page: every key a string (or absent), none holding a control character
    (``spool_field`` escapes those), and a body known to hold no raw line break; ``None``
    otherwise.
    """
    items = page.items
    if page.line_breaks or not items:
        return None
    flat = [value for values in keys for value in values]
    if not _STR_KEYS.issuperset(map(type, flat)):
        return None
    if None in flat:
        keys = [tuple(value or "" for value in values) for values in keys]
        flat = [value or "" for value in flat]
    joined = "".join(cast("list[str]", flat))  # every key is a string by now (checked above)
    if _CONTROL.search(joined):
        return None
    # b"id\x01extra\x01" per item, encoded in one call (the ids hold no line break to split on).
    lines = map("\x01".join, cast("list[tuple[str, ...]]", keys))
    prefixes = ("\x01\n".join(lines) + "\x01").encode().split(b"\n")
    parts: list[bytes | msgspec.Raw] = [b"\n"] * (3 * len(items))
    parts[0::3] = prefixes
    parts[1::3] = items
    return parts


def spool_parts(page: Page, decode: msgspec.json.Decoder) -> list[bytes | msgspec.Raw]:
    """The page's items as spool lines, ``id \x01 [extras \x01] payload`` each, as buffers to
    write one after the other."""
    # Pages reach the spool through the pager, which refuses null items: keys, never None.
    keys = (
        page.keys
        if page.keys is not None
        else cast("list[ItemKeys]", item_keys(page.items, decode))
    )
    parts = _page_parts(page, keys)
    return parts if parts is not None else [_item_lines(page.items, keys)]


def _write_all(fd: int, parts: list[bytes | msgspec.Raw]) -> int:
    """Write ``parts`` in order with ``writev`` (no copy into one buffer); returns the bytes."""
    written = 0
    for start in range(0, len(parts), _IOV_MAX):
        chunk = parts[start : start + _IOV_MAX]
        size = sum(map(len, chunk))
        done = os.writev(fd, chunk)
        if done < size:  # a short write (signal, full disk): the rest the plain way
            rest = memoryview(b"".join(chunk))[done:]
            while rest:
                rest = rest[os.write(fd, rest) :]
        written += size
    return written


class StagingWriter:
    """Spools pages to disk and inserts each full spool into the staging table, in a thread."""

    def __init__(
        self,
        conn: duckdb.DuckDBPyConnection,
        endpoint: ListEndpoint,
        table: str,
        loaded_at: datetime,
        spool_dir: Path,
        spool_bytes: int,
        max_item_bytes: int = MAX_ITEM_BYTES,
    ):
        self.table = table
        self.sql = _insert_sql(endpoint, table, max_item_bytes)
        self.decode = key_decoder(endpoint)
        self.loaded_at = loaded_at.replace(tzinfo=None)
        self.spool_dir = spool_dir
        self.spool_bytes = spool_bytes
        self.items_written = 0
        self.rows_inserted = 0
        self._spools = 0
        self._file: io.FileIO | None = None
        self._size = 0
        self._ready: queue.Queue[Path | None] = queue.Queue(maxsize=1)
        self._error: BaseException | None = None
        #: Inside an asset's transaction (a lake's write), which commits or rolls back the rows.
        self._own_transaction = not in_transaction(conn)
        self._inserter = threading.Thread(
            target=self._insert_spools, args=(conn,), name="fieldsales-insert", daemon=True
        )
        self._inserter.start()

    def _insert_spools(self, conn: duckdb.DuckDBPyConnection) -> None:
        # One transaction for the whole pass: DuckDB then writes full row groups straight to
        # the file. Committing each ~7k-row spool instead sends every byte through the WAL and
        # compresses it again at checkpoint (measured 101 -> 177 MB/s).
        if self._own_transaction:
            conn.execute("BEGIN TRANSACTION")
        while (path := self._ready.get()) is not None:
            try:
                if self._error is None:
                    params = {"path": str(path), "loaded_at": self.loaded_at}
                    self.rows_inserted += one_row(conn, self.sql, params)[0]
            except BaseException as exc:  # raised in the caller's thread at the next call
                self._error = exc
            finally:
                path.unlink(missing_ok=True)
        if not self._own_transaction:
            return
        try:
            conn.execute("ROLLBACK" if self._error is not None else "COMMIT")
        except BaseException as exc:
            self._error = self._error or exc

    def _raise_insert_error(self) -> None:
        if self._error is not None:
            raise RawLoadError(
                f"Inserting fetched pages into {self.table} failed, so nothing was replaced: "
                f"{self._error}"
            ) from self._error

    def add(self, page: Page) -> None:
        self._raise_insert_error()
        if not page.items:
            return
        parts = spool_parts(page, self.decode)
        if self._file is None:
            self._spools += 1
            self._path = self.spool_dir / f"{self.table}-{id(self)}-{self._spools}.txt"
            self._file = self._path.open("wb", buffering=0)
        self._size += _write_all(self._file.fileno(), parts)
        self.items_written += page.n
        if self._size >= self.spool_bytes:
            self._hand_over()

    def _hand_over(self) -> None:
        if self._file is None:
            return
        self._file.close()
        self._file = None
        self._size = 0
        self._ready.put(self._path)

    def finish(self) -> None:
        """Insert what is spooled and wait for every insert; raises an insert's error."""
        self._hand_over()
        self.close()
        self._raise_insert_error()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
            self._path.unlink(missing_ok=True)
        if self._inserter.is_alive():
            self._ready.put(None)
            self._inserter.join()


# --- loading ------------------------------------------------------------------------------------


def spool_root(conn: duckdb.DuckDBPyConnection) -> Path | None:
    """Where spools go: ``<db dir>/.fieldsales_spool/<db file name>/``; ``None`` in memory."""
    row = conn.execute(
        "SELECT path, type FROM duckdb_databases() WHERE database_name = current_database()"
    ).fetchone()
    if not row or not row[0]:
        return None
    if row[1] == "ducklake":  # the catalog is elsewhere: spool beside the local temp_directory
        (temp,) = one_row(conn, "SELECT current_setting('temp_directory')")
        return spool_folder(Path(temp).parent / "lake")
    return spool_folder(Path(row[0]))


def _table_rows(conn: duckdb.DuckDBPyConnection, table: str) -> int | None:
    if not table_exists(conn, table):
        return None
    return one_row(conn, f"SELECT count(*) FROM {qualified(table)}")[0]


@dataclass(frozen=True)
class ShrinkGuard:
    """How much a full refresh may shrink a raw table (``check_shrink``): the warehouse's
    ``max_shrink_fraction``, unless the run's config allows any shrink."""

    max_fraction: float
    allow: bool


def check_shrink(
    table: str, old_rows: int | None, new_rows: int, max_shrink_fraction: float, allow: bool
) -> None:
    """Refuse a refresh that empties ``table`` or shrinks it by more than the fraction."""
    if allow or not old_rows or new_rows >= old_rows:
        return
    lost = 1 - new_rows / old_rows
    if new_rows == 0 or lost > max_shrink_fraction:
        what = "empty it" if new_rows == 0 else f"shrink it by {lost:.0%}"
        raise ShrinkRefusedError(
            f"{table}: the server now lists {new_rows} items where the table holds {old_rows}; "
            f"replacing it would {what} (more than max_shrink_fraction="
            f"{max_shrink_fraction:.0%}), so {table} was left as it was. If the data really "
            "went away, run again allowing it (allow_shrink)."
        )


@dataclass
class Staging:
    """A staging table that receives the executor's pages, counted per list.

    ``by``: the column that tells the lists apart (``event_id`` for the per-event transaction
    lists); ``None`` for one whole list. Each ``write`` is one insert transaction.
    """

    conn: duckdb.DuckDBPyConnection
    endpoint: ListEndpoint
    table: str
    loaded_at: datetime
    spool_dir: Path
    spool_bytes: int
    by: str | None = None
    #: The longest item the pager lets through (``max_item_mb``): the reader's line size.
    max_item_bytes: int = MAX_ITEM_BYTES

    def create(self) -> None:
        self.conn.execute(raw_table_ddl(self.endpoint, self.table, lake=True))

    def write(self, pages: Iterator[tuple[Stream, Page]]) -> None:
        writer = StagingWriter(
            self.conn,
            self.endpoint,
            self.table,
            self.loaded_at,
            self.spool_dir,
            self.spool_bytes,
            self.max_item_bytes,
        )
        try:
            for _, page in pages:
                writer.add(page)
                pause_at("loading")
            writer.finish()
        finally:
            writer.close()  # joins the inserter (and its transaction) before anything else runs
        if writer.rows_inserted != writer.items_written:
            raise FieldSalesAPIError(
                f"{self.endpoint.name}: DuckDB read {writer.rows_inserted} items from the pages "
                f"but the API returned {writer.items_written}; {self.endpoint.raw_table} was left "
                "as it was."
            )

    def counts(self) -> dict[Hashable, tuple[int, int]]:
        table = qualified(self.table)
        if self.by is None:
            rows, distinct = one_row(self.conn, f"SELECT count(*), count(DISTINCT id) FROM {table}")
            return {None: (rows, distinct)}
        by = quote_ident(self.by)
        found = self.conn.execute(
            f"SELECT {by}, count(*), count(DISTINCT id) FROM {table} GROUP BY {by}"
        ).fetchall()
        return {key: (rows, distinct) for key, rows, distinct in found}

    def differing(self, key: Hashable) -> tuple[int, list[str]]:
        table = qualified(self.table)
        where, params = "", {}
        if self.by is not None:
            where, params = f"WHERE {quote_ident(self.by)} = $key", {"key": key}
        count, ids = one_row(
            self.conn,
            f"SELECT count(*), list(id ORDER BY id)[1:{NAMED_IDS}] FROM ("
            f"  SELECT id FROM {table} {where} GROUP BY id"
            "   HAVING count(*) > 1 AND min(md5(payload::VARCHAR)) <> max(md5(payload::VARCHAR)))",
            params,
        )
        return count, list(ids or [])

    def ids_of(self, key: Hashable, digests: set[int]) -> list[str]:
        where, params = "", {}
        if self.by is not None:
            where, params = f"WHERE {quote_ident(self.by)} = $key", {"key": key}
        cursor = self.conn.execute(
            f"SELECT id, payload::VARCHAR FROM {qualified(self.table)} {where}", params
        )
        found: set[str] = set()
        while rows := cursor.fetchmany(10_000):
            found.update(i for i, payload in rows if item_digest(payload.encode()) in digests)
        return sorted(found)[:NAMED_IDS]

    def forget(self, keys: list[Hashable]) -> None:
        if self.by is None:
            self.create()
        else:
            self.conn.execute(
                f"DELETE FROM {qualified(self.table)} WHERE {quote_ident(self.by)} "
                "IN (SELECT unnest($keys))",
                {"keys": keys},
            )


def page_executor(
    api: FieldSalesAPI,
    staging: Staging | None,
    *,
    label: str,
    log: Callable[[str], None] = lambda message: None,
    spent: ListStats | None = None,
) -> PageExecutor:
    """The executor that pages with ``api``: its ``fetch_page`` and its limits."""
    limits = Limits(
        concurrency=api.concurrency,
        max_pages_per_pass=api.max_pages_per_pass,
        max_item_mb=api.max_item_mb,
        max_list_passes=api.max_list_passes,
    )
    return PageExecutor(api.fetch_page, limits, staging, label=label, log=log, spent=spent)


def load_list(
    api: FieldSalesAPI,
    conn: duckdb.DuckDBPyConnection,
    endpoint: ListEndpoint,
    *,
    log: Callable[[str], None] = lambda message: None,
    spool_bytes: int = SPOOL_BYTES,
    spool_dir: Path | None = None,
    before_swap: Callable[[str], None] | None = None,
    after_swap: Callable[[int], None] | None = None,
    max_shrink_fraction: float = 0.5,
    allow_shrink: bool = False,
    run_id: str | None = None,
) -> LoadReport:
    """Replace ``endpoint.raw_table`` with every item the server lists, or leave it untouched.

    ``before_swap(staging_table)`` runs on the complete staging table just before it replaces
    the old one (redaction, comments); ``after_swap(rows)`` records the load in the swap's
    transaction (the state of an incremental refresh). ``max_shrink_fraction``: the largest share
    of the current table's rows a refresh may lose; emptying a non-empty table is always refused
    unless ``allow_shrink``. The rows the new table drops go to the deletion audit in the swap's
    transaction (``deletions.record_deletions``, found gone by run ``run_id``).
    """
    started = time.monotonic()
    loaded_at = datetime.now(UTC)
    stage = staging_table(endpoint.raw_table)
    conn.execute(f"CREATE SCHEMA IF NOT EXISTS {quote_ident(endpoint.schema)}")
    spools = spool_dir if spool_dir is not None else spool_root(conn)
    if spools is not None:
        spools.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"{endpoint.table}-", dir=spools) as tmp:
        staging = Staging(
            conn,
            endpoint,
            stage,
            loaded_at,
            Path(tmp),
            spool_bytes,
            max_item_bytes=api.max_item_mb << 20,
        )
        executor = page_executor(api, staging, label=endpoint.name, log=log)
        try:
            staging.create()
            (result,) = executor.run([Stream(endpoint)]).values()
            rows, distinct = result.facts.rows, result.facts.distinct
            if rows != distinct:
                _drop_duplicate_ids(conn, stage)
            check_shrink(
                endpoint.raw_table,
                _table_rows(conn, endpoint.raw_table),
                distinct,
                max_shrink_fraction,
                allow_shrink,
            )
            if before_swap is not None:
                before_swap(stage)

            def swap(rows: int = distinct) -> None:
                kept = f"SELECT id FROM {qualified(stage)}"
                record_deletions(conn, endpoint, kept=kept, run_id=run_id, at=loaded_at)
                replace_table(conn, stage, endpoint.raw_table)
                if after_swap is not None:
                    after_swap(rows)

            run_transaction(conn, endpoint.raw_table, swap)
        finally:
            drop_table(conn, qualified(stage))
    spent, stats = executor.spent, result.stats
    report = LoadReport(
        table=endpoint.raw_table,
        rows=distinct,
        api_total=stats.total,
        passes=result.passes,
        pages=spent.pages,
        requests=spent.requests,
        retries=spent.retries,
        bytes=spent.bytes,
        duplicates_dropped=rows - distinct,
        seconds=time.monotonic() - started,
        surrogates_replaced=stats.surrogates_replaced,  # in the rows kept
        repairs=result.repairs,
    )
    log(
        f"{endpoint.name}: wrote {report.rows} rows to {report.table} "
        f"({report.pages} pages, {report.retries} retries, {report.repairs} repairs, "
        f"{report.seconds:.1f} s; {result.verdict.reason})"
    )
    return report


def _drop_duplicate_ids(conn: duckdb.DuckDBPyConnection, table: str) -> None:
    """Keep one copy of each id: the copies are identical (the completeness rule pages a list
    again, or fails it, while copies of an id differ)."""
    conn.execute(
        f"DELETE FROM {qualified(table)} WHERE rowid IN ("
        f"  SELECT rowid FROM (SELECT rowid, row_number() OVER (PARTITION BY id ORDER BY rowid)"
        f"  AS copy FROM {qualified(table)}) WHERE copy > 1)"
    )
