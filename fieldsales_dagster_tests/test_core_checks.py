"""Asset checks on the core tables fail, with the offending rows named, on bad data."""

from __future__ import annotations

import json

import dagster as dg
import duckdb
import pytest

from fieldsales_dagster.assets import checks, metadata
from fieldsales_dagster.assets.build import code_digest
from fieldsales_dagster.assets.tables import derived_tables
from fieldsales_dagster.warehouse.lake import run_transaction, table_exists
from fieldsales_dagster_tests import core_payloads as p
from fieldsales_dagster_tests.conftest import attach_again, lake_at
from fieldsales_dagster_tests.project import core_check_count

SLIDER = p.field("f-slider", "Slider", minimum=0, maximum=10, step=1)
CONFIG = p.config("cfg-1", [SLIDER])


def evaluations(result: dg.ExecuteInProcessResult) -> dict[tuple[str, str], object]:
    return {
        (e.asset_key.to_user_string(), e.check_name): e
        for e in result.get_asset_check_evaluations()
    }


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    path = tmp_path_factory.mktemp("clean") / "t.duckdb"
    transactions = [
        p.transaction("t-1", report_config=CONFIG, report_results=p.results(**{"f-slider": 3}))
    ]
    events = [p.event("e1", history=[p.history_entry("h-1", "", "Planned", p.T0)])]
    return evaluations(
        p.materialize_core(path, transactions=transactions, events=events, with_checks=True)
    )


@pytest.fixture(scope="module")
def bad(tmp_path_factory):
    path = tmp_path_factory.mktemp("bad") / "t.duckdb"
    transactions = [
        p.transaction("t-orphan", event_id="e-never-paged"),
        p.transaction("t-high", report_config=CONFIG, report_results=p.results(**{"f-slider": 11})),
        p.transaction(
            "t-half", report_config=CONFIG, report_results=p.results(**{"f-slider": 2.5})
        ),
    ]
    events = [
        p.event(
            "e1",
            pos=p.point_of_sale("pos-swapped", location=[200.0, 95.0]),
            report_results=[p.event_report("r-1", "e1", {"f-unknown": 1})],
        )
    ]
    result = p.materialize_core(
        path, transactions=transactions, events=events, with_checks=True, raise_on_error=False
    )
    return evaluations(result)


@pytest.fixture(scope="module")
def duplicated(tmp_path_factory):
    path = tmp_path_factory.mktemp("duplicated") / "t.duckdb"
    same = p.transaction("t-dup", report_config=CONFIG, report_results=p.results(**{"f-slider": 3}))
    return p.materialize_core(
        path,
        transactions=[same, same],
        events=[p.event("e1")],
        with_checks=True,
        raise_on_error=False,
    )


def test_every_check_passes_on_clean_data(clean):
    failed = [key for key, evaluation in clean.items() if not evaluation.passed]
    assert failed == []
    assert len(clean) == core_check_count() + len(derived_tables())  # and each column_schema_change


def test_duplicate_transaction_ids_fail_the_blocking_uniqueness_check(duplicated):
    evaluation = evaluations(duplicated)[("core_transactions", "ids_unique")]
    assert not evaluation.passed
    assert evaluation.severity == dg.AssetCheckSeverity.ERROR
    assert evaluation.blocking
    assert evaluation.metadata["duplicated_rows"].value == 2
    assert evaluation.metadata["offending_keys"].value == "t-dup"


def test_failed_blocking_check_keeps_downstream_tables_from_building(duplicated):
    built = {m.asset_key.to_user_string() for m in duplicated.get_asset_materialization_events()}
    assert "core_transactions" in built
    assert "core_custom_report_fields" not in built
    assert "core_events" in built


def test_coordinates_out_of_range_fail_the_check(bad):
    evaluation = bad[("core_dim_point_of_sale", "coordinates_in_range")]
    assert not evaluation.passed
    assert evaluation.severity == dg.AssetCheckSeverity.ERROR
    assert evaluation.metadata["sample_pos_ids"].value == "pos-swapped"


def test_transaction_of_an_unknown_event_warns(bad):
    evaluation = bad[("core_transactions", "event_ids_known")]
    assert not evaluation.passed
    assert evaluation.severity == dg.AssetCheckSeverity.WARN
    assert evaluation.metadata["transactions_with_unknown_event"].value == 1
    assert evaluation.metadata["sample_transaction_ids"].value == "t-orphan"


