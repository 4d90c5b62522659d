"""Load one list endpoint into its ``raw.*`` table: stream pages into a staging table, check, swap.

Pages go to DuckDB as bytes: each page's items (already validated JSON) are appended to a
newline-delimited spool file, and every ``spool_bytes`` DuckDB's JSON reader inserts the spool into
the staging table in one statement. Fetching runs in a background thread meanwhile, so network and
inserts overlap, and memory holds a few pages plus one spool buffer whatever the list's size.

A pass is accepted only when nothing shows the list moved while it was paged: the total stayed
the same, no id came twice, and the distinct ids equal the final total. Otherwise the whole list
is paged again, up to ``max_list_passes`` times, before the load fails. The previous table is
replaced only after that check, in one transaction.
"""

from __future__ import annotations

import queue
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

import duckdb

from fieldsales_dagster.api import FieldSalesAPI, FieldSalesAPIError, ListStats, Page
from fieldsales_dagster.endpoints import ListEndpoint
from fieldsales_dagster.warehouse import qualified, quote_ident, replace_table

T = TypeVar("T")

#: DuckDB reads at most this many bytes for one JSON item (its default is 16 MiB).
MAX_ITEM_BYTES = 32 * 1024 * 1024


class IncompleteListError(FieldSalesAPIError):
    """Every pass over a list disagreed with the server's total."""


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

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0


def raw_table_ddl(endpoint: ListEndpoint, table: str) -> str:
    extra = "".join(f", {quote_ident(col)} VARCHAR" for col, _ in endpoint.extra_columns)
    return (
        f"CREATE OR REPLACE TABLE {qualified(table)} "
        f"(id VARCHAR, payload JSON, loaded_at TIMESTAMP{extra})"
    )


def _insert_sql(endpoint: ListEndpoint, table: str) -> str:
    # `_id` where present; an item without one (event groups' shape is not documented) gets a
    # content hash, so identical copies collapse and distinct items stay distinct.
    extra_cols = "".join(f", {quote_ident(col)}" for col, _ in endpoint.extra_columns)
    extra_vals = "".join(f", json ->> '{key}'" for _, key in endpoint.extra_columns)
    return (
        f"INSERT INTO {qualified(table)} (id, payload, loaded_at{extra_cols}) "
        f"SELECT coalesce(json ->> '_id', md5(json::VARCHAR)), json, $loaded_at{extra_vals} "
        f"FROM read_ndjson_objects($path, maximum_object_size={MAX_ITEM_BYTES})"
    )


class StagingWriter:
    """Appends pages to a spool file and inserts it into the staging table in large batches."""

    def __init__(
        self,
        conn: duckdb.DuckDBPyConnection,
        endpoint: ListEndpoint,
        table: str,
        loaded_at: datetime,
        spool_dir: Path,
        spool_bytes: int,
    ):
        self.conn = conn
        self.sql = _insert_sql(endpoint, table)
        self.loaded_at = loaded_at.replace(tzinfo=None)
        self.spool_path = spool_dir / f"{endpoint.name}.ndjson"
        self.spool_bytes = spool_bytes
        self._spool = self.spool_path.open("wb")
        self._size = 0
        self.items_written = 0
        self.rows_inserted = 0

    def add(self, page: Page) -> None:
        data = page.ndjson()
        if not data:
            return
        self._spool.write(data)
        self._size += len(data)
        self.items_written += page.n
        if self._size >= self.spool_bytes:
            self.flush()

    def flush(self) -> None:
        if not self._size:
            return
        self._spool.close()
        inserted = self.conn.execute(
            self.sql, {"path": str(self.spool_path), "loaded_at": self.loaded_at}
        ).fetchone()[0]
        self.rows_inserted += inserted
        self._spool = self.spool_path.open("wb")
        self._size = 0

    def close(self) -> None:
        self._spool.close()
        self.spool_path.unlink(missing_ok=True)


