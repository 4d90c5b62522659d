"""Load one list endpoint into its ``raw.*`` table: stream pages into a staging table, check, swap.

Pages go to DuckDB as Arrow batches: each page's items (JSON that msgspec already split and
validated, never parsed again) become one batch of ``id``, the extra columns and ``payload``
(Arrow's JSON type, which DuckDB takes as its JSON type without validating it again), built from
the page's bytes without a copy per item. One ``INSERT`` per pass reads the batches as a stream
while the pager fetches: memory holds a few pages whatever the list's size, and nothing goes
through a file. Ids ride as the text they are (``id_text``), control characters and all, and
payloads as received, line breaks included.

The list loader (``lists.py``) pages into the staging table (``Staging``, its ``Sink``) and asks
it for the distinct ids after each pass; its one rule accepts the pass, or pages the list again,
or fails saying what the server sent. The previous
table is replaced only after that, in one
transaction, and never by one that would empty it or shrink it by more than
``max_shrink_fraction`` unless ``allow_shrink``. A load starts by removing what a killed load left
behind: ``_stage_*`` tables.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, cast

import duckdb
import msgspec

from fieldsales_dagster.client.api import FieldSalesAPI
from fieldsales_dagster.client.endpoints import ListEndpoint
from fieldsales_dagster.client.envelope import ListStats, Page
from fieldsales_dagster.client.errors import FieldSalesAPIError
from fieldsales_dagster.heap import TRIM_EVERY_PAGES, release_free_memory
from fieldsales_dagster.loading.deletions import record_deletions
from fieldsales_dagster.loading.lists import (
    NAMED_IDS,
    ItemKeys,
    Limits,
    ListPasses,
    ListResult,
    PageExecutor,
    Stream,
    id_text,
    item_keys,
    key_decoder,
)
from fieldsales_dagster.pause import pause_at
from fieldsales_dagster.warehouse.lake import drop_table, run_transaction
from fieldsales_dagster.warehouse.quoting import qualified, quote_ident
from fieldsales_dagster.warehouse.rows import one_row
from fieldsales_dagster.warehouse.warehouse import (
    replace_table,
    staging_table,
    table_exists,
)

if TYPE_CHECKING:
    # Imported where a load runs (``page_schema``, ``page_batch``): the definitions load without.
    import pyarrow as pa

#: Pages waiting for the insert (a few MB each): what memory holds whatever the list's size.
QUEUED_PAGES = 8
#: Bytes of items DuckDB reads at a time (a slice of a page's batch; see ``_stream``).
SLICE_BYTES = 256 * 1024


class RawLoadError(RuntimeError):
    """Fetched pages could not be stored."""


class NotTextError(RawLoadError):
    """An item's bytes are not UTF-8 text."""


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
    #: Rounds in which the head of a list that grew was re-fetched.
    repairs: int = 0

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0


def raw_table_ddl(
    endpoint: ListEndpoint,
    table: str,
    lake: bool = False,
    temporary: bool = False,
    digest: bool = False,
) -> str:
    """A raw table; with ``digest``, a staging table (each item's ``item_digests``)."""
    # zstd suits ~5 KB JSON documents: measured 2.6x faster to write than DuckDB's default
    # dictionary/FSST choice for them, smaller on disk, and faster to read back. A lake's
    # Parquet files take no per-column compression (its files are zstd: see lake.py).
    extra = "".join(f", {quote_ident(col)} VARCHAR" for col, _ in endpoint.extra_columns)
    compression = "" if lake else " USING COMPRESSION zstd"
    kind = "TEMP TABLE" if temporary else "TABLE"
    return (
        f"CREATE OR REPLACE {kind} {qualified(table)} "
        f"(id VARCHAR, payload JSON{compression}, loaded_at TIMESTAMP{extra}"
        + (", digest BIGINT)" if digest else ")")
    )


def _insert_sql(endpoint: ListEndpoint, table: str, pages: str) -> str:
    extra = [quote_ident(col) for col, _ in endpoint.extra_columns]
    # `_id` where present; an item without one (event groups' shape is not documented) gets a
    # content hash, so identical copies collapse and distinct items stay distinct.
    return (
        f"INSERT INTO {qualified(table)} (id, payload, loaded_at, digest"
        f"{''.join(', ' + c for c in extra)}) SELECT coalesce(id, md5(payload)), payload, "
        f"$loaded_at, digest{''.join(', ' + c for c in extra)} FROM {pages}"
    )


def page_schema(endpoint: ListEndpoint) -> pa.Schema:
    """The Arrow schema of a page's batch: ``id``, the extra columns, ``payload`` (JSON), and
    each item's ``digest``."""
    import pyarrow as pa

    return pa.schema(
        [
            ("id", pa.string()),
            *((column, pa.string()) for column, _ in endpoint.extra_columns),
            ("payload", pa.json_(pa.large_string())),
            ("digest", pa.int64()),
        ]
    )


