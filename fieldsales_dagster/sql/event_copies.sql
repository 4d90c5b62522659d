-- The tables made of the objects events embed (core.projects, core.areas, core.users,
-- core.dim_point_of_sale and its history) are keyed by the ids core.events names: an event's
-- project, area and point of sale (object or bare id), and its assigned users. They follow the
-- changed events by those keys (follow.py, the YAML's follows: named_by and reads): followed(key)
-- holds for every key in a whole build, else for those named by the events changed or gone,
-- before and after the change; only the payloads of the events a key's rows read are parsed.

-- Each (key, event) pair: the ids of kind 'project', 'area', 'point_of_sale' or 'user' that each
-- event of core.events names (a user listed twice in an event, twice).
CREATE OR REPLACE TEMP MACRO events_naming(kind) AS TABLE
    SELECT
        key,
        event_id,
        planned_start
    FROM (
        SELECT
            unnest(
                CASE kind
                    WHEN 'project' THEN [project_id]
                    WHEN 'area' THEN [area_id]
                    WHEN 'point_of_sale' THEN [pos_id]
                    WHEN 'user' THEN assigned_user_ids
                END
            ) AS key,
            event_id,
            planned_start
        FROM core.events
    )
    WHERE key IS NOT NULL;

-- Per key of kind: the event whose copy is kept, the latest planned (then the greatest event id,
-- so the choice is deterministic), and the key's events in core.events, counted.
CREATE OR REPLACE TEMP MACRO latest_copies(kind) AS TABLE
    SELECT
        key,
        event_id,
        count(*) OVER (PARTITION BY key) AS event_count,
        min(planned_start) OVER (PARTITION BY key) AS first_planned_start,
        max(planned_start) OVER (PARTITION BY key) AS last_planned_start
    FROM events_naming(kind)
    QUALIFY row_number() OVER (
        PARTITION BY key ORDER BY planned_start DESC NULLS LAST, event_id DESC
    ) = 1
