-- core.projects: one row per project id, from the project_id objects embedded in events.
--
-- There is no project endpoint; every event carries its own copy of the project. The copy kept is
-- the one in the event with the latest planned start (then the greatest event id, so the choice
-- is deterministic), i.e. the most recent state of the project the API has shown us.
WITH embedded AS (
    SELECT
        e.id AS event_id,
        json_transform(e.project, '{
            "_id": "VARCHAR",
            "name": "VARCHAR",
            "eventSettings": {
                "isCRMLeads": "BOOLEAN",
                "enableMessenger": "BOOLEAN",
                "useTargets": "BOOLEAN"
            }
        }') AS project
    FROM temp.events_decoded AS e
),

copies AS (
    SELECT
        embedded.project,
        events.planned_start,
        events.event_id
    FROM embedded
    JOIN core.events AS events USING (event_id)
    WHERE embedded.project._id IS NOT NULL
),

latest_copy AS (
    SELECT
        project,
        count(*) OVER (PARTITION BY project._id) AS event_count,
        min(planned_start) OVER (PARTITION BY project._id) AS first_planned_start,
        max(planned_start) OVER (PARTITION BY project._id) AS last_planned_start
    FROM copies
    QUALIFY row_number() OVER (
        PARTITION BY project._id ORDER BY planned_start DESC NULLS LAST, event_id DESC
    ) = 1
)

SELECT
    project._id AS project_id,
    project.name AS project_name,
    project.eventSettings.isCRMLeads AS is_crm_leads,
    project.eventSettings.enableMessenger AS enable_messenger,
    project.eventSettings.useTargets AS use_targets,
    event_count,
    first_planned_start,
    last_planned_start
FROM latest_copy
