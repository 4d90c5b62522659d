"""The pandas IO manager of user assets: DataFrames in and out of the warehouse, one writer.

``fieldsales_io_manager`` (prefixed per tenant) is dagster-duckdb's ``DbIOManager`` with its
DuckDB client and pandas type handler, connected through ``FieldSalesWarehouse.get_connection()``
instead of its own ``duckdb.connect``. So a user asset reads and writes the same lake as the
project's assets, and its table reaches analysts with the commit of its store.

* An input from one of the project's assets (``core_transactions: pd.DataFrame``) is read from
  the table the asset declares (its ``table`` metadata, ``core.transactions``); ``columns`` in
  the input's metadata selects columns (dagster-duckdb's convention).
* An output lands in ``<schema>.<asset name>``: the schema is the asset's ``schema`` metadata,
  else the component's ``user_schema`` (``analytics``). An unpartitioned output replaces the
  whole table (its columns may change from run to run); a partitioned one replaces its
  partitions, as dagster-duckdb does. The project's own schemas are refused: their tables are
  rebuilt by the project and would overwrite it, or be overwritten.
* What is stored is exactly what the frame holds (``storable_frame``), or nothing: an index
  becomes columns (a ``groupby`` result keeps its keys; only an unnamed integer index, pandas'
  row numbering, is left out), and a frame DuckDB would store otherwise (two columns of one name,
  which it renames; an object column of mixed types, which it turns into text; a lone surrogate,
  which breaks the database) fails the run naming the column and what to do.
"""

from __future__ import annotations

import datetime as dt
import decimal
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, cast

import dagster as dg
import duckdb
import numpy as np
import pandas as pd

# The base dagster-duckdb builds its own IO manager on: Dagster 1.13 does not export it.
from dagster._core.storage.db_io_manager import DbIOManager, TableSlice
from dagster_duckdb.io_manager import DuckDbClient
from dagster_duckdb_pandas import DuckDBPandasTypeHandler

from fieldsales_dagster.assets.columns import TableDoc, column_schema
from fieldsales_dagster.assets.metadata import table_metadata
from fieldsales_dagster.names import ResourceKey
from fieldsales_dagster.settings import PROJECT_SCHEMAS
from fieldsales_dagster.warehouse.quoting import qualified
from fieldsales_dagster.warehouse.warehouse import (
    FieldSalesWarehouse,
    table_exists,
)


def _table(table_slice: TableSlice) -> str:
    return f"{table_slice.schema}.{table_slice.table}"


class FrameNotStorableError(ValueError):
    """A DataFrame holds something DuckDB would not store as it is."""


#: A UTF-16 surrogate code point: a string cut in the middle of a pair, which UTF-8 cannot hold.
_SURROGATE = re.compile("[\ud800-\udfff]")
#: Kinds of values an object column may hold, one kind per column (``None``/NaN/NaT aside).
_KINDS: tuple[tuple[type, str], ...] = (
    (bool, "bool"),
    (int, "int"),
    (float, "float"),
    (decimal.Decimal, "Decimal"),
    (str, "str"),
    (bytes, "bytes"),
    (dt.datetime, "datetime"),
    (dt.date, "date"),
    (dt.time, "time"),
    (dt.timedelta, "timedelta"),
)


def _kind(value: object) -> str:
    if isinstance(value, np.generic):  # numpy's scalars: their Python value's kind
        value = value.item()
    for kind, name in _KINDS:
        if isinstance(value, kind):
            if name == "datetime":  # naive and zoned times are different things
                return "datetime" if cast(dt.datetime, value).tzinfo is None else "zoned datetime"
            return name
    return type(value).__name__


