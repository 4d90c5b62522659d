-- mart.event_summary: one row per event: where and when it was planned, who was assigned, what
-- was sold, when it first reached each state, and the lead times between the usual states.
--
-- State timestamps are the first time the event entered the state (core.event_state_durations);
-- a lead time is NULL unless the event reached both states, and negative if it reached the later
-- one first (for example SalesReportUploaded straight from Planned, then Published later).
--
-- followed(event_id) holds for every event in a whole build, else for the events whose rows a
-- build makes again (mart_event_summary.yaml's follows:).
WITH sales AS (
    SELECT
        event_id,
        count(*) AS transactions,
        sum(qty) AS qty,
        sum(total_value) AS total_value,
        count(DISTINCT product_id) AS distinct_products,
        min(sale_time) AS first_sale_at,
        max(sale_time) AS last_sale_at
    FROM core.transactions
    WHERE followed(event_id)
    GROUP BY event_id
),

reached AS (
    SELECT
        event_id,
        count(*) AS status_changes,
        min(entered_at) FILTER (WHERE state = 'Planned') AS planned_at,
        min(entered_at) FILTER (WHERE state = 'Published') AS published_at,
        min(entered_at) FILTER (WHERE state = 'Rejected') AS rejected_at,
        min(entered_at) FILTER (WHERE state = 'Accepted') AS accepted_at,
        min(entered_at) FILTER (WHERE state = 'LoggedIn') AS logged_in_at,
        min(entered_at) FILTER (WHERE state = 'LoggedOut') AS logged_out_at,
        min(entered_at) FILTER (WHERE state = 'SalesReport') AS sales_report_at,
        min(entered_at) FILTER (WHERE state = 'SalesReportUploaded') AS sales_report_uploaded_at,
        min(entered_at) FILTER (WHERE state = 'SalesReportAccepted') AS sales_report_accepted_at,
        min(entered_at) FILTER (WHERE state = 'Invoiced') AS invoiced_at,
        min(entered_at) FILTER (WHERE state = 'Paid') AS paid_at
    FROM core.event_state_durations
    WHERE followed(event_id)
    GROUP BY event_id
)

SELECT
    e.event_id,
    e.project_id,
    e.project_name,
    e.pos_id,
    e.pos_name,
    e.area_id,
    e.area_name,
    e.event_state,
    e.planned_start,
    e.planned_stop,
    e.assigned_user_ids,
    len(e.assigned_user_ids) AS assigned_user_count,
    coalesce(sales.transactions, 0) AS transactions,
    coalesce(sales.qty, 0) AS qty,
    coalesce(sales.total_value, 0) AS total_value,
    coalesce(sales.distinct_products, 0) AS distinct_products,
    sales.first_sale_at,
    sales.last_sale_at,
    coalesce(reached.status_changes, 0) AS status_changes,
    reached.* EXCLUDE (event_id, status_changes),
    (epoch(published_at) - epoch(planned_at)) / 3600 AS hours_planned_to_published,
    (epoch(accepted_at) - epoch(published_at)) / 3600 AS hours_published_to_accepted,
    (epoch(logged_in_at) - epoch(accepted_at)) / 3600 AS hours_accepted_to_logged_in,
    (epoch(logged_out_at) - epoch(logged_in_at)) / 3600 AS hours_logged_in_to_logged_out,
    (epoch(sales_report_accepted_at) - epoch(sales_report_uploaded_at)) / 3600
        AS hours_sales_report_uploaded_to_accepted,
    (epoch(invoiced_at) - epoch(sales_report_accepted_at)) / 3600
        AS hours_sales_report_accepted_to_invoiced,
    (epoch(paid_at) - epoch(invoiced_at)) / 3600 AS hours_invoiced_to_paid,
    (epoch(paid_at) - epoch(planned_at)) / 3600 AS hours_planned_to_paid
FROM core.events AS e
LEFT JOIN sales USING (event_id)
LEFT JOIN reached USING (event_id)
WHERE followed(e.event_id)
