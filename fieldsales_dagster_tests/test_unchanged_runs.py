"""A run in which nothing changed writes nothing: raw tables the server lists as stored are kept,
and a core or mart table whose inputs, code and settings are as at its last build is not built
again (``fieldsales/build: unchanged``). Any change is built."""

import dagster as dg

from fieldsales_dagster.assets import metadata as metadata_module
from fieldsales_dagster.assets.columns import TableDoc
from fieldsales_dagster.warehouse import lake as lake_module
from fieldsales_dagster.warehouse.lake import table_exists
from fieldsales_dagster_tests.conftest import attach_again, make_api, make_warehouse
from fieldsales_dagster_tests.project import (
    core_assets,
    mart_assets,
    materialize,
    raw_assets,
)
from fieldsales_dagster_tests.test_ducklake import assert_lakes_equal

ASSETS = [*raw_assets(), *core_assets(), *mart_assets()]
DERIVED = {asset.key.to_user_string() for asset in [*core_assets(), *mart_assets()]}
SCHEMA = "column_schema_change"


def _run(server, tmp_path, warehouse, assets=ASSETS, **kwargs) -> dict[str, dict]:
    """Every asset (or ``selection``) once; each materialization's metadata by asset."""
    resources = {"fieldsales_api": make_api(server, tmp_path), "warehouse": warehouse}
    result = materialize(assets, resources=resources, **kwargs)
    assert result.success
    found = (event.materialization for event in result.get_asset_materialization_events())
    return {
        m.asset_key.to_user_string(): {k: v.value for k, v in m.metadata.items()} for m in found
    }


def _builds(metadata: dict[str, dict]) -> dict[str, str]:
    return {
        asset: str(found.get("fieldsales/build", "built")).partition(":")[0]
        for asset, found in metadata.items()
        if asset in DERIVED
    }


def _tables(warehouse) -> dict[str, list]:
    with warehouse.get_connection() as conn:
        names = [
            f"{schema}.{name}"
            for schema, name in conn.execute(
                "SELECT schema_name, table_name FROM duckdb_tables() WHERE database_name = "
                "current_database() AND schema_name IN ('raw', 'core', 'mart')"
            ).fetchall()
        ]
        return {name: sorted(map(str, conn.execute(f"FROM {name}").fetchall())) for name in names}


def test_a_run_with_nothing_changed_keeps_every_table_and_says_why(
    demo_server, tmp_path, warehouse
):
    _run(demo_server, tmp_path, warehouse)
    before = _tables(warehouse)
    again = _run(demo_server, tmp_path, warehouse)
    assert set(_builds(again).values()) == {"unchanged"}, {
        a: again[a].get("fieldsales/build") for a in DERIVED
    }
    assert "raw.events" in again["core_events"]["fieldsales/build"]
    assert [again[name]["table_written"] for name in ("raw_events", "raw_event_groups")] == [0, 0]
    # The refresh by event still ran (the event list was checked this run), writing nothing.
    transactions = again["raw_transactions"]
    assert transactions["refresh_mode"] == "incremental"
    assert transactions["table_written"] == 0
    assert _tables(warehouse) == before  # loaded_at too: nothing was written


def test_an_unchanged_table_reports_its_last_materializations_description(
    demo_server, tmp_path, warehouse, monkeypatch
):
    """Row count, column schema and preview of a table no commit wrote since its last
    materialization are that materialization's, not read from the table again."""
    instance = dg.DagsterInstance.ephemeral()
    first = _run(demo_server, tmp_path, warehouse, instance=instance)
    described: list[str] = []
    monkeypatch.setattr(
        metadata_module, "column_schema", lambda conn, table, *a: described.append(table)
    )
    again = _run(demo_server, tmp_path, warehouse, instance=instance)
    assert described == [], "described again though unchanged"
    for asset, found in again.items():
        for key in ("dagster/row_count", "dagster/column_schema", "preview"):
            assert found.get(key) == first[asset].get(key), (asset, key)


