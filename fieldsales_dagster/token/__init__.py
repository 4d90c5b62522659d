"""The API token: the durable store, the renewal policy and the renewal call. No Dagster here."""
