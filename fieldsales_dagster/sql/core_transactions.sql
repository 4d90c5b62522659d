-- core.transactions: one row per transaction, typed.
--
-- Each payload (~5 KB) is parsed and typed exactly once per run, by meta.transactions_decoded
-- (meta_transactions_decoded.sql): it holds this table's columns typed (numbers, UTC timestamps,
-- booleans, the invoice list, and untyped_values naming every present value that could not be
-- typed), so this query only reads them. decoded_rows() is that table: all of it for a whole
-- build; after an incremental raw load only its added rows, whose rows replace those of the
-- changed transactions (follow.py).
SELECT
    id AS transaction_id,
    event_id,
    product_id,
    proxy_product_name,
    price,
    qty,
    finite_or_null(price * qty) AS total_value,
    sale_time,
    created,
    date,
    invoice_status,
    invoice_ids,
    prev_invoice_id,
    credits,
    item_credit_state,
    export_processed,
    custom_report_config_id,
    custom_report_config_embedded,
    loaded_at,
    untyped_values
FROM decoded_rows()
