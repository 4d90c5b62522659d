"""Core tables derived in DuckDB from the raw tables (placeholder)."""

core_assets: list = []
