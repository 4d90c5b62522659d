-- core.event_status_history: one row per eventStateHistory entry.
--
-- seq numbers the entries 1, 2, ... in date order within the event, whatever order the array has;
-- entries with the same date (or none) keep their array order, so seq is deterministic.
-- An empty stateOld (the first transition) becomes NULL. client_ip is personal data (see
-- warehouse/pii.py).
-- decoded_rows() is temp.events_decoded, or only the events a raw load wrote: an event's rows
-- come from it alone, so they replace the rows of the events changed or gone (follow.py).
WITH entries AS (
    SELECT
        e.id AS event_id,
        unnest(
            list_transform(
                e.state_history,
                lambda entry, position: {'entry': entry, 'position': position}
            )
        ) AS item
    FROM decoded_rows() AS e
)

SELECT
    event_id,
    row_number() OVER (
        PARTITION BY event_id ORDER BY item.entry.date NULLS LAST, item.position
    ) AS seq,
    item.entry._id AS history_id,
    nullif(trim(item.entry.stateOld), '') AS state_old,
    item.entry.stateNew AS state_new,
    finite_or_null(item.entry.date) AT TIME ZONE 'UTC' AS changed_at,
    item.entry.user AS user_id,
    item.entry.historyType AS history_type,
    item.entry.ip AS client_ip
FROM entries
