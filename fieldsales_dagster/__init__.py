"""fieldsales_dagster: the Field-Sales read API, kept fresh in DuckDB by Dagster.

Importing the package builds nothing and reads no environment: ``code_location`` (what
``dagster ... -m fieldsales_dagster`` finds) is looked up lazily, and is itself the lazy
``@dg.definitions`` function of ``definitions.py``, so even the demo API
(``fieldsales_dagster.demo_api``) imports none of the pipeline. (Not named ``defs``: that is the
``defs/`` folder's module, which replaces such an attribute once it is imported.)

``FieldSalesWarehouse``, the warehouse resource, is the public extension point for assets of
your own in SQL (README, "Build on it"); it is looked up lazily too. So is
``FieldSalesComponent``: the package is ``dg``'s registry module (the
``dagster_dg_cli.registry_modules`` entry point), so ``dg list components`` lists it and
``dg scaffold defs fieldsales_dagster.FieldSalesComponent acme`` adds a tenant.
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
