-- core.events: one row per event.
--
-- The payload is parsed once, by meta.events_decoded (meta_events_decoded.sql); this query reads
-- its columns. project_id and point_of_sale are documented as embedded objects, but a reference
-- may also arrive unpopulated as a bare id string; both shapes give the id.
WITH embedded_references AS (
    SELECT
        e.id AS event_id,
        e.loaded_at,
        e.event_state,
        e.times,
        e.event_users,
        len(e.state_history) AS status_changes,
        len(e.report_results) AS custom_reports,
        CASE json_type(e.project)
            WHEN 'VARCHAR' THEN json_extract_string(e.project, '$')
            ELSE json_extract_string(e.project, '$._id')
        END AS project_id,
        json_extract_string(e.project, '$.name') AS project_name,
        CASE json_type(e.point_of_sale)
            WHEN 'VARCHAR' THEN json_extract_string(e.point_of_sale, '$')
            ELSE json_extract_string(e.point_of_sale, '$._id')
        END AS pos_id,
        json_extract_string(e.point_of_sale, '$.name') AS pos_name,
        CASE json_type(e.area)
            WHEN 'VARCHAR' THEN json_extract_string(e.area, '$')
            ELSE json_extract_string(e.area, '$._id')
        END AS area_id,
        json_extract_string(e.area, '$.name') AS area_name
    FROM meta.events_decoded AS e
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
