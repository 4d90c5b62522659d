-- core.areas: one row per area id core.events names, from pointOfSaleProjectStructure.area
-- embedded in events.
--
-- Like projects, areas only exist as copies inside events; the copy kept is the one in the event
-- with the latest planned start (then the greatest event id): latest_copies (event_copies.sql);
-- decoded_rows() holds the payloads of the events picked.
WITH latest_copy AS (
    SELECT
        latest.key AS area_id,
        events.project_id,
        json_transform(e.area, '{
            "name": "VARCHAR",
            "number": "VARCHAR",
            "channel": "VARCHAR[]",
            "relatedUsers": "VARCHAR[]",
            "active": "BOOLEAN",
            "created": "TIMESTAMPTZ"
        }') AS area
    FROM latest_copies('area') AS latest
    JOIN decoded_rows() AS e ON e.id = latest.event_id
    JOIN core.events AS events ON events.event_id = latest.event_id
    WHERE followed(latest.key)
)

SELECT
    area_id,
    area.name AS name,
    area.number AS number,
    project_id,
    area.channel AS channel_ids,
    area.relatedUsers AS related_user_ids,
    area.active AS active,
    finite_or_null(area.created) AT TIME ZONE 'UTC' AS created
FROM latest_copy
