"""``fieldsales_io_manager``, the pandas IO manager of user assets (docs/building-on-it.md).
It stores exactly what the frame holds or fails naming the column: DuckDB renames case-equal
names, stores mixed or unknown kinds as text, and dies on a lone surrogate (no failure event)."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from decimal import Decimal
from typing import TYPE_CHECKING, Any, cast

import dagster as dg
import duckdb

from fieldsales_dagster.assets.columns import TableDoc
from fieldsales_dagster.assets.metadata import storage_metadata, table_metadata
from fieldsales_dagster.names import ResourceKey
from fieldsales_dagster.settings import PROJECT_SCHEMAS
from fieldsales_dagster.warehouse.lake import run_transaction
from fieldsales_dagster.warehouse.quoting import qualified, quote_ident
from fieldsales_dagster.warehouse.warehouse import FieldSalesWarehouse, table_exists

if TYPE_CHECKING:
    import pandas as pd


#: A UTF-16 surrogate code point: a string cut in the middle of a pair, which UTF-8 cannot hold.
_SURROGATE = re.compile("[\ud800-\udfff]")
#: Kinds of values an object column may hold, one kind per column (``None``/NaN/NaT aside).
_KINDS = (bool, int, float, Decimal, str, bytes, dt.datetime, dt.date, dt.time, dt.timedelta)
_FRAME = "_fieldsales_frame"


def _kind(value: object) -> str:
    if isinstance(value, dt.datetime) and value.tzinfo is not None:  # naive ones are another
        return "zoned datetime"
    return next((kind for kind in _KINDS if isinstance(value, kind)), type(value)).__name__


def _refuse(table: str, column: object, why: str, what_to_do: str) -> dg.Failure:
    return dg.Failure(
        f"fieldsales_io_manager cannot store this DataFrame in {table} as it is: column "
        f"{column!r} {why}. {what_to_do}. Nothing was written; {table} is as it was."
    )


def _columns_stored(frame: pd.DataFrame, table: str) -> pd.DataFrame:
    import pandas as pd  # noqa: PLC0415  (a definitions load does without pandas)

    if isinstance(frame.columns, pd.MultiIndex):
        raise _refuse(table, frame.columns[0], "is one of several column levels", "Flatten them")
    index = frame.index
    if not (index.nlevels == 1 and index.name is None and pd.api.types.is_integer_dtype(index)):
        if clash := [name for name in index.names if name in frame.columns]:
            why = "is both an index level and a column"
            raise _refuse(table, clash[0], why, "Rename or drop the level")
        frame = frame.reset_index()  # an unnamed level as pandas names it: index, level_0, ...
    if len(frame.columns) == 0:
        raise _refuse(table, "", "is missing: the frame has no columns", "Return one")
    lowered = [str(column).lower() for column in frame.columns]
    for position, column in enumerate(frame.columns):
        if _SURROGATE.search(str(column)):  # DuckDB would fail naming no column
            why = "has a lone surrogate (half of a UTF-16 pair) in its name"
            raise _refuse(table, column, why, "Rename it")
        if (first := lowered.index(lowered[position])) != position:
            why = f"has the name of column {frame.columns[first]!r} (DuckDB ignores case)"
            raise _refuse(table, column, why, "Rename one of them")
    if not all(isinstance(column, str) for column in frame.columns):
        frame = frame.set_axis([str(column) for column in frame.columns], axis="columns")
    return frame


def _values_stored(frame: pd.DataFrame, table: str) -> tuple[pd.DataFrame, dict[str, str]]:
    """``frame`` with numpy scalars as Python values, and each object column's kind."""
    import numpy as np  # noqa: PLC0415
    import pandas as pd  # noqa: PLC0415

    held: dict[str, str] = {}
    for position, column in enumerate(frame.columns):
        values = frame.iloc[:, position]
        if values.dtype == object:
            if any(isinstance(value, np.generic) for value in values):  # DuckDB makes them text
                values = values.map(lambda v: v.item() if isinstance(v, np.generic) else v)
                frame = frame.assign(**{column: values})
            kinds = sorted({_kind(value) for value in values[values.notna()]})
            if len(kinds) > 1 or (kinds and kinds[0] not in {kind.__name__ for kind in _KINDS}):
                why = f"holds values of {len(kinds)} kinds ({', '.join(kinds)})"
                raise _refuse(table, column, why, "Convert it to one type (json.dumps for dicts)")
            if not kinds:  # no value to tell the type: text, as an empty object column is
                frame = frame.astype({column: "string"})
            held[column] = kinds[0] if kinds else "str"
        if values.dtype == object or isinstance(values.dtype, pd.StringDtype | pd.CategoricalDtype):
            cut = values[values.astype(str).str.contains(_SURROGATE, na=False) & values.notna()]
            if len(cut):
                why = (
                    f"holds a lone surrogate (half of a UTF-16 pair, e.g. a string cut mid-emoji) "
                    f"in row {cut.index.tolist()[0]!r} and {len(cut) - 1} more rows"
                )
                raise _refuse(table, column, why, "Replace them")
    return frame, held


