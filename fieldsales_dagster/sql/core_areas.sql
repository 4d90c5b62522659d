-- core.areas: one row per area id, from pointOfSaleProjectStructure.area embedded in events.
--
-- Like projects, areas only exist as copies inside events; the copy kept is the one in the event
-- with the latest planned start (then the greatest event id).
WITH embedded AS (
    SELECT
        e.id AS event_id,
        json_transform(e.area, '{
            "_id": "VARCHAR",
            "name": "VARCHAR",
            "number": "VARCHAR",
            "channel": "VARCHAR[]",
            "relatedUsers": "VARCHAR[]",
            "active": "BOOLEAN",
            "created": "TIMESTAMPTZ"
        }') AS area
    FROM temp.events_decoded AS e
),

latest_copy AS (
    SELECT
        embedded.area,
        events.project_id
    FROM embedded
    JOIN core.events AS events USING (event_id)
    WHERE embedded.area._id IS NOT NULL
    QUALIFY row_number() OVER (
        PARTITION BY embedded.area._id
        ORDER BY events.planned_start DESC NULLS LAST, events.event_id DESC
    ) = 1
)

SELECT
    area._id AS area_id,
    area.name AS name,
    area.number AS number,
    project_id,
    area.channel AS channel_ids,
    area.relatedUsers AS related_user_ids,
    area.active AS active,
    finite_or_null(area.created) AT TIME ZONE 'UTC' AS created
FROM latest_copy
