-- core.custom_report_field_types: one row per custom-report field type seen in a configuration,
-- with how many fields, configurations and submitted values have it, and whether this project
-- decodes it (field_type_kinds.sql). An undecoded type's values are typed by their JSON type in
-- core.custom_report_results; the field_types_known check warns when one appears.
WITH definitions AS (
    SELECT
        field_type,
        count(*) AS field_count,
        count(DISTINCT config_id) AS config_count
    FROM core.custom_report_fields
    WHERE field_type IS NOT NULL
    GROUP BY field_type
),

submitted AS (
    SELECT
        field_type,
        count(*) AS result_count,
        count(*) FILTER (WHERE value_raw IS NOT NULL) AS answered_count,
        -- An answer is typed when it landed in one of the typed columns (tested for NULL as they
        -- are: casting 5.5M values to text to coalesce them cost half of this query).
        count(*) FILTER (
            WHERE value_number IS NOT NULL OR value_text IS NOT NULL OR file_ref IS NOT NULL
                OR value_bool IS NOT NULL OR value_json_number IS NOT NULL
                OR value_json_text IS NOT NULL
        ) AS typed_count,
        list(DISTINCT value_kind ORDER BY value_kind) AS value_kinds
    FROM core.custom_report_results
    WHERE field_type IS NOT NULL
    GROUP BY field_type
)

SELECT
    field_type,
    kinds.value_kind AS decoded_as,
    kinds.value_kind IS NOT NULL AS decoded,
    coalesce(definitions.field_count, 0) AS field_count,
    coalesce(definitions.config_count, 0) AS config_count,
    coalesce(submitted.result_count, 0) AS result_count,
    coalesce(submitted.answered_count, 0) AS answered_count,
    coalesce(submitted.typed_count, 0) AS typed_count,
    coalesce(submitted.answered_count, 0) - coalesce(submitted.typed_count, 0) AS untyped_count,
    coalesce(submitted.value_kinds, []::VARCHAR[]) AS value_kinds
FROM definitions
FULL JOIN submitted USING (field_type)
LEFT JOIN field_type_kinds() AS kinds ON kinds.field_type = lower(field_type)
