"""The project's definitions as tests need them: the default instance's parts, or the whole code
location loaded from ``defs/`` the way ``dg`` and ``dagster`` load it."""

from __future__ import annotations

import textwrap
import uuid
from pathlib import Path
from typing import Any

import dagster as dg
import yaml

from fieldsales_dagster.assets import checks
from fieldsales_dagster.assets.checks import build_core_checks, checks_in_asset_step
from fieldsales_dagster.assets.columns import PACKAGE_SQL
from fieldsales_dagster.assets.core import build_core_assets
from fieldsales_dagster.assets.raw import build_raw_assets
from fieldsales_dagster.assets.tables import derived_tables
from fieldsales_dagster.assets.upkeep import UPKEEP_ASSET
from fieldsales_dagster.names import InstanceNames

DEFAULT = InstanceNames()
OWNERS = ["team:data"]
#: The project's tables, one YAML file each, by asset name (``raw_events``, ``core_areas``, ...).
TABLES = frozenset(path.stem for path in PACKAGE_SQL.glob("*.yaml"))
#: The project's assets: a table each, and the lake's upkeep.
ASSETS = TABLES | {UPKEEP_ASSET}


def raw_assets() -> list[dg.AssetsDefinition]:
    return build_raw_assets(DEFAULT, OWNERS)


def core_assets(with_checks: bool = False) -> list[dg.AssetsDefinition]:
    """The core assets; ``with_checks``: with the checks their steps evaluate, as deployed."""
    checks_for = checks_in_asset_step if with_checks else None
    return build_core_assets(
        DEFAULT,
        OWNERS,
        freshness_policy=None,
        checks_for=checks_for,
        tables=[t for t in derived_tables() if t.schema == "core"],
    )


def mart_assets(with_checks: bool = False) -> list[dg.AssetsDefinition]:
    checks_for = checks_in_asset_step if with_checks else None
    return build_core_assets(
        DEFAULT,
        OWNERS,
        freshness_policy=None,
        checks_for=checks_for,
        tables=[t for t in derived_tables() if t.schema == "mart"],
    )


def core_checks() -> list[dg.AssetChecksDefinition]:
    """The core checks that run as steps of their own (the others: ``core_assets(True)``)."""
    return build_core_checks(DEFAULT)


def core_check_count() -> int:
    """How many checks the core and mart tables have, wherever they run."""
    return len(checks.core_checks())


def materialize(
    assets: list[dg.AssetsDefinition], *, resources: dict[str, object], **kwargs: object
) -> dg.ExecuteInProcessResult:
    """``dg.materialize`` of ``assets`` with ``resources``."""
    return dg.materialize(assets, resources=resources, **kwargs)


def load_project_defs() -> dg.Definitions:
    """Everything under ``fieldsales_dagster/defs``, configured from the environment as it is."""
    from fieldsales_dagster.definitions import defs

    return defs()


def error_chain(exc: BaseException) -> str:
    """Every message of an exception and its causes, each once (Dagster wraps a component's load
    error, and a cause may loop back to an exception already seen)."""
    seen: list[BaseException] = []
    while exc is not None and not any(exc is each for each in seen):
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return "\n".join(str(each) for each in seen)


def load_failure(monkeypatch, **env: str) -> str:
    """``error_chain`` of loading the project's definitions with ``env`` set: the load must fail."""
    import pytest

    for variable, value in env.items():
        monkeypatch.setenv(variable, value)
    with pytest.raises(Exception) as failure:
        load_project_defs()
    return error_chain(failure.value)


def write_project(root: Path, instances: dict[str, str]) -> Path:
    """A dg project of its own at ``root`` whose ``defs/`` holds one folder per instance.

    Each gets a package name of its own: Python caches imported modules by name.
    """
    module = f"tenants_{uuid.uuid4().hex[:12]}"
    package = root / module
    (package / "defs").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "defs" / "__init__.py").write_text("")
    (root / "pyproject.toml").write_text(
        f'[tool.dg]\ndirectory_type = "project"\n[tool.dg.project]\nroot_module = "{module}"\n'
    )
    for name, attributes in instances.items():
        folder = package / "defs" / name
        folder.mkdir()
        (folder / "defs.yaml").write_text(
            "type: fieldsales_dagster.component.FieldSalesComponent\nattributes:\n"
            + textwrap.indent(textwrap.dedent(attributes).strip(), "  ")
            + "\n"
        )
    return package


def load_project(package: Path, monkeypatch) -> dg.Definitions:
    """The project's definitions as ``definitions.py`` builds them."""
    monkeypatch.syspath_prepend(str(package.parent))
    return dg.load_from_defs_folder(path_within_project=package)


def spelled(name: str, value: object) -> dict[str, object]:
    """Setting ``name`` (its flat name) given ``value``, as the component takes it: under its
    concern (``{"api": {"page_size": 5}}``), or at the top for the instance's own names."""
    from fieldsales_dagster.settings import SETTINGS

    group, field = SETTINGS[name].group, SETTINGS[name].field
    return {group: {field: value}} if group else {field: value}


def component(**given: object):
    """A ``FieldSalesComponent`` of the loopback demo URL (unless ``given`` says another) and
    ``given``, nested settings merged with that URL."""
    from fieldsales_dagster.component import FieldSalesComponent

    api = {"base_url": "http://127.0.0.1:9", **dict(given.pop("api", None) or {})}
    return FieldSalesComponent(api=api, **given)


def instance_yaml(**settings: object) -> str:
    """A component's YAML of ``settings`` by flat name (``None``: left out), each under its
    concern as the component takes it (``api: {base_url: ...}``)."""
    from fieldsales_dagster.settings import SETTINGS

    nested: dict[str, Any] = {}
    for name, value in settings.items():
        group, key = SETTINGS[name].group, SETTINGS[name].key
        place = nested.setdefault(group, {}) if group else nested
        if value is not None:
            place[key] = str(value) if isinstance(value, Path) else value
    return yaml.safe_dump(nested)


def value_of(settings: object, name: str) -> object:
    """The value of setting ``name`` (its flat name) in a component or its settings."""
    from fieldsales_dagster.settings import SETTINGS

    group, field = SETTINGS[name].group, SETTINGS[name].field
    return getattr(getattr(settings, group) if group else settings, field)
