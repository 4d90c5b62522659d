"""The resources every definition uses, configured from the environment.

The API token reaches Dagster as ``EnvVar("FIELDSALES_API_TOKEN")``: the UI and run config show the
variable's name, never its value.
"""

from __future__ import annotations

import os

import dagster as dg

from fieldsales_dagster.api import FieldSalesAPI
from fieldsales_dagster.warehouse import FieldSalesWarehouse, default_duckdb_path


def build_resources() -> dict[str, object]:
    api_kwargs: dict[str, object] = {}
    if os.environ.get("FIELDSALES_TOKEN_STORE"):
        api_kwargs["token_store_path"] = dg.EnvVar("FIELDSALES_TOKEN_STORE")
    return {
        "fieldsales_api": FieldSalesAPI(
            base_url=dg.EnvVar("FIELDSALES_BASE_URL"),
            api_token=dg.EnvVar("FIELDSALES_API_TOKEN"),
            **api_kwargs,
        ),
        "warehouse": FieldSalesWarehouse(database=default_duckdb_path()),
    }
