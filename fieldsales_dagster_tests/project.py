"""The project's definitions as tests need them: the default instance's parts, or the whole code
location loaded from ``defs/`` the way ``dg`` and ``dagster`` load it."""

from __future__ import annotations

import dagster as dg

from fieldsales_dagster.assets.checks import (
    build_core_checks,
    checks_in_asset_step,
    core_check_keys,
)
from fieldsales_dagster.assets.core import build_core_assets
from fieldsales_dagster.assets.mart import build_mart_assets
from fieldsales_dagster.assets.publish import publish_steps
from fieldsales_dagster.assets.raw import build_raw_assets
from fieldsales_dagster.names import InstanceNames

DEFAULT = InstanceNames()
OWNERS = ["team:data"]


def raw_assets() -> list[dg.AssetsDefinition]:
    return build_raw_assets(DEFAULT, OWNERS)


def core_assets(with_checks: bool = False) -> list[dg.AssetsDefinition]:
    """The core assets; ``with_checks``: with the checks their steps evaluate, as deployed."""
    checks_for = checks_in_asset_step if with_checks else None
    return build_core_assets(DEFAULT, OWNERS, freshness_policy=None, checks_for=checks_for)


def mart_assets(with_checks: bool = False) -> list[dg.AssetsDefinition]:
    checks_for = checks_in_asset_step if with_checks else None
    return build_mart_assets(DEFAULT, OWNERS, freshness_policy=None, checks_for=checks_for)


def core_checks() -> list[dg.AssetChecksDefinition]:
    """The core checks that run as steps of their own (the others: ``core_assets(True)``)."""
    return build_core_checks(DEFAULT)


def core_check_count() -> int:
    """How many checks the core and mart tables have, wherever they run."""
    return len(core_check_keys(DEFAULT))


def materialize(
    assets: list[dg.AssetsDefinition], *, resources: dict[str, object], **kwargs: object
) -> dg.ExecuteInProcessResult:
    """``dg.materialize`` with the publish step the code location adds after the writers."""
    return dg.materialize(
        [*assets, *publish_steps(assets, resources)], resources=resources, **kwargs
    )


def load_project_defs() -> dg.Definitions:
    """Everything under ``fieldsales_dagster/defs``, configured from the environment as it is."""
    from fieldsales_dagster.definitions import defs

    return defs()


def error_chain(exc: BaseException) -> str:
    """Every message of an exception and its causes: Dagster wraps a component's load error."""
    texts = []
    while exc is not None:
        texts.append(str(exc))
        exc = exc.__cause__ or exc.__context__
    return "\n".join(texts)
