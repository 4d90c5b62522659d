"""The resources every definition uses, configured from the environment.

The API token reaches Dagster as ``EnvVar("FIELDSALES_API_TOKEN")``: the UI and run config show the
variable's name, never its value.
"""

from __future__ import annotations

import os

import dagster as dg

from fieldsales_dagster.client.resource import FieldSalesAPI
from fieldsales_dagster.warehouse.resource import DEFAULT_DUCKDB_PATH, FieldSalesWarehouse

#: Optional tuning knobs: environment variable -> FieldSalesAPI field.
API_TUNING_ENV = {
    "FIELDSALES_PAGE_SIZE": "page_size",
    "FIELDSALES_CONCURRENCY": "concurrency",
}


def default_duckdb_path() -> str:
    return os.environ.get("FIELDSALES_DUCKDB_PATH") or DEFAULT_DUCKDB_PATH


def build_resources() -> dict[str, object]:
    api_kwargs: dict[str, object] = {}
    if os.environ.get("FIELDSALES_TOKEN_STORE"):
        api_kwargs["token_store_path"] = dg.EnvVar("FIELDSALES_TOKEN_STORE")
    for variable, field in API_TUNING_ENV.items():
        value = os.environ.get(variable, "").strip()
        if value:
            if not value.isdigit() or int(value) < 1:
                raise ValueError(f"{variable} must be a whole number >= 1, got {value!r}.")
            api_kwargs[field] = int(value)
    warehouse_kwargs: dict[str, object] = {}
    if os.environ.get("FIELDSALES_DUCKDB_MEMORY_LIMIT"):
        warehouse_kwargs["memory_limit"] = os.environ["FIELDSALES_DUCKDB_MEMORY_LIMIT"]
    return {
        "fieldsales_api": FieldSalesAPI(
            base_url=dg.EnvVar("FIELDSALES_BASE_URL"),
            api_token=dg.EnvVar("FIELDSALES_API_TOKEN"),
            **api_kwargs,
        ),
        "warehouse": FieldSalesWarehouse(database=default_duckdb_path(), **warehouse_kwargs),
    }
