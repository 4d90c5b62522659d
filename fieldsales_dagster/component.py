"""The Field-Sales component: one instance of the service, configured in YAML, as Dagster defs.

A ``defs.yaml`` of this type is the project's one settings model: every knob is a validated field
below, read from the YAML (the default one reads the ``FIELDSALES_*`` environment variables), its
default, range and meaning defined once in ``settings.py``. A bad
value fails the definitions load at once, with one paragraph naming the setting, its variable and
what it accepts. One instance becomes:

* resources: the API client (its token a Dagster ``EnvVar``, so the UI shows the variable's name,
  never the token) and the warehouse (a DuckLake);
* assets ``raw_*`` and ``core_*`` (under ``key_prefix`` for a second tenant), their checks;
* the refresh job and its schedule, the token-renewal sensor and its job, and the core-table
  automation sensor.

Subclasses may override ``build_assets`` or ``build_checks`` to add or change definitions. (Most
core checks are check specs of their assets, evaluated in the asset's step: ``build_assets``
wires them; ``build_checks`` holds the ones that run as steps of their own.)
"""

from __future__ import annotations

import os
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, Literal, cast
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import dagster as dg
import urllib3
from pydantic import ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticUndefined

from fieldsales_dagster.assets.checks import build_core_checks, checks_in_asset_step
from fieldsales_dagster.assets.core import build_core_assets
from fieldsales_dagster.assets.export import build_export_asset
from fieldsales_dagster.assets.io_manager import build_io_manager
from fieldsales_dagster.assets.mart import build_mart_assets
from fieldsales_dagster.assets.raw import build_raw_assets
from fieldsales_dagster.assets.upkeep import build_upkeep_asset, build_upkeep_job_and_schedule
from fieldsales_dagster.automation.alerts import AlertSettings, build_alert_sensors
from fieldsales_dagster.automation.schedule import build_refresh_job, build_refresh_schedule
from fieldsales_dagster.automation.sensors import (
    build_core_automation_sensor,
    build_token_renewal_sensor,
)
from fieldsales_dagster.client.api import FieldSalesAPI
from fieldsales_dagster.client.errors import FieldSalesAPIError
from fieldsales_dagster.client.urls import validate_base_url
from fieldsales_dagster.loading.refresh_mode import RefreshMode
from fieldsales_dagster.names import InstanceNames
from fieldsales_dagster.paths import PathSettingError, check_file_setting
from fieldsales_dagster.settings import (
    ITEM_SHARE_OF_MEMORY,
    RETIRED_SETTINGS,
    SETTINGS,
    setting_field,
)
from fieldsales_dagster.tenancy import Claim, refuse_shared_claims
from fieldsales_dagster.token.renewal import RenewalPolicy
from fieldsales_dagster.token.secret import clean_token
from fieldsales_dagster.warehouse.lake import Lake, check_catalog, old_warehouse_warning
from fieldsales_dagster.warehouse.warehouse import PROJECT_SCHEMAS, FieldSalesWarehouse

#: ``{{ env.NAME }}`` or ``{{ env('NAME') }}``: the only accepted form of a secret in YAML.
_ENV_REFERENCE = re.compile(
    r"""^\{\{\s*env(?:\.(?P<attr>[A-Za-z_][A-Za-z0-9_]*)|\(\s*['"](?P<call>[A-Za-z_][A-Za-z0-9_]*)['"]\s*\))\s*\}\}$"""
)
#: Schemas the project writes: a DuckDB file may not be named after one (see ``_duckdb_path``).
RESERVED_STEMS = PROJECT_SCHEMAS
#: The one value the retired ``storage`` setting still accepts (FIELDSALES_STORAGE of an older
#: deployment): DuckLake is the only storage.
LAKE_STORAGE = "ducklake"
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MEMORY = re.compile(r"^\d+(\.\d+)?\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)$", re.IGNORECASE)


class SettingError(ValueError):
    """A setting of the component is missing or out of range."""


_UNITS = {"b": 1e-6, "kb": 1e-3, "mb": 1, "gb": 1e3, "tb": 1e6}
_UNITS |= {"kib": 1024 / 1e6, "mib": 1.048576, "gib": 1073.741824, "tib": 1099511.627776}


def trimmed(value: Any) -> Any:
    """A setting's value without whitespace around it (each item of a list too)."""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, list):
        return [trimmed(item) for item in value]
    return value


