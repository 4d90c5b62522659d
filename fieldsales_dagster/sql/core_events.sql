-- core.events: one row per event.
--
-- The payload is parsed once into the struct below. project_id and point_of_sale are documented
-- as embedded objects, but a reference may also arrive unpopulated as a bare id string; both
-- shapes give the id.
-- raw.events is read in slices to bound the JSON parser's memory: see raw_events_in_slices.sql.
WITH decoded AS (
    SELECT
        e.id AS event_id,
        e.loaded_at,
        json_transform(e.payload, '{
            "project_id": "JSON",
            "point_of_sale": "JSON",
            "pointOfSaleProjectStructure": {"area": "JSON"},
            "eventState": "VARCHAR",
            "times": [{"start": "TIMESTAMPTZ", "stop": "TIMESTAMPTZ"}],
            "eventUser": [{"_id": "VARCHAR"}],
            "eventStateHistory": [{"_id": "VARCHAR"}],
            "customReportResult": [{"_id": "VARCHAR"}]
        }') AS p
    FROM raw_events_in_slices() AS e
),

embedded_references AS (
    SELECT
        event_id,
        loaded_at,
        p,
        CASE json_type(p.project_id)
            WHEN 'VARCHAR' THEN json_extract_string(p.project_id, '$')
            ELSE json_extract_string(p.project_id, '$._id')
        END AS project_id,
        json_extract_string(p.project_id, '$.name') AS project_name,
        CASE json_type(p.point_of_sale)
            WHEN 'VARCHAR' THEN json_extract_string(p.point_of_sale, '$')
            ELSE json_extract_string(p.point_of_sale, '$._id')
        END AS pos_id,
        json_extract_string(p.point_of_sale, '$.name') AS pos_name,
        CASE json_type(p.pointOfSaleProjectStructure.area)
            WHEN 'VARCHAR' THEN json_extract_string(p.pointOfSaleProjectStructure.area, '$')
            ELSE json_extract_string(p.pointOfSaleProjectStructure.area, '$._id')
        END AS area_id,
        json_extract_string(p.pointOfSaleProjectStructure.area, '$.name') AS area_name
    FROM decoded
)

SELECT
    event_id,
    project_id,
    project_name,
    pos_id,
    pos_name,
    area_id,
    area_name,
    p.eventState AS event_state,
    list_min(list_transform(p.times, lambda t: t.start)) AT TIME ZONE 'UTC' AS planned_start,
    list_max(list_transform(p.times, lambda t: t.stop)) AT TIME ZONE 'UTC' AS planned_stop,
    coalesce(
        list_filter(list_transform(p.eventUser, lambda u: u._id), lambda i: i IS NOT NULL),
        []::VARCHAR[]
    ) AS assigned_user_ids,
    coalesce(len(p.eventStateHistory), 0) AS status_change_count,
    coalesce(len(p.customReportResult), 0) AS custom_report_count,
    loaded_at
FROM embedded_references
