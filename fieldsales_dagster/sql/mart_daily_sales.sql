-- mart.daily_sales: sales per day (of sale_time, UTC) x project x point of sale x area.
--
-- Project, point of sale and area are the transaction's event's. A transaction whose event is
-- not in core.events (see the event_ids_known check) is still counted, under NULL project,
-- point of sale and area, so the totals equal core.transactions'; so is one without sale_time,
-- under a NULL sale_date.
--
-- The transactions are summed per day, event and product before the join: the join and the
-- grouping then carry ~370k rows instead of 1M. They are summed again per day, point of sale, area
-- and product, and the products counted by a plain count of those groups: count(DISTINCT
-- product_id) in the last grouping held its distinct sets in memory and ran out of the default
-- 192MB at 10M demo transactions, where plain sums spill. The first sum groups by numbers that
-- stand for the event and the product, not their text ids: at 3M demo transactions its 1.1M groups
-- of two 24-character ids spilled at 192MB (the query alone: 2.1-2.6 -> 1.2-1.3 CPU-s; the same
-- at 1M, which fits either way). The sums of DOUBLE columns are then added in another order;
-- DuckDB's parallel sum orders them differently from run to run anyway.
-- The numbers are made once (MATERIALIZED): each of their two readers must see the same.
--
-- followed(key) holds for every row in a whole build, else for the days and places (project,
-- point of sale, area) whose rows a build makes again (mart_daily_sales.yaml's follows:).
WITH events AS MATERIALIZED (
    SELECT
        event_id,
        project_id,
        pos_id,
        area_id,
        CAST(row_number() OVER () AS INTEGER) AS event_no
    FROM core.events
),

products AS MATERIALIZED (
    SELECT
        product_id,
        CAST(row_number() OVER () AS INTEGER) AS product_no
    FROM (SELECT DISTINCT product_id FROM core.transactions WHERE product_id IS NOT NULL)
),

per_event_product AS (
    SELECT
        CAST(t.sale_time AS DATE) AS sale_date,
        e.event_no,
        p.product_no,
        count(*) AS transactions,
        sum(t.qty) AS qty,
        sum(t.total_value) AS total_value
    FROM core.transactions AS t
    LEFT JOIN events AS e ON e.event_id = t.event_id
    LEFT JOIN products AS p ON p.product_id = t.product_id
    WHERE followed({
        'sale_date': CAST(t.sale_time AS DATE),
        'project_id': e.project_id,
        'pos_id': e.pos_id,
        'area_id': e.area_id
    })
    GROUP BY ALL
),

per_product AS (
    SELECT
        p.sale_date,
        e.project_id,
        e.pos_id,
        e.area_id,
        p.product_no,
        sum(p.transactions) AS transactions,
        sum(p.qty) AS qty,
        sum(p.total_value) AS total_value
    FROM per_event_product AS p
    LEFT JOIN events AS e ON e.event_no = p.event_no
    GROUP BY ALL
)

SELECT
    sale_date,
    project_id,
    pos_id,
    area_id,
    CAST(sum(transactions) AS BIGINT) AS transactions,
    sum(qty) AS qty,
    sum(total_value) AS total_value,
    count(product_no) AS distinct_products
FROM per_product
GROUP BY ALL