def memory_megabytes(limit: str) -> float:
    """A DuckDB size such as ``192MB`` or ``2GiB``, in MB (``_MEMORY`` matched it already)."""
    match = re.match(r"^(\d+(?:\.\d+)?)\s*([A-Za-z]+)$", limit.strip())
    assert match is not None, limit
    return float(match.group(1)) * _UNITS[match.group(2).lower()]


#: What ``api_token`` resolves to when the YAML holds anything but an ``env`` reference. The load
#: then fails in ``build_resources``, whose message cannot echo the YAML line (Dagster's own
#: resolution errors quote it, and the line would be the token).
NOT_AN_ENV_REFERENCE = "<not an environment variable reference>"


def _secret_env_var(context: dg.ResolutionContext, raw: Any) -> str:
    """The name of the environment variable a secret is read from, never the secret itself.

    The YAML must say ``{{ env.FIELDSALES_API_TOKEN }}`` (or another variable): the resource then
    reads it as a Dagster ``EnvVar`` at run time, so the UI and run config show the name only.
    """
    match = _ENV_REFERENCE.match(raw.strip()) if isinstance(raw, str) else None
    return (match.group("attr") or match.group("call")) if match else NOT_AN_ENV_REFERENCE


# --- `dg scaffold defs fieldsales_dagster.FieldSalesComponent <folder>`: a new tenant ---------
#
# The folder's name becomes the tenant's key prefix, and every setting a tenant must have to itself
# (its API, token, lake and token store) reads an environment variable named after it, so
# the new folder loads beside the shipped one (tenancy.py refuses shared files) and no secret is
# ever written into the YAML. `requirements: env:` lists the variables it reads (`dg list env`).

#: Variables a scaffolded tenant reads, by setting: ``{PREFIX}`` is the tenant's name, upper case.
TENANT_VARIABLES = {
    "base_url": "{PREFIX}_FIELDSALES_BASE_URL",
    "api_token": "{PREFIX}_FIELDSALES_API_TOKEN",
    "ducklake_catalog": "{PREFIX}_FIELDSALES_DUCKLAKE_CATALOG",
    "ducklake_data_path": "{PREFIX}_FIELDSALES_DUCKLAKE_DATA_PATH",
    "token_store_path": "{PREFIX}_FIELDSALES_TOKEN_STORE",
}


class ScaffoldNameError(ValueError):
    """The scaffolded folder's name cannot be a key prefix."""


