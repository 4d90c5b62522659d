"""The Field-Sales component: one instance, configured in YAML (``settings.py``), as Dagster defs.

Subclasses may override ``build_assets`` or ``build_checks`` (the checks run as steps of their
own). Of several tenants, one whose settings are wrong becomes ``NotConfigured``; the rest load.
"""

from __future__ import annotations

import os
from collections.abc import Hashable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import urllib3
import yaml
from pydantic import BaseModel, ValidationError

from fieldsales_dagster.assets.checks import (
    build_core_checks,
    checks_in_asset_step,
)
from fieldsales_dagster.assets.core import build_core_assets
from fieldsales_dagster.assets.export import build_export_asset
from fieldsales_dagster.assets.io_manager import build_io_manager
from fieldsales_dagster.assets.raw import build_raw_assets
from fieldsales_dagster.assets.upkeep import build_upkeep_asset, build_upkeep_job_and_schedule
from fieldsales_dagster.automation.alerts import AlertSettings, build_alert_sensors
from fieldsales_dagster.automation.renewal import RenewalPolicy
from fieldsales_dagster.automation.schedule import build_refresh_job_and_schedule
from fieldsales_dagster.automation.sensors import (
    build_core_automation_sensor,
    build_token_renewal_job,
    build_token_renewal_sensor,
)
from fieldsales_dagster.client.api import TOKEN_ROW, FieldSalesAPI
from fieldsales_dagster.names import InstanceNames
from fieldsales_dagster.paths import check_file_setting, identity, locations
from fieldsales_dagster.settings import (
    IDENTIFIER,
    ITEM_SHARE_OF_MEMORY,
    NOT_AN_ENV_REFERENCE,
    PLAIN_NAME,
    SETTINGS,
    FieldSalesSettings,
    SettingError,
    memory_megabytes,
    named,
    schedule_interval,
    setting_error,
    values,
    variables_named,
)
from fieldsales_dagster.tenancy import (
    Claim,
    TenantConflictError,
    declared_tenants,
    refuse_shared_claims,
)
from fieldsales_dagster.token.catalog import CATALOG_STORE, open_token_store
from fieldsales_dagster.token.secret import TokenFormatError, clean_token
from fieldsales_dagster.warehouse.lake import AWS_KEY_VARIABLES, Lake, LakeError, postgres_identity
from fieldsales_dagster.warehouse.pii import PiiSettingError
from fieldsales_dagster.warehouse.warehouse import FieldSalesWarehouse

#: Errors whose message is the whole story of what to fix.
CONFIGURATION_ERRORS = (SettingError, PiiSettingError, TokenFormatError, TenantConflictError)


def configuration_problems(exc: BaseException | None) -> list[str]:
    """The setting errors in ``exc``'s chain, in order."""
    found: list[str] = []
    while exc is not None:  # Python breaks a cycle of contexts as it raises
        causes: list[Any] = [exc]
        if isinstance(exc, ValidationError):
            causes = [(error.get("ctx") or {}).get("error") for error in exc.errors()]
        found += [str(cause) for cause in causes if isinstance(cause, CONFIGURATION_ERRORS)]
        exc = exc.__cause__ or exc.__context__
    return list(dict.fromkeys(found))


def not_configured(
    exc: Exception, context: dg.ComponentLoadContext, key_prefix: str | None
) -> NotConfigured:
    """A tenant with wrong settings among several leaves the others loaded; ``exc`` is raised
    again if it is no setting's, or under ``dg check defs`` (``DAGSTER_IS_DEFS_VALIDATION_CLI``)."""
    problems = configuration_problems(exc)
    validating = os.environ.get("DAGSTER_IS_DEFS_VALIDATION_CLI")
    if not problems or validating or len(declared_tenants(context, FieldSalesComponent)) < 2:
        raise exc
    return NotConfigured(context.path, key_prefix, "\n".join(problems))


