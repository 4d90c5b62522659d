"""Load one list endpoint into its ``raw.*`` table: stream pages into a staging table, check, swap.

Each page becomes one Arrow batch (``payload`` in Arrow's JSON type, which DuckDB does not parse
again) built from its bytes without a copy per item; one ``INSERT`` per pass streams the batches
while the pager fetches, so memory holds a few pages whatever the list's size. Ids and payloads
are stored as received. The table is brought to the list in one transaction (only the rows whose
digest changed replaced: ``compare_digests``), never to empty or shrink it by more than
``max_shrink_fraction`` unless ``allow_shrink``.
"""

from __future__ import annotations

import hashlib
import queue
import re
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from itertools import compress
from typing import TYPE_CHECKING, Any, cast

import duckdb
import msgspec
import xxhash

from fieldsales_dagster.client.api import FieldSalesAPI
from fieldsales_dagster.client.endpoints import EVENTS, ListEndpoint
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
    in_sorted,
    item_keys,
    key_decoder,
)
from fieldsales_dagster.pause import pause_at
from fieldsales_dagster.warehouse.lake import drop_table, ensure_table, run_transaction
from fieldsales_dagster.warehouse.pii import PII_VALUE
from fieldsales_dagster.warehouse.quoting import qualified, quote_ident
from fieldsales_dagster.warehouse.rows import one_row
from fieldsales_dagster.warehouse.warehouse import replace_table, staging_table, table_exists

if TYPE_CHECKING:  # imported where a load runs: the definitions load without it
    import numpy as np
    import pyarrow as pa

QUEUED_PAGES = 8  # waiting for the insert (a few MB each)
SLICE_BYTES = 256 * 1024  # of a page's batch DuckDB reads at a time (see ``_stream``)
#: Per raw table, its last load (``record_load``): when the server last listed it whole (it then
#: holds what was listed; a row listed as stored keeps its ``loaded_at``, so the tables built from
#: it stay current), when it was last loaded and how, its rows; for ``raw.transactions``, when
#: ``raw.events`` was last listed whole then (incremental.py).
STATE_TABLE = "meta.refresh_state"
#: Each staged item's ``digest_columns``, kept by ``Staging.seal`` for the comparison and stored
#: with the rows (``digests_table``).
STAGED_DIGESTS = "_fs_staged_digests"
#: The ids whose staged and stored digests differ (``compare_digests``): ``staged`` where the list
#: holds the id (new or changed), ``stored`` where the table does (changed or gone).
CHANGES = "_fs_changes"
#: Bumped when the code that makes a row of the bytes received changes what it stores (the id of an
#: item without ``_id``, how an item is stored, an event's state: ``event_state``, ``seal``): every
#: row is then compared as changed once, so no row keeps what older code made of its bytes.
STORED_FORM = 2
_PII_VALUE = re.compile(PII_VALUE.encode())


class _State(msgspec.Struct, rename="camel"):
    event_state: msgspec.Raw = msgspec.Raw(b"null")
    event_state_history: msgspec.Raw = msgspec.Raw(b"null")
    event_state_timestamps: msgspec.Raw = msgspec.Raw(b"null")


def event_state(item: msgspec.Raw) -> tuple[str, bytes]:
    """An event's state fingerprint (its ``_State`` as received, whitespace aside, personal values
    nulled as ``redact_pii_keys`` nulls them: an unkeyed hash of one could be guessed), and its
    ``[eventStateHistory, eventStateTimestamps]``, whose dates ``Staging.seal`` reads in DuckDB.
    A stored row listed as received keeps its state: what this makes of an item changes only
    with ``STORED_FORM``."""
    try:
        state = msgspec.structs.astuple(msgspec.json.decode(item, type=_State))
    except msgspec.ValidationError:  # not an object
        state = msgspec.structs.astuple(_State())
    whole = b"\x01".join(msgspec.json.format(s, indent=-1) for s in state)
    # No whitespace is left between tokens: a key and ``null`` are the whole replacement (a
    # function is twice as fast as a template with groups).
    fingerprint = hashlib.md5(_PII_VALUE.sub(lambda value: b'"%b":null' % value[1], whole))
    return fingerprint.hexdigest(), b"[%b,%b]" % state[1:]


