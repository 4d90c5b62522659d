"""fieldsales_dagster: the Field-Sales read API, kept fresh in DuckDB by Dagster."""

from fieldsales_dagster.definitions import defs

__all__ = ["defs"]