def test_a_table_written_since_its_last_materialization_is_described_again(
    demo_server, tmp_path, warehouse
):
    instance = dg.DagsterInstance.ephemeral()
    first = _run(demo_server, tmp_path, warehouse, instance=instance)
    with warehouse.get_connection() as conn:  # a writer outside the project's builds
        conn.execute(
            "DELETE FROM core.users WHERE user_id IN (SELECT min(user_id) FROM core.users)"
        )
    again = _run(demo_server, tmp_path, warehouse, instance=instance)
    assert again["core_users"]["fieldsales/build"].startswith("unchanged")
    assert again["core_users"]["dagster/row_count"] == first["core_users"]["dagster/row_count"] - 1


def test_a_description_is_carried_only_from_the_same_snapshot_of_the_same_lake(tmp_path, warehouse):
    """A materialization's snapshot id may be another lake's (the lake made again, its Dagster
    instance kept): the snapshot's commit time tells them apart."""

    def described(lake, rows: int, last=None) -> dict:
        with lake.get_connection() as conn:
            conn.execute(
                f"CREATE SCHEMA IF NOT EXISTS mine; CREATE OR REPLACE TABLE mine.t AS "
                f"SELECT * FROM range({rows})"
            )
            found = metadata_module.table_metadata(conn, lake, "mine.t", TableDoc(()), last=last)
        # As a materialization stores it.
        return {
            key: dg.MetadataValue.text(v) if isinstance(v, str) else v for key, v in found.items()
        }

    first = described(warehouse, 1)
    # The same commits on another lake: the same snapshot ids, another table.
    elsewhere = described(make_warehouse(tmp_path, "again"), 2, last=first)
    assert elsewhere["dagster/row_count"] == 2


def test_a_changed_input_is_built_again_and_equals_a_first_build(demo_server, tmp_path, warehouse):
    _run(demo_server, tmp_path, warehouse)
    demo_server.behaviour.evolve(1)  # events changed, added and deleted; transactions too
    changed = _run(demo_server, tmp_path, warehouse)
    assert changed["raw_events"]["table_written"] == 1
    built = _builds(changed)
    assert built["core_events"] != "unchanged"
    assert built["mart_daily_sales"] != "unchanged"
    with warehouse.get_connection() as conn:  # one record of each table's last build, not one a run
        records = "count(DISTINCT (table_name, check_name)), count(DISTINCT table_name)"
        rows, kinds, tables = conn.execute(
            f"SELECT count(*), {records} FROM meta.lake_builds"
        ).fetchone()
    assert rows == kinds and tables > len(DERIVED)
    fresh = make_warehouse(tmp_path, "fresh")
    _run(demo_server, tmp_path, fresh)
    assert_lakes_equal(warehouse, fresh)


def test_tables_whose_build_did_not_follow_a_change_are_built_by_the_next_run(
    demo_server, tmp_path, warehouse
):
    """A run that refreshed the raw tables but not what reads them (deselected, or failed):
    the next run finds nothing new on the server, and builds them anyway."""
    _run(demo_server, tmp_path, warehouse)
    demo_server.behaviour.evolve(1)
    _run(demo_server, tmp_path, warehouse, selection=["raw_events", "raw_transactions"])
    after = _builds(_run(demo_server, tmp_path, warehouse))
    assert after["core_events"] != "unchanged"
    assert after["core_transactions"] != "unchanged"


def test_a_change_whose_snapshot_was_expired_still_builds_what_reads_it(
    demo_server, tmp_path, warehouse
):
    _run(demo_server, tmp_path, warehouse)
    demo_server.behaviour.evolve(1)
    _run(demo_server, tmp_path, warehouse, selection=["raw_events"])
    _run(demo_server, tmp_path, warehouse, selection=["raw_event_groups"])  # a later commit
    with warehouse.get_connection() as conn:  # the lake's upkeep, past every snapshot but one
        conn.execute("CALL ducklake_expire_snapshots('fieldsales', older_than => now())")
    after = _builds(_run(demo_server, tmp_path, warehouse))
    assert after["core_events"] != "unchanged"


def test_a_setting_that_changes_the_tables_builds_them_again(demo_server, tmp_path, warehouse):
    _run(demo_server, tmp_path, warehouse)
    dropped = make_warehouse(tmp_path, pii="drop")  # the same lake
    after = _run(demo_server, tmp_path, dropped)
    assert _builds(after)["core_users"] != "unchanged"
    with dropped.get_connection() as conn:
        assert conn.execute("SELECT count(email) FROM core.users").fetchone() == (0,)


