"""``dg scaffold defs fieldsales_dagster.FieldSalesComponent <folder>``: a new tenant's folder.

The folder's name becomes the tenant's key prefix, and every setting a tenant must have to itself
(its API, token, DuckDB file and token store) reads an environment variable named after it, so
that the new folder loads beside the shipped one (``tenancy.py`` refuses shared files) and no
secret is ever written into the YAML. ``requirements: env:`` lists the variables it reads, which
``dg list env`` shows.
"""

from __future__ import annotations

import re
from typing import Any

import dagster as dg

#: Variables a scaffolded tenant reads, by setting: ``{PREFIX}`` is the tenant's name, upper case.
TENANT_VARIABLES = {
    "base_url": "{PREFIX}_FIELDSALES_BASE_URL",
    "api_token": "{PREFIX}_FIELDSALES_API_TOKEN",
    "duckdb_path": "{PREFIX}_FIELDSALES_DUCKDB_PATH",
    "token_store_path": "{PREFIX}_FIELDSALES_TOKEN_STORE",
}

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


class ScaffoldNameError(ValueError):
    """The scaffolded folder's name cannot be a key prefix."""


def tenant_defs_yaml(type_name: str, tenant: str) -> str:
    """The ``defs.yaml`` of tenant ``tenant`` (also its key prefix)."""
    if not _NAME.match(tenant):
        raise ScaffoldNameError(
            f"dg scaffold defs {type_name} {tenant}: the folder's name becomes the tenant's "
            "key_prefix, which must be a name of letters, digits and underscores, starting with "
            "a letter (e.g. acme). Choose such a name and scaffold again."
        )
    variables = {
        setting: pattern.format(PREFIX=tenant.upper())
        for setting, pattern in TENANT_VARIABLES.items()
    }
    home_store = f"((env.DAGSTER_HOME or 'data') ~ '/{tenant}_token.json')"
    values = {
        "base_url": f"env.{variables['base_url']}",
        "api_token": f"env.{variables['api_token']}",
        "duckdb_path": f"env.{variables['duckdb_path']} or 'data/{tenant}.duckdb'",
        "token_store_path": f"env.{variables['token_store_path']} or {home_store}",
    }
    template = {name: '"{{ ' + value + ' }}"' for name, value in values.items()}
    requirements = "\n".join(f"    - {variable}" for variable in variables.values())
    return (
        f"# Field-Sales tenant {tenant!r}: its own API, token, DuckDB file and token store, each\n"
        "# read from an environment variable (only a variable's name is written here, never a\n"
        "# token). Every other setting keeps its default (fieldsales_dagster/settings.py); add it\n"
        "# under attributes to change it.\n"
        f"type: {type_name}\n"
        "\n"
        "attributes:\n"
        f"  base_url: {template['base_url']}\n"
        f"  api_token: {template['api_token']}\n"
        f"  # Assets {tenant}/raw_events ..., job {tenant}_refresh_all, pool "
        f"fieldsales_duckdb_{tenant}.\n"
        f"  key_prefix: {tenant}\n"
        f"  duckdb_path: {template['duckdb_path']}\n"
        f"  token_store_path: {template['token_store_path']}\n"
        "\n"
        "requirements:\n"
        "  env:\n"
        f"{requirements}\n"
    )


class FieldSalesScaffolder(dg.Scaffolder):
    """Writes a tenant's ``defs.yaml`` (see ``tenant_defs_yaml``)."""

    def scaffold(self, request: dg.ScaffoldRequest[Any]) -> None:
        if request.scaffold_format != "yaml":
            dg.scaffold_component(request)
            return
        (request.target_path / "defs.yaml").write_text(
            tenant_defs_yaml(request.type_name, request.target_path.name), encoding="utf-8"
        )
