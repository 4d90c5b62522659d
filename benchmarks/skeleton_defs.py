"""The project's asset graph with steps that do nothing: Dagster's own cost of running it.

The same assets, checks, dependencies and steps as the project's definitions (loaded from the
environment, as a run loads them), each step yielding its materializations and passed checks and
nothing else. Beside ``noop_defs.py`` (one asset), it splits an unchanged run's cost into what
Dagster pays for this graph and what the steps' own work adds:

    dagster asset materialize -m benchmarks.skeleton_defs --select '*'

(with the project's ``FIELDSALES_*`` settings and an initialised ``DAGSTER_HOME``; measure its
second run, as the unchanged run is a lake's second).
"""

from collections.abc import Iterator, Sequence

import dagster as dg

import fieldsales_dagster.definitions as project

Result = dg.MaterializeResult | dg.AssetCheckResult


def _passed(keys: Sequence[dg.AssetCheckKey]) -> Iterator[dg.AssetCheckResult]:
    for key in keys:
        yield dg.AssetCheckResult(asset_key=key.asset_key, check_name=key.name, passed=True)


def _asset(assets: dg.AssetsDefinition) -> dg.AssetsDefinition:
    specs = [
        dg.AssetSpec(key=s.key, deps=s.deps, group_name=s.group_name, code_version=s.code_version)
        for s in assets.specs
    ]

    @dg.multi_asset(
        specs=specs,
        check_specs=list(assets.check_specs),
        name=assets.node_def.name,
        can_subset=True,
    )
    def _nothing(context: dg.AssetExecutionContext) -> Iterator[Result]:
        for key in context.selected_asset_keys:
            yield dg.MaterializeResult(asset_key=key)
        yield from _passed(sorted(context.selected_asset_check_keys, key=str))

    return _nothing


def _checks(checks: dg.AssetsDefinition) -> dg.AssetChecksDefinition:
    @dg.multi_asset_check(
        specs=list(checks.check_specs), name=checks.node_def.name, can_subset=True
    )
    def _nothing(context: dg.AssetCheckExecutionContext) -> Iterator[dg.AssetCheckResult]:
        yield from _passed(sorted(context.selected_asset_check_keys, key=str))

    return _nothing


def _skeleton() -> dg.Definitions:
    built = project.defs()
    return dg.Definitions(
        assets=[
            _asset(a)
            for a in built.assets or []
            if isinstance(a, dg.AssetsDefinition) and a.is_executable
        ],
        asset_checks=[_checks(c) for c in built.asset_checks or []],
        executor=dg.in_process_executor,
    )


defs = _skeleton()
