"""Dagster automation: the refresh job and schedule, the token-renewal and automation sensors."""