def storable_frame(frame: pd.DataFrame, table: str) -> tuple[pd.DataFrame, dict[str, str]]:
    """``frame`` as DuckDB will store it, exactly: its index as columns (but pandas' row
    numbering), every column name a distinct string, numpy scalars as Python values; or
    ``FrameNotStorableError`` naming the column and what to do. Also the kind of value each
    object column holds (``check_stored`` holds the stored table to it)."""

    def refuse(column: object, why: str, what_to_do: str) -> FrameNotStorableError:
        return FrameNotStorableError(
            f"fieldsales_io_manager cannot store this DataFrame in {table} as it is: column "
            f"{column!r} {why}. {what_to_do}. Nothing was written; {table} is as it was."
        )

    if isinstance(frame.columns, pd.MultiIndex):
        raise refuse(
            frame.columns[0],
            "is one of several column levels (a pivot or an aggregation with several functions)",
            "Flatten the columns first, e.g. df.columns = ['_'.join(map(str, c)) for c in "
            "df.columns]",
        )
    index = frame.index
    row_numbers = index.nlevels == 1 and index.name is None and pd.api.types.is_integer_dtype(index)
    if not row_numbers:
        names = [name if name is not None else "index" for name in index.names]
        if index.nlevels > 1:
            names = [
                name if name is not None else f"level_{i}" for i, name in enumerate(index.names)
            ]
        taken = {str(c).lower() for c in frame.columns}
        for name in names:
            if str(name).lower() in taken:
                raise refuse(
                    name,
                    "is both an index level and a column",
                    "Rename the index level (df.index.names = [...]) or drop it "
                    "(df.reset_index(drop=True))",
                )
        frame = frame.reset_index(names=names)
    if len(frame.columns) == 0:
        raise refuse("", "is missing: the frame has no columns", "Return at least one column")
    seen: dict[str, int] = {}
    for position, column in enumerate(frame.columns):
        other = frame.columns[seen.setdefault(str(column).lower(), position)]
        if seen[str(column).lower()] != position:
            raise refuse(
                column,
                f"has the name of column {other!r} (DuckDB's names ignore case and type: it would "
                "rename one of them)",
                "Rename one of them, e.g. with df.columns = [...]",
            )
    if not all(isinstance(column, str) for column in frame.columns):
        frame = frame.set_axis([str(column) for column in frame.columns], axis="columns")
    held: dict[str, str] = {}
    for position, column in enumerate(frame.columns):
        values = frame.iloc[:, position]
        if values.dtype == object:
            present = values[values.notna()]
            if any(isinstance(value, np.generic) for value in present):  # DuckDB makes them text
                values = values.map(lambda v: v.item() if isinstance(v, np.generic) else v)
                frame = frame.assign(**{column: values})
            kinds = sorted({_kind(value) for value in present})
            if len(kinds) > 1 or (kinds and kinds[0] not in {name for _, name in _KINDS}):
                raise refuse(
                    column,
                    f"holds values of {len(kinds)} kinds ({', '.join(kinds)}); DuckDB would turn "
                    "them into one (text, or a map of text)",
                    f"Convert it to one type first, e.g. df[{column!r}].astype(str), or "
                    f"df[{column!r}].map(json.dumps) for dicts and lists",
                )
            if not kinds:  # no value to tell the type: text, as an empty object column is
                frame = frame.astype({column: "string"})
            held[column] = kinds[0] if kinds else "str"
        if values.dtype == object or isinstance(values.dtype, pd.StringDtype):
            cut = values[values.astype(str).str.contains(_SURROGATE, na=False) & values.notna()]
            if len(cut):
                raise refuse(
                    column,
                    f"holds a lone surrogate (half of a UTF-16 pair, e.g. a string cut mid-emoji) "
                    f"in row {cut.index.tolist()[0]!r} and {len(cut) - 1} more rows, which UTF-8 "
                    "cannot hold",
                    f"Replace them first, e.g. df[{column!r}] = df[{column!r}].str.encode("
                    "'utf-8', 'replace').str.decode('utf-8')",
                )
    return frame, held


def check_stored(connection: duckdb.DuckDBPyConnection, table: str, held: dict[str, str]) -> None:
    """Fail if DuckDB stored an object column of non-text values as text (it does so for value
    types it does not know): the frame's values would come back as strings."""
    schema, _, name = table.partition(".")
    types = dict(
        connection.execute(
            "SELECT column_name, data_type FROM duckdb_columns() "
            "WHERE schema_name = $schema AND table_name = $table",
            {"schema": schema, "table": name},
        ).fetchall()
    )
    for column, kind in held.items():
        if kind != "str" and types.get(column) == "VARCHAR":
            raise FrameNotStorableError(
                f"fieldsales_io_manager cannot store this DataFrame in {table} as it is: column "
                f"{column!r} holds {kind} values, which DuckDB would store as text. Convert it to "
                f"a pandas type first (e.g. df[{column!r}].astype(...)). Nothing was written; "
                f"{table} is as it was."
            )


class WarehouseClient(DuckDbClient):
    """dagster-duckdb's DuckDB client, its connection taken from the warehouse.

    Each load or store is one transaction on the lake (one snapshot): a store that fails leaves
    the previous table as it was.
    """

    def __init__(self, warehouse: FieldSalesWarehouse) -> None:
        self._warehouse = warehouse

    # DuckDbClient.connect is a static method reading the resource's config; this client connects
    # through its warehouse, so it is an instance method: a deliberate [override].
    @contextmanager
    def connect(self, context, table_slice: TableSlice) -> Iterator[duckdb.DuckDBPyConnection]:  # type: ignore[override]
        with self._warehouse.get_connection() as conn:
            conn.execute("BEGIN TRANSACTION")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    @staticmethod
    def delete_table_slice(context, table_slice: TableSlice, connection) -> None:
        # A whole table is replaced by the type handler; partitions are deleted before their
        # rows are inserted, as dagster-duckdb does (a missing table would abort the transaction).
        if table_slice.partition_dimensions and table_exists(connection, _table(table_slice)):
            DuckDbClient.delete_table_slice(context, table_slice, connection)


