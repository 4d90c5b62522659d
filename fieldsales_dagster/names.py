"""Every name one Field-Sales instance gives Dagster, derived from its key prefix in one place.

The default instance (no prefix) keeps the names the SPEC and the README use: assets
``raw_events`` … ``core_*``, job ``refresh_all``, pool ``fieldsales_duckdb``. A second tenant with
``key_prefix: acme`` gets ``acme/raw_events``, ``acme_refresh_all``, ``fieldsales_duckdb_acme``,
and so on, so two instances in one code location never collide.
"""

from __future__ import annotations

from dataclasses import dataclass

import dagster as dg

#: Run tag every refresh carries; the instance's run queue allows one such run per tag value.
REFRESH_TAG = "fieldsales/refresh"


@dataclass(frozen=True)
class InstanceNames:
    """Names of one instance's assets, groups, resources, pool, job, schedule and sensors."""

    key_prefix: str | None = None
    group_prefix: str | None = None

    def _prefixed(self, name: str, sep: str = "_") -> str:
        return f"{self.key_prefix}{sep}{name}" if self.key_prefix else name

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
        """DuckDB allows one writer per file: every asset of one instance sits in this pool."""
        return f"fieldsales_duckdb_{self.key_prefix}" if self.key_prefix else "fieldsales_duckdb"

    @property
    def api_resource(self) -> str:
        return self._prefixed("fieldsales_api")

    @property
    def warehouse_resource(self) -> str:
        return self._prefixed("warehouse")

    @property
    def refresh_job(self) -> str:
        return self._prefixed("refresh_all")

    @property
    def refresh_schedule(self) -> str:
        return f"{self.refresh_job}_schedule"

    @property
    def refresh_tag_value(self) -> str:
        return self.key_prefix or "all"

    @property
    def token_renewal_sensor(self) -> str:
        return self._prefixed("token_renewal_sensor")

    @property
    def automation_sensor(self) -> str:
        return self._prefixed("core_automation_sensor")
