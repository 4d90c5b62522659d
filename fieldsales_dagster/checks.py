"""Asset checks on the core tables (placeholder)."""

core_checks: list = []