def prefetch(iterator: Iterator[T], depth: int) -> Iterator[T]:
    """Run ``iterator`` in a background thread, at most ``depth`` items ahead of the consumer."""
    buffer: queue.Queue[tuple[str, object]] = queue.Queue(maxsize=max(1, depth))
    stop = threading.Event()

    def put(kind: str, value: object) -> bool:
        while not stop.is_set():
            try:
                buffer.put((kind, value), timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def pump() -> None:
        try:
            for item in iterator:
                if not put("item", item):
                    break
        except BaseException as exc:  # handed to the consumer, raised there
            put("error", exc)
        else:
            put("done", None)
        finally:
            close = getattr(iterator, "close", None)
            if close:
                close()

    thread = threading.Thread(target=pump, name="fieldsales-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            kind, value = buffer.get()
            if kind == "item":
                yield value  # type: ignore[misc]
            elif kind == "error":
                raise value  # type: ignore[misc]
            else:
                return
    finally:
        stop.set()
        thread.join()


def load_list(
    api: FieldSalesAPI,
    conn: duckdb.DuckDBPyConnection,
    endpoint: ListEndpoint,
    *,
    log: Callable[[str], None] = lambda message: None,
    spool_bytes: int = 64 * 1024 * 1024,
    spool_dir: Path | None = None,
) -> LoadReport:
    """Replace ``endpoint.raw_table`` with every item the server lists, or leave it untouched."""
    started = time.monotonic()
    loaded_at = datetime.now(UTC)
    schema = endpoint.schema
    stage = f"{schema}._stage_{endpoint.table}"
    conn.execute(f"CREATE SCHEMA IF NOT EXISTS {quote_ident(schema)}")
    totals = ListStats()  # summed over passes

    def progress(stats: ListStats) -> None:
        of = f"/{stats.total}" if stats.total is not None else ""
        log(
            f"{endpoint.name}: {stats.items}{of} items in {stats.pages} pages, "
            f"{stats.bytes / 1e6:.0f} MB, {stats.retries} retries, "
            f"{time.monotonic() - started:.1f} s"
        )

    last_problem = ""
    with tempfile.TemporaryDirectory(prefix="fieldsales-spool-", dir=spool_dir) as tmp:
        for attempt in range(1, api.max_list_passes + 1):
            conn.execute(raw_table_ddl(endpoint, stage))
            stats = ListStats()
            writer = StagingWriter(conn, endpoint, stage, loaded_at, Path(tmp), spool_bytes)
            try:
                for page in prefetch(api.iter_pages(endpoint, stats, progress), api.concurrency):
                    writer.add(page)
                writer.flush()
            except BaseException:
                conn.execute(f"DROP TABLE IF EXISTS {qualified(stage)}")
                raise
            finally:
                writer.close()
            for name in ("requests", "retries", "pages", "bytes"):
                totals.count(**{name: getattr(stats, name)})

            if writer.rows_inserted != writer.items_written:
                raise FieldSalesAPIError(
                    f"{endpoint.name}: DuckDB read {writer.rows_inserted} items from the pages "
                    f"but the API returned {writer.items_written}; nothing was replaced."
                )
            rows, distinct = conn.execute(
                f"SELECT count(*), count(DISTINCT id) FROM {qualified(stage)}"
            ).fetchone()
            # The list may move while it is paged (items inserted or deleted ahead of the
            # cursor shift the rest into or out of windows already fetched). A pass is trusted
            # when nothing shows a move: the total stayed the same, no id came twice, and the
            # distinct ids match the total. A shift can hide items while the counts still agree
            # (as many deleted-but-fetched ids as shifted-and-missed ones), so every sign counts.
            moved = len(stats.totals_seen) > 1
            matches_total = stats.total is None or distinct == stats.total
            complete = matches_total and not moved and rows == distinct
            if not complete and attempt == api.max_list_passes:
                # Last pass: a stable total that the distinct ids match is the best evidence
                # there is; the repeated ids are dropped.
                complete = stats.total is not None and matches_total and not moved
            problem = (
                f"{distinct} distinct ids against a final total of {stats.total}"
                if stats.total is not None
                else "no total reported"
            ) + f", {rows - distinct} repeated ids"
            if complete:
                if rows != distinct:
                    _drop_duplicate_ids(conn, stage)
                replace_table(conn, stage, endpoint.raw_table)
                report = LoadReport(
                    table=endpoint.raw_table,
                    rows=distinct,
                    api_total=stats.total,
                    passes=attempt,
                    pages=totals.pages,
                    requests=totals.requests,
                    retries=totals.retries,
                    bytes=totals.bytes,
                    duplicates_dropped=rows - distinct,
                    seconds=time.monotonic() - started,
                )
                log(
                    f"{endpoint.name}: wrote {report.rows} rows to {report.table} "
                    f"({report.pages} pages, {report.retries} retries, {report.seconds:.1f} s)"
                )
                return report
            seen = ", ".join(map(str, stats.totals_seen))
            last_problem = problem + (f" (totals seen: {seen})" if seen else "")
            log(
                f"{endpoint.name}: pass {attempt} found {last_problem}; the list changed while "
                "it was paged, paging it again."
            )
    conn.execute(f"DROP TABLE IF EXISTS {qualified(stage)}")
    raise IncompleteListError(
        f"{endpoint.name} ({endpoint.path}): after {api.max_list_passes} passes the server's "
        f"list kept changing: {last_problem}. {endpoint.raw_table} was left as "
        "it was. The list kept changing during the load (or the server miscounts); run again "
        "later or raise max_list_passes."
    )


def _drop_duplicate_ids(conn: duckdb.DuckDBPyConnection, table: str) -> None:
    """Keep the first copy of each id (the list changed while it was paged)."""
    conn.execute(
        f"DELETE FROM {qualified(table)} WHERE rowid IN ("
        f"  SELECT rowid FROM (SELECT rowid, row_number() OVER (PARTITION BY id ORDER BY rowid)"
        f"  AS copy FROM {qualified(table)}) WHERE copy > 1)"
    )
