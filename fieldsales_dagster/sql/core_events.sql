-- core.events: one row per event.
--
-- The payload is parsed once into the struct below. project_id and point_of_sale are documented
-- as embedded objects, but a reference may also arrive unpopulated as a bare id (a string, or a
-- number read as its text); both shapes give the id (json_reference_id, typed_values.sql).
-- untyped_values names what could not be typed: a reference that gives no id, a planned time
-- that is not a timestamp, a list that is not an array, an event report whose reportResults is
-- not an object (json_type reads those shapes in a second pass over the payload).
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
            "times": [{"start": "JSON", "stop": "JSON"}],
            "eventUser": [{"_id": "VARCHAR"}],
            "eventStateHistory": [{"_id": "VARCHAR"}],
            "customReportResult": [{"_id": "VARCHAR"}]
        }') AS p,
        json_type(e.payload, ['$.times', '$.eventUser', '$.eventStateHistory',
            '$.customReportResult']) AS list_types,
        json_type(e.payload, '$.customReportResult[*].reportResults') AS report_results_types,
        e.payload
    FROM raw_events_in_slices() AS e
),

embedded_references AS (
    SELECT
        event_id,
        loaded_at,
        p,
        list_types,
        report_results_types,
        payload,
        json_reference_id(p.project_id) AS project_id,
        json_extract_string(p.project_id, '$.name') AS project_name,
        json_reference_id(p.point_of_sale) AS pos_id,
        json_extract_string(p.point_of_sale, '$.name') AS pos_name,
        json_reference_id(p.pointOfSaleProjectStructure.area) AS area_id,
        json_extract_string(p.pointOfSaleProjectStructure.area, '$.name') AS area_name,
        list_transform(
            p.times, lambda t: {'start': json_timestamp(t.start), 'stop': json_timestamp(t.stop)}
        ) AS times
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
    list_min(list_transform(times, lambda t: t.start)) AS planned_start,
    list_max(list_transform(times, lambda t: t.stop)) AS planned_stop,
    coalesce(
        list_filter(list_transform(p.eventUser, lambda u: u._id), lambda i: i IS NOT NULL),
        []::VARCHAR[]
    ) AS assigned_user_ids,
    coalesce(len(p.eventStateHistory), 0) AS status_change_count,
    coalesce(len(p.customReportResult), 0) AS custom_report_count,
    loaded_at,
    untyped_values(flatten([
        [
            untyped('project_id', p.project_id, project_id, 'a reference'),
            untyped('point_of_sale', p.point_of_sale, pos_id, 'a reference'),
            untyped(
                'pointOfSaleProjectStructure.area',
                p.pointOfSaleProjectStructure.area,
                area_id,
                'a reference'
            ),
            untyped_shape('times', payload, '$.times', list_types[1], 'ARRAY'),
            untyped_shape('eventUser', payload, '$.eventUser', list_types[2], 'ARRAY'),
            untyped_shape(
                'eventStateHistory', payload, '$.eventStateHistory', list_types[3], 'ARRAY'
            ),
            untyped_shape(
                'customReportResult', payload, '$.customReportResult', list_types[4], 'ARRAY'
            )
        ],
        list_transform(
            list_zip(p.times, times),
            lambda pair: untyped('times[].start', pair[1].start, pair[2].start, 'a timestamp')
        ),
        list_transform(
            list_zip(p.times, times),
            lambda pair: untyped('times[].stop', pair[1].stop, pair[2].stop, 'a timestamp')
        ),
        list_transform(
            report_results_types,
            lambda found, i: untyped_shape(
                'customReportResult[].reportResults',
                payload,
                '$.customReportResult[' || (i - 1) || '].reportResults',
                found,
                'OBJECT'
            )
        )
    ])) AS untyped_values
FROM embedded_references
