-- mart.daily_sales: sales per day (of sale_time, UTC) x project x point of sale x area.
--
-- Project, point of sale and area are the transaction's event's. A transaction whose event is
-- not in core.events (see the event_ids_known check) is still counted, under NULL project,
-- point of sale and area, so the totals equal core.transactions'; so is one without sale_time,
-- under a NULL sale_date.
--
-- The transactions are summed per day, event and product before the join: the join and the
-- grouping then carry ~370k rows instead of 1M (1M demo transactions, the query alone: ~20 MiB
-- less memory at its peak, the same CPU). They are summed again per day, point of sale, area and
-- product, and the products counted by a plain count of those groups: count(DISTINCT product_id)
-- in the last grouping held its distinct sets in memory and ran out of the default 192MB at 10M
-- demo transactions (3.7M rows into 250k groups), where plain sums spill. The sums of DOUBLE
-- columns are then added in another order; DuckDB's parallel sum orders them differently from
-- run to run anyway.
WITH per_event_product AS (
    SELECT
        CAST(t.sale_time AS DATE) AS sale_date,
        t.event_id,
        t.product_id,
        count(*) AS transactions,
        sum(t.qty) AS qty,
        sum(t.total_value) AS total_value
    FROM core.transactions AS t
    GROUP BY ALL
),

per_product AS (
    SELECT
        p.sale_date,
        e.project_id,
        e.pos_id,
        e.area_id,
        p.product_id,
        sum(p.transactions) AS transactions,
        sum(p.qty) AS qty,
        sum(p.total_value) AS total_value
    FROM per_event_product AS p
    LEFT JOIN core.events AS e ON e.event_id = p.event_id
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
    count(product_id) AS distinct_products
FROM per_product
GROUP BY ALL
