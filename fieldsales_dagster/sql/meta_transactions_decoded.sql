-- meta.transactions_decoded: every raw.transactions payload parsed once, into one struct
-- holding every path that core.transactions and core.custom_report_results read. Pipeline-internal
-- (not part of the contract): both core tables bring it up to date before they read it, so each
-- ~5 KB payload is parsed once (refresh_decoded in core.py).
--
-- rows_to_decode() is the rows this query parses: all of raw.transactions, read in slices to
-- bound the JSON parser's memory (see raw_transactions_in_slices.sql), for a full decode; after
-- an incremental raw load, only the rows the decode lacks (new ids, or a newer loaded_at).
--
-- json_transform reads each key independently (absent or mistyped: NULL), so the union of both
-- tables' paths gives each table exactly what its own parse gave. Timestamps are read as
-- TIMESTAMPTZ so that a non-UTC offset is honoured; the core tables store them as UTC TIMESTAMP.
-- Each report value is kept as JSON so its JSON type is known (a string's characters are kept,
-- so "00123" stays "00123").
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
FROM rows_to_decode() AS t
