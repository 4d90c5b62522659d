"""Hand-written API items (shaped as in field-sales-api.md 2.1-2.5) and raw tables holding them."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import dagster as dg

from fieldsales_dagster.warehouse.lake import run_transaction
from fieldsales_dagster_tests.conftest import lake_at
from fieldsales_dagster_tests.project import core_assets, core_checks, mart_assets, materialize

T0 = "2025-03-04T09:30:00.000Z"

RAW_STAND_INS = [
    dg.AssetSpec("raw_events"),
    dg.AssetSpec("raw_transactions"),
    dg.AssetSpec("raw_event_groups"),
]


def field(
    field_id: str,
    field_type: str,
    name: str | None = None,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    step: float | None = None,
    required: bool = False,
) -> dict[str, Any]:
    """One ``customFields[]`` entry; slider bounds go in ``fieldObject``."""
    field_object: dict[str, Any] = {"options": []}
    for key, value in (("minimum", minimum), ("maximum", maximum), ("step", step)):
        if value is not None:
            field_object[key] = value
    if field_type == "upload":
        field_object["config"] = {"forceGps": False, "preferMetaGpsLocationData": True}
    return {
        "_id": f"entry-{field_id}",
        "config": {
            "_id": field_id,
            "name": name or f"Field {field_id}",
            "fieldType": field_type,
            "slug": f"slug-{field_id}",
            "toolTipTxt": "",
            "description": "",
            "active": True,
            "enableHintOnClick": False,
            "created": T0,
            "fieldObject": field_object,
        },
        "required": required,
        "pdf": False,
        "requiredByFieldId": None,
        "relatedReport": None,
        "layout": {"cols": 12, "rows": 1, "inline": 0},
        "visibility": {
            "conditions": {
                "productGroups": [],
                "products": [],
                "hideForDealerRanks": [],
                "field": {"type": "", "operator": "", "rKey": "", "conditions": []},
            },
            "config": {"multiplyForEachCondition": False, "groupByConditions": False},
        },
    }


def config(config_id: str, fields: list[dict], name: str = "Sales report") -> dict[str, Any]:
    return {
        "_id": config_id,
        "type": "sales",
        "name": name,
        "transactionConfig": {"useQty1": False},
        "customFields": fields,
    }


def results(**values: Any) -> dict[str, Any]:
    """``reportResults`` keyed by field id, each with ``fieldId`` and ``name``."""
    return {
        key: {"value": value, "name": f"Field {key}", "fieldId": key}
        for key, value in values.items()
    }


def transaction(
    transaction_id: str = "t1",
    *,
    event_id: str = "e1",
    report_config: dict | None = None,
    report_results: dict | None = None,
    nested_config: bool = False,
    **overrides: Any,
) -> dict[str, Any]:
    """A transaction; with ``report_config`` it carries ``_customReport`` (nested if asked)."""
    item: dict[str, Any] = {
        "_id": transaction_id,
        "price": 2.5,
        "qty": 4,
        "eventId": event_id,
        "productId": "p1",
        "proxyProductName": "Cola 0.5l",
        "saleTime": T0,
        "created": T0,
        "date": T0,
        "invoice_status": "ReadyToInvoice",
        "invoice_id": ["inv-1", "inv-2"],
        "prev_invoice_id": "inv-0",
        "credits": 1.5,
        "item_credit_state": False,
        "exportDetails": {"processed": True},
    }
    if report_config is not None or report_results is not None:
        report: dict[str, Any] = {"reportResults": report_results or {}}
        if report_config is not None:
            report["_customReportConfig"] = report_config["_id"]
            if nested_config:
                report["_customReport"] = {"_configcreatedTime": copy.deepcopy(report_config)}
            else:
                report["_configcreatedTime"] = copy.deepcopy(report_config)
        item["_customReport"] = report
    item.update(overrides)
    return item


def point_of_sale(pos_id: str = "pos1", **overrides: Any) -> dict[str, Any]:
    item: dict[str, Any] = {
        "_id": pos_id,
        "name": "Corner Shop",
        "number": "0042",
        "address": {
            "company": "Corner Shop GmbH",
            "city": "Berlin",
            "postal": "10115",
            "streetnumber": "Main St 1",
            "additional": "",
            "phone": "+49 30 1",
            "email": "shop@example.com",
            "fax": "",
            "website": "https://shop.example.com",
        },
        "locationGroups": [{"_id": "lg1", "name": "North"}, {"_id": "lg2", "name": "Urban"}],
        "location": [13.4, 52.5],
        "genericFields": {"storeSize": None},
    }
    item.update(overrides)
    return item


def event(
    event_id: str = "e1",
    *,
    starts: tuple[str, ...] = (T0,),
    stops: tuple[str, ...] = ("2025-03-04T17:30:00.000Z",),
    pos: dict | None = None,
    users: list[dict] | None = None,
    history: list[dict] | None = None,
    report_results: list[dict] | None = None,
    **overrides: Any,
) -> dict[str, Any]:
    item: dict[str, Any] = {
        "_id": event_id,
        "project_id": {
            "_id": "proj1",
            "name": "Summer Promo",
            "eventSettings": {"isCRMLeads": False, "enableMessenger": True, "useTargets": True},
            "viewConfig": {
                "user": {"visibleToClient": True},
                "location": {"visibleToClient": True},
                "project": {"visibleToClient": False},
            },
        },
        "point_of_sale": pos if pos is not None else point_of_sale(),
        "pointOfSaleProjectStructure": {
            "area": {
                "_id": "area1",
                "name": "Berlin North",
                "number": "007",
                "channel": ["ch1"],
                "relatedUsers": ["u1"],
                "active": True,
                "created": T0,
            }
        },
        "times": [
            {"_id": f"time{i}", "start": start, "stop": stop, "duration": 7}
            for i, (start, stop) in enumerate(zip(starts, stops, strict=True))
        ],
        "eventState": "Published",
        "eventStateHistory": history if history is not None else [],
        "eventStateTimestamps": {"Published": [T0]},
        "eventUser": users if users is not None else [user("u1")],
        "agency_user": [
            {
                "_id": "au1",
                "user_id": "u1",
                "paymentType": "project",
                "payment": {"fixum": {"amount": 100, "per": "event"}, "provision": "no"},
            }
        ],
        "customReportResult": report_results if report_results is not None else [],
    }
    item.update(overrides)
    return item


def user(user_id: str, first_name: str = "Ada", **overrides: Any) -> dict[str, Any]:
    item = {
        "_id": user_id,
        "firstName": first_name,
        "lastName": "Lovelace",
        "email": f"{user_id}@example.com",
        "language": "de",
        "usertype": "agency",
    }
    item.update(overrides)
    return item


def history_entry(
    entry_id: str, state_old: str, state_new: str, date: str, user_id: str = "u1"
) -> dict[str, Any]:
    return {
        "_id": entry_id,
        "stateNew": state_new,
        "stateOld": state_old,
        "date": date,
        "historyType": "eventState",
        "ip": "192.0.2.1",
        "user": user_id,
    }


def event_report(report_id: str, event_id: str, values: dict[str, Any]) -> dict[str, Any]:
    """An event-level ``customReportResult`` entry: results carry no ``fieldId``."""
    return {
        "_id": report_id,
        "_event": event_id,
        "_project": "proj1",
        "created": T0,
        "reportResults": {key: {"name": f"Field {key}", "value": v} for key, v in values.items()},
    }


def write_raw_tables(
    database: Path,
    *,
    transactions: list[dict] = (),
    events: list[dict] = (),
) -> None:
    """Create ``raw.events``/``raw.transactions``/``raw.event_groups`` holding these items.

    They go into the lake ``lake_at(database)``, in one commit.
    """
    with lake_at(database).get_connection() as conn:

        def write() -> None:
            conn.execute("CREATE SCHEMA IF NOT EXISTS raw")
            conn.execute(
                "CREATE OR REPLACE TABLE raw.events (id VARCHAR, payload JSON, loaded_at TIMESTAMP)"
            )
            conn.execute(
                "CREATE OR REPLACE TABLE raw.transactions "
                "(id VARCHAR, event_id VARCHAR, payload JSON, loaded_at TIMESTAMP)"
            )
            conn.execute(
                "CREATE OR REPLACE TABLE raw.event_groups "
                "(id VARCHAR, payload JSON, loaded_at TIMESTAMP)"
            )
            for item in events:
                conn.execute(
                    "INSERT INTO raw.events VALUES (?, ?, now()::TIMESTAMP)",
                    [item["_id"], json.dumps(item)],
                )
            for item in transactions:
                conn.execute(
                    "INSERT INTO raw.transactions VALUES (?, ?, ?, now()::TIMESTAMP)",
                    [item["_id"], item.get("eventId"), json.dumps(item)],
                )

        run_transaction(conn, "raw.events", write)


def materialize_core(
    database: Path,
    *,
    transactions: list[dict] = (),
    events: list[dict] = (),
    raise_on_error: bool = True,
    with_checks: bool = False,
    **warehouse_settings: Any,
) -> dg.ExecuteInProcessResult:
    """Write the raw tables, then materialize every core and mart asset (and, if asked, checks).

    ``warehouse_settings`` are further ``FieldSalesWarehouse`` fields (``pii``, ...).
    """
    write_raw_tables(database, transactions=transactions, events=events)
    return materialize_core_only(
        database, raise_on_error=raise_on_error, with_checks=with_checks, **warehouse_settings
    )


def materialize_core_only(
    database: Path,
    *,
    raise_on_error: bool = True,
    with_checks: bool = False,
    **warehouse_settings: Any,
) -> dg.ExecuteInProcessResult:
    """Materialize every core and mart asset from the raw tables as they are."""
    warehouse = lake_at(database, threads=2, **warehouse_settings)
    return materialize(
        [
            *RAW_STAND_INS,
            *core_assets(with_checks),
            *mart_assets(with_checks),
            *(core_checks() if with_checks else []),
        ],
        resources={"warehouse": warehouse},
        raise_on_error=raise_on_error,
        selection=dg.AssetSelection.groups("core", "mart"),
    )


def query(database: Path, sql: str, params: list | None = None) -> list[tuple]:
    """``sql`` on the lake's latest snapshot: what the steps wrote, where a test materializes
    only some tables (analysts, ``read_lake``, see the last complete refresh instead)."""
    with lake_at(database).get_connection() as conn:
        return conn.execute(sql, params or []).fetchall()
