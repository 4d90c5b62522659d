"""Core tables: typed, decoded tables built in DuckDB from the raw API items.

Each core table is one query in ``sql/<schema>_<table>.sql`` and its column meanings in
``sql/<schema>_<table>.yaml``. An asset runs its query into a staging table (empty strings stored
as NULL, personal columns as ``FieldSalesWarehouse.pii`` says, see ``columns.py``), writes the
descriptions as DuckDB comments, swaps it in for the previous table (a failed query leaves the
previous table in place), and reports the table's described schema, row count and a few rows.
The asset's deps are the tables its query's FROM and JOIN clauses read (``upstream_of``), so a
new JOIN is a new dependency without a line of Python.
"""

import functools
import hashlib
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any

import dagster as dg
import duckdb

from fieldsales_dagster.assets.columns import (
    Column,
    TableDoc,
    column_schema,
    comment_table,
    publishing_query,
    table_doc,
)
from fieldsales_dagster.assets.follow import (
    WHOLE_ABOVE,
    Follows,
    build_following,
    define_decoded_rows,
    rows_missing,
    same_row,
)
from fieldsales_dagster.assets.lineage import QueryReadError, Reads, column_sources, reads_of
from fieldsales_dagster.assets.metadata import storage_metadata, table_metadata
from fieldsales_dagster.assets.raw import raw_asset_name
from fieldsales_dagster.client.endpoints import LIST_ENDPOINTS
from fieldsales_dagster.names import InstanceNames
from fieldsales_dagster.pause import pause_at
from fieldsales_dagster.warehouse.lake import cleanup, drop_table, run_transaction
from fieldsales_dagster.warehouse.quoting import qualified, quote_ident, sql_literal
from fieldsales_dagster.warehouse.rows import one_row
from fieldsales_dagster.warehouse.warehouse import (
    FieldSalesWarehouse,
    replace_table,
    staging_table,
    table_exists,
)

if TYPE_CHECKING:
    from fieldsales_dagster.assets.checks import CoreCheck

#: ``checks_for(table)``: the checks an asset's step evaluates after building ``table``.
ChecksFor = Callable[["CoreTable"], Sequence["CoreCheck"]]


@dataclass(frozen=True)
class Decoded:
    """A pipeline-internal table: one raw table's payloads parsed once, for several core tables.

    Not part of the contract. It keeps the raw table's ``id`` and ``loaded_at``: every load stamps
    the rows it writes with its own ``loaded_at`` and keeps the others as they were, so the rows
    the decode lacks, and those it holds in vain, are told apart without parsing anything. After
    an incremental raw load only the re-fetched rows are parsed (``refresh_decoded``).

    A ``temp.<name>`` table is not kept (``kept``): the run's steps share one decode, outside
    the lake (``share_decoded``), each reading it as ``temp.<name>``.
    """

    #: ``meta.<name>`` (a lake table) or ``temp.<name>`` (not kept).
    table: str
    source: str
    description: str
    #: The whole source, as the full decode reads it (in slices, to bound the parser's memory).
    whole_source: str

    @property
    def kept(self) -> bool:
        """False for a ``temp.*`` table: it holds personal values, which core.* hashes or drops
        as ``pii`` says, so it is never written to the lake (as a lake table, its Parquet files
        sat in the data path during the step, and a failed step left them there until the
        upkeep deleted orphans). The first step of a run reading it builds it whole in the
        process's DuckDB instance (memory, spilled to the local temp_directory); the run's other
        steps read that (``share_decoded``), each through a TEMP view ``temp.<name>``; the run's
        end drops it."""
        return self.table.partition(".")[0] != "temp"

    @property
    def query_file(self) -> str:
        return f"{self.table.replace('.', '_')}.sql"


#: Every raw.transactions payload parsed once: core.transactions and core.custom_report_results
#: read it instead of parsing the ~5 KB payloads once each.
TRANSACTIONS_DECODED = Decoded(
    "meta.transactions_decoded",
    "raw.transactions",
    "Pipeline-internal, not for analysis (use core.transactions and "
    "core.custom_report_results): raw.transactions' payloads parsed once for the core tables.",
    whole_source="raw_transactions_in_slices()",
)


