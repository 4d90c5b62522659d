"""The API token: its format and the durable store. No Dagster here."""
