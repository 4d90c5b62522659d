-- mart.user_activity: one row per user and day (UTC) on which the user had an event planned,
-- changed an event's state, or had sales at an event they were assigned to.
--
-- Sales count for every user assigned to the event (eventUser): an event with two users counts
-- its sales for both, so summing transactions over users can exceed core.transactions.
-- Users come from core.users where known; a user id seen only in a status change keeps NULL
-- names.
WITH assignments AS (
    SELECT
        event_id,
        CAST(planned_start AS DATE) AS planned_date,
        unnest(assigned_user_ids) AS user_id
    FROM core.events
),

planned AS (
    SELECT
        user_id,
        planned_date AS activity_date,
        count(DISTINCT event_id) AS events_planned
    FROM assignments
    WHERE planned_date IS NOT NULL
    GROUP BY ALL
),

changes AS (
    SELECT
        user_id,
        CAST(changed_at AS DATE) AS activity_date,
        count(*) AS status_changes,
        count(DISTINCT event_id) AS events_changed
    FROM core.event_status_history
    WHERE user_id IS NOT NULL AND changed_at IS NOT NULL
    GROUP BY ALL
),

-- The transactions are summed per event and day before the join (10M demo transactions: 260k
-- rows instead of 13M joined), and summed again per user, day and event, so that the events
-- with sales are a plain count of those groups: count(DISTINCT event_id) over every joined
-- transaction held each group's set in memory and ran a 10M nightly run out of the default
-- 192MB (the query alone: 192MB failed, 80MB passes). A user listed twice for one event still
-- counts its sales twice and the event once. The DOUBLE sums are added in another order.
sales_per_event AS (
    SELECT
        event_id,
        CAST(sale_time AS DATE) AS activity_date,
        count(*) AS transactions,
        sum(qty) AS qty,
        sum(total_value) AS total_value
    FROM core.transactions
    WHERE sale_time IS NOT NULL
    GROUP BY ALL
),

sales_per_user_event AS (
    SELECT
        a.user_id,
        s.activity_date,
        s.event_id,
        sum(s.transactions) AS transactions,
        sum(s.qty) AS qty,
        sum(s.total_value) AS total_value
    FROM sales_per_event AS s
    JOIN assignments AS a ON a.event_id = s.event_id
    GROUP BY ALL
),

sales AS (
    SELECT
        user_id,
        activity_date,
        CAST(sum(transactions) AS BIGINT) AS transactions,
        sum(qty) AS qty,
        sum(total_value) AS total_value,
        count(event_id) AS events_with_sales
    FROM sales_per_user_event
    GROUP BY ALL
)

SELECT
    user_id,
    activity_date,
    users.first_name,
    users.last_name,
    coalesce(planned.events_planned, 0) AS events_planned,
    coalesce(changes.status_changes, 0) AS status_changes,
    coalesce(changes.events_changed, 0) AS events_changed,
    coalesce(sales.transactions, 0) AS transactions,
    coalesce(sales.qty, 0) AS qty,
    coalesce(sales.total_value, 0) AS total_value,
    coalesce(sales.events_with_sales, 0) AS events_with_sales
FROM planned
FULL JOIN changes USING (user_id, activity_date)
FULL JOIN sales USING (user_id, activity_date)
LEFT JOIN core.users AS users USING (user_id)