#: Every raw.events payload parsed once: the eight tables that read events read it instead of
#: parsing the payloads (up to ~14 KB each) once each; see temp_events_decoded.sql. Not kept:
#: it holds the events' personal values (names, emails, IPs).
EVENTS_DECODED = Decoded(
    "temp.events_decoded",
    "raw.events",
    "Pipeline-internal, not for analysis (use core.events and the other core tables): "
    "raw.events' payloads parsed once for the core tables.",
    whole_source="raw_events_in_slices()",
)


def _follows_transactions(
    inputs: str,
    from_decoded: str = "true",
    resolved_against: tuple[tuple[str, str], ...] = (),
) -> Follows:
    """How a core table with a ``transaction_id`` per row follows ``TRANSACTIONS_DECODED``."""
    return Follows(
        TRANSACTIONS_DECODED.table,
        key="transaction_id",
        from_decoded=from_decoded,
        inputs=inputs,
        resolved_against=resolved_against,
    )


@dataclass(frozen=True)
class CoreTable:
    """One core table: where its query lives; what it reads is read from the query."""

    table: str
    #: Columns that identify a row; checked for uniqueness by ``checks.py``.
    key: tuple[str, ...]
    description: str
    #: Key columns that may be NULL (a mart's group-by key); the others must not be.
    nullable_key: tuple[str, ...] = ()
    #: Set when the table follows the decoded table's changes rather than being rebuilt whole.
    follows: Follows | None = None

    @property
    def asset_name(self) -> str:
        return self.table.replace(".", "_")

    @property
    def query_file(self) -> str:
        return f"{self.asset_name}.sql"

    @property
    def schema(self) -> str:
        return self.table.partition(".")[0]

    @property
    def doc(self) -> TableDoc:
        """The column meanings declared in ``sql/<asset_name>.yaml``."""
        return table_doc(self.asset_name)

    @property
    def columns(self) -> tuple[Column, ...]:
        """Every column, in order: name, description, and whether it holds personal data."""
        return self.doc.columns

    @functools.cached_property
    def upstream(self) -> "Upstream":
        """What the table's query reads (parsed on first use, when the definitions load)."""
        return upstream_of(self, core_query(self))

    @property
    def deps(self) -> tuple[str, ...]:
        """The assets whose tables the query reads: the asset's ``deps``."""
        return self.upstream.deps

    @property
    def decoded(self) -> tuple[Decoded, ...]:
        """The decoded tables the query reads: brought up to date with their raw tables first."""
        return self.upstream.decoded


CORE_TABLES: tuple[CoreTable, ...] = (
    CoreTable(
        "core.transactions",
        ("transaction_id",),
        "One row per transaction: product, price, quantity, total value (price * qty), sale and "
        "creation times in UTC, invoice, credit and export state, and the custom report "
        "configuration id.",
        follows=_follows_transactions("meta.core_transactions_inputs"),
    ),
    CoreTable(
        "core.events",
        ("event_id",),
        "One row per event: project, point of sale, area, current state, planned start (earliest "
        "times[].start) and stop (latest times[].stop) in UTC, and the assigned user ids.",
    ),
    CoreTable(
        "core.projects",
        ("project_id",),
        "One row per project id, from the project objects embedded in events (the copy in the "
        "event with the latest planned start).",
    ),
    CoreTable(
        "core.areas",
        ("area_id",),
        "One row per area id, from pointOfSaleProjectStructure.area embedded in events (the copy "
        "in the event with the latest planned start).",
    ),
    CoreTable(
        "core.users",
        ("user_id",),
        "One row per user id, from the users assigned to events (eventUser; the copy in the "
        "event with the latest planned start).",
    ),
    CoreTable(
        "core.dim_point_of_sale",
        ("pos_id",),
        "One row per point of sale: address, coordinates ([longitude, latitude]), location "
        "groups and places-directory data, from the copy embedded in the event with the latest "
        "planned start.",
    ),
    CoreTable(
        "core.dim_point_of_sale_history",
        ("pos_id", "version"),
        "One row per point of sale and version of its name, address and coordinates, as the "
        "events that embed it carried them: valid_from is the planned start of the first event "
        "with that version, valid_to the start of the next version (NULL for the current one).",
    ),
    CoreTable(
        "core.event_status_history",
        ("event_id", "seq"),
        "One row per event status change (eventStateHistory), numbered 1, 2, ... in date order "
        "within each event.",
    ),
    CoreTable(
        "core.event_state_durations",
        ("event_id", "seq"),
        "One row per event and stay in a state: when the event entered it, when it left it (its "
        "next status change), and the seconds in between; NULL left_at for the current state.",
    ),
    CoreTable(
        "core.custom_report_fields",
        ("config_id", "field_id"),
        "One row per (custom report configuration, field), from the configurations embedded in "
        "transactions: field type and, for sliders, minimum, maximum and step.",
    ),
    CoreTable(
        "core.custom_report_results",
        ("source", "report_id", "field_id"),
        "One row per submitted custom report value, from transactions and events, resolved "
        "against its field definition and typed by field type (number, text, file reference, "
        "boolean), or by JSON type where the field type is unknown (value_kind says which), "
        "with slider range and step validity.",
        follows=_follows_transactions(
            "meta.custom_report_results_inputs",
            from_decoded="source = 'transaction'",
            # What a transaction's results read of its configuration's fields (the SQL's
            # transaction_resolved); event results also read config_last_used_at, but they
            # are rebuilt every time.
            resolved_against=(
                (
                    "core.custom_report_fields",
                    "config_id, field_id, field_name, field_type, slider_min, slider_max, "
                    "slider_step",
                ),
            ),
        ),
    ),
    CoreTable(
        "core.custom_report_field_types",
        ("field_type",),
        "One row per custom report field type seen in a configuration: how many fields, "
        "configurations and values have it, and whether this project decodes it.",
    ),
)


