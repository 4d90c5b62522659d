"""Marts: the tables for the questions analysts ask most, built in SQL from the core tables.

A mart is declared like a core table (``CoreTable``: ``sql/mart_<name>.sql`` and its column
meanings in ``sql/mart_<name>.yaml``) and built the same way; it reads ``core.*`` only, so the
personal-data policy applied there carries over. Its assets sit in the group ``mart``.
"""

from collections.abc import Sequence

import dagster as dg

from fieldsales_dagster.assets.core import ChecksFor, CoreTable, build_core_asset
from fieldsales_dagster.names import InstanceNames

MART_GROUP = "mart"

MART_TABLES: tuple[CoreTable, ...] = (
    CoreTable(
        "mart.daily_sales",
        ("sale_date", "project_id", "pos_id", "area_id"),
        "Sales per day (of sale_time, UTC) x project x point of sale x area: transactions, "
        "quantity, total value and distinct products. Transactions of an event missing from "
        "core.events count under NULL project, point of sale and area.",
        ("core_transactions", "core_events"),
        nullable_key=("sale_date", "project_id", "pos_id", "area_id"),
    ),
    CoreTable(
        "mart.event_summary",
        ("event_id",),
        "One row per event: project, point of sale, area, assigned users, sales (transactions, "
        "quantity, total value), the first time it reached each state, and the lead times in "
        "hours between the usual states.",
        ("core_events", "core_transactions", "core_event_state_durations"),
    ),
    CoreTable(
        "mart.user_activity",
        ("user_id", "activity_date"),
        "One row per user and day (UTC): events planned, status changes made, and sales at the "
        "events the user was assigned to.",
        ("core_events", "core_event_status_history", "core_transactions", "core_users"),
    ),
)


def build_mart_assets(
    names: InstanceNames,
    owners: list[str],
    freshness_policy: dg.FreshnessPolicy | None,
    checks_for: ChecksFor | None = None,
    io_manager_key: str | None = None,
) -> Sequence[dg.AssetsDefinition]:
    def in_mart_group(spec: dg.AssetSpec) -> dg.AssetSpec:
        return spec.replace_attributes(group_name=names.group(MART_GROUP))

    return dg.map_asset_specs(
        in_mart_group,
        [
            build_core_asset(
                names,
                table,
                owners,
                freshness_policy,
                checks_for(table) if checks_for else (),
                io_manager_key,
            )
            for table in MART_TABLES
        ],
    )
