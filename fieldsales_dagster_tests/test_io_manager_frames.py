"""What ``fieldsales_io_manager`` stores of each DataFrame shape pandas produces in ordinary use
(issue 31, class 5): exactly what the frame holds, an index as columns, or a failed run naming the
column and what to do, the previous table intact.

Before: two columns of one name were stored renamed (``a_1``), a ``groupby`` result lost its
keys (the index), an object column of numbers and text became text, and a lone surrogate broke
the DuckDB database with an internal error naming no column.
"""

from __future__ import annotations

import datetime as dt
import decimal

import dagster as dg
import numpy as np
import pandas as pd
import pytest

from fieldsales_dagster.assets.io_manager import build_io_manager
from fieldsales_dagster_tests.conftest import make_warehouse, read_lake

SALES = pd.DataFrame(
    {
        "region": ["north", "south", "north", "east"],
        "product": ["tea", "tea", "cake", "tea"],
        "amount": [10.5, 3.0, 7.25, 1.0],
        "units": [1, 2, 3, 4],
    }
)
VIENNA = "Europe/Vienna"


def store(tmp_path, frame: pd.DataFrame):
    """Materialize an asset returning ``frame`` through the IO manager; the stored table (or
    ``None``) and the run's failure text (or ``None``)."""

    @dg.asset(io_manager_key="fieldsales_io_manager")
    def frame_asset() -> pd.DataFrame:
        return frame

    warehouse = make_warehouse(tmp_path)
    result = dg.materialize(
        [frame_asset],
        resources={
            "warehouse": warehouse,
            "fieldsales_io_manager": build_io_manager("warehouse", "analytics"),
        },
        raise_on_error=False,
    )
    failure = None
    if not result.success:
        failure = result.get_step_failure_events()[0].step_failure_data.error.to_string()
    catalog = warehouse.lake.catalog_file
    if catalog is None or not catalog.exists():  # failed before the lake was ever written
        return None, None, failure
    with read_lake(warehouse) as conn:
        found = conn.execute(
            "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'frame_asset' "
            "AND database_name = current_database()"
        ).fetchone()[0]
        stored = conn.execute("SELECT * FROM analytics.frame_asset").df() if found else None
        types = (
            dict(
                conn.execute(
                    "SELECT column_name, data_type FROM duckdb_columns() "
                    "WHERE table_name = 'frame_asset' AND database_name = current_database()"
                ).fetchall()
            )
            if found
            else None
        )
    return stored, types, failure


STORED_AS_IS = {
    "named index (set_index)": (
        SALES.set_index("region"),
        SALES[["region", "product", "amount", "units"]],
    ),
    "groupby result (named index)": (
        SALES.groupby("region")["amount"].sum().to_frame(),
        pd.DataFrame({"region": ["east", "north", "south"], "amount": [1.0, 17.75, 3.0]}),
    ),
    "multi index (groupby on two keys)": (
        SALES.groupby(["region", "product"]).agg(units=("units", "sum")),
        pd.DataFrame(
            {
                "region": ["east", "north", "north", "south"],
                "product": ["tea", "cake", "tea", "tea"],
                "units": [4, 3, 1, 2],
            }
        ),
    ),
    "unnamed string index": (
        pd.DataFrame({"v": [1, 2]}, index=["a", "b"]),
        pd.DataFrame({"index": ["a", "b"], "v": [1, 2]}),
    ),
    "filtered rows (row numbers with gaps)": (
        SALES[SALES["units"] > 2],
        SALES[SALES["units"] > 2].reset_index(drop=True),
    ),
    "NaN and NaT": (
        pd.DataFrame({"x": [1.5, np.nan], "t": [pd.Timestamp("2024-01-01 12:00"), pd.NaT]}),
        pd.DataFrame({"x": [1.5, np.nan], "t": [pd.Timestamp("2024-01-01 12:00"), pd.NaT]}),
    ),
    "nanoseconds": (
        pd.DataFrame({"t": [pd.Timestamp("2024-01-01 00:00:00.000000001")]}),
        pd.DataFrame({"t": [pd.Timestamp("2024-01-01 00:00:00.000000001")]}),
    ),
    "time zone (instants kept, shown in UTC)": (
        pd.DataFrame(
            {"t": pd.to_datetime(["2024-03-31 01:30", "2024-03-31 03:30"]).tz_localize(VIENNA)}
        ),
        pd.DataFrame(
            {"t": pd.to_datetime(["2024-03-31 00:30", "2024-03-31 01:30"]).tz_localize("UTC")}
        ),
    ),
    "non-BMP text": (
        pd.DataFrame({"s": ["😀 tea", "𝄞", None]}),
        pd.DataFrame({"s": ["😀 tea", "𝄞", None]}),
    ),
    "object column of one kind, with None": (
        pd.DataFrame({"d": pd.Series([decimal.Decimal("1.10"), None], dtype=object)}),
        pd.DataFrame({"d": [1.1, np.nan]}),
    ),
    "numpy scalars in an object column": (
        pd.DataFrame({"n": pd.Series([np.int64(3), 4], dtype=object)}),
        pd.DataFrame({"n": [3, 4]}),
    ),
    "nullable dtypes": (
        pd.DataFrame(
            {"a": pd.array([1, None], dtype="Int64"), "b": pd.array(["x", None], dtype="string")}
        ),
        pd.DataFrame({"a": [1.0, np.nan], "b": ["x", None]}),
    ),
    "empty frame with columns": (
        pd.DataFrame({"name": pd.Series([], dtype=object), "n": pd.Series([], dtype="int64")}),
        pd.DataFrame({"name": pd.Series([], dtype=object), "n": pd.Series([], dtype="int64")}),
    ),
}