def digest_key(redact_pii_in_raw: bool) -> int:
    """The key of the digests stored with a raw table's rows: what makes a row of the bytes
    received (``STORED_FORM``, and the redaction, if asked). A row stored in another form has
    another digest, so a changed setting rewrites every row: a digest describes what is stored.

    A digest is 64 bits (XXH3, ``lists.item_digests``): an item edited in place keeps its row
    only if its new digest equals the old, by chance: 2**-64 per edit (a million edits a night
    for a thousand years: 2e-8). Rows are matched by id first: two items never share one."""
    form = f"{STORED_FORM}:{PII_VALUE if redact_pii_in_raw else ''}"
    return xxhash.xxh3_64_intdigest(form.encode())


def digests_table(table: str) -> str:
    """Where each row of raw ``table`` has its ``digest_columns``, written in the transaction that
    writes the row: ``meta.raw_events_digests``."""
    return f"meta.{table.replace('.', '_')}_digests"


def digest_columns(endpoint: ListEndpoint) -> dict[str, str]:
    """What ``digests_table`` holds per row, as ``Staging.seal`` selects it from the staging table
    by name: the row's id, extra columns and digest (``digest_key``); an event's state too, which
    an incremental refresh compares (docs/refresh.md), computed as its item is staged with its
    payload (``event_state``): so no step parses the payloads for it, and a row listed as stored
    keeps it with its digest. Its dated changes: its history's dates and every time its state
    timestamps hold."""
    columns = {name: quote_ident(name) for name in ("id", *dict(endpoint.extra_columns), "digest")}
    if endpoint is EVENTS:
        history = "json_extract_string(state_times, '$[0][*].date')"
        stamps = "json_extract_string(state_times, '$[1].*[*]')"
        columns["fingerprint"] = "fingerprint"
        columns["state_changes"] = (
            f"list_distinct(list_transform({history} || {stamps}, "
            "lambda d: try_cast(d AS TIMESTAMPTZ)))"
        )
    return columns


def stored_digests_current(conn: duckdb.DuckDBPyConnection, endpoint: ListEndpoint) -> bool:
    """Whether ``endpoint``'s raw table has its digests stored, with this code's
    ``digest_columns`` (an earlier release kept no event state with them: its list is replaced
    whole once, as one without digests)."""
    try:
        digests = conn.execute(f"SELECT * FROM {digests_table(endpoint.raw_table)} LIMIT 0")
        stored = [column[0] for column in digests.description]
    except duckdb.CatalogException:
        return False
    return stored == list(digest_columns(endpoint)) and table_exists(conn, endpoint.raw_table)


def event_states(conn: duckdb.DuckDBPyConnection) -> str:
    """A query of each stored event's ``event_id``, ``fingerprint`` and ``state_changes``
    (``digest_columns``); none before ``raw.events`` is loaded with them."""
    states = "id AS event_id, fingerprint, state_changes"
    if stored_digests_current(conn, EVENTS):
        return f"(SELECT {states} FROM {digests_table(EVENTS.raw_table)})"
    none = "''::VARCHAR id, ''::VARCHAR fingerprint, []::TIMESTAMPTZ[] state_changes"
    return f"(SELECT {states} FROM (SELECT {none}) LIMIT 0)"


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
    #: False where the server listed exactly what the table held: it was kept as it was.
    written: bool = True
    duplicates_dropped: int = 0
    surrogates_replaced: int = 0  # lone surrogate escapes (strings cut mid-emoji) made U+FFFD
    repairs: int = 0  # rounds in which the head of a list that grew was re-fetched

    @classmethod
    def of(
        cls, table: str, rows: int, total: int | None, spent: ListStats, started: float, **more: Any
    ) -> LoadReport:
        cost = (spent.pages, spent.requests, spent.retries, spent.bytes)
        return cls(table, rows, total, *cost, time.monotonic() - started, **more)