def core_query(table: CoreTable | Decoded) -> str:
    """The SQL that builds ``table``, as shipped in the package."""
    return (resources.files("fieldsales_dagster") / "sql" / table.query_file).read_text("utf-8")


def _fingerprint(conn: duckdb.DuckDBPyConnection, table: str) -> tuple | None:
    """Row count, latest load and a hash of every (id, loaded_at); ``None`` without the table.

    Every load stamps the rows it writes with its own ``loaded_at``, so a decode holds exactly the
    rows (ids and loads) its raw table holds when the two fingerprints are equal, and a raw table
    refreshed since differs in its count, its latest load or the hash.
    """
    if not table_exists(conn, table):
        return None
    return conn.execute(
        f"SELECT count(*), max(loaded_at), bit_xor(hash(id, loaded_at)) FROM {qualified(table)}"
    ).fetchone()


@dataclass(frozen=True)
class DecodeRefresh:
    """What ``refresh_decoded`` did: ``mode`` (current, incremental or full), rows parsed."""

    mode: str
    parsed: int

    def describe(self, decoded: Decoded) -> str:
        return f"{decoded.table}: {self.mode} ({self.parsed:,} payloads parsed)"


def decode_metadata(refreshed: Sequence[tuple[Decoded, DecodeRefresh]]) -> dict[str, Any]:
    """What bringing a table's decoded tables up to date did (nothing when it reads none)."""
    if not refreshed:
        return {}
    return {
        "fieldsales/decode": dg.MetadataValue.text(
            "; ".join(done.describe(decoded) for decoded, done in refreshed)
        ),
        "fieldsales/decode_payloads_parsed": dg.MetadataValue.int(
            sum(done.parsed for _, done in refreshed)
        ),
    }


def build_decoded(conn: duckdb.DuckDBPyConnection, decoded: Decoded) -> DecodeRefresh:
    """Parse all of ``decoded.source`` into the kept ``decoded.table``, staged and swapped like a
    core table."""

    def describe(staged: str) -> None:
        conn.execute(f"COMMENT ON TABLE {qualified(staged)} IS {sql_literal(decoded.description)}")

    _define_rows_to_decode(conn, f"SELECT * FROM {decoded.whole_source}")
    build_table(conn, decoded.table, core_query(decoded), before_swap=describe)
    (rows,) = one_row(conn, f"SELECT count(*) FROM {qualified(decoded.table)}")
    return DecodeRefresh("full", rows)


