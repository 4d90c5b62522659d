-- meta.transactions_decoded: every raw.transactions payload parsed once, into one struct
-- holding every path that core.transactions and core.custom_report_results read. Pipeline-internal
-- (not part of the contract): the core_transactions asset rebuilds it before core.transactions,
-- and core.custom_report_results reads it instead of parsing each ~5 KB payload a second time
-- (it rebuilds it first if raw.transactions changed since; see core.py).
--
-- json_transform reads each key independently (absent or mistyped: NULL), so the union of both
-- tables' paths gives each table exactly what its own parse gave. Timestamps are read as
-- TIMESTAMPTZ so that a non-UTC offset is honoured; the core tables store them as UTC TIMESTAMP.
-- Each report value is kept as JSON so its JSON type is known (a string's characters are kept,
-- so "00123" stays "00123").
-- raw.transactions is read in slices to bound the JSON parser's memory: see
-- raw_transactions_in_slices.sql.
SELECT
    t.id,
    t.event_id,
    t.loaded_at,
    json_transform(t.payload, '{
        "eventId": "VARCHAR",
        "productId": "VARCHAR",
        "proxyProductName": "VARCHAR",
        "price": "DOUBLE",
        "qty": "DOUBLE",
        "saleTime": "TIMESTAMPTZ",
        "created": "TIMESTAMPTZ",
        "date": "TIMESTAMPTZ",
        "invoice_status": "VARCHAR",
        "invoice_id": "VARCHAR[]",
        "prev_invoice_id": "VARCHAR",
        "credits": "DOUBLE",
        "item_credit_state": "BOOLEAN",
        "exportDetails": {"processed": "BOOLEAN"},
        "_customReport": {
            "_customReportConfig": "VARCHAR",
            "reportResults": "MAP(VARCHAR, STRUCT(value JSON, name VARCHAR, fieldId VARCHAR))",
            "_configcreatedTime": {"_id": "VARCHAR"},
            "_customReport": {
                "_customReportConfig": "VARCHAR",
                "reportResults": "MAP(VARCHAR, STRUCT(value JSON, name VARCHAR, fieldId VARCHAR))",
                "_configcreatedTime": {"_id": "VARCHAR"}
            }
        }
    }') AS p
FROM raw_transactions_in_slices() AS t
