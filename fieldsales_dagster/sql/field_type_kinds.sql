-- The custom-report field types this project decodes, and how (one list, used by
-- core.custom_report_results, core.custom_report_field_types and the field_types_known check).
-- Compared in lower case. The API document names only Slider and upload; number and text are
-- mentioned without identifiers, and the rest are kinds seen or expected in real instances.
-- A field type missing here is still loaded: its values are typed by their JSON type
-- (value_kind 'json_*') and the field_types_known check warns that it is new.
CREATE OR REPLACE TEMP MACRO field_type_kinds() AS TABLE
    SELECT * FROM (VALUES
        ('slider', 'number'),
        ('number', 'number'),
        ('text', 'text'),
        ('textarea', 'text'),
        ('upload', 'upload'),
        ('checkbox', 'boolean'),
        ('boolean', 'boolean'),
        ('toggle', 'boolean'),
        ('yesno', 'boolean')
    ) AS kinds(field_type, value_kind);

-- A boolean-like answer as BOOLEAN: JSON true/false, and the words checkbox answers arrive as
-- ('true', 'yes', 'ja', '1', 'on', 'x' / 'false', 'no', 'nein', '0', 'off'), any case; NULL for
-- anything else (the text stays in value_raw).
CREATE OR REPLACE TEMP MACRO boolean_answer(text) AS
    CASE
        WHEN lower(trim(text)) IN ('true', 'yes', 'y', 'ja', 'j', '1', 'on', 'x', 'checked')
            THEN true
        WHEN lower(trim(text)) IN ('false', 'no', 'n', 'nein', '0', 'off', 'unchecked')
            THEN false
    END;
