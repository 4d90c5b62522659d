-- core.users: one row per user id, from the users assigned to events (eventUser).
--
-- Users only exist as copies inside events; the copy kept is the one in the event with the
-- latest planned start (then the greatest event id), the most recent profile the API has shown.
WITH assigned AS (
    SELECT
        e.id AS event_id,
        unnest(e.event_users) AS app_user
    FROM temp.events_decoded AS e
),

latest_copy AS (
    SELECT
        assigned.app_user,
        count(*) OVER (PARTITION BY assigned.app_user._id) AS event_count
    FROM assigned
    JOIN core.events AS events USING (event_id)
    WHERE assigned.app_user._id IS NOT NULL
    QUALIFY row_number() OVER (
        PARTITION BY assigned.app_user._id
        ORDER BY events.planned_start DESC NULLS LAST, events.event_id DESC
    ) = 1
)

SELECT
    app_user._id AS user_id,
    app_user.firstName AS first_name,
    app_user.lastName AS last_name,
    app_user.email AS email,
    app_user.language AS language,
    app_user.usertype AS usertype,
    event_count
FROM latest_copy
