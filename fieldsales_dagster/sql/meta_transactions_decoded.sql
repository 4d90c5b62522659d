-- meta.transactions_decoded: every raw.transactions payload parsed once, into one struct
-- holding every path that core.transactions and core.custom_report_results read. Pipeline-internal
-- (not part of the contract): both core tables bring it up to date before they read it, so each
-- ~5 KB payload is parsed once (refresh_decoded in core.py).
--
-- rows_to_decode() is the rows this query parses: all of raw.transactions, read in slices to
-- bound the JSON parser's memory (see raw_transactions_in_slices.sql), for a full decode; after
-- an incremental raw load, only the rows the decode lacks (new ids, or a newer loaded_at).
--
-- json_transform reads each key independently (absent: NULL), so the union of both tables' paths
-- gives each table exactly what its own parse gave. Values the core tables type (numbers,
-- timestamps, booleans, the invoice list, reportResults) are kept as JSON: the core queries type
-- them with typed_values.sql, and name those that cannot be typed. Each report value is kept as
-- JSON too, so its JSON type is known (a string's characters are kept: "00123" stays "00123").
SELECT
    t.id,
    t.event_id,
    t.loaded_at,
    json_transform(t.payload, '{
        "eventId": "VARCHAR",
        "productId": "VARCHAR",
        "proxyProductName": "VARCHAR",
        "price": "JSON",
        "qty": "JSON",
        "saleTime": "JSON",
        "created": "JSON",
        "date": "JSON",
        "invoice_status": "VARCHAR",
        "invoice_id": "JSON",
        "prev_invoice_id": "VARCHAR",
        "credits": "JSON",
        "item_credit_state": "JSON",
        "exportDetails": {"processed": "JSON"},
        "_customReport": {
            "_customReportConfig": "VARCHAR",
            "reportResults": "JSON",
            "_configcreatedTime": {"_id": "VARCHAR"},
            "_customReport": {
                "_customReportConfig": "VARCHAR",
                "reportResults": "JSON",
                "_configcreatedTime": {"_id": "VARCHAR"}
            }
        }
    }') AS p
FROM rows_to_decode() AS t
