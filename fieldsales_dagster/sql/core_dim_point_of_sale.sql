-- core.dim_point_of_sale: one row per point of sale, from the copy embedded in the event with the
-- latest planned start (then the greatest event id, so the choice is deterministic).
--
-- latest_copies (event_copies.sql) picks the event; decoded_rows() holds the payloads of the
-- events picked, their point-of-sale objects as JSON (temp.events_decoded). location is
-- [longitude, latitude] (GeoJSON order); a GeoJSON point object {"coordinates": [lng, lat]} is
-- read the same way.
-- The places-directory object is documented as placesResult, but its real key carries the
-- provider's name (googleResult, ...). It is recognised by its shape: an object value of
-- point_of_sale holding place_id, formatted_address or geometry (address and genericFields, which
-- are documented and could hold such keys, are not candidates). If several match, the first in
-- the payload's key order wins.
--
-- Memory: every JSON function in a query keeps, per thread, the working memory of the largest
-- vector it parsed, and it does not spill: at 10M demo transactions (61k points of sale, 2
-- threads) the parses of whole 2,048-row vectors here needed more than the 192MB default. So each
-- object is parsed whole once (entries: its keys' values as JSON, which every column reads), and
-- the chosen objects are read in eight slices (sliced, as raw_events_in_slices does for the
-- decode): a slice's filter leaves ~256 rows of each vector to parse. At 250k demo events on 2
-- threads, temp.events_decoded built, the query needed more than 176MB; it holds in 64MB.
--
-- Kept whole (and spilled where it must be) so that the slices' filters read it, not the join.
WITH chosen AS MATERIALIZED (
    SELECT
        latest.key AS pos_id,
        e.point_of_sale
    FROM latest_copies('point_of_sale') AS latest
    JOIN decoded_rows() AS e ON e.id = latest.event_id
    WHERE followed(latest.key)
),

sliced AS (
    SELECT * FROM chosen WHERE hash(pos_id) % 8 = 0
    UNION ALL
    SELECT * FROM chosen WHERE hash(pos_id) % 8 = 1
    UNION ALL
    SELECT * FROM chosen WHERE hash(pos_id) % 8 = 2
    UNION ALL
    SELECT * FROM chosen WHERE hash(pos_id) % 8 = 3
    UNION ALL
    SELECT * FROM chosen WHERE hash(pos_id) % 8 = 4
    UNION ALL
    SELECT * FROM chosen WHERE hash(pos_id) % 8 = 5
    UNION ALL
    SELECT * FROM chosen WHERE hash(pos_id) % 8 = 6
    UNION ALL
    SELECT * FROM chosen WHERE hash(pos_id) % 8 = 7
),

pos_entries AS (
    SELECT
        pos_id,
        json_transform(point_of_sale, '"MAP(VARCHAR, JSON)"') AS entries
    FROM sliced
),

decoded AS (
    SELECT
        pos_id,
        entries,
        -- Each value typed as the whole object's json_transform typed it (NULL where absent).
        {
            'name': json_transform(entries['name'], '"VARCHAR"'),
            'number': json_transform(entries['number'], '"VARCHAR"'),
            'address': json_transform(entries['address'], '{
                "company": "VARCHAR",
                "streetnumber": "VARCHAR",
                "postal": "VARCHAR",
                "city": "VARCHAR",
                "additional": "VARCHAR",
                "phone": "VARCHAR",
                "email": "VARCHAR",
                "fax": "VARCHAR",
                "website": "VARCHAR"
            }'),
            'locationGroups': json_transform(
                entries['locationGroups'], '[{"_id": "VARCHAR", "name": "VARCHAR"}]'
            ),
            'location': entries['location']
        } AS p
    FROM pos_entries
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
        untyped_shape('address', entries['address'], '$', shapes[1], 'OBJECT'),
        untyped_shape('locationGroups', entries['locationGroups'], '$', shapes[2], 'ARRAY'),
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
        [json_type(entries['address']), json_type(entries['locationGroups'])] AS shapes,
        {
            'rating': json_extract(places_entry.value, '$.rating'),
            'user_ratings_total': json_extract(places_entry.value, '$.user_ratings_total'),
            'place_lat': json_extract(places_entry.value, '$.geometry.location.lat'),
            'place_lng': json_extract(places_entry.value, '$.geometry.location.lng')
        } AS places
    FROM places_entries
)