def test_a_lake_of_an_earlier_release_builds_its_tables_once_then_keeps_them(
    demo_server, tmp_path, warehouse
):
    """Its builds were recorded without their fingerprints, which a table of their own held."""
    _run(demo_server, tmp_path, warehouse)
    with warehouse.get_connection() as conn:
        conn.execute("ALTER TABLE meta.lake_builds DROP COLUMN fingerprint")
        conn.execute(
            "CREATE TABLE meta.build_fingerprints "
            "(table_name VARCHAR, fingerprint VARCHAR, read_snapshot BIGINT)"
        )
    attach_again(warehouse)
    assert "unchanged" not in _builds(_run(demo_server, tmp_path, warehouse)).values()
    assert set(_builds(_run(demo_server, tmp_path, warehouse)).values()) == {"unchanged"}
    with warehouse.get_connection() as conn:  # one record per table: its build and fingerprint
        records = "SELECT table_name FROM meta.lake_builds WHERE fingerprint IS NOT NULL"
        built = [name for (name,) in conn.execute(f"{records} AND check_name IS NULL").fetchall()]
        assert len(built) == len(set(built))  # the decode's refresh is recorded as a build is
        assert {name.replace(".", "_") for name in built} == DERIVED | {"meta_transactions_decoded"}
        assert not table_exists(conn, "meta.build_fingerprints")


def test_the_steps_of_an_unchanged_run_share_one_read_of_the_build_records(
    demo_server, tmp_path, warehouse, monkeypatch
):
    """Read again only after a commit: the raw steps may record a list check between them."""
    _run(demo_server, tmp_path, warehouse)
    reads: list[str] = []

    class Counted(dict):
        def __setitem__(self, key, value) -> None:
            reads.append(key[1])
            super().__setitem__(key, value)

    monkeypatch.setattr(lake_module, "_READ_AT", Counted())
    again = _run(demo_server, tmp_path, warehouse)
    assert set(_builds(again).values()) == {"unchanged"}
    assert 1 <= reads.count(lake_module.BUILDS_TABLE) <= 3 < len(DERIVED), reads
    assert 1 <= reads.count("changes") <= 3, reads


def _statements(warehouse, run) -> list[str]:
    """The statements the process's lake instance ran during ``run()`` (DuckDB's query log)."""
    with warehouse.get_connection() as conn:
        conn.execute("CALL truncate_duckdb_logs(); CALL enable_logging('QueryLog')")
        try:
            run()
        finally:
            logged = conn.execute("SELECT message FROM duckdb_logs WHERE type = 'QueryLog'")
            statements = [message for (message,) in logged.fetchall()]
            conn.execute("CALL disable_logging(); CALL truncate_duckdb_logs()")
    return statements


def test_a_process_upgrades_the_lakes_meta_tables_as_it_attaches_it_not_in_its_runs(
    demo_server, tmp_path, warehouse, monkeypatch
):
    """An earlier release's tables are looked for, and its records' columns added, as a writer
    attaches the lake, before anything reads a record: not in each run, nor at each commit."""
    _run(demo_server, tmp_path, warehouse)
    demo_server.behaviour.evolve(1)
    statements = _statements(warehouse, lambda: _run(demo_server, tmp_path, warehouse))
    upgrades = [s for s in statements if "ADD COLUMN IF NOT EXISTS" in s]
    drops = [s for s in statements if "DROP TABLE IF EXISTS meta.list_checks" in s]
    assert statements.count("COMMIT") > len(DERIVED)
    assert (upgrades, drops) == ([], [])
    attached: list[object] = []
    upgrade = lake_module.upgrade
    monkeypatch.setattr(
        lake_module, "upgrade", lambda conn, lake: [attached.append(conn), upgrade(conn, lake)]
    )
    attach_again(warehouse)
    _run(demo_server, tmp_path, warehouse)
    assert len(attached) == 1


