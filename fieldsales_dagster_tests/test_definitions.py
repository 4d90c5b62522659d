import dagster as dg

from fieldsales_dagster import defs


def test_definitions_load():
    assert isinstance(defs, dg.Definitions)
    defs.get_repository_def()
