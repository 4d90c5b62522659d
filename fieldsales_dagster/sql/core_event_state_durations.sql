-- core.event_state_durations: one row per event and stay in a state, from
-- core.event_status_history: entered when a status change moved the event into the state, left
-- at the event's next status change. An event can enter a state more than once (Published,
-- Rejected, Published): each stay is a row, numbered by visit.
-- The current state has no left_at and no seconds_in_state. A change without a date sorts last
-- and leaves the durations around it NULL.
-- An event's stays come from its own status changes alone: decoded_rows() is every event for a
-- whole build, or only those a raw load wrote, whose stays replace those of the events changed or
-- gone (follow.py), once core.event_status_history reflects the same events (reads_current).
SELECT
    event_id,
    seq,
    state_new AS state,
    row_number() OVER (PARTITION BY event_id, state_new ORDER BY seq) AS visit,
    changed_at AS entered_at,
    lead(changed_at) OVER stays AS left_at,
    epoch(lead(changed_at) OVER stays) - epoch(changed_at) AS seconds_in_state,
    lead(state_new) OVER stays AS next_state,
    lead(seq) OVER stays IS NULL AS is_current,
    user_id AS entered_by_user_id
FROM core.event_status_history
WHERE event_id IN (SELECT d.id FROM decoded_rows() AS d)
WINDOW stays AS (PARTITION BY event_id ORDER BY seq)
