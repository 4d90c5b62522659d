"""Marts: the tables for the questions analysts ask most, built in SQL from the core tables.

A mart is declared like a core table (``CoreTable``: ``sql/mart_<name>.sql`` and its column
meanings in ``sql/mart_<name>.yaml``) and built the same way; it reads ``core.*`` only, so the
personal-data policy applied there carries over. Its assets sit in the group ``mart``.
"""

import functools

from fieldsales_dagster.assets.core import CoreTable, build_core_assets

MART_TABLES: tuple[CoreTable, ...] = (
    CoreTable(
        "mart.daily_sales",
        ("sale_date", "project_id", "pos_id", "area_id"),
        "Sales per day (of sale_time, UTC) x project x point of sale x area: transactions, "
        "quantity, total value and distinct products. Transactions of an event missing from "
        "core.events count under NULL project, point of sale and area.",
        nullable_key=("sale_date", "project_id", "pos_id", "area_id"),
    ),
    CoreTable(
        "mart.event_summary",
        ("event_id",),
        "One row per event: project, point of sale, area, assigned users, sales (transactions, "
        "quantity, total value), the first time it reached each state, and the lead times in "
        "hours between the usual states.",
    ),
    CoreTable(
        "mart.user_activity",
        ("user_id", "activity_date"),
        "One row per user and day (UTC): events planned, status changes made, and sales at the "
        "events the user was assigned to.",
    ),
)

#: One asset per mart table: the core tables' factory, given the marts.
build_mart_assets = functools.partial(build_core_assets, tables=MART_TABLES)