def test_slider_values_out_of_range_or_off_step_warn_with_their_ids(bad):
    evaluation = bad[("core_custom_report_results", "slider_values_valid")]
    assert not evaluation.passed
    assert evaluation.severity == dg.AssetCheckSeverity.WARN
    assert evaluation.metadata["out_of_range"].value == 1
    assert evaluation.metadata["off_step"].value == 1
    sample = evaluation.metadata["sample_results"].value
    assert "t-high / f-slider = 11" in sample and "t-half / f-slider = 2.5" in sample


def test_unresolved_results_are_counted(bad):
    evaluation = bad[("core_custom_report_results", "field_types_resolved")]
    assert not evaluation.passed
    assert evaluation.severity == dg.AssetCheckSeverity.WARN
    assert evaluation.metadata["unresolved"].value == 1
    assert evaluation.metadata["unresolved_by_source"].value == "event: 1"


@pytest.fixture(scope="module")
def many_report_results(tmp_path_factory):
    """A core.custom_report_results of 5.5M keys (1M transactions' worth), two of them shared."""
    path = tmp_path_factory.mktemp("many") / "t.duckdb"
    with duckdb.connect(str(path)) as conn:
        conn.execute("CREATE SCHEMA core")
        conn.execute(
            "CREATE TABLE core.custom_report_results AS SELECT 'transaction' AS source, "
            "'tx-' || (range // 5) AS report_id, 'field-' || (range % 5) AS field_id "
            "FROM range(5500000) UNION ALL SELECT 'transaction', 'tx-7', 'field-2'"
        )
    return path


def test_uniqueness_check_of_millions_of_keys_fits_a_small_memory_limit(many_report_results):
    # The screen grouped every key at once: 5.5M groups needed more than 32MB (DuckDB: "Out of
    # Memory Error: failed to pin block"), and after a nightly update of the table at 1M
    # transactions more than the 192MB memory_limit had left. In buckets it fits, and still finds
    # the one duplicate (equal keys fall in the same bucket) and names it.
    (table,) = [t for t in derived_tables() if t.table == "core.custom_report_results"]
    config = {"memory_limit": "32MB", "threads": 2, "preserve_insertion_order": False}
    with duckdb.connect(str(many_report_results), config=config) as conn:
        result = checks.ids_unique(conn, table, False)["ids_unique"]
    assert not result.passed
    assert result.metadata["duplicated_rows"].value == 2
    assert result.metadata["offending_keys"].value == "transaction / tx-7 / field-2"


def test_column_schema_change_is_evaluated_in_the_materializing_step_and_says_what_changed():
    """As every table asset does (raw.py, core.py): its columns against the metadata of its last
    materialization before the run (``last_metadata``), with no step of its own."""
    columns = [dg.TableColumn("id", "BIGINT"), dg.TableColumn("name", "VARCHAR")]
    key = dg.AssetKey("table")

    @dg.asset(key=key, check_specs=[metadata.schema_change_spec(key)])
    def table(context) -> dg.MaterializeResult:  # (annotated, a string: Dagster refuses it)
        now = {"dagster/column_schema": dg.TableSchema(columns=list(columns))}
        compared = [now, metadata.last_metadata(context, key)]
        return dg.MaterializeResult(
            metadata=now, check_results=[metadata.schema_change(key, compared)]
        )

    with dg.DagsterInstance.ephemeral() as instance:

        def evaluate():
            result = dg.materialize([table], instance=instance)
            (evaluation,) = result.get_asset_check_evaluations()
            return evaluation

        assert evaluate().passed  # the first materialization: nothing to compare with
        assert evaluate().passed  # the same columns
        columns[1] = dg.TableColumn("name", "INTEGER")
        columns.append(dg.TableColumn("added", "DATE"))
        changed = evaluate()
    assert not changed.passed
    assert changed.severity == dg.AssetCheckSeverity.WARN
    assert changed.description == (
        "Column schema changed since the previous materialization: added: added; "
        "name: VARCHAR -> INTEGER"
    )


