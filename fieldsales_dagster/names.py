"""Every name one instance gives Dagster, from its key prefix: none keeps the SPEC's names
(``raw_events``, ``refresh_all``); ``acme`` gives ``acme/raw_events``, ``acme_refresh_all``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import dagster as dg

from fieldsales_dagster.client.api import FieldSalesAPI
from fieldsales_dagster.warehouse.warehouse import FieldSalesWarehouse

#: Run tag every refresh carries; the instance's run queue allows one such run per tag value.
REFRESH_TAG = "fieldsales/refresh"

R = TypeVar("R")


@dataclass(frozen=True)
class ResourceKey(Generic[R]):
    """A resource's key and type: a factory declares ``required_resource_keys={handle.key}`` and
    reads ``handle.of(context)``, so the key read is the key declared (checked at load)."""

    key: str
    kind: type[R]

    def of(self, context: Any) -> R:
        resource = getattr(context.resources, self.key)
        if not isinstance(resource, self.kind):
            raise TypeError(
                f"The resource {self.key!r} is a {type(resource).__name__}, but the Field-Sales "
                f"definitions need a {self.kind.__name__}: bind one to {self.key!r}."
            )
        return resource


class _Prefixed:
    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, names: InstanceNames, owner: type) -> str:
        return names._prefixed(self.name)


@dataclass(frozen=True)
class InstanceNames:
    key_prefix: str | None = None
    group_prefix: str | None = None

    def _prefixed(self, name: str) -> str:
        return f"{self.key_prefix}_{name}" if self.key_prefix else name

    def asset_key(self, name: str) -> dg.AssetKey:
        return dg.AssetKey([self.key_prefix, name]) if self.key_prefix else dg.AssetKey(name)

    def group(self, layer: str) -> str:
        prefix = self.group_prefix or self.key_prefix
        return f"{prefix}_{layer}" if prefix else layer

    @property
    def tenant(self) -> str:
        return self.key_prefix or "default"

    @property
    def pool(self) -> str:
        return f"fieldsales_duckdb_{self.key_prefix}" if self.key_prefix else "fieldsales_duckdb"

    def pool_for(self, asset_name: str) -> str:
        """Writers of different tables run at once; the pool's limit (1): one per table."""
        return f"{self.pool}_{asset_name}"

    @property
    def api(self) -> ResourceKey[FieldSalesAPI]:
        return ResourceKey(self._prefixed("fieldsales_api"), FieldSalesAPI)

    @property
    def warehouse(self) -> ResourceKey[FieldSalesWarehouse]:
        return ResourceKey(self._prefixed("warehouse"), FieldSalesWarehouse)

    io_manager = _Prefixed("fieldsales_io_manager")
    refresh_job = _Prefixed("refresh_all")
    token_renewal_sensor = _Prefixed("token_renewal_sensor")
    token_renewal_job = _Prefixed("renew_token")
    token_renewal_op = _Prefixed("renew_or_test_token")
    automation_sensor = _Prefixed("core_automation_sensor")
    alert_sensor = _Prefixed("run_failure_alert_sensor")
    check_alert_sensor = _Prefixed("check_failure_alert_sensor")
    refresh_schedule = _Prefixed("refresh_all_schedule")

    @property
    def refresh_tag_value(self) -> str:
        return self.key_prefix or "all"
