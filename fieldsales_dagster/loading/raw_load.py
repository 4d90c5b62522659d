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
from fieldsales_dagster.heap import TRIM_EVERY_PAGES, release_free_memory
from fieldsales_dagster.loading.deletions import record_deletions
from fieldsales_dagster.loading.lists import (
    NAMED_IDS,
    ItemKeys,
    Limits,
    ListPasses,
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


class ShrinkRefusedError(RawLoadError):
    """A refresh would have emptied a raw table, or shrunk it beyond the allowed fraction."""


@dataclass
class LoadReport:
    """What a load wrote and what it cost; becomes asset metadata."""

    table: str
    rows: int
    api_total: int | None
    pages: int
    requests: int
    retries: int
    bytes: int
    seconds: float
    passes: int = 1
    duplicates_dropped: int = 0
    #: Lone surrogate escapes replaced by U+FFFD (strings the server cut mid-emoji).
    surrogates_replaced: int = 0
    #: Rounds in which the head of a list that grew was re-fetched.
    repairs: int = 0

    @classmethod
    def of(
        cls, table: str, rows: int, total: int | None, spent: ListStats, started: float, **more: int
    ) -> LoadReport:
        """A load of ``rows`` that cost ``spent``, started at ``started`` (``time.monotonic``)."""
        cost = (spent.pages, spent.requests, spent.retries, spent.bytes)
        return cls(table, rows, total, *cost, time.monotonic() - started, **more)

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0


def raw_table_ddl(
    endpoint: ListEndpoint, table: str, temporary: bool = False, digest: bool = False
) -> str:
    """A raw table; with ``digest``, a staging table (each item's ``item_digests``)."""
    # A temporary table's payloads are zstd: measured 2.6x faster to write ~5 KB JSON documents
    # than DuckDB's default dictionary/FSST choice, and smaller. A lake's Parquet files take no
    # per-column compression (its files are zstd: see lake.py).
    extra = "".join(f", {quote_ident(col)} VARCHAR" for col, _ in endpoint.extra_columns)
    return (
        f"CREATE OR REPLACE {'TEMP ' * temporary}TABLE {qualified(table)} (id VARCHAR, payload "
        f"JSON{' USING COMPRESSION zstd' * temporary}, loaded_at TIMESTAMP{extra}"
        + (", digest BIGINT)" if digest else ")")
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
    # A page holds items: the executor passes on none that is empty.
    columns = [
        pa.array([id_text(v) or None for v in values], pa.string())
        for values in zip(*keys, strict=True)
    ]
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
                raise RawLoadError(
                    f"item {id_text(keys[position][0]) or f'at skip {page.skip + position}'} is "
                    f"not UTF-8 text ({exc.reason} at byte {exc.start}); ask the server's operator"
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
        self.pages_written = 0
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
        columns = "".join(f", {quote_ident(col)}" for col, _ in self.endpoint.extra_columns)
        try:
            conn.register(pages, pa.RecordBatchReader.from_batches(self.schema, self._stream()))
            try:
                # `_id` where present; an item without one (event groups' shape is not
                # documented) gets a content hash: identical copies collapse, others stay apart.
                conn.execute(
                    f"INSERT INTO {qualified(self.table)} (id, payload, loaded_at, digest"
                    f"{columns}) SELECT coalesce(id, md5(payload)), payload, $loaded_at, digest"
                    f"{columns} FROM {pages}",
                    {"loaded_at": self.loaded_at},
                )
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
        try:
            self._batches.put(page_batch(page, self.schema, self.decode))
        except RawLoadError as exc:  # not text
            self._error = exc
            self._raise_insert_error()
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


@dataclass(frozen=True)
class ShrinkGuard:
    """How much a full refresh may shrink a raw table (``check_shrink``): the warehouse's
    ``max_shrink_fraction``, unless the run's config allows any shrink."""

    max_fraction: float
    allow: bool


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
        self.conn.execute(raw_table_ddl(self.endpoint, self.table, self.temporary, digest=True))

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

    @property
    def _list(self) -> str:
        """What tells a row's list: ``by``, or NULL (``None``, the key of one whole list)."""
        return quote_ident(self.by) if self.by else "NULL"

    def counts(self) -> dict[Hashable, tuple[int, int]]:
        """``(rows, distinct ids)`` stored per list (``by``'s value)."""
        found = self.conn.execute(
            f"SELECT {self._list}, count(*), count(DISTINCT id) "
            f"FROM {qualified(self.table)} GROUP BY ALL"
        ).fetchall()
        return {key: (rows, distinct) for key, rows, distinct in found}

    def differing(self, key: Hashable) -> tuple[int, tuple[str, ...]]:
        """Ids of one list stored more than once with different content: how many, and a few."""
        count, ids = one_row(
            self.conn,
            f"SELECT count(*), list(id ORDER BY id)[1:{NAMED_IDS}] FROM (SELECT id FROM "
            f"{qualified(self.table)} WHERE {self._list} IS NOT DISTINCT FROM $key GROUP BY id "
            "HAVING count(*) > 1 AND min(digest) <> max(digest))",
            {"key": key},
        )
        return count, tuple(ids or ())

    def ids_of(self, key: Hashable, digests: set[int]) -> tuple[str, ...]:
        """The first few ids (in order) of one list's items whose ``item_digests`` is listed."""
        found = self.conn.execute(
            f"SELECT DISTINCT id FROM {qualified(self.table)} WHERE digest IN (SELECT unnest("
            f"$digests)) AND {self._list} IS NOT DISTINCT FROM $key ORDER BY id LIMIT {NAMED_IDS}",
            {"key": key, "digests": list(digests)},
        ).fetchall()
        return tuple(row[0] for row in found)

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
    limits = (api.concurrency, api.max_pages_per_pass, api.max_item_mb, api.max_list_passes)
    variable = api.named("FIELDSALES_MAX_ITEM_MB")
    return PageExecutor(
        api.fetch_page, Limits(*limits, variable), label=label, log=log, spent=spent
    )


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
        table = endpoint.raw_table
        old = (
            one_row(conn, f"SELECT count(*) FROM {qualified(table)}")[0]
            if table_exists(conn, table)
            else 0
        )
        if old and not allow_shrink and (distinct == 0 or 1 - distinct / old > max_shrink_fraction):
            what = "empty it" if distinct == 0 else f"shrink it by {1 - distinct / old:.0%}"
            raise ShrinkRefusedError(
                f"{table}: the server now lists {distinct} items where the table holds {old}; "
                f"replacing it would {what} (max_shrink_fraction={max_shrink_fraction:.0%}), so "
                "it was left as it was. If the data really went away, run with allow_shrink."
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
    report = LoadReport.of(
        endpoint.raw_table,
        distinct,
        result.facts.total,
        executor.spent,
        started,
        passes=result.passes,
        duplicates_dropped=result.facts.rows - distinct,
        surrogates_replaced=result.stats.surrogates_replaced,  # in the rows kept
        repairs=result.repairs,
    )
    log(
        f"{endpoint.name}: wrote {report.rows} rows to {report.table} "
        f"({report.pages} pages, {report.retries} retries, {report.repairs} repairs, "
        f"{report.seconds:.1f} s; {result.reason})"
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