def test_a_check_reports_its_last_result_while_nothing_it_reads_changed_and_runs_when_one_did(
    tmp_path,
):
    database = tmp_path / "t.duckdb"
    orphan = [p.transaction("t-orphan", event_id="e-later")]
    first = evaluations(
        p.materialize_core(database, transactions=orphan, events=[p.event("e1")], with_checks=True)
    )
    again = evaluations(p.materialize_core_only(database, with_checks=True))
    unique, known = ("core_transactions", "ids_unique"), ("core_transactions", "event_ids_known")
    metadata = dict(again[unique].metadata)
    carried = metadata.pop("fieldsales/check").value
    # Evaluated in its table's build commit: it holds while what the build read does.
    assert carried.startswith("carried: raw.transactions unchanged since snapshot ")
    assert (again[unique].passed, metadata) == (True, first[unique].metadata)
    assert (again[known].passed, again[known].severity) == (False, dg.AssetCheckSeverity.WARN)
    assert (
        "carried: core.transactions, core.events" in again[known].metadata["fieldsales/check"].value
    )
    # The event turns up: core.events changes, which the cross-table check reads beside its own.
    with lake_at(database).get_connection() as conn:
        event = json.dumps(p.event("e-later"))
        insert = "INSERT INTO raw.events VALUES ('e-later', ?, now()::TIMESTAMP)"
        run_transaction(conn, "raw.events", lambda: conn.execute(insert, [event]))
    after = evaluations(p.materialize_core_only(database, with_checks=True))
    assert after[known].passed
    assert "fieldsales/check" not in after[known].metadata
    assert after[unique].metadata["fieldsales/check"].value.startswith("carried: ")


def test_a_lake_of_an_earlier_release_evaluates_its_checks_once_then_carries_them(tmp_path):
    """Its check results had a table of their own, ``meta.check_evaluations``, which no check
    trusts (this one says, falsely, that every transaction's event is known); its build records
    have no check_name or result."""
    database = tmp_path / "t.duckdb"
    orphan = [p.transaction("t-orphan", event_id="e-later")]
    p.materialize_core(database, transactions=orphan, events=[p.event("e1")], with_checks=True)
    (known,) = [c for c in checks.core_checks() if c.name == "event_ids_known"]
    with lake_at(database).get_connection() as conn:
        conn.execute(
            "CREATE OR REPLACE TABLE meta.lake_builds AS SELECT table_name, reads, read_snapshot, "
            "fingerprint FROM (FROM meta.lake_builds UNION ALL BY NAME "
            "SELECT NULL::VARCHAR AS check_name WHERE false) WHERE check_name IS NULL"
        )
        conn.execute(
            "CREATE OR REPLACE TABLE meta.check_evaluations AS SELECT 'core.transactions' AS "
            "table_name, 'event_ids_known' AS check_name, ? AS fingerprint, id AS evaluated_at, "
            "true AS passed, 'WARN' AS severity, '{}' AS metadata FROM current_snapshot()",
            [code_digest(known.table.folder)],  # as that release fingerprinted a check
        )
    attach_again(lake_at(database))
    key = ("core_transactions", "event_ids_known")
    evaluated = evaluations(p.materialize_core_only(database, with_checks=True))[key]
    assert (evaluated.passed, "fieldsales/check" in evaluated.metadata) == (False, False)
    carried = evaluations(p.materialize_core_only(database, with_checks=True))[key]
    assert not carried.passed
    assert carried.metadata["fieldsales/check"].value.startswith("carried: core.transactions")
    with lake_at(database).get_connection() as conn:
        assert not table_exists(conn, "meta.check_evaluations")


def test_a_check_run_alone_before_its_tables_build_is_evaluated_again_in_that_build(tmp_path):
    """Run alone after an input changed, it judges the table as it was; the build that follows
    evaluates it again in its commit, whatever the record of that lone evaluation says."""
    database = tmp_path / "t.duckdb"
    same = p.transaction("t-1", report_config=CONFIG, report_results=p.results(**{"f-slider": 3}))
    p.materialize_core(database, transactions=[same], events=[p.event("e1")], with_checks=True)
    with lake_at(database).get_connection() as conn:  # the id twice: no longer unique
        insert = (
            "INSERT INTO raw.transactions SELECT id, event_id, payload, now() FROM raw.transactions"
        )
        run_transaction(conn, "raw.transactions", lambda: conn.execute(insert))
    key = ("core_transactions", "ids_unique")
    alone = dg.materialize(
        [*p.RAW_STAND_INS, *p.core_assets(True)],
        resources={"warehouse": lake_at(database, threads=2)},
        selection=dg.AssetSelection.checks(dg.AssetCheckKey(dg.AssetKey(key[0]), key[1])),
    )
    assert evaluations(alone)[key].passed  # the table as it was built
    built = evaluations(p.materialize_core_only(database, with_checks=True, raise_on_error=False))
    assert not built[key].passed
    assert "fieldsales/check" not in built[key].metadata