class WholeTablePandasHandler(DuckDBPandasTypeHandler):
    """dagster-duckdb's pandas handler, with an unpartitioned DataFrame replacing its table whole
    (even empty, even with other columns than last time) and the project's table metadata."""

    def __init__(self, database: str) -> None:
        self._database = database

    def handle_output(
        self, context: dg.OutputContext, table_slice: TableSlice, obj: pd.DataFrame, connection
    ) -> Mapping[str, Any] | None:
        table = _table(table_slice)
        held: dict[str, str] = {}
        if isinstance(obj, pd.DataFrame):
            try:
                obj, held = storable_frame(obj, table)
            except FrameNotStorableError as exc:
                raise dg.Failure(str(exc)) from None
        if table_slice.partition_dimensions:
            return super().handle_output(context, table_slice, obj, connection)
        connection.register("_fieldsales_frame", obj)
        try:
            connection.execute(
                f"CREATE OR REPLACE TABLE {qualified(table)} AS SELECT * FROM _fieldsales_frame"
            )
        finally:
            connection.unregister("_fieldsales_frame")
        try:
            check_stored(connection, table, held)  # the client rolls the table back on failure
        except FrameNotStorableError as exc:
            raise dg.Failure(str(exc)) from None
        # No preview: a user table may hold personal data the project cannot see.
        schema = column_schema(connection, table, TableDoc(()), "keep")
        return table_metadata(connection, self._database, table, schema=schema, preview=False)


class FieldSalesIOManager(DbIOManager):
    """Loads inputs from, and stores outputs in, the warehouse's lake as DataFrames."""

    def __init__(self, warehouse: FieldSalesWarehouse, schema: str) -> None:
        super().__init__(
            type_handlers=[WholeTablePandasHandler(warehouse.name)],
            db_client=WarehouseClient(warehouse),
            database=warehouse.name,
            schema=schema,
            io_manager_name="fieldsales_io_manager",
            default_load_type=pd.DataFrame,
        )

    def _get_table_slice(
        self, context: dg.OutputContext | dg.InputContext, output_context: dg.OutputContext
    ) -> TableSlice:
        table_slice = super()._get_table_slice(context, output_context)
        declared = (output_context.definition_metadata or {}).get("table")
        if isinstance(declared, str) and "." in declared:
            # The project's assets declare their table: core_transactions -> core.transactions.
            schema, _, table = declared.partition(".")
            table_slice = table_slice._replace(schema=schema, table=table)
        if isinstance(context, dg.OutputContext) and table_slice.schema in PROJECT_SCHEMAS:
            raise dg.Failure(
                f"fieldsales_io_manager will not write {_table(table_slice)} for asset "
                f"{context.asset_key.to_user_string()}: schema {table_slice.schema} belongs to "
                "the project, whose runs rebuild it. Store the asset in a schema of your own "
                f"(the default is {self._schema}; or metadata={{'schema': ...}} on the asset)."
            )
        return table_slice

    def load_input(self, context: dg.InputContext) -> object:
        try:
            return super().load_input(context)
        except (duckdb.CatalogException, duckdb.BinderException) as exc:
            # An asset input has an upstream output (DbIOManager.load_input casts it too).
            upstream = cast("dg.OutputContext", context.upstream_output)
            table_slice = self._get_table_slice(context, upstream)
            raise dg.Failure(
                f"fieldsales_io_manager could not load {_table(table_slice)} for input "
                f"{context.name!r} of {context.asset_key.to_user_string()} ({exc}). Materialize "
                f"{upstream.asset_key.to_user_string()} first, and check that "
                "the input's 'columns' metadata names columns of that table."
            ) from exc


def build_io_manager(warehouse_key: str, schema: str) -> dg.IOManagerDefinition:
    """The IO manager on the warehouse resource under ``warehouse_key`` (the very instance the
    project's assets use)."""
    warehouse = ResourceKey(warehouse_key, FieldSalesWarehouse)

    @dg.io_manager(
        required_resource_keys={warehouse.key},
        description=(
            f"Pandas DataFrames in the Field-Sales warehouse ({warehouse_key}): inputs from the "
            f"project's tables (raw.*, core.*, mart.*), outputs to {schema}.<asset name>, "
            "in the lake (dagster-duckdb)."
        ),
    )
    def _fieldsales_io_manager(context: dg.InitResourceContext) -> FieldSalesIOManager:
        return FieldSalesIOManager(warehouse.of(context), schema)

    return _fieldsales_io_manager
