"""The optional single-file export (``duckdb_path``) as an asset downstream of every core and
mart table: a failing export fails its step and the run, and changes nothing."""

from collections.abc import Sequence

import dagster as dg

from fieldsales_dagster.names import InstanceNames
from fieldsales_dagster.warehouse.lake import ExportError

EXPORT_ASSET = "duckdb_export"


def build_export_asset(
    names: InstanceNames, owners: list[str], tables: Sequence[dg.AssetKey]
) -> dg.AssetsDefinition:
    @dg.asset(
        key=names.asset_key(EXPORT_ASSET),
        deps=list(tables),
        group_name=names.group("export"),
        kinds={"duckdb"},
        owners=owners,
        pool=names.pool_for(EXPORT_ASSET),
        required_resource_keys={names.warehouse.key},
        automation_condition=dg.AutomationCondition.eager(),
        description=(
            "The single-file export (FIELDSALES_DUCKDB_PATH): one lake snapshot in one DuckDB "
            "file, replaced atomically after the run's writers."
        ),
    )
    def _export(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        try:
            done = names.warehouse.of(context).export()
        except ExportError as exc:
            raise dg.Failure(str(exc)) from None
        assert done is not None  # defined only when an export is set
        path = done["fieldsales/export_path"]
        context.log.info(
            f"Exported snapshot {done['fieldsales/snapshot_id']} of the lake to {path}: "
            f"{done['fieldsales/tables']} tables, {done['fieldsales/bytes'] / 1e6:,.1f} MB in "
            f"{done['fieldsales/seconds']:.2f} s."
        )
        return dg.MaterializeResult(
            metadata={**done, "fieldsales/export_path": dg.MetadataValue.path(path)}
        )

    return _export
