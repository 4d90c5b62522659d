-- core.transactions: one row per transaction, typed.
--
-- Each payload (~5 KB) is parsed exactly once per run, by meta.transactions_decoded
-- (meta_transactions_decoded.sql): json_transform reads every path this table and
-- core.custom_report_results need into one struct, and the columns below only read that struct.
-- decoded_rows() is that table: all of it for a whole build; after an incremental raw load only
-- its added rows, whose rows replace those of the changed transactions (follow.py).
-- Numbers, timestamps, booleans and the invoice list are typed by typed_values.sql: timestamps
-- arrive as ISO 8601 with an offset ('...Z'), which is honoured, and are stored as plain UTC
-- TIMESTAMP; NaN and infinity are NULL. untyped_values names every present value that could not
-- be typed (the values_typed and values_finite checks count them).
WITH decoded AS (
    SELECT
        id AS transaction_id,
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
        coalesce(p._customReport.reportResults, p._customReport._customReport.reportResults)
            AS report_results
    FROM decoded_rows()
)

SELECT
    transaction_id,
    coalesce(p.eventId, raw_event_id) AS event_id,
    p.productId AS product_id,
    p.proxyProductName AS proxy_product_name,
    price,
    qty,
    finite_or_null(price * qty) AS total_value,
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
    loaded_at,
    untyped_values([
        untyped('price', p.price, price, 'a number'),
        untyped('qty', p.qty, qty, 'a number'),
        untyped('saleTime', p.saleTime, sale_time, 'a timestamp'),
        untyped('created', p.created, created, 'a timestamp'),
        untyped('date', p.date, date, 'a timestamp'),
        untyped('invoice_id', p.invoice_id, invoice_ids, 'an array'),
        untyped('credits', p.credits, credits, 'a number'),
        untyped('item_credit_state', p.item_credit_state, item_credit_state, 'a boolean'),
        untyped('exportDetails.processed', p.exportDetails.processed, export_processed, 'a boolean'),
        untyped(
            '_customReport.reportResults',
            report_results,
            CASE WHEN json_type(report_results) = 'OBJECT' THEN true END,
            'an object'
        )
    ]) AS untyped_values
FROM decoded
