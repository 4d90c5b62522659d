"""Time every core and mart table's SQL on N synthetic raw transactions (default 1,000,000).

Builds a DuckDB file with raw.transactions (realistic ~4-5 KB payloads: a custom report with an
embedded configuration of several fields, half of them at the nested location) and raw.events
(one event per ``--transactions-per-event`` transactions, with users, status history, places data
and event-level report results), then runs each core query through the same code path the assets
use (``FieldSalesWarehouse`` connection settings, staging table, swap) and prints seconds per table.

    .venv/bin/python benchmarks/core_decode.py                 # 1,000,000 transactions
    .venv/bin/python benchmarks/core_decode.py --rows 100000 --reuse
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import duckdb

from fieldsales_dagster.assets.build import build_described_table
from fieldsales_dagster.assets.tables import derived_tables
from fieldsales_dagster.client.endpoints import EVENT_GROUPS, EVENTS, TRANSACTIONS
from fieldsales_dagster.loading.raw_load import raw_table_ddl
from fieldsales_dagster.warehouse.warehouse import FieldSalesWarehouse

DEFAULT_DATABASE = Path(__file__).parent / "work" / "core_decode.duckdb"
CONFIGS = 25
TS = "2025-03-04T09:30:00.000Z"


def field(index: int, field_type: str, field_object: dict) -> dict:
    return {
        "_id": f"entry-__CID__-{index}",
        "config": {
            "_id": f"field-__CID__-{index}",
            "name": f"Question {index} about the point of sale",
            "fieldType": field_type,
            "slug": f"question-{index}",
            "toolTipTxt": "Answer as seen on site.",
            "description": "Asked at the end.",
            "active": True,
            "enableHintOnClick": False,
            "created": TS,
            "fieldObject": field_object,
        },
        "required": index % 2 == 0,
        "pdf": True,
        "requiredByFieldId": None,
        "relatedReport": None,
        "layout": {"cols": 6, "rows": 1, "inline": 0},
        "visibility": {
            "conditions": {
                "productGroups": ["pg-1", "pg-2"],
                "products": [],
                "hideForDealerRanks": [],
                "field": {"type": "", "operator": "eq", "rKey": "", "conditions": []},
            },
            "config": {"multiplyForEachCondition": False, "groupByConditions": False},
        },
    }


def transaction_template() -> str:
    """One transaction as JSON text with placeholders the SQL fills in per row."""
    slider = {"options": [], "minimum": 0, "maximum": 10, "step": 0.5}
    fields = [
        field(1, "Slider", slider),
        field(2, "Slider", {"options": [], "minimum": 0, "maximum": 1, "step": 0.1}),
        field(3, "number", {"options": []}),
        field(4, "text", {"options": []}),
        field(5, "upload", {"options": [], "config": {"forceGps": True}}),
        field(6, "text", {"options": []}),
    ]
    config = {
        "_id": "__CID__",
        "type": "sales",
        "name": "Sales report __CID__",
        "transactionConfig": {"useQty1": False},
        "customFields": fields,
    }
    results = {
        "field-__CID__-1": {
            "value": "__SLIDER__",
            "name": "Question 1",
            "fieldId": "field-__CID__-1",
        },
        "field-__CID__-2": {"value": "__TENTHS__", "name": "Question 2"},
        "field-__CID__-3": {"value": "12.5", "name": "Question 3", "fieldId": "field-__CID__-3"},
        "field-__CID__-4": {
            "value": "00__QTY__",
            "name": "Question 4",
            "fieldId": "field-__CID__-4",
        },
        "field-__CID__-5": {"value": "file-__TID__", "name": "Question 5"},
    }
    item = {
        "_id": "__TID__",
        "price": "__PRICE__",
        "qty": "__QTY__",
        "eventId": "__EID__",
        "productId": "product-__QTY__",
        "proxyProductName": "Sparkling water 0.5l, promotional pack",
        "saleTime": "__TS__",
        "created": "__TS__",
        "date": "__TS__",
        "invoice_status": "ReadyToInvoice",
        "invoice_id": ["invoice-__TID__"],
        "prev_invoice_id": "invoice-prev-__TID__",
        "credits": 0,
        "item_credit_state": False,
        "exportDetails": {"processed": True},
        "_customReport": {
            "reportResults": results,
            "_customReportConfig": "__CID__",
            "__CONFIG_KEY__": config,
        },
    }
    text = json.dumps(item, separators=(",", ":"))
    # Numeric placeholders become bare JSON numbers.
    for name in ("PRICE", "QTY", "SLIDER", "TENTHS"):
        text = text.replace(f'"__{name}__"', f"__{name}__")
    return text


def event_template() -> str:
    history = [
        {
            "_id": f"hist-__EID__-{i}",
            "stateNew": new,
            "stateOld": old,
            "date": f"2025-03-0{i + 1}T08:00:00.000Z",
            "historyType": "eventState",
            "ip": "192.0.2.10",
            "user": "user-__U1__",
        }
        for i, (old, new) in enumerate(
            [("", "Planned"), ("Planned", "Published"), ("Published", "Accepted")]
        )
    ]
    users = [
        {
            "_id": f"user-__U{n}__",
            "firstName": "Ada",
            "lastName": "Lovelace",
            "email": f"user-__U{n}__@example.com",
            "language": "de",
            "usertype": "agency",
        }
        for n in (1, 2)
    ]
    item = {
        "_id": "__EID__",
        "project_id": {
            "_id": "project-__PROJ__",
            "name": "Summer promotion __PROJ__",
            "eventSettings": {"isCRMLeads": False, "enableMessenger": True, "useTargets": True},
            "viewConfig": {k: {"visibleToClient": True} for k in ("user", "location", "project")},
        },
        "point_of_sale": {
            "_id": "pos-__POS__",
            "name": "Market __POS__",
            "number": "0__POS__",
            "address": {
                "company": "Market __POS__ GmbH",
                "city": "Berlin",
                "postal": "10115",
                "streetnumber": "Invalidenstrasse 1",
                "additional": "",
                "phone": "+49 30 123456",
                "email": "market@example.com",
                "fax": "",
                "website": "https://market.example.com",
            },
            "locationGroups": [{"_id": "lg-1", "name": "North"}],
            "location": [13.38, 52.53],
            "genericFields": {"storeSize": None, "openingHours": "08-20"},
            "googleResult": {
                "formatted_address": "Invalidenstrasse 1, 10115 Berlin",
                "place_id": "place-__POS__",
                "rating": 4.3,
                "user_ratings_total": 120,
                "geometry": {"location": {"lat": 52.53, "lng": 13.38}},
            },
        },
        "pointOfSaleProjectStructure": {
            "area": {
                "_id": "area-__AREA__",
                "name": "Area __AREA__",
                "number": "__AREA__",
                "channel": ["channel-1"],
                "relatedUsers": ["user-__U1__"],
                "active": True,
                "created": TS,
            }
        },
        "times": [{"_id": "time-__EID__", "start": "__TS__", "stop": "__TS__", "duration": 7}],
        "eventState": "Accepted",
        "eventStateHistory": history,
        "eventStateTimestamps": {"Planned": [TS], "Published": [TS], "Accepted": [TS]},
        "eventUser": users,
        "agency_user": [
            {
                "_id": "agency-__EID__",
                "user_id": "user-__U1__",
                "paymentType": "project",
                "payment": {"fixum": {"amount": 120, "per": "event"}, "provision": "no"},
            }
        ],
        "customReportResult": [
            {
                "_id": "report-__EID__",
                "_event": "__EID__",
                "_project": "project-__PROJ__",
                "created": TS,
                "reportResults": {
                    "field-config-1-1": {"name": "Question 1", "value": 7},
                    "field-config-2-4": {"name": "Question 4", "value": "0815"},
                },
            }
        ],
    }
    return json.dumps(item, separators=(",", ":"))


def build_raw_tables(database: Path, rows: int, transactions_per_event: int) -> None:
    events = max(1, rows // transactions_per_event)
    database.parent.mkdir(parents=True, exist_ok=True)
    for path in (database, Path(f"{database}.wal")):
        path.unlink(missing_ok=True)
    started = time.perf_counter()
    with duckdb.connect(str(database)) as conn:
        conn.execute("CREATE SCHEMA raw")
        # The raw tables are created exactly as the raw load creates them (raw_table_ddl:
        # payload JSON USING COMPRESSION zstd), so reading payloads costs what it costs in a run.
        for endpoint in (TRANSACTIONS, EVENTS, EVENT_GROUPS):
            conn.execute(raw_table_ddl(endpoint, endpoint.raw_table))
        conn.execute(
            """
            INSERT INTO raw.transactions BY NAME
            WITH numbered AS (
                SELECT
                    i,
                    'tx-' || i AS tid,
                    'event-' || (i % $events) AS eid,
                    'config-' || (i % $configs) AS cid,
                    strftime(TIMESTAMP '2025-01-01' + to_seconds(i), '%Y-%m-%dT%H:%M:%S.000Z') AS ts
                FROM range($rows) AS r(i)
            )
            SELECT
                tid AS id,
                eid AS event_id,
                -- Half the configurations sit at the nested location
                -- (_customReport._customReport._configcreatedTime), which needs one more brace.
                CASE WHEN i % 2 = 0
                    THEN replace(body, '"__CONFIG_KEY__":', '"_configcreatedTime":')
                    ELSE left(
                        replace(
                            body, '"__CONFIG_KEY__":', '"_customReport":{"_configcreatedTime":'
                        ),
                        -2
                    ) || '}}}'
                END::JSON AS payload,
                now()::TIMESTAMP AS loaded_at
            FROM (
                SELECT
                    *,
                    replace(replace(replace(replace(replace(replace(replace(replace(
                        $template,
                        '__TID__', tid), '__EID__', eid), '__CID__', cid), '__TS__', ts),
                        '__PRICE__', ((i % 997) / 10.0)::VARCHAR),
                        '__QTY__', (1 + i % 12)::VARCHAR),
                        '__SLIDER__', ((i % 23) / 2.0)::VARCHAR),
                        '__TENTHS__', ((i % 11) / 10.0)::VARCHAR) AS body
                FROM numbered
            )
            """,
            {
                "rows": rows,
                "events": events,
                "configs": CONFIGS,
                "template": transaction_template(),
            },
        )
        conn.execute(
            """
            INSERT INTO raw.events BY NAME
            SELECT
                'event-' || i AS id,
                replace(replace(replace(replace(replace(replace(replace(
                    $template,
                    '__EID__', 'event-' || i), '__PROJ__', (i % 7)::VARCHAR),
                    '__POS__', (i % 5000)::VARCHAR), '__AREA__', (i % 40)::VARCHAR),
                    '__U1__', (i % 800)::VARCHAR), '__U2__', ((i + 1) % 800)::VARCHAR),
                    '__TS__',
                    strftime(TIMESTAMP '2025-01-01' + to_hours(i), '%Y-%m-%dT%H:%M:%S.000Z')
                )::JSON AS payload,
                now()::TIMESTAMP AS loaded_at
            FROM range($events) AS r(i)
            """,
            {"events": events, "template": event_template()},
        )
        (avg_bytes,) = conn.execute(
            "SELECT avg(strlen(payload::VARCHAR)) FROM raw.transactions"
        ).fetchone()
    print(
        f"built {rows:,} transactions (avg {avg_bytes:,.0f} bytes) and {events:,} events "
        f"in {time.perf_counter() - started:.1f} s -> {database}"
    )


def time_core_tables(database: Path, threads: int | None, memory_limit: str) -> None:
    # The warehouse's settings (pii, ...) only: the tables are built in the benchmark's file.
    warehouse = FieldSalesWarehouse(threads=threads, duckdb_memory_limit=memory_limit)
    totals = {"core": 0.0, "mart": 0.0}
    config = {"threads": threads or 0, "memory_limit": memory_limit}
    with duckdb.connect(str(database), config={k: v for k, v in config.items() if v}) as conn:
        for table in derived_tables():
            started = time.perf_counter()
            build_described_table(conn, table, warehouse)
            seconds = time.perf_counter() - started
            totals[table.schema] += seconds
            (rows,) = conn.execute(f"SELECT count(*) FROM {table.table}").fetchone()
            print(f"{table.table:<32} {seconds:8.2f} s  {rows:>12,} rows", flush=True)
    for schema, seconds in totals.items():
        print(f"{'total ' + schema:<32} {seconds:8.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="raw transactions")
    parser.add_argument("--transactions-per-event", type=int, default=20)
    parser.add_argument("--database", type=Path, default=DEFAULT_DATABASE)
    parser.add_argument("--reuse", action="store_true", help="keep an existing raw database")
    parser.add_argument("--threads", type=int, default=None, help="DuckDB threads (default all)")
    parser.add_argument(
        "--memory-limit", default="192MB", help="as FieldSalesWarehouse's default (192MB)"
    )
    args = parser.parse_args()
    if not (args.reuse and args.database.exists()):
        build_raw_tables(args.database, args.rows, args.transactions_per_event)
    print(f"cores: {os.cpu_count()}, DuckDB {duckdb.__version__}, memory_limit {args.memory_limit}")
    time_core_tables(args.database, args.threads, args.memory_limit)


if __name__ == "__main__":
    main()
