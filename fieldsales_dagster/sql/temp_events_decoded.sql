-- temp.events_decoded: raw.events payloads, each parsed once per run, into the columns the event
-- tables read (core.events, core.projects, core.areas, core.users, core.dim_point_of_sale,
-- core.dim_point_of_sale_history, core.event_status_history, core.custom_report_results).
-- Pipeline-internal (not part of the contract); each payload parsed once per run, when a step
-- first reads it (decode.py: share_decoded, parse_shared; a nightly step reads the changed events
-- and the copies their ids keep, event_copies.sql): a table of the process's DuckDB instance (in
-- memory, spilled to its temp_directory) that the run's steps read, with the rows the step parsed,
-- as a TEMP view temp.events_decoded, and the run's end drops. It holds personal values (names,
-- emails, IPs) that core.* hashes or drops as the pii setting says, so it never outlives the run
-- and is never written to the lake: as a lake table its Parquet files sat in the data path, and a
-- failed step left them there (unknown to the catalog until the upkeep deletes orphans), and the
-- lake's snapshots would keep them until expiry. (The lake's Parquet writer also held this
-- table's row groups in memory: 64MB was too little for the heavy tenant, test_core_memory.py.)
--
-- Why: parsing a payload holds the whole parsed document, ~2.7 times its text, for every row of
-- the 2,048-row vector being parsed. With event payloads of ~14 KB (long status histories, many
-- custom-report results, full point-of-sale objects) one vector is ~75 MB per thread, so each of
-- those eight queries parsing raw.events on its own needed 150-180 MB of the 192 MB
-- memory_limit before doing any work. Parsed once here, in slices (rows_to_decode() reads
-- raw_events_in_slices(), see there, for a full decode), the tables read narrow, typed columns.
--
-- json_transform reads each key independently (absent or mistyped: NULL), so the union of the
-- paths gives each table what its own parse gave. The embedded objects that a table reads as
-- JSON (a reference may arrive as a bare id string, or the keys are not known in advance) stay
-- JSON here; they are a few hundred bytes to a few KB, not the whole payload.
SELECT
    parsed.id,
    parsed.loaded_at,
    p.project_id AS project,
    p.point_of_sale,
    p.pointOfSaleProjectStructure.area AS area,
    p.eventState AS event_state,
    -- start and stop as JSON: core.events types them (json_timestamp) and names what it cannot.
    p.times,
    p.eventUser AS event_users,
    p.eventStateHistory AS state_history,
    p.customReportResult AS report_results,
    -- core.events counts both lists: counted here, it need not read them.
    len(p.eventStateHistory) AS status_change_count,
    len(p.customReportResult) AS custom_report_count,
    -- What core.events and core.dim_point_of_sale_history read of the point of sale, parsed here
    -- on the slice's rows: a few-KB object parsed 2,048 rows at a time by those queries needed
    -- ~45 MB per thread (DuckDB 1.5).
    json_transform(p.point_of_sale, '{
        "_id": "VARCHAR",
        "name": "VARCHAR",
        "address": {
            "company": "VARCHAR",
            "streetnumber": "VARCHAR",
            "postal": "VARCHAR",
            "city": "VARCHAR",
            "additional": "VARCHAR"
        },
        "location": "JSON"
    }') AS pos_fields,
    -- The lists and reports the parse gave NULL for, as received where they are present (a list
    -- that is not an array, a reportResults that is not an object): core.events names them in
    -- untyped_values (typed_values.sql) without reading the payload. The payload is read again
    -- only for such rows, and only here: computing the untyped_values entries in this query took
    -- it past the memory a heavy tenant's decode fits in.
    CASE WHEN p.times IS NULL THEN json_extract(parsed.payload, '$.times') END AS unparsed_times,
    CASE
        WHEN p.eventUser IS NULL THEN json_extract(parsed.payload, '$.eventUser')
    END AS unparsed_event_users,
    CASE
        WHEN p.eventStateHistory IS NULL THEN json_extract(parsed.payload, '$.eventStateHistory')
    END AS unparsed_state_history,
    CASE
        WHEN p.customReportResult IS NULL THEN json_extract(parsed.payload, '$.customReportResult')
    END AS unparsed_report_results,
    CASE
        WHEN list_contains(
            list_transform(p.customReportResult, lambda r: r.reportResults IS NULL), true
        ) THEN json_extract(parsed.payload, '$.customReportResult[*].reportResults')
    END AS unparsed_report_result_maps
FROM (
    SELECT
        e.id,
        e.loaded_at,
        json_transform(e.payload, '{
            "project_id": "JSON",
            "point_of_sale": "JSON",
            "pointOfSaleProjectStructure": {"area": "JSON"},
            "eventState": "VARCHAR",
            "times": [{"start": "JSON", "stop": "JSON"}],
            "eventUser": [{
                "_id": "VARCHAR",
                "firstName": "VARCHAR",
                "lastName": "VARCHAR",
                "email": "VARCHAR",
                "language": "VARCHAR",
                "usertype": "VARCHAR"
            }],
            "eventStateHistory": [{
                "_id": "VARCHAR",
                "stateOld": "VARCHAR",
                "stateNew": "VARCHAR",
                "date": "TIMESTAMPTZ",
                "user": "VARCHAR",
                "historyType": "VARCHAR",
                "ip": "VARCHAR"
            }],
            "customReportResult": [{
                "_id": "VARCHAR",
                "_event": "VARCHAR",
                "reportResults": "MAP(VARCHAR, STRUCT(value JSON, name VARCHAR, fieldId VARCHAR))"
            }]
        }') AS p,
        e.payload
    FROM rows_to_decode() AS e
) AS parsed
