"""fieldsales_dagster: the Field-Sales read API, kept fresh in DuckDB by Dagster.

Importing the package builds nothing: ``code_location`` (what ``dagster ... -m
fieldsales_dagster`` finds; not ``defs``, the ``defs/`` folder's module would replace it),
``FieldSalesWarehouse`` (README, "Build on it") and ``FieldSalesComponent`` (``dg``'s registry
module) are looked up lazily, so even the demo API imports none of the pipeline.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "code_location":
        from fieldsales_dagster.definitions import defs

        return defs
    if name == "FieldSalesComponent":  # what `dg list components` and `dg scaffold defs` find
        from fieldsales_dagster.component import FieldSalesComponent

        return FieldSalesComponent
    if name == "FieldSalesWarehouse":
        from fieldsales_dagster.warehouse.warehouse import FieldSalesWarehouse

        return FieldSalesWarehouse
    raise AttributeError(f"module 'fieldsales_dagster' has no attribute {name!r}")


def __dir__() -> list[str]:
    return ["FieldSalesComponent", "FieldSalesWarehouse", "code_location"]