def page_batch(page: Page, schema: pa.Schema, decode: msgspec.json.Decoder) -> pa.RecordBatch:
    """The page's items as one Arrow batch: each key as its text (``id_text``; none, or empty:
    NULL), and the payloads as received, in one buffer shared with Arrow (one copy of the page's
    bytes, none per item)."""
    import numpy as np
    import pyarrow as pa

    items = page.items
    # Pages reach the table through the pager, which refuses null items: keys, never None.
    keys = page.keys if page.keys is not None else cast("list[ItemKeys]", item_keys(items, decode))
    columns = [
        pa.array([id_text(value) or None for value in values], pa.string())
        for values in zip(*keys, strict=True)
    ] or [pa.nulls(0, pa.string()) for _ in schema.names[:-2]]
    offsets = np.zeros(len(items) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, items), dtype=np.int64, count=len(items)), out=offsets[1:])
    text = pa.Array.from_buffers(
        pa.large_string(), len(items), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(items))]
    )
    try:
        text.validate(full=True)  # UTF-8: splitting a page into items does not read its strings
    except pa.ArrowInvalid:
        for position, item in enumerate(items):
            try:
                bytes(item).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise NotTextError(
                    f"item {id_text(keys[position][0]) or f'at skip {page.skip + position}'} is "
                    f"not UTF-8 text ({exc.reason} at byte {exc.start})"
                ) from None
        raise
    payload = pa.ExtensionArray.from_storage(schema.field("payload").type, text)
    digests = (
        pa.array(np.frombuffer(page.digests, np.int64))
        if page.digests is not None
        else pa.nulls(len(items), pa.int64())
    )
    return pa.RecordBatch.from_arrays([*columns, payload, digests], schema=schema)


class StagingWriter:
    """Streams pages into the staging table: one ``INSERT`` reading Arrow batches, in a thread."""

    def __init__(
        self,
        conn: duckdb.DuckDBPyConnection,
        endpoint: ListEndpoint,
        table: str,
        loaded_at: datetime,
    ):
        self.table = table
        self.endpoint = endpoint
        self.schema = page_schema(endpoint)
        self.decode = key_decoder(endpoint)
        self.loaded_at = loaded_at.replace(tzinfo=None)
        self.items_written = 0
        self.pages_written = 0
        self.rows_inserted = 0
        self._batches: queue.Queue[pa.RecordBatch | None] = queue.Queue(maxsize=QUEUED_PAGES)
        self._error: BaseException | None = None
        self._ended = False
        self._inserter = threading.Thread(
            target=self._insert, args=(conn,), name="fieldsales-insert", daemon=True
        )
        self._inserter.start()

    def _stream(self) -> Iterator[pa.RecordBatch]:
        while (batch := self._batches.get()) is not None:
            # In slices of about SLICE_BYTES (no copy): the lake's writer closes a row group
            # once it passes its size (``LAKE_OPTIONS``), so a whole page of heavy items (4.5 MB)
            # made groups ~2.5 MB larger, and reading them back needed more than 64MB
            # (test_core_memory.py).
            rows = max(1, len(batch) * SLICE_BYTES // max(1, batch.nbytes))
            for start in range(0, len(batch), rows):
                yield batch.slice(start, rows)
        self._ended = True

    def _insert(self, conn: duckdb.DuckDBPyConnection) -> None:
        import pyarrow as pa

        pages = f"_fs_pages_{id(self)}"
        try:
            conn.register(pages, pa.RecordBatchReader.from_batches(self.schema, self._stream()))
            try:
                sql = _insert_sql(self.endpoint, self.table, pages)
                self.rows_inserted = one_row(conn, sql, {"loaded_at": self.loaded_at})[0]
            finally:
                conn.unregister(pages)
        except BaseException as exc:  # raised in the caller's thread at its next call
            self._error = exc
        finally:
            # After a failed insert, take what is still put, so that the pager never waits.
            while not self._ended:
                self._ended = self._batches.get() is None

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
        try:
            batch = page_batch(page, self.schema, self.decode)
        except NotTextError as exc:
            raise NotTextError(
                f"Inserting fetched pages into {self.table} failed, so nothing was replaced: "
                f"{exc}. The server sent bytes that are not text; ask its operator."
            ) from None
        self._batches.put(batch)
        self.items_written += page.n
        self.pages_written += 1
        if self.pages_written % TRIM_EVERY_PAGES == 0:
            release_free_memory()

    def finish(self) -> None:
        """End the stream and wait for the insert; raises its error."""
        self.close()
        self._raise_insert_error()

    def close(self) -> None:
        if self._inserter.is_alive():
            self._batches.put(None)
            self._inserter.join()


# --- loading ------------------------------------------------------------------------------------


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
    """A staging table that receives the executor's pages, counted per list (``lists.Sink``).

    ``by``: the column that tells the lists apart (``event_id`` for the per-event transaction
    lists); ``None`` for one whole list. Each ``write`` is one insert transaction. Each row keeps
    its item's ``item_digests`` until ``seal`` drops the column, before the table is used.
    """

    conn: duckdb.DuckDBPyConnection
    endpoint: ListEndpoint
    table: str
    loaded_at: datetime
    by: str | None = None
    temporary: bool = False

    def create(self) -> None:
        self.conn.execute(
            raw_table_ddl(
                self.endpoint,
                self.table,
                lake=not self.temporary,
                temporary=self.temporary,
                digest=True,
            )
        )

    def seal(self) -> None:
        """Drop the digests: the table now holds what it will hold."""
        self.conn.execute(f"ALTER TABLE {qualified(self.table)} DROP COLUMN digest")

    def write(self, pages: Iterator[tuple[Stream, Page]]) -> None:
        """Store every page; returns when they are all stored (raises if one was lost)."""
        writer = StagingWriter(self.conn, self.endpoint, self.table, self.loaded_at)
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
        """``(rows, distinct ids)`` stored per list (``by``'s value)."""
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
        """Ids of one list stored more than once with different content: how many, and a few."""
        table = qualified(self.table)
        where, params = "", {}
        if self.by is not None:
            where, params = f"WHERE {quote_ident(self.by)} = $key", {"key": key}
        count, ids = one_row(
            self.conn,
            f"SELECT count(*), list(id ORDER BY id)[1:{NAMED_IDS}] FROM ("
            f"  SELECT id FROM {table} {where} GROUP BY id"
            "   HAVING count(*) > 1 AND min(digest) <> max(digest))",
            params,
        )
        return count, list(ids or [])

    def ids_of(self, key: Hashable, digests: set[int]) -> list[str]:
        """The first few ids (in order) of one list's items whose ``item_digests`` is listed."""
        params: dict[str, object] = {"digests": list(digests)}
        where = ""
        if self.by is not None:
            where, params["key"] = f"AND {quote_ident(self.by)} = $key", key
        found = self.conn.execute(
            f"SELECT DISTINCT id FROM {qualified(self.table)} "
            f"WHERE digest IN (SELECT unnest($digests)) {where} ORDER BY id LIMIT {NAMED_IDS}",
            params,
        ).fetchall()
        return [row[0] for row in found]

    def forget(self, keys: list[Hashable]) -> None:
        """Remove what is stored for these lists: they are paged again."""
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
        max_item_variable=api.named("FIELDSALES_MAX_ITEM_MB"),
    )
    return PageExecutor(api.fetch_page, limits, label=label, log=log, spent=spent)