def raw_table_ddl(
    endpoint: ListEndpoint, table: str, temporary: bool = False, digest: bool = False
) -> str:
    """A raw table; with ``digest``, a staging table (each item's ``item_digests``, and an
    event's ``event_state``)."""
    # A temporary table's payloads are zstd: 2.6x faster to write ~5 KB JSON documents than
    # DuckDB's default, and smaller. A lake's Parquet files are zstd already (lake.py).
    extra = "".join(f", {quote_ident(col)} VARCHAR" for col, _ in endpoint.extra_columns)
    states = "".join(f", {column} VARCHAR" for column in _staged_states(endpoint))
    return (
        f"CREATE OR REPLACE {'TEMP ' * temporary}TABLE {qualified(table)} (id VARCHAR, payload "
        f"JSON{' USING COMPRESSION zstd' * temporary}, loaded_at TIMESTAMP{extra}"
        f"{f', digest BIGINT{states}' * digest})"
    )


def _staged_states(endpoint: ListEndpoint) -> tuple[str, ...]:
    """Of an event staged with its payload, its ``event_state``: staging columns until ``seal``."""
    return ("fingerprint", "state_times") if endpoint is EVENTS else ()


def page_schema(endpoint: ListEndpoint) -> pa.Schema:
    import pyarrow as pa

    names = ("id", *dict(endpoint.extra_columns), *_staged_states(endpoint))
    keys = [(column, pa.string()) for column in names]
    return pa.schema([*keys, ("payload", pa.json_(pa.large_string())), ("digest", pa.int64())])