@pytest.mark.parametrize("shape", sorted(STORED_AS_IS))
def test_each_shape_is_stored_exactly_with_its_index_as_columns(tmp_path, shape):
    frame, expected = STORED_AS_IS[shape]
    stored, types, failure = store(tmp_path, frame)
    assert failure is None
    pd.testing.assert_frame_equal(
        stored, expected.reset_index(drop=True), check_dtype=False, check_index_type=False
    )
    if shape == "empty frame with columns":
        assert types == {"name": "VARCHAR", "n": "BIGINT"}
    if shape.startswith("time zone"):
        assert types == {"t": "TIMESTAMP WITH TIME ZONE"}


REFUSED = {
    "two columns of one name": (
        pd.DataFrame([[1, 2]], columns=["amount", "amount"]),
        "column 'amount' has the name of column 'amount'",
    ),
    "names that differ only in case": (
        pd.DataFrame([[1, 2]], columns=["Amount", "amount"]),
        "column 'amount' has the name of column 'Amount'",
    ),
    "an index level named like a column": (
        SALES.set_index("region", drop=False),
        "column 'region' is both an index level and a column",
    ),
    "several column levels (pivot)": (
        SALES.pivot_table(index="region", columns="product", values=["amount", "units"]),
        "is one of several column levels",
    ),
    "mixed object column (numbers and text)": (
        pd.DataFrame({"code": pd.Series([1, "A7", 2.5], dtype=object)}),
        "column 'code' holds values of 3 kinds (float, int, str)",
    ),
    "naive and zoned times in one column": (
        pd.DataFrame(
            {
                "t": pd.Series(
                    [dt.datetime(2024, 1, 1), pd.Timestamp("2024-01-01", tz=VIENNA)], dtype=object
                )
            }
        ),
        "column 't' holds values of 2 kinds (datetime, zoned datetime)",
    ),
    "an integer over 128 bits, which DuckDB stores as text": (
        pd.DataFrame({"n": pd.Series([2**130, 1], dtype=object)}),
        "column 'n' holds int values, which DuckDB would store as text",
    ),
    "dicts in a column": (
        pd.DataFrame({"attrs": [{"k": 1}, {"k": 2}]}),
        "column 'attrs' holds values of 1 kinds (dict)",
    ),
    "lone surrogate": (
        pd.DataFrame({"note": ["fine", "cut \ud83d", "also \udc00"]}),
        "column 'note' holds a lone surrogate (half of a UTF-16 pair, e.g. a string cut "
        "mid-emoji) in row 1 and 1 more rows",
    ),
    "lone surrogate in a category": (
        pd.DataFrame({"note": pd.Series(["fine", "cut \ud83d"], dtype="category")}),
        "column 'note' holds a lone surrogate (half of a UTF-16 pair, e.g. a string cut "
        "mid-emoji) in row 1 and 0 more rows",
    ),
    "lone surrogate in a column's name": (
        pd.DataFrame({"note \udc00": ["fine"]}),
        "column 'note \\udc00' has a lone surrogate (half of a UTF-16 pair) in its name",
    ),
    "lone surrogate in an index's name": (
        pd.DataFrame({"n": [1]}, index=pd.Index(["a"], name="key \ud800")),
        "column 'key \\ud800' has a lone surrogate (half of a UTF-16 pair) in its name",
    ),
    "no columns at all": (pd.DataFrame(), "the frame has no columns"),
}


@pytest.mark.parametrize("shape", sorted(REFUSED))
def test_each_shape_duckdb_would_change_fails_naming_the_column_and_keeps_the_table(
    tmp_path, shape
):
    before, _, failure = store(tmp_path, SALES)
    assert failure is None
    frame, named = REFUSED[shape]
    after, _, failure = store(tmp_path, frame)
    assert failure is not None and named in failure
    assert "Nothing was written; analytics.frame_asset is as it was" in failure
    pd.testing.assert_frame_equal(after, before)
