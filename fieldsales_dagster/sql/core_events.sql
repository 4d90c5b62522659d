-- core.events: one row per event.
--
-- The payload is parsed once, by temp.events_decoded (temp_events_decoded.sql); this query reads
-- its columns, never the payload. project_id and point_of_sale are documented as embedded
-- objects, but a reference may also arrive unpopulated as a bare id (a string, or a number read
-- as its text); both shapes give the id (json_reference_id, typed_values.sql).
-- untyped_values names what could not be typed: a reference that gives no id, a planned time
-- that is not a timestamp, a list that is not an array, an event report whose reportResults is
-- not an object (temp.events_decoded keeps those values as received: unparsed_*).
-- decoded_rows() is temp.events_decoded: all of it for a whole build; after a raw load that wrote
-- some events only those (new, or a newer loaded_at), whose rows replace those of the events
-- changed or gone (follow.py): each row comes from its event alone.
WITH embedded AS (
    SELECT
        e.id AS event_id,
        e.loaded_at,
        e.event_state,
        e.times AS raw_times,
        e.event_users,
        e.status_change_count AS status_changes,
        e.custom_report_count AS custom_reports,
        e.project,
        e.point_of_sale,
        e.area,
        e.unparsed_times,
        e.unparsed_event_users,
        e.unparsed_state_history,
        e.unparsed_report_results,
        e.unparsed_report_result_maps,
        -- Each embedded object is parsed once (the point of sale by temp.events_decoded): every
        -- JSON function call parses its argument anew, and a vector's parsed documents stay in
        -- memory until the vector is done, so an id and a name read by separate calls cost
        -- several times the memory.
        json_transform(e.project, '{"_id": "VARCHAR", "name": "VARCHAR"}') AS project_ref,
        e.pos_fields AS pos_ref,
        json_transform(e.area, '{"_id": "VARCHAR", "name": "VARCHAR"}') AS area_ref
    FROM decoded_rows() AS e
),

embedded_references AS (
    SELECT
        * EXCLUDE (project_ref, pos_ref, area_ref),
        -- A reference is an object (its _id parsed above) or a bare id (typed_values.sql).
        embedded_reference_id(project, project_ref._id) AS project_id,
        project_ref.name AS project_name,
        embedded_reference_id(point_of_sale, pos_ref._id) AS pos_id,
        pos_ref.name AS pos_name,
        embedded_reference_id(area, area_ref._id) AS area_id,
        area_ref.name AS area_name,
        list_transform(
            raw_times,
            lambda t: {'start': json_timestamp(t.start), 'stop': json_timestamp(t.stop)}
        ) AS times
    FROM embedded
),

-- The references that gave no id, for untyped_values: untyped reads its value's JSON type, and
-- reading it for every point-of-sale object would parse each anew.
references_read AS (
    SELECT
        *,
        CASE WHEN project_id IS NULL THEN project END AS unread_project,
        CASE WHEN pos_id IS NULL THEN point_of_sale END AS unread_pos,
        CASE WHEN area_id IS NULL THEN area END AS unread_area
    FROM embedded_references
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
    list_min(list_transform(times, lambda t: t.start)) AS planned_start,
    list_max(list_transform(times, lambda t: t.stop)) AS planned_stop,
    coalesce(
        list_filter(list_transform(event_users, lambda u: u._id), lambda i: i IS NOT NULL),
        []::VARCHAR[]
    ) AS assigned_user_ids,
    coalesce(status_changes, 0) AS status_change_count,
    coalesce(custom_reports, 0) AS custom_report_count,
    loaded_at,
    untyped_values(flatten([
        [
            -- Only a reference that gave no id is read again (untyped parses its value).
            untyped('project_id', unread_project, project_id, 'a reference'),
            untyped('point_of_sale', unread_pos, pos_id, 'a reference'),
            untyped('pointOfSaleProjectStructure.area', unread_area, area_id, 'a reference')
        ],
        list_transform(
            list_zip(raw_times, times),
            lambda pair: untyped('times[].start', pair[1].start, pair[2].start, 'a timestamp')
        ),
        list_transform(
            list_zip(raw_times, times),
            lambda pair: untyped('times[].stop', pair[1].stop, pair[2].stop, 'a timestamp')
        ),
        [
            untyped('times', unparsed_times, NULL, 'an array'),
            untyped('eventUser', unparsed_event_users, NULL, 'an array'),
            untyped('eventStateHistory', unparsed_state_history, NULL, 'an array'),
            untyped('customReportResult', unparsed_report_results, NULL, 'an array')
        ],
        list_transform(
            unparsed_report_result_maps,
            lambda j: CASE WHEN json_type(j) <> 'OBJECT' THEN untyped(
                'customReportResult[].reportResults', j, NULL, 'an object'
            ) END
        )
    ])) AS untyped_values
FROM references_read
