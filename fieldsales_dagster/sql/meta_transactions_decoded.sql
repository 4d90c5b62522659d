-- meta.transactions_decoded: every raw.transactions payload parsed once and typed once, into the
-- columns core.transactions and core.custom_report_results read. Pipeline-internal (not part of
-- the contract): both core tables bring it up to date before they read it (refresh_decoded in
-- core.py), and neither parses JSON again: this table holds no JSON.
--
-- rows_to_decode() is the rows this query parses: all of raw.transactions, read in slices to
-- bound the JSON parser's memory (see raw_transactions_in_slices.sql), for a full decode; after
-- an incremental raw load, only the rows the decode lacks (new ids, or a newer loaded_at).
--
-- json_transform reads each key independently (absent: NULL), so the union of both tables' paths
-- gives each table exactly what its own parse gave. The values to type (numbers, timestamps,
-- booleans, the invoice list, reportResults) are read as JSON and typed in this query by
-- typed_values.sql: timestamps arrive as ISO 8601 with an offset ('...Z'), which is honoured, and
-- are stored as plain UTC TIMESTAMP; NaN and infinity are NULL. untyped_values names every
-- present value that could not be typed (the values_typed and values_finite checks count them).
--
-- report_results: reportResults (at _customReport, or one level deeper) as a list of typed
-- entries, one per field id (typed_report_results): the field's type is not known here (it is
-- resolved against core.custom_report_fields, which is built from core.transactions), so each
-- value keeps its JSON type, its text (a string's characters: "00123" stays "00123"; anything else
-- as JSON text) and its number, and core.custom_report_results picks by the resolved field type.
-- The parse is the one element of a list that is unnested: an operator of its own, so each payload
-- is parsed once. Inlined into the query below as a plain expression, DuckDB evaluated it more than
-- once per row (100k synthetic transactions: ~5.9 CPU-s against ~2.7 CPU-s); a MATERIALIZED CTE
-- parsed it once but stored every parsed row before the query went on (1M transactions: ~1 CPU-s
-- more than the unnest, same rows).
WITH parsed AS (
    SELECT
        t.id,
        t.event_id,
        t.loaded_at,
        unnest([json_transform(t.payload, '{
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
        }')]) AS p
    FROM rows_to_decode() AS t
),

typed AS (
    SELECT
        id,
        event_id AS raw_event_id,
        loaded_at,
        p,
        json_number(p.price) AS price,
        json_number(p.qty) AS qty,
        json_timestamp(p.saleTime) AS sale_time,
        json_timestamp(p.created) AS created,
        json_timestamp(p.date) AS date,
        json_text_list(p.invoice_id) AS invoice_ids,
        json_number(p.credits) AS credits,
        json_boolean(p.item_credit_state) AS item_credit_state,
        json_boolean(p.exportDetails.processed) AS export_processed,
        -- reportResults is documented at _customReport; the nested shape is accepted too.
        coalesce(p._customReport.reportResults, p._customReport._customReport.reportResults)
            AS report_results_json
    FROM parsed
)

SELECT
    id,
    coalesce(p.eventId, raw_event_id) AS event_id,
    loaded_at,
    p.productId AS product_id,
    p.proxyProductName AS proxy_product_name,
    price,
    qty,
    sale_time,
    created,
    date,
    p.invoice_status AS invoice_status,
    invoice_ids,
    p.prev_invoice_id AS prev_invoice_id,
    credits,
    item_credit_state,
    export_processed,
    -- The configuration sits at _customReport or one level deeper, depending on the response
    -- shape; _customReportConfig names it, and the embedded configuration's _id is the fallback.
    coalesce(
        p._customReport._customReportConfig,
        p._customReport._customReport._customReportConfig,
        p._customReport._configcreatedTime._id,
        p._customReport._customReport._configcreatedTime._id
    ) AS custom_report_config_id,
    -- Whether this payload embeds its configuration (at either location): core.custom_report_fields
    -- reads configurations only from such transactions.
    coalesce(
        p._customReport._configcreatedTime IS NOT NULL
        OR p._customReport._customReport._configcreatedTime IS NOT NULL,
        false
    ) AS custom_report_config_embedded,
    typed_report_results(report_results_map(report_results_json)) AS report_results,
    untyped_values([
        untyped('price', p.price, price, 'a number'),
        untyped('qty', p.qty, qty, 'a number'),
        untyped('saleTime', p.saleTime, sale_time, 'a timestamp'),
        untyped('created', p.created, created, 'a timestamp'),
        untyped('date', p.date, date, 'a timestamp'),
        untyped('invoice_id', p.invoice_id, invoice_ids, 'an array'),
        untyped('credits', p.credits, credits, 'a number'),
        untyped('item_credit_state', p.item_credit_state, item_credit_state, 'a boolean'),
        untyped(
            'exportDetails.processed', p.exportDetails.processed, export_processed, 'a boolean'
        ),
        untyped(
            '_customReport.reportResults',
            report_results_json,
            CASE WHEN json_is_object(report_results_json) THEN true END,
            'an object'
        )
    ]) AS untyped_values
FROM typed