def share_decoded(
    conn: duckdb.DuckDBPyConnection, warehouse: FieldSalesWarehouse, decoded: Decoded
) -> DecodeRefresh:
    """Bring the not-kept ``decoded`` up to date for this run's steps; returns what it did.

    It is parsed once per run, not once per step reading it: the first step builds it whole
    (``"full"``) as a table of the process's DuckDB instance (``FieldSalesWarehouse.shared_table``:
    in memory, spilled to the local temp_directory, never in the lake), and the run's other steps
    read it as it is (``"current"``) while its raw table holds the same rows (``_fingerprint``);
    a raw table changed since (another run loaded it) is parsed again. The run's end drops it
    (``drop_shared``): it holds personal values that core.* hashes or drops as ``pii`` says.
    Outside a transaction: the lake's transaction may write one database only.
    """
    source = _fingerprint(conn, decoded.source)
    if source is not None and warehouse.shared_source(decoded.table) == source:
        return DecodeRefresh("current", 0)
    shared = warehouse.shared_table(decoded.table)
    _define_rows_to_decode(conn, f"SELECT * FROM {decoded.whole_source}")
    try:
        warehouse.create_shared_schema(conn)
        conn.execute(f"CREATE OR REPLACE TABLE {shared} AS\n{core_query(decoded)}")
    except duckdb.Error as exc:
        raise RuntimeError(
            f"Building {decoded.table} (a table of the run, never in the lake) failed. "
            f"DuckDB: {exc}"
        ) from exc
    warehouse.shared_built(decoded.table, source)
    (rows,) = one_row(conn, f"SELECT count(*) FROM {shared}")
    return DecodeRefresh("full", rows)


def _read_shared(
    conn: duckdb.DuckDBPyConnection, warehouse: FieldSalesWarehouse, decoded: Decoded
) -> None:
    """``temp.<name>``: a view of the step's connection on the run's shared ``decoded``."""
    name = decoded.table.partition(".")[2]
    conn.execute(
        f"CREATE OR REPLACE TEMP VIEW {quote_ident(name)} AS "
        f"SELECT * FROM {warehouse.shared_table(decoded.table)}"
    )


def refresh_decoded(conn: duckdb.DuckDBPyConnection, decoded: Decoded) -> DecodeRefresh:
    """Bring ``decoded`` up to date with its raw table; returns what it did.

    ``"current"``: nothing to do. ``"incremental"``: only the source rows the decode lacks (by
    ``id`` and ``loaded_at``) are parsed and inserted, and the rows no longer in the source are
    deleted, in one transaction. ``"full"``: no decode yet, or more than ``WHOLE_ABOVE`` of
    the source to parse (after a full raw load, every row). Either way the result holds exactly
    what a full decode of the source would hold.
    """
    found = _fingerprint(conn, decoded.table)
    if found is None or _layout_changed(conn, decoded):
        return build_decoded(conn, decoded)
    raw = _fingerprint(conn, decoded.source)
    assert raw is not None, f"{decoded.table} exists without its source {decoded.source}"
    if found == raw:
        return DecodeRefresh("current", 0)
    table, source = qualified(decoded.table), qualified(decoded.source)
    missing = rows_missing(conn, decoded.source, decoded.table, "_fs_to_decode", slices=4)
    if missing.count > WHOLE_ABOVE * raw[0]:
        return build_decoded(conn, decoded)
    _define_rows_to_decode(conn, missing.select)
    query = core_query(decoded)
    if macros := shared_macros_sql(query):  # the decode types values with typed_values.sql
        conn.execute(macros)

    def update() -> None:
        conn.execute(
            f"DELETE FROM {table} AS d WHERE NOT EXISTS (SELECT 1 FROM {source} AS s WHERE "
            f"{same_row('s', 'd')})"
        )
        conn.execute(f"INSERT INTO {table} BY NAME\n{query}")

    try:
        run_transaction(conn, decoded.table, update)
    except duckdb.Error as exc:
        raise RuntimeError(
            f"Updating {decoded.table} failed; it is left as it was. DuckDB: {exc}"
        ) from exc
    return DecodeRefresh("incremental", missing.count)


def _layout_changed(conn: duckdb.DuckDBPyConnection, decoded: Decoded) -> bool:
    """Whether the stored decode's columns (names, types) differ from its query's: a decode
    written by an earlier release is parsed again whole, not read with a layout it lacks. A query
    that does not bind (a raw table without its payload) is built whole, which names the error."""
    _define_rows_to_decode(conn, f"SELECT * FROM {qualified(decoded.source)} LIMIT 0")
    query = core_query(decoded)
    try:
        if macros := shared_macros_sql(query):
            conn.execute(macros)
        wanted = [row[:2] for row in conn.execute(f"DESCRIBE {query}").fetchall()]
    except duckdb.Error:
        return True
    stored = conn.execute(f"DESCRIBE SELECT * FROM {qualified(decoded.table)}").fetchall()
    return wanted != [row[:2] for row in stored]