def test_a_run_reads_its_assets_last_materializations_in_one_query(
    demo_server, tmp_path, warehouse, monkeypatch
):
    """Each asset's last metadata (what an unchanged table reports again): one read of the event
    log for the run, not one per step (the schema-change checks read two of each, apart)."""
    instance = dg.DagsterInstance.ephemeral()
    _run(demo_server, tmp_path, warehouse, instance=instance)
    reads: list[object] = []
    for method in ("fetch_materializations", "get_latest_materialization_events"):
        counted = getattr(instance, method)

        def count(*args, counted=counted, **kwargs):
            if kwargs.get("limit") != 2:
                reads.append(args[0])
            return counted(*args, **kwargs)

        monkeypatch.setattr(instance, method, count)
    again = _run(demo_server, tmp_path, warehouse, instance=instance)
    assert len(reads) == 1, reads
    assert all("dagster/row_count" in found for found in again.values())


def _event_log_reads(instance: dg.DagsterInstance, monkeypatch) -> list[str]:
    """The names of the reads of the materializations in ``instance``'s event log, as they come."""
    reads: list[str] = []
    for method in ("fetch_materializations", "get_latest_materialization_events"):
        counted = getattr(instance, method)

        def count(*args, counted=counted, method=method, **kwargs):
            reads.append(method)
            return counted(*args, **kwargs)

        monkeypatch.setattr(instance, method, count)
    return reads


def test_each_assets_schema_check_runs_in_its_step_on_the_one_read_of_the_last_materializations(
    demo_server, tmp_path, warehouse, monkeypatch
):
    """Each table asset compares its columns in its own step with its last materialization
    before the run (``last_metadata``'s one read for every asset): no step of the checks' own, no
    read of the event log per asset."""
    instance = dg.DagsterInstance.ephemeral()
    _run(demo_server, tmp_path, warehouse, instance=instance)
    reads = _event_log_reads(instance, monkeypatch)
    result = materialize(
        ASSETS,
        resources={"fieldsales_api": make_api(demo_server, tmp_path), "warehouse": warehouse},
        instance=instance,
    )
    assert reads == ["get_latest_materialization_events"]
    evaluations = [e for e in result.get_asset_check_evaluations() if e.check_name == SCHEMA]
    assert len(evaluations) == len(ASSETS)
    assert {e.description for e in evaluations} == {
        "The columns are those of the previous materialization."
    }


def test_a_run_of_the_schema_change_checks_alone_reads_each_assets_last_two_only(
    demo_server, tmp_path, warehouse, monkeypatch
):
    """A run of the checks alone (no materialization before them in the run) compares each
    asset's last two materializations, one read each."""
    derived = [*core_assets(), *mart_assets()]
    instance = dg.DagsterInstance.ephemeral()
    for _ in range(2):
        _run(demo_server, tmp_path, warehouse, instance=instance)
    reads = _event_log_reads(instance, monkeypatch)
    result = materialize(
        ASSETS,
        selection=dg.AssetSelection.checks(*(dg.AssetCheckKey(a.key, SCHEMA) for a in derived)),
        resources={"fieldsales_api": make_api(demo_server, tmp_path), "warehouse": warehouse},
        instance=instance,
    )
    assert result.get_asset_materialization_events() == []
    assert reads == ["fetch_materializations"] * len(derived), reads
    evaluations = [e for e in result.get_asset_check_evaluations() if e.check_name == SCHEMA]
    assert len(evaluations) == len(derived)
    assert {e.description for e in evaluations} == {
        "The columns are those of the previous materialization."
    }


def test_an_unchanged_step_reads_the_lake_at_one_snapshot_and_judges_no_commit(
    demo_server, tmp_path, warehouse
):
    """Its queries run in one transaction (outside one, each reads the lake's catalog first),
    whose commit makes no snapshot and so is not judged complete or not (``_mark_refresh``)."""

    def last_snapshot() -> int:
        with warehouse.get_connection() as conn:
            return conn.execute("SELECT id FROM current_snapshot()").fetchone()[0]

    _run(demo_server, tmp_path, warehouse)
    before = last_snapshot()
    statements = _statements(warehouse, lambda: _run(demo_server, tmp_path, warehouse))
    outside, open_ = [], False
    for statement in statements:
        if statement.startswith(("BEGIN", "COMMIT", "ROLLBACK")):
            open_ = statement.startswith("BEGIN")
        elif not open_ and "current_snapshot()" in statement:
            outside.append(statement)
    assert len(outside) < len(DERIVED), outside
    judged = [s for s in statements if "set_commit_message" in s]
    assert len(judged) == last_snapshot() - before, judged
