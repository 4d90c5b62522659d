"""Core tables follow their raw parents: a refreshed raw table requests the core tables it feeds."""

import dagster as dg

from fieldsales_dagster_tests.conftest import make_api
from fieldsales_dagster_tests.project import core_assets, load_project_defs, materialize, raw_assets


def test_automation_sensor_is_on_by_default_and_targets_every_asset(demo_env):
    defs = load_project_defs()
    sensor = defs.get_sensor_def("core_automation_sensor")
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING
    repository = defs.get_repository_def()
    targeted = sensor.asset_selection.resolve(repository.asset_graph)
    # Every table; the lake's upkeep has a schedule of its own.
    upkeep = {dg.AssetKey("ducklake_upkeep")}
    assert targeted == set(repository.asset_graph.get_all_asset_keys()) - upkeep


def test_refreshed_raw_transactions_request_the_core_tables_that_read_them(
    demo_server, tmp_path, warehouse
):
    assets = [*raw_assets(), *core_assets()]
    resources = {"fieldsales_api": make_api(demo_server, tmp_path), "warehouse": warehouse}
    defs = dg.Definitions(assets=assets, resources=resources)
    with dg.instance_for_test() as instance:
        # Everything built once: nothing is due.
        assert materialize(assets, resources=resources, instance=instance).success
        first = dg.evaluate_automation_conditions(defs=defs, instance=instance)
        assert first.total_requested == 0

        # A manual refresh of raw transactions alone.
        selection = ["raw_transactions"]
        assert materialize(
            assets, resources=resources, instance=instance, selection=selection
        ).success
        second = dg.evaluate_automation_conditions(
            defs=defs, instance=instance, cursor=first.cursor
        )
        assert second.get_num_requested(dg.AssetKey("core_transactions")) == 1
        assert second.get_num_requested(dg.AssetKey("core_custom_report_results")) == 1
        assert second.get_num_requested(dg.AssetKey("core_events")) == 0  # reads raw_events
        # No step of its own follows the tables: what a run commits, analysts read.
        requested = {r.key for r in second.results if r.true_subset.size}
        assert not [key for key in requested if isinstance(key, dg.AssetCheckKey)]
