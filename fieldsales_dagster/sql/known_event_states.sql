-- The event states of field-sales-api.md section 3.1, in the order an event usually passes them
-- (used by mart.event_summary and the event_states_known check). A state missing here is still
-- loaded everywhere; the event_states_known check warns that it is new.
CREATE OR REPLACE TEMP MACRO known_event_states() AS TABLE
    SELECT * FROM (VALUES
        ('Planned', 1),
        ('Published', 2),
        ('Rejected', 3),
        ('Accepted', 4),
        ('LoggedIn', 5),
        ('LoggedOut', 6),
        ('SalesReport', 7),
        ('SalesReportUploaded', 8),
        ('SalesReportAccepted', 9),
        ('Invoiced', 10),
        ('Paid', 11)
    ) AS states(state, state_order);
