"""Partitioned DataFrames through ``fieldsales_io_manager`` (dagster-duckdb's convention: the
``partition_expr`` metadata names the column a partition lives in): a partition's
materialization replaces that partition's rows and no others, and a partitioned input loads its
partitions' rows only. Real materializations on a real lake."""

import dagster as dg
import pandas as pd

from fieldsales_dagster.assets.io_manager import build_io_manager
from fieldsales_dagster_tests.conftest import make_warehouse, read_lake

DAYS = dg.DailyPartitionsDefinition(start_date="2024-01-01", end_date="2024-01-04")
REGIONS = dg.StaticPartitionsDefinition(["north", "south", "it's"])
#: What each run's asset returns, per partition key (set by the test before each run).
ROWS: dict[str, list[int]] = {}


def resources(warehouse) -> dict:
    return {
        "warehouse": warehouse,
        "fieldsales_io_manager": build_io_manager("warehouse", "analytics"),
    }


@dg.asset(
    io_manager_key="fieldsales_io_manager",
    partitions_def=DAYS,
    metadata={"partition_expr": "sale_date"},
)
def daily_sales(context: dg.AssetExecutionContext) -> pd.DataFrame:
    day = pd.Timestamp(context.partition_key)
    units = ROWS[context.partition_key]
    return pd.DataFrame({"sale_date": [day] * len(units), "units": units})


@dg.asset(
    io_manager_key="fieldsales_io_manager",
    partitions_def=DAYS,
    metadata={"partition_expr": "sale_date"},
)
def daily_units(daily_sales: pd.DataFrame) -> pd.DataFrame:
    return daily_sales.groupby("sale_date", as_index=False)["units"].sum()


@dg.asset(
    io_manager_key="fieldsales_io_manager",
    partitions_def=REGIONS,
    metadata={"partition_expr": "region"},
)
def regional(context: dg.AssetExecutionContext) -> pd.DataFrame:
    units = ROWS[context.partition_key]
    return pd.DataFrame({"region": [context.partition_key] * len(units), "units": units})


@dg.asset(io_manager_key="fieldsales_io_manager", partitions_def=REGIONS)
def no_partition_expr() -> pd.DataFrame:
    return pd.DataFrame({"region": ["north"]})


def stored(warehouse, table: str) -> list[tuple]:
    with read_lake(warehouse) as conn:
        return conn.execute(f"SELECT * FROM analytics.{table} ORDER BY ALL").fetchall()


def test_a_day_replaces_its_own_rows_and_a_partitioned_input_reads_only_its_day(tmp_path):
    warehouse = make_warehouse(tmp_path)
    ROWS.update({"2024-01-01": [1, 2], "2024-01-02": [5]})
    for day in ("2024-01-01", "2024-01-02"):
        assert dg.materialize([daily_sales], partition_key=day, resources=resources(warehouse))
    ROWS["2024-01-01"] = [7]
    result = dg.materialize(
        [daily_sales, daily_units], partition_key="2024-01-01", resources=resources(warehouse)
    )
    assert result.success
    jan = [pd.Timestamp("2024-01-01").to_pydatetime(), pd.Timestamp("2024-01-02").to_pydatetime()]
    assert stored(warehouse, "daily_sales") == [(jan[0], 7), (jan[1], 5)]
    # daily_units of the first day saw the first day's rows only.
    assert stored(warehouse, "daily_units") == [(jan[0], 7)]
    (materialization,) = result.asset_materializations_for_node("daily_sales")
    assert materialization.metadata["dagster/partition_row_count"].value == 1
    assert materialization.metadata["dagster/storage_kind"].value == "ducklake"


def test_a_static_partition_replaces_its_own_rows_whatever_its_key_holds(tmp_path):
    warehouse = make_warehouse(tmp_path)
    ROWS.update({"north": [1], "it's": [2, 3]})
    for region in ("north", "it's"):
        assert dg.materialize([regional], partition_key=region, resources=resources(warehouse))
    ROWS["it's"] = [9]
    assert dg.materialize([regional], partition_key="it's", resources=resources(warehouse))
    assert stored(warehouse, "regional") == [("it's", 9), ("north", 1)]


def test_a_partitioned_asset_without_partition_expr_fails_naming_the_metadata(tmp_path):
    warehouse = make_warehouse(tmp_path)
    result = dg.materialize(
        [no_partition_expr],
        partition_key="north",
        resources=resources(warehouse),
        raise_on_error=False,
    )
    assert not result.success
    failure = result.get_step_failure_events()[0].step_failure_data.error.to_string()
    assert "no_partition_expr" in failure and "'partition_expr' metadata" in failure


@dg.asset(
    io_manager_key="fieldsales_io_manager",
    partitions_def=dg.MultiPartitionsDefinition({"day": DAYS, "region": REGIONS}),
    metadata={"partition_expr": {"day": "sale_date", "region": "region"}},
)
def by_day_and_region() -> pd.DataFrame:
    return pd.DataFrame({"sale_date": [pd.Timestamp("2024-01-01")], "region": ["north"]})


def test_a_multi_partitioned_asset_is_refused_naming_the_metadata(tmp_path):
    # One partition column per asset: a multi-partitioned one is refused before anything is stored.
    result = dg.materialize(
        [by_day_and_region],
        partition_key=dg.MultiPartitionKey({"day": "2024-01-01", "region": "north"}),
        resources=resources(make_warehouse(tmp_path)),
        raise_on_error=False,
    )
    assert not result.success
    failure = result.get_step_failure_events()[0].step_failure_data.error.to_string()
    assert "by_day_and_region" in failure and "'partition_expr' metadata" in failure
    assert "no multi-partitions" in failure
