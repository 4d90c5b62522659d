-- core.custom_report_results: one row per submitted custom-report value, from transactions
-- (_customReport.reportResults) and from events (customReportResult[].reportResults).
--
-- Resolution (which field definition a value belongs to), against core.custom_report_fields:
--   * a transaction's value is resolved against its own configuration: the configuration its
--     payload names (_customReport._customReportConfig, else the embedded configuration's _id),
--     matched by (config_id, field_id). A field id shared by several configurations therefore
--     resolves to the definition in the transaction's configuration, not to another one.
--     (core.custom_report_fields holds the most recent copy of each configuration; resolving
--     against each payload's embedded snapshot instead would parse every ~4 KB configuration
--     again and triple the cost of this table.)
--   * an event's value carries no configuration; it is resolved by field id alone. Where several
--     configurations define the field id, the newest configuration wins: the one most recently
--     used by a transaction (config_last_used_at), then the greatest config_id, so the choice is
--     deterministic;
--   * where a result has no fieldId, its map key is the field id.
--
-- Typing by the matched field type (compared case-insensitively; the list is field_type_kinds.sql):
--   Slider, number     -> value_number (numbers, and numeric strings such as "12.5")
--   text, textarea     -> value_text   (the text as received: "0042" stays "0042")
--   upload             -> file_ref     (the file reference id)
--   checkbox, boolean  -> value_bool   (JSON true/false, and 'true'/'yes'/'ja'/'1'/... as text)
-- value_kind says which. A value whose field is not found, or whose field type is not in the list,
-- is typed by its JSON type instead, and value_kind says so: 'json_number' -> value_json_number,
-- 'json_string' -> value_json_text, 'json_boolean' -> value_bool, 'json_null', 'json_other'
-- (arrays, objects). value_number and value_text keep the contract's meaning (numeric and text
-- field types only), so a number of an unknown kind is in value_json_number, not value_number.
-- A JSON boolean is value_bool whatever the field type.
-- value_raw is the value as text: a JSON string without its quotes, anything else as JSON text.
-- Slider values also get in_range (minimum..maximum) and on_step (a whole number of steps from
-- minimum, or from 0 without a minimum). on_step allows a rounding error of 1e-9 of a step, so
-- 0.3 is on a 0.1 grid although 0.3 / 0.1 = 2.9999999999999996 in binary floating point.
-- No JSON is parsed here. Transaction payloads are parsed and their results typed once, by
-- meta.transactions_decoded (meta_transactions_decoded.sql): its report_results column holds each
-- result as a typed entry (typed_report_result in typed_values.sql: field id, name, the value's
-- JSON type, text and number), for this table and core.transactions. decoded_rows() is that
-- table: all of it for a whole build; after an incremental raw load only its added rows, when
-- this table follows their changes instead of being rebuilt (follow.py: the other rows kept).
-- Event payloads are parsed by temp.events_decoded (temp_events_decoded.sql); their results are
-- typed here the same way (typed_report_results). event_rows() is that table, followed the same
-- way: all of it, or the events added or changed since the last build, whose event rows replace
-- those with their event_id (the YAML's keyed_when: no result names another event as _event).
WITH transaction_results AS (
    SELECT
        id AS transaction_id,
        event_id,
        custom_report_config_id AS config_id,
        unnest(report_results) AS result
    FROM decoded_rows()
),

transaction_resolved AS (
    SELECT
        'transaction' AS source,
        results.transaction_id AS report_id,
        results.transaction_id,
        results.event_id,
        results.config_id,
        results.result.field_id,
        results.result.name AS result_name,
        results.result.json_type,
        results.result.text AS value_raw,
        results.result.number,
        fields.field_name,
        fields.field_type,
        fields.slider_min,
        fields.slider_max,
        fields.slider_step
    FROM transaction_results AS results
    LEFT JOIN core.custom_report_fields AS fields
        ON fields.config_id = results.config_id
        AND fields.field_id = results.result.field_id
),

event_reports AS (
    SELECT
        e.id AS event_id,
        unnest(e.report_results) AS report
    FROM event_rows() AS e
),

event_results AS (
    SELECT
        coalesce(report._event, event_id) AS event_id,
        report._id AS report_id,
        unnest(typed_report_results(report.reportResults)) AS result
    FROM event_reports
),

newest_field_definitions AS (
    SELECT *
    FROM core.custom_report_fields
    QUALIFY row_number() OVER (
        PARTITION BY field_id ORDER BY config_last_used_at DESC NULLS LAST, config_id DESC
    ) = 1
),

event_resolved AS (
    SELECT
        'event' AS source,
        results.report_id,
        NULL::VARCHAR AS transaction_id,
        results.event_id,
        fields.config_id,
        results.result.field_id,
        results.result.name AS result_name,
        results.result.json_type,
        results.result.text AS value_raw,
        results.result.number,
        fields.field_name,
        fields.field_type,
        fields.slider_min,
        fields.slider_max,
        fields.slider_step
    FROM event_results AS results
    LEFT JOIN newest_field_definitions AS fields
        ON fields.field_id = results.result.field_id
),

all_results AS (
    SELECT
        resolved.*,
        kinds.value_kind AS field_kind
    FROM (
        SELECT * FROM transaction_resolved
        UNION ALL
        SELECT * FROM event_resolved
    ) AS resolved
    LEFT JOIN field_type_kinds() AS kinds ON kinds.field_type = lower(resolved.field_type)
),

typed AS (
    SELECT
        *,
        coalesce(
            field_kind,
            CASE
                WHEN json_type IN ('BIGINT', 'UBIGINT', 'DOUBLE') THEN 'json_number'
                WHEN json_type = 'VARCHAR' THEN 'json_string'
                WHEN json_type = 'BOOLEAN' THEN 'json_boolean'
                WHEN json_type IS NULL THEN 'json_null'
                ELSE 'json_other'
            END
        ) AS value_kind,
        -- typed_report_result: numbers and numeric strings; NaN and infinity are NULL.
        CASE WHEN field_kind = 'number' THEN number END AS value_number
    FROM all_results
),

stepped AS (
    SELECT
        *,
        -- Slider values as a count of steps from the minimum (from 0 without a minimum).
        (value_number - coalesce(slider_min, 0)) / nullif(slider_step, 0) AS steps,
        CASE
            WHEN json_type = 'BOOLEAN' THEN value_raw = 'true'
            WHEN value_kind = 'boolean' THEN boolean_answer(value_raw)
        END AS value_bool,
        CASE WHEN value_kind = 'json_number' THEN number END AS value_json_number
    FROM typed
)

SELECT
    source,
    report_id,
    transaction_id,
    event_id,
    config_id,
    field_id,
    coalesce(field_name, result_name) AS field_name,
    field_type,
    value_raw,
    value_number,
    CASE WHEN value_kind = 'text' THEN value_raw END AS value_text,
    CASE WHEN value_kind = 'upload' THEN value_raw END AS file_ref,
    value_bool,
    CASE
        WHEN lower(field_type) = 'slider' AND value_number IS NOT NULL
            THEN (slider_min IS NULL OR value_number >= slider_min)
                AND (slider_max IS NULL OR value_number <= slider_max)
    END AS in_range,
    CASE
        WHEN lower(field_type) = 'slider' AND value_number IS NOT NULL AND slider_step > 0
            THEN abs(steps - round(steps)) <= 1e-9 * greatest(1.0, abs(steps))
    END AS on_step,
    slider_min,
    slider_max,
    slider_step,
    value_kind,
    value_json_number,
    CASE WHEN value_kind = 'json_string' THEN value_raw END AS value_json_text,
    -- A number or boolean field's answer that is neither (values_typed, values_finite checks).
    untyped_values([
        CASE value_kind
            WHEN 'number' THEN untyped_text('value', json_type, value_raw, value_number, 'a number')
            WHEN 'json_number'
                THEN untyped_text('value', json_type, value_raw, value_json_number, 'a number')
            WHEN 'boolean' THEN untyped_text('value', json_type, value_raw, value_bool, 'a boolean')
        END
    ]) AS untyped_values
FROM stepped