def _partition_where(
    context: dg.OutputContext | dg.InputContext, metadata: Mapping[str, Any]
) -> tuple[str, dict[str, Any]]:
    """``context``'s partitions as a `` WHERE`` clause on ``partition_expr`` (dagster-duckdb's)."""
    if not context.has_asset_partitions:
        return "", {}
    expr, definition = metadata.get("partition_expr"), context.asset_partitions_def
    if not isinstance(expr, str) or isinstance(definition, dg.MultiPartitionsDefinition):
        raise dg.Failure(
            f"fieldsales_io_manager: partitioned {context.asset_key.to_user_string()} needs a "
            "'partition_expr' metadata naming its one partition column (no multi-partitions), "
            'e.g. metadata={"partition_expr": "sale_date"}.'
        )
    if isinstance(definition, dg.TimeWindowPartitionsDefinition) and context.asset_partition_keys:
        # As dagster-duckdb: the window as naive UTC times, end exclusive.
        start, end = (
            moment.astimezone(dt.UTC).replace(tzinfo=None)
            for moment in context.asset_partitions_time_window
        )
        return f" WHERE ({expr}) >= $start AND ({expr}) < $end", {"start": start, "end": end}
    return f" WHERE ({expr}) IN (SELECT unnest($keys))", {"keys": context.asset_partition_keys}