def catalog_identity(lake: Lake) -> Hashable:
    """``lake``'s catalog however spelled: its SQLite file, or its PostgreSQL server's system
    identifier and database; its spelling, with a warning, if the server cannot be asked."""
    if lake.catalog_file is not None:
        return identity(lake.catalog_file)
    try:
        return postgres_identity(lake)
    except LakeError as exc:
        dg.get_dagster_logger().warning(
            f"Field-Sales: {exc} Until then, tenants are told apart by spelling."
        )
        return lake.catalog


class ScaffoldNameError(ValueError):
    """The scaffolded folder's name cannot be a key prefix."""


def tenant_defs_yaml(type_name: str, tenant: str) -> str:
    """The ``defs.yaml`` of tenant ``tenant`` (its key prefix), reading ``ACME_FIELDSALES_...``."""
    if not (IDENTIFIER.match(tenant) and tenant[0].isalpha()):
        raise ScaffoldNameError(
            f"dg scaffold defs {type_name} {tenant}: the folder's name becomes the tenant's "
            f"key_prefix, which must be {PLAIN_NAME} (e.g. acme)."
        )
    own, read = f"{tenant.upper()}_", []

    def env(setting: str, fallback: str = "") -> str:
        read.append(own + SETTINGS[setting].variable)
        return "{{ env." + read[-1] + (f" or {fallback}" if fallback else "") + " }}"

    attributes: dict[str, Any] = {
        "api": {
            "base_url": env("base_url"),
            "api_token": env("api_token"),
            "token_store_path": env(
                "token_store_path", f'((env.DAGSTER_HOME or "data") ~ "/{tenant}_token.json")'
            ),
        },
        "key_prefix": tenant,
        # Unset, the lake's files go to lake/ beside its catalog (data/<tenant>/lake).
        "storage": {
            "ducklake_catalog": env("ducklake_catalog", f'"sqlite:data/{tenant}/ducklake.sqlite"'),
            "ducklake_data_path": env("ducklake_data_path"),
        },
    }
    for declared in SETTINGS.values():
        if declared.name.endswith("_env_var"):
            attributes.setdefault(declared.group, {})[declared.key] = own + declared.default
            read.append(own + declared.default)
    document = {"type": type_name, "attributes": attributes, "requirements": {"env": read}}
    return (
        f"# Field-Sales tenant {tenant!r}: its settings read {own}* variables (only their names\n"
        "# are written here); add one under attributes to change its default.\n"
        + yaml.safe_dump(document, sort_keys=False, width=200)
    )


class FieldSalesScaffolder(dg.Scaffolder):
    def scaffold(self, request: dg.ScaffoldRequest[Any]) -> None:
        if request.scaffold_format != "yaml":
            dg.scaffold_component(request)
            return
        (request.target_path / "defs.yaml").write_text(
            tenant_defs_yaml(request.type_name, request.target_path.name), encoding="utf-8"
        )