def _define_rows_to_decode(conn: duckdb.DuckDBPyConnection, rows: str) -> None:
    """``rows_to_decode()``, the rows a decode query parses (``sql/meta_*.sql`` read it)."""
    if macros := shared_macros_sql(rows):
        conn.execute(macros)
    conn.execute(f"CREATE OR REPLACE TEMP MACRO rows_to_decode() AS TABLE {rows}")


#: Connection-scoped macros the queries and checks share (``sql/<name>.sql``; a file defines
#: the macro it is named after, and may define helpers beside it).
SHARED_MACROS = (
    "raw_transactions_in_slices",
    "raw_events_in_slices",
    "field_type_kinds",
    "known_event_states",
    "typed_values",
)


@functools.cache
def _macro_file(name: str) -> tuple[str, tuple[str, ...]]:
    """``sql/<name>.sql`` as one statement list, and the names of the macros it defines."""
    text = (resources.files("fieldsales_dagster") / "sql" / f"{name}.sql").read_text("utf-8")
    defined = tuple(re.findall(r"CREATE OR REPLACE TEMP MACRO (\w+)\(", text))
    return text.strip().rstrip(";"), defined


def _macro_files_called(query: str) -> list[str]:
    """The names of the macro files ``query`` calls a macro of."""
    return [
        name
        for name in SHARED_MACROS
        if any(f"{macro}(" in query for macro in _macro_file(name)[1])
    ]


def shared_macros_sql(query: str) -> str:
    """The macro files ``query`` calls a macro of (DuckDB binds a macro's tables when it is
    created)."""
    return ";\n".join(_macro_file(name)[0] for name in _macro_files_called(query))


#: Every decoded table, in the order a table reading several brings them up to date.
DECODED_TABLES: tuple[Decoded, ...] = (TRANSACTIONS_DECODED, EVENTS_DECODED)
#: The schemas whose tables this project builds: a query may read only these.
BUILT_SCHEMAS = ("raw", "meta", "core", "mart")


@dataclass(frozen=True)
class Upstream:
    """What a core or mart table's query reads, as the assets and decoded tables behind it."""

    #: Asset names, sorted: the asset's ``deps``.
    deps: tuple[str, ...]
    decoded: tuple[Decoded, ...]


def query_reads(query: str, where: str) -> Reads:
    """The tables ``query`` reads, with those the bodies of the shared macros it calls read."""
    reads = reads_of(query, where)
    for name in _macro_files_called(query):
        reads |= reads_of(_macro_file(name)[0], f"sql/{name}.sql")
    return reads


def upstream_of(table: CoreTable, query: str) -> Upstream:
    """The assets and decoded tables ``query`` (``table``'s) reads, from its FROM and JOIN clauses.

    ``raw.*``: the raw asset of that list. ``core.*``, ``mart.*``: the asset building the table.
    A decoded ``meta.*`` or ``temp.*`` table, or ``decoded_rows()`` of a table that follows one:
    the decoded table, and the raw asset it decodes. Other ``meta.*`` tables are pipeline state,
    no asset's. A table in any other schema (the user's own, for one) is refused: the project's
    tables are built before the user's assets, never from them.
    """
    where = f"sql/{table.query_file}"
    reads = query_reads(query, where)
    decoded_by_table = {decoded.table: decoded for decoded in DECODED_TABLES}
    raw_assets = {endpoint.raw_table: raw_asset_name(endpoint) for endpoint in LIST_ENDPOINTS}
    read_decoded = {name for name in reads.tables if name in decoded_by_table}
    if "decoded_rows" in reads.table_functions:
        if table.follows is None:
            raise QueryReadError(
                f"{where} calls decoded_rows(), which only a table that follows a decoded table "
                "defines: read the decoded meta.* or temp.* table by name, or give the table a "
                "Follows."
            )
        read_decoded.add(table.follows.decoded)
    deps: set[str] = set()
    for name in reads.tables - read_decoded:
        schema = name.partition(".")[0]
        if schema not in BUILT_SCHEMAS:
            raise QueryReadError(
                f"{where} reads {name}, in schema {schema}, which this project does not build "
                f"(it builds {', '.join(BUILT_SCHEMAS)}): a core or mart table may not read the "
                "user's own tables, which are built after it. Read the project's tables only."
            )
        if schema == "raw":
            if name not in raw_assets:
                raise QueryReadError(
                    f"{where} reads {name}, which no raw asset loads (they load "
                    f"{', '.join(sorted(raw_assets))}). Fix the table name."
                )
            deps.add(raw_assets[name])
        elif schema in ("core", "mart"):
            asset = name.replace(".", "_")
            if not (resources.files("fieldsales_dagster") / "sql" / f"{asset}.sql").is_file():
                raise QueryReadError(
                    f"{where} reads {name}, which no query of this project builds (there is no "
                    f"sql/{asset}.sql). Fix the table name."
                )
            deps.add(asset)
    decoded = tuple(d for d in DECODED_TABLES if d.table in read_decoded)
    deps.update(raw_assets[d.source] for d in decoded)
    return Upstream(tuple(sorted(deps)), decoded)