def tenant_defs_yaml(type_name: str, tenant: str) -> str:
    """The ``defs.yaml`` of tenant ``tenant`` (also its key prefix)."""
    if not (_IDENTIFIER.match(tenant) and tenant[0].isalpha()):
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
        "ducklake_catalog": (
            f"env.{variables['ducklake_catalog']} or 'sqlite:data/{tenant}.ducklake.sqlite'"
        ),
        "ducklake_data_path": f"env.{variables['ducklake_data_path']} or 'data/{tenant}_lake'",
        "token_store_path": f"env.{variables['token_store_path']} or {home_store}",
    }
    template = {name: '"{{ ' + value + ' }}"' for name, value in values.items()}
    requirements = "\n".join(f"    - {variable}" for variable in variables.values())
    return (
        f"# Field-Sales tenant {tenant!r}: its own API, token, lake and token store, each\n"
        "# read from an environment variable (only a variable's name is written here, never a\n"
        "# token). Every other setting keeps its default (fieldsales_dagster/settings.py); add it\n"
        "# under attributes to change it.\n"
        f"type: {type_name}\n"
        "\n"
        "attributes:\n"
        f"  base_url: {template['base_url']}\n"
        f"  api_token: {template['api_token']}\n"
        f"  # Assets {tenant}/raw_events ..., job {tenant}_refresh_all, pools "
        f"fieldsales_duckdb_{tenant}_*.\n"
        f"  key_prefix: {tenant}\n"
        f"  ducklake_catalog: {template['ducklake_catalog']}\n"
        f"  ducklake_data_path: {template['ducklake_data_path']}\n"
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


@dg.scaffold_with(FieldSalesScaffolder)
class FieldSalesComponent(dg.Component, dg.Model, dg.Resolvable):
    """One Field-Sales instance, loaded into one DuckLake and kept fresh.

    ``dg scaffold defs fieldsales_dagster.FieldSalesComponent acme`` adds a tenant: a folder
    ``defs/acme`` whose ``defs.yaml`` reads ``ACME_FIELDSALES_*`` variables (``tenant_defs_yaml``).
    """

    # Defaults, ranges and meanings: settings.py. Ranges are checked by ``_in_range`` below, not
    # Field(ge=...): Dagster copies Field constraints onto the YAML model, where the value is still
    # a "{{ env... }}" template.
    base_url: str | None = setting_field("base_url", bounded=False)
    api_token_env_var: Annotated[
        str,
        dg.Resolver(
            _secret_env_var,
            model_field_name="api_token",
            model_field_type=str,
            inject_before_resolve=False,
            description=SETTINGS["api_token"].description + ".",
        ),
    ] = SETTINGS["api_token"].variable
    token_store_path: str = setting_field("token_store_path", bounded=False)
    duckdb_path: str | None = setting_field("duckdb_path", bounded=False)
    create_dirs: bool = setting_field("create_dirs", bounded=False)
    duckdb_memory_limit: str = setting_field("duckdb_memory_limit", bounded=False)
    # Retired (RETIRED_SETTINGS): unset or "ducklake" accepted with a warning, "file" refused.
    storage: str | None = None
    ducklake_catalog: str | None = setting_field("ducklake_catalog", bounded=False)
    ducklake_data_path: str | None = setting_field("ducklake_data_path", bounded=False)
    ducklake_schema: str | None = setting_field("ducklake_schema", bounded=False)
    ducklake_password_env_var: str = setting_field("ducklake_password_env_var", bounded=False)
    retain_snapshots_days: float = setting_field("retain_snapshots_days", bounded=False)
    page_size: int = setting_field("page_size", bounded=False)
    concurrency: int = setting_field("concurrency", bounded=False)
    max_item_mb: int = setting_field("max_item_mb", bounded=False)
    schedule_cron: str = setting_field("schedule_cron", bounded=False)
    schedule_timezone: str = setting_field("schedule_timezone", bounded=False)
    token_renew_after_days: float = setting_field("token_renew_after_days", bounded=False)
    refresh_mode: RefreshMode = setting_field("refresh_mode", bounded=False)
    full_refresh_every_days: float = setting_field("full_refresh_every_days", bounded=False)
    lookback_days: float = setting_field("lookback_days", bounded=False)
    pii: Literal["keep", "hash", "drop"] = setting_field("pii", bounded=False)
    pii_hash_key_env_var: str = setting_field("pii_hash_key_env_var", bounded=False)
    redact_pii_in_raw: bool = setting_field("redact_pii_in_raw", bounded=False)
    alert_webhook_url_env_var: str = setting_field("alert_webhook_url_env_var", bounded=False)
    alert_email_to: str | None = setting_field("alert_email_to", bounded=False)
    alert_email_from: str = setting_field("alert_email_from", bounded=False)
    alert_smtp_host: str = setting_field("alert_smtp_host", bounded=False)
    alert_smtp_port: int = setting_field("alert_smtp_port", bounded=False)
    alert_smtp_user: str | None = setting_field("alert_smtp_user", bounded=False)
    alert_smtp_password_env_var: str = setting_field("alert_smtp_password_env_var", bounded=False)
    ui_base_url: str | None = setting_field("ui_base_url", bounded=False)
    key_prefix: str | None = setting_field("key_prefix", bounded=False)
    group_prefix: str | None = setting_field("group_prefix", bounded=False)
    owners: list[str] = setting_field("owners", bounded=False)
    user_schema: str = setting_field("user_schema", bounded=False)

    # --- validation: one paragraph per bad setting ------------------------------------------

    @field_validator("base_url")
    @classmethod
    def _base_url(cls, value: str | None) -> str:
        if not value or not value.strip():
            raise ValueError("it is not set")
        try:
            return validate_base_url(value)
        except FieldSalesAPIError as exc:
            raise ValueError(str(exc).rstrip(".")) from None

    @model_validator(mode="before")
    @classmethod
    def _unset_is_default(cls, values: Any) -> Any:
        # defs.yaml reads each setting as "{{ env.FIELDSALES_... }}": an unset (or empty)
        # variable renders as None (or ""), which leaves the setting at its default. Whitespace
        # around a value (a stray space in an env file or compose file) is trimmed first.
        if not isinstance(values, dict):
            return values
        values = {key: trimmed(value) for key, value in values.items()}
        return {
            key: value
            for key, value in values.items()
            if not (
                value in (None, "")
                and key in SETTINGS
                and SETTINGS[key].default is not PydanticUndefined
            )
        }

    @field_validator(*(name for name, setting in SETTINGS.items() if setting.bounds))
    @classmethod
    def _in_range(cls, value: float, info: ValidationInfo) -> float:
        if not SETTINGS[cast(str, info.field_name)].inside(value):  # set for field validators
            raise ValueError("it is out of range")
        return value

    @field_validator("duckdb_path", mode="before")
    @classmethod
    def _no_export(cls, value: Any) -> Any:
        # The default YAML reads an unset variable as an empty string: no export.
        return value.strip() or None if isinstance(value, str) else value

    @field_validator("duckdb_path")
    @classmethod
    def _duckdb_path(cls, value: str | None) -> str | None:
        # DuckDB names a file's catalog after its stem: raw.duckdb would shadow the raw schema.
        if value is None:
            return None
        if Path(value).stem.lower() in RESERVED_STEMS:
            raise ValueError(
                f"a file named {Path(value).name} gives DuckDB a catalog named like one of the "
                f"schemas ({', '.join(sorted(RESERVED_STEMS))})"
            )
        return value

    @field_validator("duckdb_memory_limit")
    @classmethod
    def _memory_limit(cls, value: str) -> str:
        if not _MEMORY.match(value.strip()):
            raise ValueError("it is not a size")
        return value.strip()

    @field_validator("schedule_cron")
    @classmethod
    def _cron(cls, value: str) -> str:
        try:
            _ticks(value.strip(), "UTC")
        except dg.DagsterInvalidDefinitionError:
            raise ValueError("it is not a cron expression") from None
        return value.strip()

    @field_validator("schedule_timezone")
    @classmethod
    def _timezone(cls, value: str) -> str:
        try:
            ZoneInfo(value.strip())
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError("it is not an IANA time zone") from None
        return value.strip()

    @field_validator("ducklake_catalog", "ducklake_data_path", mode="before")
    @classmethod
    def _blank_is_unset(cls, value: Any) -> Any:
        # The default YAML reads an unset variable as an empty string.
        return value.strip() or None if isinstance(value, str) else value

    @field_validator("ducklake_catalog")
    @classmethod
    def _catalog(cls, value: str | None) -> str | None:
        return None if value is None else check_catalog(value)

    @field_validator("storage", mode="before")
    @classmethod
    def _storage(cls, value: Any) -> Any:
        text = value.strip().lower() if isinstance(value, str) else value
        if text in (None, ""):
            return None
        if text == LAKE_STORAGE:
            dg.get_dagster_logger().warning(
                "Field-Sales: storage (FIELDSALES_STORAGE=ducklake) is no longer a setting: "
                "DuckLake is the only storage. Remove it from defs.yaml and the environment."
            )
            return None
        raise ValueError(
            "it was retired: this release keeps the tables in a DuckLake only (the file storage "
            "and its publish step are gone), so remove storage: from defs.yaml and unset "
            "FIELDSALES_STORAGE. An existing DuckDB warehouse file is left untouched: "
            "docs/storage.md says how to move (a full refresh into the lake), and "
            "FIELDSALES_DUCKDB_PATH keeps a single-file export for tools that need one"
        )

    @field_validator("ducklake_schema")
    @classmethod
    def _lake_schema(cls, value: str | None) -> str | None:
        if value and not _IDENTIFIER.match(value):
            raise ValueError("it is not a plain name")
        return value or None

    @model_validator(mode="after")
    def _postgres_needs_a_data_path(self) -> FieldSalesComponent:
        if (self.ducklake_catalog or "").startswith("postgres:") and not self.ducklake_data_path:
            variable = SETTINGS["ducklake_data_path"].variable
            raise SettingError(
                f"Field-Sales setting ducklake_data_path (from {variable}) is not set, and a "
                "PostgreSQL catalog (FIELDSALES_DUCKLAKE_CATALOG) needs it: the folder every "
                "machine sees (a shared volume) or an s3:// URL for the lake's Parquet files. "
                f"Set it in defs.yaml or through {variable} and load again."
            )
        return self

    @field_validator("alert_email_to", "alert_email_from")
    @classmethod
    def _addresses(cls, value: str | None) -> str | None:
        addresses = [a.strip() for a in (value or "").split(",") if a.strip()]
        if any("@" not in address or " " in address for address in addresses):
            raise ValueError("it is not a list of e-mail addresses")
        return ", ".join(addresses) or None

    @field_validator("ui_base_url")
    @classmethod
    def _ui_url(cls, value: str | None) -> str | None:
        if value and not re.match(r"^https?://[^/\s]+", value.strip()):
            raise ValueError("it is not an http:// or https:// URL")
        return value.strip().rstrip("/") if value else None

    @field_validator("key_prefix", "group_prefix")
    @classmethod
    def _prefix(cls, value: str | None) -> str | None:
        if value is not None and not _IDENTIFIER.match(value):
            raise ValueError("it is not a plain name")
        return value or None

    @field_validator("user_schema")
    @classmethod
    def _user_schema(cls, value: str) -> str:
        if not _IDENTIFIER.match(value):
            raise ValueError("it is not a plain name")
        if value.lower() in PROJECT_SCHEMAS:
            raise ValueError("the project rebuilds that schema, so it would overwrite your tables")
        return value

    # Defined last, so it wraps every validator above.
    @field_validator("*", mode="wrap")
    @classmethod
    def _explain(cls, value: Any, handler: Any, info: ValidationInfo) -> Any:
        try:
            return handler(value)
        except (ValidationError, ValueError) as exc:
            raise SettingError(_explain_setting(info.field_name, value, exc)) from None

    # --- what one instance becomes ------------------------------------------------------------

    @property
    def names(self) -> InstanceNames:
        return InstanceNames(self.key_prefix, self.group_prefix)

    def build_resources(self) -> dict[str, dg.ConfigurableResource | dg.IOManagerDefinition]:
        token_variable = self.api_token_env_var
        if token_variable == NOT_AN_ENV_REFERENCE:
            raise SettingError(
                "api_token must name an environment variable, as "
                "'{{ env.FIELDSALES_API_TOKEN }}', never hold a token: a token written in YAML "
                "would be committed and shown in the UI. Put the token in an environment variable "
                "and reference it."
            )
        # Checked here, at load, so a token a header cannot carry fails `dg check defs` at once.
        clean_token(os.environ.get(token_variable), token_variable)
        if not (os.environ.get(token_variable) or "").strip():
            raise SettingError(
                f"api_token: the environment variable {token_variable} is not set (or empty). "
                "Set it to a token from your Field-Sales user profile (API tab; admin users "
                "only); for the bundled demo API, the token fieldsales-demo-api printed."
            )
        self.check_paths()
        self.check_item_size()
        if (
            self.pii == "hash"
            and len((os.environ.get(self.pii_hash_key_env_var) or "").strip()) < 16
        ):
            raise SettingError(
                f"pii: hash needs a secret key in {self.pii_hash_key_env_var} (at least 16 "
                "characters; a new key gives every value a new hash). Set it, or choose pii: keep "
                "or drop (FIELDSALES_PII)."
            )
        return {
            self.names.api_resource: FieldSalesAPI(
                base_url=cast(str, self.base_url),  # _base_url refuses None
                api_token=dg.EnvVar(token_variable),
                token_store_path=self.token_store_path,
                page_size=self.page_size,
                concurrency=self.concurrency,
                max_item_mb=self.max_item_mb,
            ),
            self.names.warehouse_resource: FieldSalesWarehouse(
                export_path=self.duckdb_path,
                tenant=self.tenant,
                ducklake_catalog=self.ducklake_catalog,
                ducklake_data_path=self.ducklake_data_path,
                ducklake_schema=self.ducklake_schema,
                ducklake_password_env_var=self.ducklake_password_env_var,
                memory_limit=self.duckdb_memory_limit,
                pii=self.pii,
                # A secret: only the variable's name reaches Dagster, and only when it is used.
                pii_hash_key=dg.EnvVar(self.pii_hash_key_env_var) if self.pii == "hash" else None,
                redact_pii_in_raw=self.redact_pii_in_raw,
                create_dirs=self.create_dirs,
                refresh_mode=self.refresh_mode,
                full_refresh_every_days=self.full_refresh_every_days,
                lookback_days=self.lookback_days,
            ),
            # User assets' DataFrames, through the warehouse above (assets/io_manager.py).
            self.names.io_manager: build_io_manager(
                self.names.warehouse_resource, self.user_schema
            ),
        }

    def check_item_size(self) -> None:
        """Fail the load at once if ``max_item_mb`` is more than the memory limit can decode."""
        memory_mb = memory_megabytes(self.duckdb_memory_limit)
        if self.max_item_mb * ITEM_SHARE_OF_MEMORY > memory_mb:
            share = f"1/{ITEM_SHARE_OF_MEMORY}"
            raise SettingError(
                f"Field-Sales setting max_item_mb (FIELDSALES_MAX_ITEM_MB) is {self.max_item_mb}, "
                f"but duckdb_memory_limit (FIELDSALES_DUCKDB_MEMORY_LIMIT) "
                f"{self.duckdb_memory_limit} decodes items of at most "
                f"{int(memory_mb // ITEM_SHARE_OF_MEMORY)} MB ({share} of it). Raise "
                f"duckdb_memory_limit to at least {self.max_item_mb * ITEM_SHARE_OF_MEMORY}MB, "
                "or lower max_item_mb, and load again."
            )

    @property
    def tenant(self) -> str:
        """Who this instance's lake belongs to: the Field-Sales host and the key prefix, recorded
        in the lake with its first commit; a lake recorded for another tenant is refused
        (``lake.check_tenant``). The port is not part of it: the bundled demo API takes a new one
        at every start, and an instance is its host."""
        url = self.base_url or ""
        host = (urllib3.util.parse_url(url).host or url).lower()
        return f"{host} (key_prefix {self.key_prefix or '-'})"

    def check_paths(self) -> None:
        """Fail the load at once if a file setting points where the pipeline cannot write; warn
        once about a DuckDB warehouse of an earlier release (``lake.old_warehouse_warning``)."""
        settings = {"token_store_path": self.token_store_path}
        if self.duckdb_path is not None:
            settings["duckdb_path"] = self.duckdb_path
        try:
            for setting, path in settings.items():
                check_file_setting(
                    path,
                    setting=setting,
                    variable=SETTINGS[setting].variable,
                    create_dirs=self.create_dirs,
                )
        except PathSettingError as exc:
            raise SettingError(str(exc)) from None
        warning = old_warehouse_warning(self.warehouse_lake(), self.duckdb_path)
        if warning:
            dg.get_dagster_logger().warning(warning)

    def warehouse_lake(self) -> Lake:
        return FieldSalesWarehouse(
            ducklake_catalog=self.ducklake_catalog,
            ducklake_data_path=self.ducklake_data_path,
            ducklake_schema=self.ducklake_schema,
        ).lake

    def freshness_policy(self) -> dg.FreshnessPolicy:
        """Core tables are fresh if refreshed within one schedule interval (plus an hour of slack
        for the run itself); they fail freshness after two missed refreshes."""
        interval = schedule_interval(self.schedule_cron, self.schedule_timezone)
        return dg.FreshnessPolicy.time_window(
            warn_window=interval + timedelta(hours=1), fail_window=2 * interval + timedelta(hours=1)
        )

    def build_assets(self) -> list[dg.AssetsDefinition]:
        names, policy = self.names, self.freshness_policy()
        # Every table loads as a pandas input of a user asset through the IO manager.
        tables = [
            *build_raw_assets(names, self.owners, names.io_manager),
            *build_core_assets(names, self.owners, policy, checks_in_asset_step, names.io_manager),
            *build_mart_assets(names, self.owners, policy, checks_in_asset_step, names.io_manager),
        ]
        if self.duckdb_path is None:
            return tables
        # The single-file export, after the core and mart tables (assets/export.py).
        built = [
            key
            for asset in tables
            for key in asset.keys
            if key.path[-1].startswith(("core_", "mart_"))
        ]
        return [*tables, build_export_asset(names, self.owners, built)]

    def build_checks(self, assets: list[dg.AssetsDefinition]) -> list[dg.AssetChecksDefinition]:
        return [
            *build_core_checks(self.names),
            *dg.build_column_schema_change_checks(assets=assets),
        ]

    def alert_settings(self) -> AlertSettings:
        """Where this instance's alerts go (``automation/sensors.py``); off unless configured."""
        return AlertSettings(
            tenant=self.names.tenant,
            webhook_url_env_var=self.alert_webhook_url_env_var,
            email_to=tuple(a.strip() for a in (self.alert_email_to or "").split(",") if a),
            email_from=self.alert_email_from,
            smtp_host=self.alert_smtp_host,
            smtp_port=self.alert_smtp_port,
            smtp_user=self.alert_smtp_user,
            smtp_password_env_var=self.alert_smtp_password_env_var,
            ui_base_url=self.ui_base_url,
            secret_env_vars=(
                self.api_token_env_var,
                self.pii_hash_key_env_var,
                self.ducklake_password_env_var,
            ),
            token_store_path=self.token_store_path,
        )

    def tenant_claims(self) -> list[Claim]:
        """What this instance must have to itself in a code location (see ``tenancy.py``)."""
        claims = [
            Claim("key prefix", self.key_prefix or "(none)", "key_prefix"),
            Claim("pool", self.names.pool, "key_prefix"),
            Claim("token store", str(Path(self.token_store_path).resolve()), "token_store_path"),
        ]
        # Spellings compared here; what the lake records (its tenant) is checked at first write.
        lake = self.warehouse_lake()
        where = lake.catalog_file.resolve() if lake.catalog_file else lake.catalog
        claims.append(
            Claim("DuckLake", f"{where} (schema {lake.schema or 'main'})", "ducklake_catalog")
        )
        if self.duckdb_path is not None:
            claims.append(
                Claim("DuckDB export", str(Path(self.duckdb_path).resolve()), "duckdb_path")
            )
        return claims

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        refuse_shared_claims(context, FieldSalesComponent)
        names = self.names
        assets = self.build_assets()
        selection = dg.AssetSelection.assets(*assets)
        job = build_refresh_job(names, selection)
        jobs: list[Any] = [job]
        schedules = [build_refresh_schedule(names, job, self.schedule_cron, self.schedule_timezone)]
        upkeep = build_upkeep_asset(names, self.owners, self.retain_snapshots_days)
        upkeep_job, upkeep_schedule = build_upkeep_job_and_schedule(
            names, upkeep, self.schedule_timezone
        )
        jobs.append(upkeep_job)
        schedules.append(upkeep_schedule)
        alerts = self.alert_settings()
        alert_sensors = build_alert_sensors(
            names,
            alerts,
            job_names=[*(j.name for j in jobs), names.token_renewal_job],
            asset_keys=[key for a in [*assets, upkeep] for key in a.keys],
        )
        return dg.Definitions(
            assets=dg.with_source_code_references([*assets, upkeep]),
            asset_checks=self.build_checks(assets),
            jobs=jobs,
            schedules=schedules,
            sensors=[
                build_token_renewal_sensor(
                    names,
                    RenewalPolicy.after_days(self.token_renew_after_days),
                ),
                # Also the user assets downstream of this instance's tables (README: Build on it).
                build_core_automation_sensor(names, selection.downstream()),
                *alert_sensors,
            ],
            resources=self.build_resources(),
        )


def _explain_setting(field: str | None, value: Any, exc: Exception) -> str:
    field = field or "?"
    known = SETTINGS.get(field)
    variable, accepts = (known.variable, known.help) if known else ("", "a valid value")
    if field in RETIRED_SETTINGS:
        variable, accepts = RETIRED_SETTINGS[field], "nothing any more (leave it unset)"
    if isinstance(exc, ValidationError):
        why = "; ".join(error["msg"].removeprefix("Value error, ") for error in exc.errors())
    else:
        why = str(exc)
    where = f" (from {variable})" if variable else ""
    shown = "" if field == "api_token" else f" Got {value!r}."
    return (
        f"Field-Sales setting {field}{where} is invalid: {why}.{shown} It takes {accepts}; set it "
        f"in defs.yaml{' or through ' + variable if variable else ''} and load again."
    )


def _ticks(cron: str, timezone: str) -> dg.TimeWindowPartitionsDefinition:
    """The next few ticks of ``cron``, as the windows of a time-partitioned definition: Dagster's
    public way to its own cron rules and tick times (its schedules use the same). An invalid
    expression raises ``DagsterInvalidDefinitionError``."""
    return dg.TimeWindowPartitionsDefinition(
        cron_schedule=cron,
        start=datetime.now(UTC),
        timezone=timezone,
        fmt="%Y-%m-%dT%H:%M:%S",
        end_offset=8,
    )


def schedule_interval(cron: str, timezone: str) -> timedelta:
    """The longest gap between two of the next few ticks of ``cron``."""
    ticks = _ticks(cron, timezone)
    windows = [
        ticks.time_window_for_partition_key(key)
        for key in ticks.get_partition_keys(current_time=datetime.now(UTC))
    ]
    return max(window.end - window.start for window in windows)
