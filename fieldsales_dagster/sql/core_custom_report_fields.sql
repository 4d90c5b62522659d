-- core.custom_report_fields: one row per (configuration, field), from the configurations embedded
-- in transactions (there is no configuration endpoint).
--
-- Many transactions carry the same configuration, so only one carrier per configuration is parsed:
-- core.transactions (already decoded) says which transactions embed a configuration and when they
-- were created. The embedded configuration is a snapshot taken when the transaction was created
-- (_configcreatedTime); when copies of one configuration differ, the copy in the most recently
-- created transaction (then the greatest transaction id) is kept.
-- config_last_used_at (latest creation time of a transaction carrying the configuration) is what
-- "newest configuration" means when an event-level result must pick between configurations.
-- The carrier is found in two steps: the latest creation time per configuration, then the
-- greatest transaction id created then (arg_max over (created, transaction_id) in one grouping
-- cost three times as much: 0.30 against 0.10 CPU-s at 3M demo transactions).
WITH usage AS (
    SELECT
        custom_report_config_id AS config_id,
        count(*) AS config_transaction_count,
        max(created) AS config_last_used_at
    FROM core.transactions
    WHERE custom_report_config_embedded AND custom_report_config_id IS NOT NULL
    GROUP BY custom_report_config_id
),

config_usage AS (
    SELECT
        usage.*,
        (
            SELECT max(t.transaction_id)
            FROM core.transactions AS t
            WHERE t.custom_report_config_embedded
                AND t.custom_report_config_id = usage.config_id
                AND coalesce(t.created, '-infinity'::TIMESTAMP)
                = coalesce(usage.config_last_used_at, '-infinity'::TIMESTAMP)
        ) AS source_transaction_id
    FROM usage
),

config_copies AS (
    SELECT
        usage.*,
        json_transform(
            -- The configuration sits at either location, depending on the response shape.
            coalesce(
                nullif(json_extract(t.payload, '$._customReport._configcreatedTime'), 'null'),
                json_extract(t.payload, '$._customReport._customReport._configcreatedTime')
            ),
            '{
                "_id": "VARCHAR",
                "name": "VARCHAR",
                "type": "VARCHAR",
                "customFields": [{
                    "_id": "VARCHAR",
                    "required": "BOOLEAN",
                    "config": {
                        "_id": "VARCHAR",
                        "name": "VARCHAR",
                        "slug": "VARCHAR",
                        "fieldType": "VARCHAR",
                        "active": "BOOLEAN",
                        "created": "TIMESTAMPTZ",
                        "fieldObject": {"minimum": "DOUBLE", "maximum": "DOUBLE", "step": "DOUBLE"}
                    }
                }]
            }'
        ) AS config
    FROM config_usage AS usage
    JOIN raw.transactions AS t ON t.id = usage.source_transaction_id
),

fields AS (
    SELECT
        config_id,
        config.name AS config_name,
        config.type AS config_type,
        config_transaction_count,
        config_last_used_at,
        source_transaction_id,
        unnest(
            list_transform(
                config.customFields,
                lambda field, position: {'field': field, 'position': position}
            )
        ) AS item
    FROM config_copies
)

SELECT
    config_id,
    config_name,
    config_type,
    item.field.config._id AS field_id,
    item.field.config.name AS field_name,
    item.field.config.fieldType AS field_type,
    item.field.required AS required,
    -- NaN and infinity are NULL (typed_values.sql).
    finite_or_null(item.field.config.fieldObject.minimum) AS slider_min,
    finite_or_null(item.field.config.fieldObject.maximum) AS slider_max,
    finite_or_null(item.field.config.fieldObject.step) AS slider_step,
    item.field._id AS field_entry_id,
    item.position AS field_position,
    item.field.config.slug AS field_slug,
    item.field.config.active AS field_active,
    finite_or_null(item.field.config.created) AT TIME ZONE 'UTC' AS field_created,
    config_transaction_count,
    config_last_used_at,
    source_transaction_id
FROM fields
-- A field without an id cannot be matched by any result; a field listed twice in one
-- configuration keeps its first entry.
WHERE item.field.config._id IS NOT NULL
QUALIFY row_number() OVER (PARTITION BY config_id, field_id ORDER BY item.position) = 1
