-- core.events: one row per event.
--
-- The payload is parsed once, by meta.events_decoded (meta_events_decoded.sql); this query reads
-- its columns. project_id and point_of_sale are documented as embedded objects, but a reference
-- may also arrive unpopulated as a bare id string; both shapes give the id.
WITH embedded AS (
    SELECT
        e.id AS event_id,
        e.loaded_at,
        e.event_state,
        e.times,
        e.event_users,
        e.status_change_count AS status_changes,
        e.custom_report_count AS custom_reports,
        e.project,
        e.point_of_sale,
        e.area,
        -- Each embedded object is parsed once (the point of sale by meta.events_decoded): every
        -- JSON function call parses its argument anew, and a vector's parsed documents stay in
        -- memory until the vector is done, so an id and a name read by separate calls cost
        -- several times the memory. A bare id string is told by its opening quote (the stored
        -- JSON is minified).
        json_transform(e.project, '{"_id": "VARCHAR", "name": "VARCHAR"}') AS project_ref,
        e.pos_fields AS pos_ref,
        json_transform(e.area, '{"_id": "VARCHAR", "name": "VARCHAR"}') AS area_ref
    FROM meta.events_decoded AS e
),

embedded_references AS (
    SELECT
        * EXCLUDE (project, point_of_sale, area, project_ref, pos_ref, area_ref),
        CASE
            WHEN starts_with(project::VARCHAR, '"') THEN json_extract_string(project, '$')
            ELSE project_ref._id
        END AS project_id,
        project_ref.name AS project_name,
        CASE
            WHEN starts_with(point_of_sale::VARCHAR, '"')
                THEN json_extract_string(point_of_sale, '$')
            ELSE pos_ref._id
        END AS pos_id,
        pos_ref.name AS pos_name,
        CASE
            WHEN starts_with(area::VARCHAR, '"') THEN json_extract_string(area, '$')
            ELSE area_ref._id
        END AS area_id,
        area_ref.name AS area_name
    FROM embedded
)

SELECT
    event_id,
    project_id,
    project_name,
    pos_id,
    pos_name,
    area_id,
    area_name,
    event_state,
    list_min(list_transform(times, lambda t: t.start)) AT TIME ZONE 'UTC' AS planned_start,
    list_max(list_transform(times, lambda t: t.stop)) AT TIME ZONE 'UTC' AS planned_stop,
    coalesce(
        list_filter(list_transform(event_users, lambda u: u._id), lambda i: i IS NOT NULL),
        []::VARCHAR[]
    ) AS assigned_user_ids,
    coalesce(status_changes, 0) AS status_change_count,
    coalesce(custom_reports, 0) AS custom_report_count,
    loaded_at
FROM embedded_references