def page_batch(
    page: Page, schema: pa.Schema, decode: msgspec.json.Decoder, stored: np.ndarray | None = None
) -> pa.RecordBatch:
    """The page's items as one Arrow batch: keys as text (none or empty: NULL), payloads in one
    buffer shared with Arrow (one copy of the page's bytes, none per item). An item with an id
    whose digest is among the ``stored`` ones (sorted) is a stored row as received: its payload
    is NULL (neither copied, stored nor redacted again, nor an event's state computed again;
    ``load_list``)."""
    import numpy as np
    import pyarrow as pa

    items = page.items
    # The pager refuses null items (keys, never None) and passes on no empty page.
    keys = page.keys if page.keys is not None else cast("list[ItemKeys]", item_keys(items, decode))
    columns = [
        pa.array([id_text(v) or None for v in values], pa.string())
        for values in zip(*keys, strict=True)
    ]
    digests, staged = pa.nulls(len(items), pa.int64()), np.ones(len(items), bool)
    if page.digests is not None:  # else a page the executor did not admit
        listed = np.frombuffer(page.digests, np.int64)
        digests = pa.array(listed)
        if stored is not None:  # an item without an id is staged: its content id is made of it
            staged = ~in_sorted(listed, stored) | np.asarray(columns[0].is_null())
    offsets = np.zeros(len(items) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, items), np.int64, len(items)) * staged, out=offsets[1:])
    valid = None if staged.all() else pa.py_buffer(np.packbits(staged, bitorder="little"))
    data = pa.py_buffer(b"".join(compress(items, staged)))
    text = pa.Array.from_buffers(
        pa.large_string(), len(items), [valid, pa.py_buffer(offsets), data]
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
    # An event's state, of the items staged with their payload (``digest_columns``).
    found = zip(items, staged, strict=True) if "fingerprint" in schema.names else ()
    made = [event_state(item) if keep else (None, None) for item, keep in found]
    states = [pa.array(column, pa.string()) for column in zip(*made, strict=True)]
    return pa.RecordBatch.from_arrays([*columns, *states, payload, digests], schema=schema)


class StagingWriter:
    """Streams pages into the staging table: one ``INSERT`` reading Arrow batches, in a thread."""

    def __init__(
        self,
        conn: duckdb.DuckDBPyConnection,
        endpoint: ListEndpoint,
        table: str,
        loaded_at: datetime,
        stored: np.ndarray | None = None,
    ):
        self.table = table
        self.endpoint = endpoint
        self.stored = stored
        self.schema = page_schema(endpoint)
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
            # Slices (no copy): a whole page of heavy items (4.5 MB) made the lake's row groups
            # ~2.5 MB larger, and reading them back needed over 64MB (test_core_memory.py).
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
                # An item without `_id` (event groups' shape is not documented) gets a content
                # hash: identical copies collapse, others stay apart.
                conn.execute(
                    f"INSERT INTO {qualified(self.table)} BY NAME SELECT * REPLACE "
                    f"(coalesce(id, md5(payload)) AS id), $loaded_at AS loaded_at FROM {pages}",
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
            batch = page_batch(page, self.schema, key_decoder(self.endpoint), self.stored)
            self._batches.put(batch)
        except RawLoadError as exc:  # not text
            self._error = exc
            self._raise_insert_error()
        self.pages_written += 1
        if self.pages_written % TRIM_EVERY_PAGES == 0:
            release_free_memory()

    def finish(self) -> None:
        self.close()
        self._raise_insert_error()

    def close(self) -> None:
        if self._inserter.is_alive():
            self._batches.put(None)
            self._inserter.join()


@dataclass
class Staging:
    """A staging table that receives the executor's pages, counted per list (``lists.Sink``):
    by column ``by`` (``event_id``), or one whole list. Rows keep a ``digest`` until ``seal``;
    those with a ``stored`` digest (sorted) get no payload (``page_batch``)."""

    conn: duckdb.DuckDBPyConnection
    endpoint: ListEndpoint
    table: str
    loaded_at: datetime
    by: str | None = None
    temporary: bool = False
    stored: np.ndarray | None = None

    def create(self) -> None:
        self.conn.execute(raw_table_ddl(self.endpoint, self.table, self.temporary, digest=True))

    def seal(self) -> None:
        """Keep each staged row's ``digest_columns`` in ``STAGED_DIGESTS`` (a row per staged row:
        ``_drop_duplicate_ids`` as for the stage) for the swap, and drop the staging columns (a
        DuckLake table's columns dropped in the swap's transaction fail its rename)."""
        stage, columns = qualified(self.table), digest_columns(self.endpoint)
        kept = ", ".join(f"{sql} AS {quote_ident(name)}" for name, sql in columns.items())
        staged_only = ("digest", *_staged_states(self.endpoint))
        self.conn.execute(
            f"CREATE OR REPLACE TEMP TABLE {STAGED_DIGESTS} AS SELECT {kept} FROM {stage}; "
            + "".join(f"ALTER TABLE {stage} DROP COLUMN {column}; " for column in staged_only)
        )

    def write(self, pages: Iterator[tuple[Stream, Page]]) -> None:
        writer = StagingWriter(self.conn, self.endpoint, self.table, self.loaded_at, self.stored)
        try:
            for _, page in pages:
                writer.add(page)
                pause_at("loading")
            writer.finish()
        finally:
            writer.close()  # joins the inserter (and its transaction) before anything else runs

    @property
    def _list(self) -> str:
        return quote_ident(self.by) if self.by else "NULL"

    def counts(self) -> dict[Hashable, tuple[int, int]]:
        found = self.conn.execute(
            f"SELECT {self._list}, count(*), count(DISTINCT id) "
            f"FROM {qualified(self.table)} GROUP BY ALL"
        ).fetchall()
        return {key: (rows, distinct) for key, rows, distinct in found}

    def differing(self, key: Hashable) -> tuple[int, tuple[str, ...]]:
        count, ids = one_row(
            self.conn,
            f"SELECT count(*), list(id ORDER BY id)[1:{NAMED_IDS}] FROM (SELECT id FROM "
            f"{qualified(self.table)} WHERE {self._list} IS NOT DISTINCT FROM $key GROUP BY id "
            "HAVING count(*) > 1 AND min(digest) <> max(digest))",
            {"key": key},
        )
        return count, tuple(ids or ())

    def ids_of(self, key: Hashable, digests: set[int]) -> tuple[str, ...]:
        found = self.conn.execute(
            f"SELECT DISTINCT id FROM {qualified(self.table)} WHERE digest IN (SELECT unnest("
            f"$digests)) AND {self._list} IS NOT DISTINCT FROM $key ORDER BY id LIMIT {NAMED_IDS}",
            {"key": key, "digests": list(digests)},
        ).fetchall()
        return tuple(row[0] for row in found)

    def forget(self, keys: list[Hashable]) -> None:
        if self.by is None:
            self.create()
        else:
            self.conn.execute(
                f"DELETE FROM {qualified(self.table)} WHERE {quote_ident(self.by)} "
                "IN (SELECT unnest($keys))",
                {"keys": keys},
            )


def page_executor(api: FieldSalesAPI, **options: Any) -> PageExecutor:
    """A ``PageExecutor`` of ``api``'s pages within its settings; ``options``: its ``label``,
    ``log`` and ``spent``."""
    limits = (api.concurrency, api.max_pages_per_pass, api.max_item_mb, api.max_list_passes)
    variable = api.named("FIELDSALES_MAX_ITEM_MB")
    return PageExecutor(api.fetch_page, Limits(*limits, variable), **options)


def write_rows(conn: duckdb.DuckDBPyConnection, table: str, staged: str) -> int:
    """Of ``table`` (a SQL name), delete the rows ``CHANGES`` holds as stored (changed or gone),
    insert those of ``staged`` it holds as staged (changed or new); any other row stays. Returns
    how many were deleted."""
    changed = f"SELECT id FROM {CHANGES} WHERE {{}}"
    (deleted,) = one_row(conn, f"DELETE FROM {table} WHERE id IN ({changed.format('stored')})")
    conn.execute(
        f"INSERT INTO {table} BY NAME FROM {staged} WHERE id IN ({changed.format('staged')})"
    )
    return int(deleted)


def load_list(
    api: FieldSalesAPI,
    conn: duckdb.DuckDBPyConnection,
    endpoint: ListEndpoint,
    *,
    log: Callable[[str], None] = lambda message: None,
    before_swap: Callable[[str], None] = lambda staged: None,
    after_swap: Callable[[int], None] | None = None,
    max_shrink_fraction: float = 0.5,
    allow_shrink: bool = False,
    run_id: str | None = None,
    redact_pii_in_raw: bool = False,
) -> LoadReport:
    """Make ``endpoint.raw_table`` hold every item the server lists (a row listed as stored is
    kept, ``loaded_at`` and all: ``compare_digests``), or leave it untouched.
    ``before_swap(staging_table)`` runs just before the swap (comments, and the redaction that
    ``redact_pii_in_raw`` says it makes); ``after_swap(rows)`` (by default ``record_load``) and
    the deletion audit run in the swap's transaction."""
    import numpy as np  # where a load runs: the definitions load without it

    started = time.monotonic()
    loaded_at = datetime.now(UTC)
    stage, table = staging_table(endpoint.raw_table), endpoint.raw_table
    digests = digests_table(table)
    conn.execute(f"CREATE SCHEMA IF NOT EXISTS {quote_ident(endpoint.schema)}")
    current = stored_digests_current(conn, endpoint)
    # Each staged item whose digest a stored row has is that row as received: staged without
    # its payload (8 bytes per stored row: 2 MB for the 250,000 events of 10M transactions).
    found = conn.execute(f"SELECT digest FROM {digests}").fetchnumpy() if current else {}
    stored = np.sort(np.asarray(found.get("digest", []), np.int64))
    staging = Staging(conn, endpoint, stage, loaded_at, stored=stored)
    key = digest_key(redact_pii_in_raw)
    executor = page_executor(api, label=endpoint.name, log=log, digest_key=key)
    try:
        staging.create()
        (result,) = ListPasses(executor, staging).run([Stream(endpoint)]).values()
        staging.seal()
        distinct = result.facts.distinct
        if result.facts.rows != distinct:
            _drop_duplicate_ids(conn, qualified(stage))
            _drop_duplicate_ids(conn, STAGED_DIGESTS)
        exists = table_exists(conn, table)
        old = one_row(conn, f"SELECT count(*) FROM {qualified(table)}")[0] if exists else 0
        if old and not allow_shrink and (distinct == 0 or 1 - distinct / old > max_shrink_fraction):
            what = "empty it" if distinct == 0 else f"shrink it by {1 - distinct / old:.0%}"
            raise ShrinkRefusedError(
                f"{table}: the server now lists {distinct} items where the table holds {old}; "
                f"replacing it would {what} (max_shrink_fraction={max_shrink_fraction:.0%}), so "
                "it was left as it was. If the data really went away, run with allow_shrink."
            )
        before_swap(stage)
        # Replaced whole (every row with this loaded_at) where no digests were recorded as this
        # code records them, or the tables' columns or comments differ.
        whole = not current or _layout(conn, stage) != _layout(conn, table)
        if whole and stored.size:  # the rows staged without their payload take it as stored
            conn.execute(
                f"UPDATE {qualified(stage)} AS s SET payload = t.payload FROM {qualified(table)} "
                "AS t WHERE s.payload IS NULL AND s.id = t.id"
            )
        # Without the table every staged id is new: a first load compares nothing.
        changes = CHANGES if exists else f"(SELECT id, true AS staged FROM {STAGED_DIGESTS})"
        recorded = f"SELECT id, {'digest' if current else 'NULL::BIGINT AS digest'} FROM "
        recorded += digests if current else qualified(table)
        written = not exists or compare_digests(conn, recorded) > 0 or whole
        # Two comparisons, on purpose: the digests read before paging (8 bytes a row, no id: what
        # fits beside a list of 10M) decide which payloads are staged; this one, by id and digest
        # (the incremental merge's too), what is written. In the asset's one transaction both
        # read one snapshot: they disagree only where an item's digest is another id's (2**-64 a
        # pair) or a write in it (``before_swap``) changed a stored row. Neither stores a NULL
        # (payload, or event state: a row staged without its payload has none). Without stored
        # digests every row was staged with its payload: reading the payloads' NULLs decompresses
        # them all (0.9 CPU-s for 200k transactions of the heavy tenant).
        lost = f"FROM {qualified(stage)} WHERE payload IS NULL AND id IN (SELECT id FROM {changes})"
        if stored.size and (lost_rows := one_row(conn, f"SELECT count(*) {lost}")[0]):
            raise RawLoadError(
                f"{table}: {lost_rows} items were stored as received when the load began, but "
                "not when it ended: another load wrote the table meanwhile. Nothing was written; "
                "run again."
            )

        def swap() -> None:
            if written:
                record_deletions(conn, endpoint, changes=changes, run_id=run_id, at=loaded_at)
                if whole:
                    replace_table(conn, stage, table)
                else:  # only the rows of ``CHANGES``: one stored as listed keeps its loaded_at
                    write_rows(conn, qualified(table), qualified(stage))
                if current:  # and its digest, with an event's state (``digest_columns``)
                    write_rows(conn, digests, STAGED_DIGESTS)
                else:
                    conn.execute(
                        "CREATE SCHEMA IF NOT EXISTS meta; "
                        f"CREATE OR REPLACE TABLE {digests} AS FROM {STAGED_DIGESTS}"
                    )
            (after_swap or partial(record_load, conn, table, at=loaded_at))(distinct)

        run_transaction(conn, endpoint.raw_table, swap)
    finally:
        drop_table(conn, qualified(stage))
        drop_table(conn, CHANGES)
        drop_table(conn, STAGED_DIGESTS)
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
        written=written,
    )
    log(
        f"{endpoint.name}: {'wrote' if written else 'kept (the server lists them as stored)'} "
        f"{report.rows} rows {'to' if written else 'of'} {report.table} "
        f"({report.pages} pages, {report.retries} retries, {report.repairs} repairs, "
        f"{report.seconds:.1f} s; {result.reason})"
    )
    return report


def compare_digests(
    conn: duckdb.DuckDBPyConnection, stored: str, params: dict[str, Any] | None = None
) -> int:
    """Fill ``CHANGES`` with the ids whose digest in ``STAGED_DIGESTS`` differs from that in
    ``stored`` (a query of stored ids and digests; a NULL digest differs from every other), or
    that only one holds; returns how many. Both hold distinct ids, so one full join by id finds
    every difference, reading no payload."""
    conn.execute(
        f"CREATE OR REPLACE TEMP TABLE {CHANGES} AS SELECT coalesce(s.id, t.id) AS id, "
        f"s.id IS NOT NULL AS staged, t.id IS NOT NULL AS stored FROM {STAGED_DIGESTS} s "
        f"FULL JOIN ({stored}) t ON s.id = t.id WHERE (s.digest = t.digest) IS NOT TRUE",
        params,
    )
    return one_row(conn, f"SELECT count(*) FROM {CHANGES}")[0]


def _layout(conn: duckdb.DuckDBPyConnection, table: str) -> Any:
    """``table``'s columns with their types and comments, in order; ``None`` without it."""
    return one_row(
        conn,
        "SELECT list((column_name, data_type, comment) ORDER BY column_index) FROM duckdb_columns()"
        " WHERE database_name = current_database() AND schema_name = ? AND table_name = ?",
        table.split(".", 1),
    )[0]


def record_load(
    conn: duckdb.DuckDBPyConnection,
    table: str,
    rows: int,
    at: datetime,
    mode: str = "full",
    events_loaded_at: datetime | None = None,
) -> None:
    """``STATE_TABLE``: ``table`` holds ``rows``, loaded ``at`` in ``mode`` (``full``: whole, as
    the server listed it then). One row per table, by delete-then-insert: a DuckLake has no
    PRIMARY KEY. An earlier release's record of lists loaded whole is dropped (``lake.upgrade``): a
    lake's first load of raw.events since is taken as its first (incremental.py)."""
    columns = "last_full_at TIMESTAMP, last_load_at TIMESTAMP, last_mode VARCHAR, rows BIGINT"
    ensure_table(conn, STATE_TABLE, f"table_name VARCHAR, {columns}, events_loaded_at TIMESTAMP")
    naive = at.astimezone(UTC).replace(tzinfo=None)
    last_full_at = naive if mode == "full" else recorded_load(conn, table)[0]
    conn.execute(f"DELETE FROM {STATE_TABLE} WHERE table_name = ?", [table])
    values = [table, last_full_at, naive, mode, rows, events_loaded_at]
    conn.execute(f"INSERT INTO {STATE_TABLE} VALUES (?, ?, ?, ?, ?, ?)", values)


def recorded_load(conn: duckdb.DuckDBPyConnection, table: str) -> tuple[Any, ...]:
    """``table``'s ``last_full_at``, ``rows`` and ``events_loaded_at`` (``record_load``); each
    ``None`` where no load of it is recorded."""
    query = f"SELECT last_full_at, rows, events_loaded_at FROM {STATE_TABLE} WHERE table_name = ?"
    found = conn.execute(query, [table]).fetchone() if table_exists(conn, STATE_TABLE) else None
    return found or (None, None, None)


def _drop_duplicate_ids(conn: duckdb.DuckDBPyConnection, table: str) -> None:
    """Keep one copy of each id of ``table`` (a SQL name): the completeness rule leaves only
    identical copies."""
    conn.execute(
        f"DELETE FROM {table} WHERE rowid IN (SELECT rowid FROM {table} "
        "QUALIFY row_number() OVER (PARTITION BY id ORDER BY rowid) > 1)"
    )