def test_after_an_incremental_follow_uniqueness_is_checked_over_the_inserted_keys(tmp_path):
    """Where it passed at the last build, a duplicate can only involve a row the follow inserted:
    the check reads the rows sharing their keys, and still finds it; after it failed, it reads
    every row again."""
    database = tmp_path / "t.duckdb"
    transactions = [p.transaction(f"t-{i}") for i in range(10)]
    p.materialize_core(
        database, transactions=transactions, events=[p.event("e1")], with_checks=True
    )
    key = ("core_transactions", "ids_unique")

    def load_again(*ids: str) -> dg.ExecuteInProcessResult:
        with lake_at(database).get_connection() as conn:  # one new load of each, here t-3 twice
            load = "SELECT id, event_id, payload, now() FROM raw.transactions WHERE id = ?"
            insert = f"INSERT INTO raw.transactions {' UNION ALL '.join([load] * len(ids))}"
            run_transaction(conn, "raw.transactions", lambda: conn.execute(insert, list(ids)))
        return p.materialize_core_only(database, with_checks=True, raise_on_error=False)

    def build_and_check(result: dg.ExecuteInProcessResult) -> tuple[str, object]:
        (built,) = [
            m.materialization.metadata["fieldsales/build"].value
            for m in result.get_asset_materialization_events()
            if m.asset_key.to_user_string() == key[0]
        ]
        return built.partition(":")[0], evaluations(result)[key]

    built, narrowed = build_and_check(load_again("t-3", "t-3"))
    assert built == "incremental"
    assert narrowed.metadata["fieldsales/check"].value.startswith(
        "over the keys of the rows the follow inserted: it passed at the build that read snapshot "
    )
    assert not narrowed.passed
    assert narrowed.metadata["duplicated_rows"].value == 2
    assert narrowed.metadata["rows_with_null_key"].value == 0
    assert narrowed.metadata["offending_keys"].value == "t-3"
    built, whole = build_and_check(load_again("t-5"))
    assert built == "incremental"
    assert "fieldsales/check" not in whole.metadata  # it failed last: every row read again
    assert not whole.passed
    assert whole.metadata["offending_keys"].value == "t-3"


def test_uniqueness_reads_every_row_where_a_commit_wrote_the_table_since_it_passed(tmp_path):
    """A writer outside the builds duplicated a key the next follow does not insert: it is found."""
    database = tmp_path / "t.duckdb"
    transactions = [p.transaction(f"t-{i}") for i in range(10)]
    p.materialize_core(
        database, transactions=transactions, events=[p.event("e1")], with_checks=True
    )
    with lake_at(database).get_connection() as conn:
        duplicate = "INSERT INTO core.transactions FROM core.transactions WHERE transaction_id = ?"
        run_transaction(conn, "core.transactions", lambda: conn.execute(duplicate, ["t-2"]))
        load = "SELECT id, event_id, payload, now() FROM raw.transactions WHERE id = 't-5'"
        run_transaction(
            conn, "raw.transactions", lambda: conn.execute(f"INSERT INTO raw.transactions {load}")
        )
    result = p.materialize_core_only(database, with_checks=True, raise_on_error=False)
    (built,) = [
        m.materialization.metadata["fieldsales/build"].value
        for m in result.get_asset_materialization_events()
        if m.asset_key.to_user_string() == "core_transactions"
    ]
    assert built.startswith("incremental"), built
    found = evaluations(result)["core_transactions", "ids_unique"]
    assert "fieldsales/check" not in found.metadata, found.metadata  # every row read
    assert found.metadata["offending_keys"].value == "t-2"