def query_code_version(table: CoreTable) -> str:
    """The asset's code version: a hash of its query and of the shared macros it calls, so the
    UI marks the table changed when its SQL changes (dagster-dbt's convention)."""
    query = core_query(table)
    return hashlib.sha256(f"{query}\n{shared_macros_sql(query)}".encode()).hexdigest()[:16]


def _columns_of(asset: str) -> tuple[str, ...]:
    """The columns of the table asset ``asset`` writes (a raw table's, or a query's)."""
    for endpoint in LIST_ENDPOINTS:
        if raw_asset_name(endpoint) == asset:
            extra = tuple(column for column, _ in endpoint.extra_columns)
            return ("id", "payload", "loaded_at", *extra)
    return tuple(column.name for column in table_doc(asset).columns)


def column_lineage(names: InstanceNames, table: CoreTable) -> dg.TableColumnLineage:
    """Each column's source columns, read from the query (``lineage.column_sources``), as the
    assets behind them: a decoded ``meta.*`` or ``temp.*`` table's columns come from its raw
    table's ``payload`` (its ``id`` and ``loaded_at`` from theirs); macros' constant lists are
    no asset."""
    decoded_by_table: dict[str, Decoded] = {decoded.table: decoded for decoded in DECODED_TABLES}
    if table.follows is not None:
        decoded_by_table["decoded_rows"] = decoded_by_table[table.follows.decoded]
    raw_assets = {endpoint.raw_table: raw_asset_name(endpoint) for endpoint in LIST_ENDPOINTS}
    known = tuple(
        (f"{dep.partition('_')[0]}.{dep.partition('_')[2]}", _columns_of(dep)) for dep in table.deps
    )
    sources = column_sources(
        core_query(table), tuple(column.name for column in table.columns), known
    )
    deps: dict[str, list[dg.TableColumnDep]] = {}
    for column, pairs in sources.items():
        found: set[tuple[str, str]] = set()
        for source, source_column in pairs:
            if source in decoded_by_table:
                asset = raw_assets[decoded_by_table[source].source]
                kept = source_column in ("id", "loaded_at")
                found.add((asset, source_column if kept else "payload"))
            elif source in raw_assets:
                found.add((raw_assets[source], source_column))
            elif source.partition(".")[0] in ("core", "mart"):
                found.add((source.replace(".", "_"), source_column))
        if found:
            deps[column] = [
                dg.TableColumnDep(asset_key=names.asset_key(asset), column_name=name)
                for asset, name in sorted(found)
            ]
    return dg.TableColumnLineage(deps_by_column=deps)


def lineage_markdown(lineage: dg.TableColumnLineage) -> str:
    """``lineage`` as a markdown table: each column and the upstream columns it comes from."""
    rows = [
        f"| {column} | "
        + ", ".join(f"{dep.asset_key.to_user_string()}.{dep.column_name}" for dep in deps)
        + " |"
        for column, deps in lineage.deps_by_column.items()
    ]
    return "\n".join(["| column | comes from |", "|---|---|", *rows])