def load_list(
    api: FieldSalesAPI,
    conn: duckdb.DuckDBPyConnection,
    endpoint: ListEndpoint,
    *,
    log: Callable[[str], None] = lambda message: None,
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
    staging = Staging(conn, endpoint, stage, loaded_at)
    executor = page_executor(api, label=endpoint.name, log=log)
    try:
        staging.create()
        (result,) = ListPasses(executor, staging).run([Stream(endpoint)]).values()
        staging.seal()
        distinct = result.facts.distinct
        if result.facts.rows != distinct:
            _drop_duplicate_ids(conn, stage)
        old_rows = _table_rows(conn, endpoint.raw_table)
        check_shrink(endpoint.raw_table, old_rows, distinct, max_shrink_fraction, allow_shrink)
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
    report = _load_report(endpoint, executor.spent, result, started)
    log(
        f"{endpoint.name}: wrote {report.rows} rows to {report.table} "
        f"({report.pages} pages, {report.retries} retries, {report.repairs} repairs, "
        f"{report.seconds:.1f} s; {result.reason})"
    )
    return report


def _load_report(
    endpoint: ListEndpoint, spent: ListStats, result: ListResult, started: float
) -> LoadReport:
    rows, distinct = result.facts.rows, result.facts.distinct
    return LoadReport(
        table=endpoint.raw_table,
        rows=distinct,
        api_total=result.facts.total,
        passes=result.passes,
        pages=spent.pages,
        requests=spent.requests,
        retries=spent.retries,
        bytes=spent.bytes,
        duplicates_dropped=rows - distinct,
        seconds=time.monotonic() - started,
        surrogates_replaced=result.stats.surrogates_replaced,  # in the rows kept
        repairs=result.repairs,
    )


def _drop_duplicate_ids(conn: duckdb.DuckDBPyConnection, table: str) -> None:
    """Keep one copy of each id: the copies are identical (the completeness rule pages a list
    again, or fails it, while copies of an id differ)."""
    conn.execute(
        f"DELETE FROM {qualified(table)} WHERE rowid IN ("
        f"  SELECT rowid FROM (SELECT rowid, row_number() OVER (PARTITION BY id ORDER BY rowid)"
        f"  AS copy FROM {qualified(table)}) WHERE copy > 1)"
    )