@dg.scaffold_with(FieldSalesScaffolder)
class FieldSalesComponent(dg.Component, FieldSalesSettings):
    """One Field-Sales instance, loaded into one DuckLake and kept fresh.

    ``dg scaffold defs fieldsales_dagster.FieldSalesComponent acme`` adds a tenant: a folder
    ``defs/acme`` whose ``defs.yaml`` reads ``ACME_FIELDSALES_*`` variables (``tenant_defs_yaml``).
    """

    @classmethod
    def load(cls, attributes: BaseModel | None, context: dg.ComponentLoadContext) -> Any:
        try:
            return super().load(attributes, context)
        except Exception as exc:
            prefix = getattr(attributes, "key_prefix", None)
            if prefix is not None and not IDENTIFIER.match(str(prefix)):
                prefix = context.path.name  # the key prefix itself is wrong: the folder's name
            return not_configured(exc, context, prefix)

    @property
    def names(self) -> InstanceNames:
        return InstanceNames(self.key_prefix, self.group_prefix)

    def build_resources(self) -> dict[str, dg.ConfigurableResource | dg.IOManagerDefinition]:
        token_variable = self.api.api_token_env_var
        if token_variable == NOT_AN_ENV_REFERENCE:
            raise SettingError(
                "api_token must name an environment variable, as "
                "'{{ env.FIELDSALES_API_TOKEN }}', never hold a token: YAML is committed and shown."
            )
        # Checked here, at load, so a token a header cannot carry fails `dg check defs` at once.
        if not clean_token(os.environ.get(token_variable), token_variable):
            raise SettingError(
                f"api_token: the environment variable {token_variable} is not set (or empty). "
                "Set it to a token from your Field-Sales user profile (API tab)."
            )
        paths = {"token_store_path": self.token_file, "duckdb_path": self.storage.duckdb_path}
        for setting, path in paths.items():
            if path is not None:
                check_file_setting(path, setting=setting, create_dirs=self.storage.create_dirs)
        self.warehouse().preflight()
        item_mb, limit = self.api.max_item_mb, self.storage.duckdb_memory_limit
        if item_mb > (decoded := int(memory_megabytes(limit) // ITEM_SHARE_OF_MEMORY)):
            raise setting_error(
                "max_item_mb",
                f"it is {item_mb}, but storage.duckdb_memory_limit {limit} decodes at most "
                f"{decoded} MB. Raise duckdb_memory_limit to at least "
                f"{item_mb * ITEM_SHARE_OF_MEMORY}MB, or lower max_item_mb",
            )
        # Only the secret's variable name reaches Dagster.
        pii_hash_key = dg.EnvVar(self.pii.hash_key_env_var) if self.pii.mode == "hash" else None
        api = {**values(self.api), "api_token": dg.EnvVar(token_variable), **self.token_row()}
        warehouse = values(self.storage, self.pii, self.refresh)
        # Whose lake this is, recorded at its first commit (``lake.check_tenant``): the host, not
        # the port (the demo API takes a new one at every start), and the key prefix.
        host = str(urllib3.util.parse_url(self.api.base_url or "").host).lower()
        tenant = f"{host} (key_prefix {self.key_prefix or '-'})"
        return {
            self.names.api.key: FieldSalesAPI(**api),
            self.names.warehouse.key: FieldSalesWarehouse(
                **warehouse, tenant=tenant, pii_hash_key=pii_hash_key
            ),
            self.names.io_manager: build_io_manager(self.names.warehouse.key, self.user_schema),
        }

    def token_row(self) -> dict[str, Any]:
        """Where a ``catalog`` token store's row is (``ducklake_*`` fields); empty for a file."""
        if self.api.token_store_path != CATALOG_STORE:
            return {}
        if not self.warehouse().lake.is_postgres:
            raise setting_error(
                "token_store_path",
                f"{CATALOG_STORE} needs a PostgreSQL storage.ducklake_catalog "
                f"({named('FIELDSALES_DUCKLAKE_CATALOG')}); set one, or a file path here",
            )
        return {setting: getattr(self.storage, setting) for setting in TOKEN_ROW}

    @property
    def token_file(self) -> str | None:
        """The token store's file; none for a ``catalog`` one (the lake's claim covers its row)."""
        return None if self.token_row() else self.api.token_store_path

    def warehouse(self) -> FieldSalesWarehouse:
        return FieldSalesWarehouse(**values(self.storage))

    def build_assets(self) -> list[dg.AssetsDefinition]:
        # Fresh: warn after one schedule interval (plus an hour for the run), fail after two.
        interval = schedule_interval(self.refresh.schedule_cron, self.refresh.schedule_timezone)
        names, hour = self.names, timedelta(hours=1)
        policy = dg.FreshnessPolicy.time_window(
            warn_window=interval + hour, fail_window=2 * interval + hour
        )
        tables = [
            *build_raw_assets(names, self.owners, names.io_manager),
            *build_core_assets(names, self.owners, policy, checks_in_asset_step, names.io_manager),
        ]
        if self.storage.duckdb_path is None:
            return tables
        built = [k for a in tables for k in a.keys if k.path[-1].startswith(("core_", "mart_"))]
        return [*tables, build_export_asset(names, self.owners, built)]

    def build_checks(self, assets: list[dg.AssetsDefinition]) -> list[dg.AssetChecksDefinition]:
        return build_core_checks(self.names)

    def alert_settings(self) -> AlertSettings:
        return AlertSettings(
            alerts=self.alerts,
            secret_env_vars=(*self.secret_variables(), *AWS_KEY_VARIABLES),
            token_store=open_token_store(self.api.token_store_path, **self.token_row()),
        )

    def tenant_claims(self) -> list[Claim]:
        lake = self.warehouse().lake
        schema = lake.schema or ("public" if lake.is_postgres else "main")
        one_file = "one file, links and relative paths followed"

        def file(thing: str, setting: str, path: str | None) -> list[Claim]:
            if path is None:
                return []
            return [Claim(thing, path, setting, resolve=lambda: (identity(path),), same=one_file)]

        return [
            Claim("key prefix", self.key_prefix or "(none)", "key_prefix"),
            Claim("pool", self.names.pool, "key_prefix"),
            *file("token store", "token_store_path", self.token_file),
            Claim(
                "DuckLake",
                f"{lake.catalog_file or lake.catalog} (schema {schema})",
                "ducklake_catalog",
                kind=(lake.is_postgres, schema),
                resolve=lambda: (catalog_identity(lake),),
                same="one PostgreSQL database (its server's system identifier)"
                if lake.is_postgres
                else one_file,
            ),
            Claim(
                "lake data folder",
                lake.data_folder,
                "ducklake_data_path",
                resolve=lambda: locations(lake.data_folder),
                same="one folder holds the other, and each tenant's upkeep deletes the files its "
                "catalog does not list",
            ),
            *file("DuckDB export", "duckdb_path", self.storage.duckdb_path),
        ]

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        refuse_shared_claims(context, FieldSalesComponent)
        try:
            with variables_named(self._variables):
                resources = self.build_resources()
        except Exception as exc:  # raised again unless a setting's (a resource's: ValidationError)
            return not_configured(exc, context, self.key_prefix).build_defs(context)
        names, refresh = self.names, self.refresh
        assets = self.build_assets()
        selection = dg.AssetSelection.assets(*assets)
        job, schedule = build_refresh_job_and_schedule(
            names, selection, refresh.schedule_cron, refresh.schedule_timezone
        )
        upkeep = build_upkeep_asset(names, self.owners, self.storage.retain_snapshots_days)
        upkeep_job, upkeep_schedule = build_upkeep_job_and_schedule(
            names, upkeep, refresh.schedule_timezone
        )
        renewal = RenewalPolicy(timedelta(days=self.api.token_renew_after_days))
        return dg.Definitions(
            assets=dg.with_source_code_references([*assets, upkeep]),
            asset_checks=self.build_checks(assets),
            jobs=[job, upkeep_job, build_token_renewal_job(names, renewal)],
            schedules=[schedule, upkeep_schedule],
            sensors=[
                build_token_renewal_sensor(names, renewal),
                build_core_automation_sensor(names, selection.downstream()),
                *build_alert_sensors(
                    names,
                    self.alert_settings(),
                    job_names=[job.name, upkeep_job.name, names.token_renewal_job],
                    asset_keys=[key for a in [*assets, upkeep] for key in a.keys],
                ),
            ],
            resources=resources,
        )


@dataclass
class NotConfigured(dg.Component):
    """A tenant with wrong settings among others: an asset ``<key_prefix>/not_configured`` and its
    refresh job, described by the error and failing with it when run."""

    folder: Path
    key_prefix: str | None
    error: str

    def tenant_claims(self) -> list[Claim]:
        return []  # its settings are unknown: nothing to compare

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        names = InstanceNames(self.key_prefix)
        where = self.folder.relative_to(context.component_tree.defs_module_path.parent)
        dg.get_dagster_logger().warning(
            f"The Field-Sales tenant in {where}/defs.yaml is not loaded (the other tenants "
            f"are): {self.error}"
        )

        @dg.asset(
            key=names.asset_key("not_configured"),
            description=self.error,
            group_name=names.group("not_configured"),
        )
        def not_configured() -> None:
            raise SettingError(self.error)

        job = dg.define_asset_job(
            names.refresh_job, selection=[not_configured], description=self.error
        )
        return dg.Definitions(assets=[not_configured], jobs=[job])
