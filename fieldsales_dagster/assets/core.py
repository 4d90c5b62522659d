"""Core tables: typed, decoded tables built in DuckDB from the raw API items.

Each core table is one query in ``sql/<schema>_<table>.sql``. An asset runs its query into a
staging table, swaps it in for the previous table (a failed query leaves the previous table in
place), and reports the table's schema, row count and a few rows.
"""

from dataclasses import dataclass
from importlib import resources

import dagster as dg
import duckdb

from fieldsales_dagster.assets.metadata import table_metadata
from fieldsales_dagster.assets.raw import raw_asset_name
from fieldsales_dagster.client.endpoints import EVENTS, TRANSACTIONS
from fieldsales_dagster.names import InstanceNames
from fieldsales_dagster.warehouse.resource import (
    FieldSalesWarehouse,
    qualified,
    quote_ident,
    replace_table,
)

RAW_EVENTS = raw_asset_name(EVENTS)
RAW_TRANSACTIONS = raw_asset_name(TRANSACTIONS)


@dataclass(frozen=True)
class CoreTable:
    """One core table: where its query lives and which assets it reads."""

    table: str
    #: Columns that identify a row; checked for uniqueness by ``checks.py``.
    key: tuple[str, ...]
    description: str
    deps: tuple[str, ...]

    @property
    def asset_name(self) -> str:
        return self.table.replace(".", "_")

    @property
    def query_file(self) -> str:
        return f"{self.asset_name}.sql"


CORE_TABLES: tuple[CoreTable, ...] = (
    CoreTable(
        "core.transactions",
        ("transaction_id",),
        "One row per transaction: product, price, quantity, total value (price * qty), sale and "
        "creation times in UTC, invoice, credit and export state, and the custom report "
        "configuration id.",
        (RAW_TRANSACTIONS,),
    ),
    CoreTable(
        "core.events",
        ("event_id",),
        "One row per event: project, point of sale, area, current state, planned start (earliest "
        "times[].start) and stop (latest times[].stop) in UTC, and the assigned user ids.",
        (RAW_EVENTS,),
    ),
    CoreTable(
        "core.projects",
        ("project_id",),
        "One row per project id, from the project objects embedded in events (the copy in the "
        "event with the latest planned start).",
        (RAW_EVENTS, "core_events"),
    ),
    CoreTable(
        "core.areas",
        ("area_id",),
        "One row per area id, from pointOfSaleProjectStructure.area embedded in events (the copy "
        "in the event with the latest planned start).",
        (RAW_EVENTS, "core_events"),
    ),
    CoreTable(
        "core.users",
        ("user_id",),
        "One row per user id, from the users assigned to events (eventUser; the copy in the "
        "event with the latest planned start).",
        (RAW_EVENTS, "core_events"),
    ),
    CoreTable(
        "core.dim_point_of_sale",
        ("pos_id",),
        "One row per point of sale: address, coordinates ([longitude, latitude]), location "
        "groups and places-directory data, from the copy embedded in the event with the latest "
        "planned start.",
        (RAW_EVENTS, "core_events"),
    ),
    CoreTable(
        "core.event_status_history",
        ("event_id", "seq"),
        "One row per event status change (eventStateHistory), numbered 1, 2, ... in date order "
        "within each event.",
        (RAW_EVENTS,),
    ),
    CoreTable(
        "core.custom_report_fields",
        ("config_id", "field_id"),
        "One row per (custom report configuration, field), from the configurations embedded in "
        "transactions: field type and, for sliders, minimum, maximum and step.",
        (RAW_TRANSACTIONS, "core_transactions"),
    ),
    CoreTable(
        "core.custom_report_results",
        ("source", "report_id", "field_id"),
        "One row per submitted custom report value, from transactions and events, resolved "
        "against its field definition and typed by field type (number, text, file reference), "
        "with slider range and step validity.",
        (RAW_TRANSACTIONS, RAW_EVENTS, "core_custom_report_fields"),
    ),
)


def core_query(table: CoreTable) -> str:
    """The SQL that builds ``table``, as shipped in the package."""
    return (resources.files("fieldsales_dagster") / "sql" / table.query_file).read_text("utf-8")


#: Connection-scoped table macros the core queries share (``sql/<name>.sql``).
SHARED_MACROS = ("raw_transactions_in_slices",)


def shared_macros_sql(query: str) -> str:
    """The macros ``query`` calls (DuckDB binds a macro's tables when it is created)."""
    files = resources.files("fieldsales_dagster") / "sql"
    used = [name for name in SHARED_MACROS if f"{name}(" in query]
    return "\n".join((files / f"{name}.sql").read_text("utf-8") for name in used)


def build_table(conn: duckdb.DuckDBPyConnection, target: str, query: str) -> None:
    """Run ``query`` into a staging table and swap it in for ``target``.

    If the query fails, ``target`` keeps its previous contents; the error names the table.
    """
    schema, _, name = target.partition(".")
    staged = f"{schema}.{name}__staging"
    conn.execute(f"CREATE SCHEMA IF NOT EXISTS {quote_ident(schema)}")
    try:
        if macros := shared_macros_sql(query):
            conn.execute(macros)
        conn.execute(f"CREATE OR REPLACE TABLE {qualified(staged)} AS\n{query}")
    except duckdb.Error as exc:
        conn.execute(f"DROP TABLE IF EXISTS {qualified(staged)}")
        raise RuntimeError(
            f"Building {target} failed; the previous {target} is left as it was. DuckDB: {exc}"
        ) from exc
    replace_table(conn, staged, target)


def materialize_core_table(
    warehouse: FieldSalesWarehouse, table: CoreTable
) -> dg.MaterializeResult:
    with warehouse.get_connection() as conn:
        build_table(conn, table.table, core_query(table))
        return dg.MaterializeResult(metadata=table_metadata(conn, warehouse.database, table.table))


def build_core_asset(
    names: InstanceNames,
    table: CoreTable,
    owners: list[str],
    freshness_policy: dg.FreshnessPolicy | None,
) -> dg.AssetsDefinition:
    @dg.asset(
        key=names.asset_key(table.asset_name),
        description=table.description,
        group_name=names.group("core"),
        kinds={"duckdb"},
        pool=names.pool,
        owners=owners,
        deps=[names.asset_key(dep) for dep in table.deps],
        automation_condition=dg.AutomationCondition.eager(),
        freshness_policy=freshness_policy,
        metadata={"table": table.table, "query": f"sql/{table.query_file}"},
        required_resource_keys={names.warehouse_resource},
    )
    def _core_table(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        return materialize_core_table(getattr(context.resources, names.warehouse_resource), table)

    return _core_table


def build_core_assets(
    names: InstanceNames, owners: list[str], freshness_policy: dg.FreshnessPolicy | None
) -> list[dg.AssetsDefinition]:
    return [build_core_asset(names, table, owners, freshness_policy) for table in CORE_TABLES]
