"""Every name one Field-Sales instance gives Dagster, derived from its key prefix in one place.

The default instance (no prefix) keeps the names the SPEC and the README use: assets
``raw_events`` … ``core_*``, job ``refresh_all``, pool ``fieldsales_duckdb``. A second tenant with
``key_prefix: acme`` gets ``acme/raw_events``, ``acme_refresh_all``, ``fieldsales_duckdb_acme``,
and so on, so two instances in one code location never collide.
"""

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
    """One resource a definition needs: the key it is declared under, and what it must be.

    A factory declares ``required_resource_keys={handle.key}`` and its body reads
    ``handle.of(context)``: both come from the one value, so the key read is the key declared,
    and a key the definitions do not supply fails when they load, not in a run.
    """

    key: str
    kind: type[R]

    def of(self, context: Any) -> R:
        """The resource, from the context of a step or a sensor tick that declared ``key``."""
        resource = getattr(context.resources, self.key)
        if not isinstance(resource, self.kind):
            raise TypeError(
                f"The resource {self.key!r} is a {type(resource).__name__}, but the Field-Sales "
                f"definitions need a {self.kind.__name__}: bind one to {self.key!r}."
            )
        return resource


class _Prefixed:
    """A name of one instance: ``name``, after its key prefix and ``_`` if it has one."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, names: InstanceNames, owner: type) -> str:
        return names._prefixed(self.name)


@dataclass(frozen=True)
class InstanceNames:
    """Names of one instance's assets, groups, resources, pool, job, schedule and sensors."""

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
        """How log lines name this instance: its key prefix, or "default" for the first."""
        return self.key_prefix or "default"

    @property
    def pool(self) -> str:
        """The prefix of this instance's pools (``pool_for``)."""
        return f"fieldsales_duckdb_{self.key_prefix}" if self.key_prefix else "fieldsales_duckdb"

    def pool_for(self, asset_name: str) -> str:
        """The pool of the asset writing ``asset_name``'s table, ``<pool>_<asset name>``: writers
        of different tables run at once, and the pools' limit (1) keeps one writer per table."""
        return f"{self.pool}_{asset_name}"

    @property
    def api(self) -> ResourceKey[FieldSalesAPI]:
        return ResourceKey(self._prefixed("fieldsales_api"), FieldSalesAPI)

    @property
    def warehouse(self) -> ResourceKey[FieldSalesWarehouse]:
        return ResourceKey(self._prefixed("warehouse"), FieldSalesWarehouse)

    io_manager = _Prefixed("fieldsales_io_manager")  # of user assets (assets/io_manager.py)
    refresh_job = _Prefixed("refresh_all")
    token_renewal_sensor = _Prefixed("token_renewal_sensor")
    token_renewal_job = _Prefixed("renew_token")
    token_renewal_op = _Prefixed("renew_or_test_token")
    automation_sensor = _Prefixed("core_automation_sensor")
    #: Alerts on a failed run, and on a failed check of ERROR severity (automation/sensors.py).
    alert_sensor = _Prefixed("run_failure_alert_sensor")
    check_alert_sensor = _Prefixed("check_failure_alert_sensor")

    @property
    def refresh_schedule(self) -> str:
        return f"{self.refresh_job}_schedule"

    @property
    def refresh_tag_value(self) -> str:
        return self.key_prefix or "all"