def build_table(
    conn: duckdb.DuckDBPyConnection,
    target: str,
    query: str,
    params: dict[str, object] | None = None,
    before_swap: Callable[[str], None] | None = None,
) -> None:
    """Run ``query`` into a staging table and swap it in for ``target``.

    ``before_swap(staged)`` runs on the staging table (comments, for example), so readers never
    see the new table without it. If either fails, ``target`` keeps its previous contents; the
    error names the table.
    """
    schema, _, name = target.partition(".")
    staged = staging_table(target)
    conn.execute(f"CREATE SCHEMA IF NOT EXISTS {quote_ident(schema)}")
    try:
        if macros := shared_macros_sql(query):
            conn.execute(macros)
        conn.execute(f"CREATE OR REPLACE TABLE {qualified(staged)} AS\n{query}", params or {})
        if before_swap is not None:
            before_swap(staged)
        pause_at("core")
    except duckdb.Error as exc:
        drop_table(conn, qualified(staged))
        raise RuntimeError(
            f"Building {target} failed; the previous {target} is left as it was. DuckDB: {exc}"
        ) from exc
    replace_table(conn, staged, target)


def share_decoded_of(
    conn: duckdb.DuckDBPyConnection, warehouse: FieldSalesWarehouse, table: CoreTable
) -> dict[Decoded, DecodeRefresh]:
    """``share_decoded`` for each not-kept decoded table ``table`` reads (before its
    transaction)."""
    shared: dict[Decoded, DecodeRefresh] = {}
    for decoded in table.decoded:
        if decoded.kept:
            continue
        try:
            shared[decoded] = share_decoded(conn, warehouse, decoded)
        except RuntimeError as exc:
            raise RuntimeError(
                f"Building {table.table} failed; the previous {table.table} is left as it was. "
                f"It reads {decoded.table}: {exc}"
            ) from exc
    return shared


def build_described_table(
    conn: duckdb.DuckDBPyConnection,
    table: CoreTable,
    warehouse: FieldSalesWarehouse,
    shared: dict[Decoded, DecodeRefresh] | None = None,
) -> dict[str, Any]:
    """Build ``table`` from its query as stored for analysts, with its comments, and swap it in.

    A table reading a decoded table first brings it up to date with its raw table, so the table
    never reads a decode older than the raw data; the returned metadata says how. ``shared``:
    what ``share_decoded_of`` did for the table before its transaction (called here without it).
    Outside a run, the shared decoded tables are dropped after the build.
    """
    own = shared is None
    if shared is None:
        shared = share_decoded_of(conn, warehouse, table)
    try:
        return _build_described(conn, table, warehouse, shared)
    finally:
        if own and not warehouse.in_run:
            warehouse.drop_shared(conn)


def _build_described(
    conn: duckdb.DuckDBPyConnection,
    table: CoreTable,
    warehouse: FieldSalesWarehouse,
    shared: dict[Decoded, DecodeRefresh],
) -> dict[str, Any]:
    refreshed: list[tuple[Decoded, DecodeRefresh]] = []
    for decoded in table.decoded:
        if not decoded.kept:
            _read_shared(conn, warehouse, decoded)
            refreshed.append((decoded, shared[decoded]))
            continue
        try:
            refreshed.append((decoded, refresh_decoded(conn, decoded)))
        except RuntimeError as exc:
            raise RuntimeError(
                f"Building {table.table} failed; the previous {table.table} is left as it was. "
                f"It reads {decoded.table}: {exc}"
            ) from exc
    metadata = decode_metadata(refreshed)
    query = core_query(table)
    macros = shared_macros_sql(query)
    try:
        if macros:
            conn.execute(macros)
        if table.follows is not None:
            define_decoded_rows(conn, table.follows)
        published, params = publishing_query(conn, table.table, query, table.doc, warehouse)
    except duckdb.Error as exc:
        raise RuntimeError(
            f"Building {table.table} failed; the previous {table.table} is left as it was. "
            f"DuckDB: {exc}"
        ) from exc

    def describe(staged: str) -> None:
        comment_table(conn, staged, table.description, table.doc, warehouse.pii)

    def build_whole() -> None:
        build_table(conn, table.table, published, params, before_swap=describe)

    try:
        if table.follows is None:
            build_whole()
            return metadata
        followed = build_following(
            conn, table.table, table.follows, published, params, build_whole, macros=macros
        )
        return {**metadata, **followed.metadata()}
    finally:
        with cleanup(conn):
            for decoded in table.decoded:
                if not decoded.kept:
                    name = decoded.table.partition(".")[2]
                    conn.execute(f"DROP VIEW IF EXISTS temp.{quote_ident(name)}")


