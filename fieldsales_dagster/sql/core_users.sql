-- core.users: one row per user id, from the users assigned to events (eventUser).
--
-- Users only exist as copies inside events; the copy kept is the one in the event with the
-- latest planned start (then the greatest event id), the most recent profile the API has shown:
-- latest_copies (event_copies.sql) picks it and counts the user's assignments; decoded_rows()
-- holds the payloads of the events picked. A user listed twice in that event: the first copy.
WITH latest_copy AS (
    SELECT
        latest.key AS user_id,
        latest.event_count,
        list_filter(e.event_users, lambda u: u._id = latest.key)[1] AS app_user
    FROM latest_copies('user') AS latest
    JOIN decoded_rows() AS e ON e.id = latest.event_id
    WHERE followed(latest.key)
)

SELECT
    user_id,
    app_user.firstName AS first_name,
    app_user.lastName AS last_name,
    app_user.email AS email,
    app_user.language AS language,
    app_user.usertype AS usertype,
    event_count
FROM latest_copy
