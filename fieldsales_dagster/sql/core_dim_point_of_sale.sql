-- core.dim_point_of_sale: one row per point of sale, from the copy embedded in the event with the
-- latest planned start (then the greatest event id, so the choice is deterministic).
--
-- Only the chosen events' point-of-sale objects are parsed (meta.events_decoded holds them as
-- JSON). location is [longitude, latitude] (GeoJSON order); a GeoJSON point object
-- {"coordinates": [lng, lat]} is read the same way.
-- The places-directory object is documented as placesResult, but its real key carries the
-- provider's name (googleResult, ...). It is recognised by its shape: an object value of
-- point_of_sale holding place_id, formatted_address or geometry (address and genericFields, which
-- are documented and could hold such keys, are not candidates). If several match, the first in
-- the payload's key order wins.
WITH chosen_events AS (
    SELECT
        event_id,
        pos_id
    FROM core.events
    WHERE pos_id IS NOT NULL
    QUALIFY row_number() OVER (
        PARTITION BY pos_id ORDER BY planned_start DESC NULLS LAST, event_id DESC
    ) = 1
),

pos_objects AS (
    SELECT
        chosen_events.pos_id,
        e.point_of_sale AS pos
    FROM chosen_events
    JOIN meta.events_decoded AS e ON e.id = chosen_events.event_id
),

decoded AS (
    SELECT
        pos_id,
        json_transform(pos, '{
            "name": "VARCHAR",
            "number": "VARCHAR",
            "address": {
                "company": "VARCHAR",
                "streetnumber": "VARCHAR",
                "postal": "VARCHAR",
                "city": "VARCHAR",
                "additional": "VARCHAR",
                "phone": "VARCHAR",
                "email": "VARCHAR",
                "fax": "VARCHAR",
                "website": "VARCHAR"
            },
            "locationGroups": [{"_id": "VARCHAR", "name": "VARCHAR"}],
            "location": "JSON"
        }') AS p,
        list_filter(
            map_entries(json_transform(pos, '"MAP(VARCHAR, JSON)"')),
            lambda entry: entry.key NOT IN ('address', 'genericFields')
                AND json_type(entry.value) = 'OBJECT'
                AND (
                    json_exists(entry.value, '$.place_id')
                    OR json_exists(entry.value, '$.formatted_address')
                    OR json_exists(entry.value, '$.geometry')
                )
        )[1] AS places_entry
    FROM pos_objects
)

SELECT
    pos_id,
    p.name AS name,
    p.number AS number,
    p.address.company AS company,
    p.address.streetnumber AS street_number,
    p.address.postal AS postal,
    p.address.city AS city,
    p.address.additional AS additional,
    p.address.phone AS phone,
    p.address.email AS email,
    p.address.fax AS fax,
    p.address.website AS website,
    TRY_CAST(coalesce(
        json_extract_string(p.location, '$[0]'),
        json_extract_string(p.location, '$.coordinates[0]')
    ) AS DOUBLE) AS longitude,
    TRY_CAST(coalesce(
        json_extract_string(p.location, '$[1]'),
        json_extract_string(p.location, '$.coordinates[1]')
    ) AS DOUBLE) AS latitude,
    list_transform(p.locationGroups, lambda g: g._id) AS location_group_ids,
    list_transform(p.locationGroups, lambda g: g.name) AS location_group_names,
    places_entry.key AS places_source,
    json_extract_string(places_entry.value, '$.place_id') AS place_id,
    json_extract_string(places_entry.value, '$.formatted_address') AS formatted_address,
    TRY_CAST(json_extract_string(places_entry.value, '$.rating') AS DOUBLE) AS rating,
    TRY_CAST(json_extract_string(places_entry.value, '$.user_ratings_total') AS BIGINT)
        AS user_ratings_total,
    TRY_CAST(json_extract_string(places_entry.value, '$.geometry.location.lat') AS DOUBLE)
        AS place_lat,
    TRY_CAST(json_extract_string(places_entry.value, '$.geometry.location.lng') AS DOUBLE)
        AS place_lng
FROM decoded
