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
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, cast

import dagster as dg
import duckdb
import pandas as pd

# The base dagster-duckdb builds its own IO manager on: Dagster 1.13 does not export it.
from dagster._core.storage.db_io_manager import DbIOManager, TableSlice
from dagster_duckdb.io_manager import DuckDbClient
from dagster_duckdb_pandas import DuckDBPandasTypeHandler

from fieldsales_dagster.assets.columns import TableDoc, column_schema
from fieldsales_dagster.assets.metadata import table_metadata
from fieldsales_dagster.names import ResourceKey
from fieldsales_dagster.warehouse.resource import (
    PROJECT_SCHEMAS,
    FieldSalesWarehouse,
    qualified,
    table_exists,
)


def _table(table_slice: TableSlice) -> str:
    return f"{table_slice.schema}.{table_slice.table}"


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
        if table_slice.partition_dimensions:
            return super().handle_output(context, table_slice, obj, connection)
        table = _table(table_slice)
        connection.register("_fieldsales_frame", obj)
        try:
            connection.execute(
                f"CREATE OR REPLACE TABLE {qualified(table)} AS SELECT * FROM _fieldsales_frame"
            )
        finally:
            connection.unregister("_fieldsales_frame")
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
