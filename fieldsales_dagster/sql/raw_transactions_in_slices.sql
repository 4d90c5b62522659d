-- raw_transactions_in_slices(): raw.transactions, read as four slices (by rowid) instead of in
-- one pass, for the queries that parse every payload (core.transactions,
-- core.custom_report_results). It bounds the JSON parser's memory: DuckDB keeps every parsed
-- document of a 2,048-row vector until the vector is done, ~60 MB per thread for ~5 KB payloads.
-- Under the 192 MB memory_limit that evicts the scanned blocks and the table being written from
-- the buffer pool, and the churn cost more than the parse (1M rows: 10 s -> 5.5 s for
-- core.transactions, 17 s -> 11 s for core.custom_report_results). A slice hands the parser
-- vectors of ~512 rows; the extra scans only decompress (cheap next to parsing). 2 or 8 slices
-- measured slower. Every row is in exactly one slice.
CREATE OR REPLACE TEMP MACRO raw_transactions_in_slices() AS TABLE
    SELECT * FROM raw.transactions WHERE rowid % 4 = 0
    UNION ALL
    SELECT * FROM raw.transactions WHERE rowid % 4 = 1
    UNION ALL
    SELECT * FROM raw.transactions WHERE rowid % 4 = 2
    UNION ALL
    SELECT * FROM raw.transactions WHERE rowid % 4 = 3
