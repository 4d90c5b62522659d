-- core.transactions: one row per transaction, typed.
--
-- Each payload (~5 KB) is parsed exactly once per run, by meta.transactions_decoded
-- (meta_transactions_decoded.sql): json_transform reads every path this table and
-- core.custom_report_results need into one struct, and the columns below only read that struct.
-- decoded_rows() is that table: all of it for a whole build; after an incremental raw load only
-- its added rows, whose rows replace those of the changed transactions (follow.py).
-- Timestamps arrive as ISO 8601 with an offset ('...Z'); they are read as TIMESTAMPTZ so that a
-- non-UTC offset is honoured, then stored as plain UTC TIMESTAMP.
WITH decoded AS (
    SELECT
        id AS transaction_id,
        event_id AS raw_event_id,
        loaded_at,
        p
    FROM decoded_rows()
)

SELECT
    transaction_id,
    coalesce(p.eventId, raw_event_id) AS event_id,
    p.productId AS product_id,
    p.proxyProductName AS proxy_product_name,
    p.price AS price,
    p.qty AS qty,
    p.price * p.qty AS total_value,
    p.saleTime AT TIME ZONE 'UTC' AS sale_time,
    p.created AT TIME ZONE 'UTC' AS created,
    p.date AT TIME ZONE 'UTC' AS date,
    p.invoice_status AS invoice_status,
    p.invoice_id AS invoice_ids,
    p.prev_invoice_id AS prev_invoice_id,
    p.credits AS credits,
    p.item_credit_state AS item_credit_state,
    p.exportDetails.processed AS export_processed,
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
    loaded_at
FROM decoded