def materialize_core_table(
    conn: duckdb.DuckDBPyConnection, warehouse: FieldSalesWarehouse, table: CoreTable
) -> dict[str, Any]:
    """Build ``table`` on ``conn`` (on a lake: one commit) and return its metadata (schema, row
    count, preview)."""
    shared = share_decoded_of(conn, warehouse, table)
    try:
        decode = warehouse.one_commit(
            conn, table.table, lambda: build_described_table(conn, table, warehouse, shared)
        )
    finally:
        if not warehouse.in_run:
            warehouse.drop_shared(conn)
    schema = column_schema(conn, table.table, table.doc, warehouse.pii)
    return {
        **table_metadata(
            conn, warehouse.name, table.table, schema=schema, hidden=table.doc.pii_columns
        ),
        **storage_metadata(warehouse, table.table),
        **decode,
    }


def build_core_asset(
    names: InstanceNames,
    table: CoreTable,
    owners: list[str],
    freshness_policy: dg.FreshnessPolicy | None,
    checks: Sequence["CoreCheck"] = (),
    io_manager_key: str | None = None,
) -> dg.AssetsDefinition:
    """The asset that builds ``table``; its step then evaluates ``checks`` on a new connection.

    It subsets: a run may select the table, any of its checks, or both (checks alone read the
    table as it is). ``io_manager_key`` loads the table as a downstream asset's input (the
    component's ``fieldsales_io_manager``, which reads the ``table`` metadata).
    """
    key = names.asset_key(table.asset_name)
    by_key = {dg.AssetCheckKey(key, check.name): check for check in checks}
    spec = dg.AssetSpec(
        key=key,
        description=table.description,
        group_name=names.group(table.schema),
        kinds={"duckdb"},
        owners=owners,
        deps=[names.asset_key(dep) for dep in table.deps],
        automation_condition=dg.AutomationCondition.eager(),
        freshness_policy=freshness_policy,
        metadata={"table": table.table, "query": f"sql/{table.query_file}"},
        code_version=query_code_version(table),
    )

    @dg.multi_asset(
        name=key.to_python_identifier(),
        specs=[spec.with_io_manager_key(io_manager_key) if io_manager_key else spec],
        check_specs=[check.spec(names) for check in checks],
        can_subset=True,
        pool=names.pool_for(table.asset_name),
        required_resource_keys={names.warehouse.key},
    )
    def _core_table(
        context: dg.AssetExecutionContext,
    ) -> Iterator[dg.MaterializeResult | dg.AssetCheckResult]:
        warehouse = names.warehouse.of(context)
        if key in context.selected_asset_keys:
            with warehouse.get_connection() as conn:
                metadata = materialize_core_table(conn, warehouse, table)
            lineage = column_lineage(names, table)
            metadata["dagster/column_lineage"] = lineage
            # The open-source UI does not show dagster/column_lineage: the same, as a table.
            metadata["fieldsales/column_lineage"] = dg.MetadataValue.md(lineage_markdown(lineage))
            yield dg.MaterializeResult(asset_key=key, metadata=metadata)
        if not context.selected_asset_check_keys:
            return
        # The checks get a connection of their own (a cursor of the lake's instance): its own
        # transaction context and TEMP objects, none of the build's left over.
        with warehouse.get_connection() as conn:
            for check_key in sorted(context.selected_asset_check_keys, key=str):
                yield by_key[check_key].result(conn, names)

    return _core_table


def build_core_assets(
    names: InstanceNames,
    owners: list[str],
    freshness_policy: dg.FreshnessPolicy | None,
    checks_for: ChecksFor | None = None,
    io_manager_key: str | None = None,
    tables: Sequence[CoreTable] = CORE_TABLES,
) -> list[dg.AssetsDefinition]:
    """One asset per table of ``tables`` (the core tables; ``mart.py`` passes the marts), in the
    group named after its schema; ``checks_for(table)`` are the checks its step evaluates."""
    return [
        build_core_asset(
            names,
            table,
            owners,
            freshness_policy,
            checks_for(table) if checks_for else (),
            io_manager_key,
        )
        for table in tables
    ]