class FieldSalesIOManager(dg.IOManager):
    """Loads inputs from, and stores outputs in, the warehouse's lake as DataFrames."""

    def __init__(self, warehouse: FieldSalesWarehouse, schema: str) -> None:
        self._warehouse = warehouse
        self._schema = schema

    def _table_slice(
        self, context: dg.OutputContext | dg.InputContext, output: dg.OutputContext
    ) -> tuple[str, str, dict[str, Any]]:
        """``schema.table`` of the asset's DataFrame, and a ``WHERE`` of its partitions."""
        metadata = output.definition_metadata or {}
        declared = metadata.get("table")
        if not (isinstance(declared, str) and "." in declared):
            declared = f"{metadata.get('schema') or self._schema}.{context.asset_key.path[-1]}"
        return declared, *_partition_where(context, metadata)

    def handle_output(self, context: dg.OutputContext, obj: object) -> None:
        import pandas as pd  # noqa: PLC0415

        asset = context.asset_key.to_user_string()
        if not isinstance(obj, pd.DataFrame):
            raise dg.Failure(
                f"fieldsales_io_manager stores pandas DataFrames, but {asset} returned "
                f"{type(obj).__name__}. Return a DataFrame, or use another io_manager_key."
            )
        table, where, params = self._table_slice(context, context)
        owner = table.partition(".")[0]
        if owner in PROJECT_SCHEMAS:
            raise dg.Failure(
                f"fieldsales_io_manager will not write {table} for asset {asset}: schema "
                f"{owner} belongs to the project. Use a schema of your own "
                f"(metadata={{'schema': ...}}; default {self._schema})."
            )
        frame, held = _values_stored(_columns_stored(obj, table), table)
        target = qualified(table)

        def store(conn: duckdb.DuckDBPyConnection) -> dict[str, Any]:
            conn.execute(f"CREATE SCHEMA IF NOT EXISTS {quote_ident(owner)}")
            if where and table_exists(conn, table):
                conn.execute(f"DELETE FROM {target}{where}", params)
                conn.execute(f"INSERT INTO {target} BY NAME SELECT * FROM {_FRAME}")
            else:  # an unpartitioned output replaces the whole table, even with other columns
                conn.execute(f"CREATE OR REPLACE TABLE {target} AS SELECT * FROM {_FRAME}")
            # An object column of non-text values stored as text (unknown types) fails: the
            # transaction rolls the table back.
            types = dict(row[:2] for row in conn.execute(f"DESCRIBE {target}").fetchall())
            for column, kind in held.items():
                if kind != "str" and types.get(column) == "VARCHAR":
                    why = f"holds {kind} values, which DuckDB would store as text"
                    raise _refuse(table, column, why, "Convert it to a pandas type")
            if where:
                return {
                    "dagster/partition_row_count": len(frame),
                    **storage_metadata(self._warehouse, table),
                }
            # No preview: a user table may hold personal data the project cannot see.
            return table_metadata(conn, self._warehouse, table, TableDoc(()), pii_policy="keep")

        with self._warehouse.get_connection() as conn:
            conn.register(_FRAME, frame)
            try:
                # One transaction, so one snapshot: a store that fails leaves the table as it was.
                metadata = run_transaction(conn, table, lambda: store(conn))
            finally:
                conn.unregister(_FRAME)
        context.add_output_metadata(metadata)

    def load_input(self, context: dg.InputContext) -> pd.DataFrame:
        import pandas as pd  # noqa: PLC0415

        asset = context.asset_key.to_user_string()
        wanted = context.dagster_type.typing_type
        if wanted is not Any and not (
            isinstance(wanted, type) and issubclass(wanted, pd.DataFrame)
        ):
            raise dg.Failure(
                f"fieldsales_io_manager loads pandas DataFrames, but input {context.name!r} "
                f"(from {asset}) is typed {wanted!r}. Type it pd.DataFrame, or leave it untyped."
            )
        # An asset input always has an upstream output.
        upstream = cast("dg.OutputContext", context.upstream_output)
        table, where, params = self._table_slice(context, upstream)
        if where and not context.asset_partition_keys:
            return pd.DataFrame()
        wanted_columns = (context.definition_metadata or {}).get("columns") or ()
        columns = ", ".join(map(quote_ident, wanted_columns)) or "*"
        with self._warehouse.get_connection() as conn:
            try:
                return conn.execute(f"SELECT {columns} FROM {qualified(table)}{where}", params).df()
            except (duckdb.CatalogException, duckdb.BinderException) as exc:
                raise dg.Failure(
                    f"fieldsales_io_manager could not load {table} for input "
                    f"{context.name!r}: {exc}. Materialize {asset} first, and check the "
                    "input's 'columns' metadata."
                ) from exc


def build_io_manager(warehouse_key: str, schema: str) -> dg.IOManagerDefinition:
    warehouse = ResourceKey(warehouse_key, FieldSalesWarehouse)

    @dg.io_manager(
        required_resource_keys={warehouse.key},
        description=f"Pandas DataFrames in the Field-Sales warehouse ({warehouse_key}): inputs "
        f"from the project's tables (raw.*, core.*, mart.*), outputs to {schema}.<asset name>.",
    )
    def _fieldsales_io_manager(context: dg.InitResourceContext) -> FieldSalesIOManager:
        return FieldSalesIOManager(warehouse.of(context), schema)

    return _fieldsales_io_manager
