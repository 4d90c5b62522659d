-- raw_events_in_slices(): raw.events, read as eight slices (by rowid) instead of in one pass, for
-- the query that parses every payload: temp.events_decoded (the one parse the core tables read;
-- the incremental refresh's event states are computed as the list is loaded). Like raw_transactions_in_slices (see there),
-- it bounds the JSON parser's memory: in one pass, 2,048 parsed ~3.4 KB event documents per
-- thread, beside the table being written in 16,384-row groups, exceeded the 192 MB memory_limit
-- at 25,000 events (1M transactions); ~14 KB documents need ~75 MB per thread per 2,048 rows,
-- ~19 MB per 512. Eight slices, not four: the payloads are stored compressed (storage format
-- v1.2.0), and the scan holds a whole 2,048-row vector of them decompressed (~28 MB of ~14 KB
-- payloads) beside the parse; with four, the heavy tenant's decode needed more than 64MB
-- (test_core_memory.py). Every row is in exactly one slice.
CREATE OR REPLACE TEMP MACRO raw_events_in_slices() AS TABLE
    SELECT * FROM raw.events WHERE rowid % 8 = 0
    UNION ALL
    SELECT * FROM raw.events WHERE rowid % 8 = 1
    UNION ALL
    SELECT * FROM raw.events WHERE rowid % 8 = 2
    UNION ALL
    SELECT * FROM raw.events WHERE rowid % 8 = 3
    UNION ALL
    SELECT * FROM raw.events WHERE rowid % 8 = 4
    UNION ALL
    SELECT * FROM raw.events WHERE rowid % 8 = 5
    UNION ALL
    SELECT * FROM raw.events WHERE rowid % 8 = 6
    UNION ALL
    SELECT * FROM raw.events WHERE rowid % 8 = 7
