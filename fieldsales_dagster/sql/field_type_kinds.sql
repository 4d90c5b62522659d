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
-- One CASE, not IN lists: DuckDB plans a constant list this long (IN or list_contains) as a
-- join, which then runs for every row of core.custom_report_results (5.5M at 1M transactions,
-- ~1.2 CPU-s), not only for the boolean rows the CASE around the call selects.
CREATE OR REPLACE TEMP MACRO boolean_answer(text) AS
    CASE lower(trim(text))
        WHEN 'true' THEN true WHEN 'yes' THEN true WHEN 'y' THEN true WHEN 'ja' THEN true
        WHEN 'j' THEN true WHEN '1' THEN true WHEN 'on' THEN true WHEN 'x' THEN true
        WHEN 'checked' THEN true
        WHEN 'false' THEN false WHEN 'no' THEN false WHEN 'n' THEN false WHEN 'nein' THEN false
        WHEN '0' THEN false WHEN 'off' THEN false WHEN 'unchecked' THEN false
    END;
