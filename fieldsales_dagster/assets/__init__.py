"""Dagster asset factories: raw tables, core tables and their checks."""
