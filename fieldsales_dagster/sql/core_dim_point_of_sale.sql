-- core.dim_point_of_sale: one row per point of sale, from the copy embedded in the event with the
-- latest planned start (then the greatest event id, so the choice is deterministic).
--
-- Only the chosen events' point-of-sale objects are parsed (temp.events_decoded holds them as
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
        -- Without genericFields, which nothing here reads: each function below parses pos again,
        -- and a tenant's hundreds of custom fields made those parses outgrow the memory limit.
        -- (json_is_object reads the opening brace: json_type would parse the whole object.)
        CASE
            WHEN json_is_object(e.point_of_sale)
                THEN json_merge_patch(e.point_of_sale, '{"genericFields": null}')
            ELSE e.point_of_sale
        END AS pos
    FROM chosen_events
    JOIN temp.events_decoded AS e ON e.id = chosen_events.event_id
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
        pos,
        -- Parses of pos per 2,048-row vector each hold its parsed objects: at 10M demo
        -- transactions five of them ran out of the default memory limit on 2 threads (three hold).
        json_transform(pos, '"MAP(VARCHAR, JSON)"') AS entries
    FROM pos_objects
),

places_entries AS (
    SELECT
        *,
        list_filter(
            map_entries(entries),
            lambda entry: entry.key NOT IN ('address', 'genericFields')
                AND json_type(entry.value) = 'OBJECT'
                AND (
                    json_exists(entry.value, '$.place_id')
                    OR json_exists(entry.value, '$.formatted_address')
                    OR json_exists(entry.value, '$.geometry')
                )
        )[1] AS places_entry
    FROM decoded
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
    location_longitude(p.location) AS longitude,
    location_latitude(p.location) AS latitude,
    list_transform(p.locationGroups, lambda g: g._id) AS location_group_ids,
    list_transform(p.locationGroups, lambda g: g.name) AS location_group_names,
    places_entry.key AS places_source,
    json_extract_string(places_entry.value, '$.place_id') AS place_id,
    json_extract_string(places_entry.value, '$.formatted_address') AS formatted_address,
    json_number(places.rating) AS rating,
    json_integer(places.user_ratings_total) AS user_ratings_total,
    json_number(places.place_lat) AS place_lat,
    json_number(places.place_lng) AS place_lng,
    -- typed_values.sql: what could not be typed (the values_typed and values_finite checks).
    untyped_values([
        untyped(
            'location',
            p.location,
            location_longitude(p.location) + location_latitude(p.location),
            'a [longitude, latitude] pair'
        ),
        untyped_shape('address', pos, '$.address', shapes[1], 'OBJECT'),
        untyped_shape('locationGroups', pos, '$.locationGroups', shapes[2], 'ARRAY'),
        untyped('placesResult.rating', places.rating, json_number(places.rating), 'a number'),
        untyped(
            'placesResult.user_ratings_total',
            places.user_ratings_total,
            json_integer(places.user_ratings_total),
            'a whole number'
        ),
        untyped(
            'placesResult.geometry.location.lat',
            places.place_lat,
            json_number(places.place_lat),
            'a number'
        ),
        untyped(
            'placesResult.geometry.location.lng',
            places.place_lng,
            json_number(places.place_lng),
            'a number'
        )
    ]) AS untyped_values
FROM (
    SELECT
        *,
        -- The shapes from the entries' values, not by parsing pos again.
        [json_type(entries['address']), json_type(entries['locationGroups'])] AS shapes,
        {
            'rating': json_extract(places_entry.value, '$.rating'),
            'user_ratings_total': json_extract(places_entry.value, '$.user_ratings_total'),
            'place_lat': json_extract(places_entry.value, '$.geometry.location.lat'),
            'place_lng': json_extract(places_entry.value, '$.geometry.location.lng')
        } AS places
    FROM places_entries
)
