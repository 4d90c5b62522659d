-- How every core query types a JSON value (the README's "Values"), written once. Each macro takes
-- the value as JSON (absent or JSON null: SQL NULL) and returns the typed value, or NULL where
-- the value cannot be typed:
--   numbers     a JSON number, or a string holding a decimal number ("12.5", "-3", "1e3"); NaN and
--               ±infinity ("NaN", "Infinity", "-Infinity", or a literal too large such as 1e309)
--               are NULL, so no typed column holds them;
--   timestamps  an ISO 8601 string (the API's only form); an offset is honoured, the result is
--               UTC. Epoch numbers (1704103200000) are not decoded: the API document never sends
--               them and does not say their unit;
--   booleans    JSON true/false, and the strings "true"/"false" in any case;
--   references  an object's _id, or the id itself (a string, or a number read as its text).
-- A present, non-empty value that types to NULL is named by untyped() (or, for an object or an
-- array of the wrong JSON type, untyped_shape()) in the row's untyped_values column, and counted by
-- the values_typed and values_finite checks. raw.* keeps every value as received.
CREATE OR REPLACE TEMP MACRO finite_or_null(x) AS CASE WHEN isfinite(x) THEN x END;

-- A number from a value already read from its JSON: its JSON type (kind, as json_type names it)
-- and its text (j ->> '$': a string's characters, a number's JSON text). TRY_CAST even where the
-- JSON type says it succeeds: DuckDB may evaluate a CASE branch's expression for every row.
CREATE OR REPLACE TEMP MACRO text_number(kind, text) AS finite_or_null(CASE
    WHEN kind IN ('DOUBLE', 'BIGINT', 'UBIGINT') THEN TRY_CAST(text AS DOUBLE)
    WHEN kind = 'VARCHAR' AND regexp_full_match(text, '[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?')
        THEN TRY_CAST(text AS DOUBLE)
END);

-- A number from a value given as JSON.
CREATE OR REPLACE TEMP MACRO json_number(j) AS text_number(json_type(j), j ->> '$');

-- A whole number (user_ratings_total, ...): json_number without a fraction, as BIGINT.
CREATE OR REPLACE TEMP MACRO json_integer(j) AS CASE
    WHEN json_number(j) = trunc(json_number(j)) AND abs(json_number(j)) < 9.2e18
        THEN TRY_CAST(json_number(j) AS BIGINT)
END;

-- A string shaped "YYYY-...": DuckDB's cast also reads words such as 'epoch' (1970) and
-- 'infinity', which the API never means. (A character test, not a regular expression: it runs for
-- three timestamps of every transaction.)
CREATE OR REPLACE TEMP MACRO json_timestamp(j) AS CASE
    WHEN json_type(j) = 'VARCHAR' AND (j ->> '$')[5] = '-'
        THEN finite_or_null(TRY_CAST(j ->> '$' AS TIMESTAMPTZ)) AT TIME ZONE 'UTC'
END;

CREATE OR REPLACE TEMP MACRO json_boolean(j) AS CASE json_type(j)
    WHEN 'BOOLEAN' THEN TRY_CAST(j AS BOOLEAN)
    WHEN 'VARCHAR' THEN CASE lower(j ->> '$') WHEN 'true' THEN true WHEN 'false' THEN false END
END;

-- A list of strings (invoice ids): a JSON array, its items as text.
CREATE OR REPLACE TEMP MACRO json_text_list(j) AS CASE
    WHEN json_type(j) = 'ARRAY' THEN json_transform(j, '["VARCHAR"]')
END;

CREATE OR REPLACE TEMP MACRO json_reference_id(j) AS CASE json_type(j)
    WHEN 'OBJECT' THEN json_extract_string(j, '$._id')
    WHEN 'VARCHAR' THEN j ->> '$'
    WHEN 'BIGINT' THEN j ->> '$'
    WHEN 'UBIGINT' THEN j ->> '$'
END;

-- The id of an embedded reference j that is an object (its _id, parsed by the caller: parsed_id)
-- or a bare id. An object is told by its opening brace (the stored JSON is minified): json_type
-- would parse every point-of-sale object anew (a few KB, 2,048 rows at a time).
CREATE OR REPLACE TEMP MACRO embedded_reference_id(j, parsed_id) AS CASE
    WHEN starts_with(j::VARCHAR, '{') THEN parsed_id
    ELSE json_reference_id(CASE WHEN NOT starts_with(j::VARCHAR, '{') THEN j END)
END;

-- One entry of untyped_values: {field, value (as received, as text, cut at 200 characters),
-- problem} where a present (neither absent nor JSON null), non-empty (not "") value typed to NULL;
-- NULL otherwise. The value is given as its JSON type (kind) and its text (a string's characters,
-- anything else as JSON text), as typed_report_result keeps them.
CREATE OR REPLACE TEMP MACRO untyped_text(field, kind, text, typed, expected) AS CASE
    WHEN typed IS NULL AND coalesce(kind <> 'NULL' AND NOT (kind = 'VARCHAR' AND text = ''), false)
        THEN {
            'field': field,
            'value': left(text, 200),
            -- NaN or ±infinity as a number or a numeric string ("NaN", "Infinity", 1e309).
            'problem': CASE
                WHEN coalesce(
                    kind IN ('DOUBLE', 'VARCHAR') AND NOT isfinite(TRY_CAST(text AS DOUBLE)), false
                ) THEN 'not finite'
                ELSE 'not ' || expected
            END
        }
END;

-- The same for a value j given as JSON.
CREATE OR REPLACE TEMP MACRO untyped(field, j, typed, expected) AS untyped_text(
    field,
    json_type(j),
    CASE json_type(j) WHEN 'VARCHAR' THEN j ->> '$' ELSE j::VARCHAR END,
    typed,
    expected
);

-- The same for an object or array found with another JSON type: found is json_type(doc, path),
-- expected 'OBJECT' or 'ARRAY'. The value is read from doc only for such rows.
CREATE OR REPLACE TEMP MACRO untyped_shape(field, doc, path, found, expected) AS CASE
    WHEN found <> expected AND found <> 'NULL' THEN untyped(
        field,
        json_extract(doc, path),
        NULL,
        CASE expected WHEN 'OBJECT' THEN 'an object' ELSE 'an array' END
    )
END;

-- untyped_values: the entries that are not NULL; NULL when there is none.
CREATE OR REPLACE TEMP MACRO untyped_values(entries) AS CASE
    WHEN list_count(entries) > 0 THEN list_filter(entries, lambda entry: entry IS NOT NULL)
END;

-- Whether j is a JSON object, told by its opening brace: j must be minified, as json_transform and
-- json_extract return a value (json_type would parse all of it).
CREATE OR REPLACE TEMP MACRO json_is_object(j) AS starts_with(j::VARCHAR, '{');

-- reportResults (a map keyed by field id) as a MAP; NULL unless it is an object (minified).
CREATE OR REPLACE TEMP MACRO report_results_map(j) AS CASE
    WHEN json_is_object(j)
        THEN json_transform(j, '"MAP(VARCHAR, STRUCT(value JSON, name VARCHAR, fieldId VARCHAR))"')
END;

-- One custom-report result (key: its key in reportResults; result: {value JSON, name, fieldId})
-- typed as far as it can be without its field's definition: field_id (fieldId, else the key),
-- name, the value's JSON type (json_type; NULL for JSON null), its text (a JSON string without
-- its quotes, so "00123" stays "00123"; anything else as JSON text) and its number (json_number:
-- a number or a numeric string, NaN and infinity NULL; added by typed_report_results).
-- core.custom_report_results types the
-- value by its field's type from these, without parsing JSON again.
CREATE OR REPLACE TEMP MACRO typed_report_result(key, result) AS {
    'field_id': coalesce(result.fieldId, key),
    'name': result.name,
    'json_type': json_type(result.value),
    'text': result.value ->> '$'
};

-- A reportResults MAP (report_results_map) as a list of typed_report_result entries, in order,
-- each with its number added from its JSON type and text (text_number): json_number inside the
-- first lambda parsed each value twice more (1M transactions: ~5 CPU-s more).
CREATE OR REPLACE TEMP MACRO typed_report_results(results) AS list_transform(
    list_transform(
        map_entries(results), lambda entry: typed_report_result(entry.key, entry.value)
    ),
    lambda result: struct_insert(result, number := text_number(result.json_type, result.text))
);

-- A point of sale's location ([longitude, latitude], or a GeoJSON point's coordinates) as numbers.
CREATE OR REPLACE TEMP MACRO location_longitude(location) AS json_number(
    coalesce(json_extract(location, '$[0]'), json_extract(location, '$.coordinates[0]'))
);
CREATE OR REPLACE TEMP MACRO location_latitude(location) AS json_number(
    coalesce(json_extract(location, '$[1]'), json_extract(location, '$.coordinates[1]'))
);
