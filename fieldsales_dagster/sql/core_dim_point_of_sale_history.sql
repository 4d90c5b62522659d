-- core.dim_point_of_sale_history: one row per point of sale and version of its name, address
-- and coordinates, as the events that embed it have carried them.
--
-- Every event carries its own copy of the point of sale. The copies are put in the order of the
-- events' planned start (events without one first, then by event id: the same order in which
-- core.dim_point_of_sale picks its latest copy, so the current version here is the dimension's
-- row). A new version starts at each copy that differs from the one before; a copy equal to an
-- older, non-adjacent version starts a new version too (A, B, A is three versions).
-- valid_from is the planned start of the first event that carried the version, valid_to the
-- valid_from of the next version (NULL for the current one). Empty strings count as NULL, so
-- "" and a missing key are the same version.
--
-- Memory: each copy is cut down to what a version compares (temp.events_decoded holds those
-- fields of the point of sale already parsed, pos_fields) before it meets core.events, so the
-- join, the windows and the grouping carry ~100 bytes per event, never the payload or the whole
-- embedded object (joining raw.events carried every payload through the join and ran out of the
-- 192 MB memory_limit at 20,000 events of a few KB).
-- It follows the changed events by point of sale (event_copies.sql): followed(key) holds for the
-- points of sale whose versions are made again, decoded_rows() holds the payloads of all their
-- events.
WITH carried AS (
    SELECT
        e.id AS event_id,
        e.pos_fields AS p
    FROM decoded_rows() AS e
),

copies AS (
    SELECT
        events.key AS pos_id,
        events.event_id,
        events.planned_start,
        {
            'name': nullif(p.name, ''),
            'company': nullif(p.address.company, ''),
            'street_number': nullif(p.address.streetnumber, ''),
            'postal': nullif(p.address.postal, ''),
            'city': nullif(p.address.city, ''),
            'additional': nullif(p.address.additional, ''),
            'longitude': location_longitude(p.location),
            'latitude': location_latitude(p.location)
        } AS copy
    FROM carried
    JOIN events_naming('point_of_sale') AS events ON events.event_id = carried.event_id
    WHERE followed(events.key)
),

changes AS (
    SELECT
        *,
        copy IS DISTINCT FROM lag(copy) OVER carrier_order AS starts_version
    FROM copies
    WINDOW carrier_order AS (PARTITION BY pos_id ORDER BY planned_start NULLS FIRST, event_id)
),

numbered AS (
    SELECT
        *,
        sum(starts_version::INTEGER) OVER (carrier_order ROWS UNBOUNDED PRECEDING)::INTEGER
            AS version,
        row_number() OVER carrier_order AS carrier_rank
    FROM changes
    WINDOW carrier_order AS (PARTITION BY pos_id ORDER BY planned_start NULLS FIRST, event_id)
),

versions AS (
    SELECT
        pos_id,
        version,
        any_value(copy) AS copy,
        min(planned_start) AS valid_from,
        count(*) AS event_count,
        arg_min(event_id, carrier_rank) AS first_event_id,
        arg_max(event_id, carrier_rank) AS last_event_id,
        max(version) OVER (PARTITION BY pos_id) AS latest_version
    FROM numbered
    GROUP BY pos_id, version
)

SELECT
    pos_id,
    version,
    valid_from,
    lead(valid_from) OVER (PARTITION BY pos_id ORDER BY version) AS valid_to,
    version = latest_version AS is_current,
    copy.name AS name,
    copy.company AS company,
    copy.street_number AS street_number,
    copy.postal AS postal,
    copy.city AS city,
    copy.additional AS additional,
    copy.longitude AS longitude,
    copy.latitude AS latitude,
    event_count,
    first_event_id,
    last_event_id
FROM versions
