-- mart.daily_sales: sales per day (of sale_time, UTC) x project x point of sale x area.
--
-- Project, point of sale and area are the transaction's event's. A transaction whose event is
-- not in core.events (see the event_ids_known check) is still counted, under NULL project,
-- point of sale and area, so the totals equal core.transactions'; so is one without sale_time,
-- under a NULL sale_date.
SELECT
    CAST(t.sale_time AS DATE) AS sale_date,
    e.project_id,
    e.pos_id,
    e.area_id,
    count(*) AS transactions,
    sum(t.qty) AS qty,
    sum(t.total_value) AS total_value,
    count(DISTINCT t.product_id) AS distinct_products
FROM core.transactions AS t
LEFT JOIN core.events AS e ON e.event_id = t.event_id
GROUP BY ALL
