-- core.projects: one row per project id core.events names, from the project objects embedded in
-- events.
--
-- There is no project endpoint; every event carries its own copy of the project. The copy kept is
-- the one in the event with the latest planned start (then the greatest event id, so the choice
-- is deterministic), i.e. the most recent state of the project the API has shown us; a project
-- that event names by a bare id has no name there. latest_copies (event_copies.sql) picks it and
-- counts the project's events; decoded_rows() holds the payloads of the events picked.
SELECT
    latest.key AS project_id,
    copy.project.name AS project_name,
    copy.project.eventSettings.isCRMLeads AS is_crm_leads,
    copy.project.eventSettings.enableMessenger AS enable_messenger,
    copy.project.eventSettings.useTargets AS use_targets,
    latest.event_count,
    latest.first_planned_start,
    latest.last_planned_start
FROM latest_copies('project') AS latest
JOIN (
    SELECT
        e.id,
        json_transform(e.project, '{
            "name": "VARCHAR",
            "eventSettings": {
                "isCRMLeads": "BOOLEAN",
                "enableMessenger": "BOOLEAN",
                "useTargets": "BOOLEAN"
            }
        }') AS project
    FROM decoded_rows() AS e
) AS copy ON copy.id = latest.event_id
WHERE followed(latest.key)
