"""A core or mart table is declared once: its query and the YAML beside it (description, key,
what it follows, checks, columns). A new table is two files and no Python; a YAML that cannot be
right fails the load, naming the file and the field."""

from __future__ import annotations

import shutil
from pathlib import Path

import dagster as dg
import duckdb
import pytest

from fieldsales_dagster.assets.checks import build_core_checks, checks_in_asset_step, checks_of
from fieldsales_dagster.assets.columns import PACKAGE_SQL, TableFileError
from fieldsales_dagster.assets.core import build_core_assets
from fieldsales_dagster.assets.lineage import QueryReadError
from fieldsales_dagster.assets.metadata import SCHEMA_CHECK
from fieldsales_dagster.assets.tables import derived_tables
from fieldsales_dagster.warehouse.lake import table_exists
from fieldsales_dagster_tests.conftest import make_api, read_lake
from fieldsales_dagster_tests.project import DEFAULT, OWNERS, raw_assets

NEW_QUERY = """\
-- Events per project and state: a table added as this file and its YAML, without Python.
SELECT project_id, event_state, count(*) AS events
FROM core.events
GROUP BY project_id, event_state
"""

NEW_YAML = """\
# core.project_states: a table added as its query and this file.
description: Events per project and current state.
key: [project_id, event_state]
nullable_key: [event_state]
checks:
  - ids_unique
  - name: events_counted
    description: Every row of {table} counts at least one event.
    severity: error
    sql: |
      SELECT
          count(*) FILTER (WHERE events < 1) = 0 AS passed,
          count(*) AS groups,
          coalesce(list(project_id ORDER BY project_id) FILTER (WHERE events < 1), [])
              AS sample_projects
      FROM core.project_states
columns:
  project_id: The project (core.projects.project_id).
  event_state: The events' current state.
  events: How many events of the project are in it.
"""


def sql_folder(tmp_path: Path) -> Path:
    """A copy of the package's ``sql/``, to add or edit table files in."""
    folder = tmp_path / "sql"
    shutil.copytree(PACKAGE_SQL, folder)
    return folder


def assets_of(folder: Path) -> list:
    tables = derived_tables(folder)
    return [
        *build_core_assets(DEFAULT, OWNERS, None, checks_in_asset_step, tables=tables),
        *build_core_checks(DEFAULT, tables),
    ]


def test_a_new_core_table_is_one_query_and_its_yaml(tmp_path, demo_server, warehouse):
    folder = sql_folder(tmp_path)
    (folder / "core_project_states.sql").write_text(NEW_QUERY)
    (folder / "core_project_states.yaml").write_text(NEW_YAML)
    assets = assets_of(folder)
    (new,) = [a for a in assets if dg.AssetKey("core_project_states") in a.keys]
    (spec,) = new.specs
    assert spec.description == "Events per project and current state."
    assert {d.asset_key.to_user_string() for d in spec.deps} == {"core_events"}
    assert spec.group_name == "core"
    assert [c.name for c in new.check_specs] == ["ids_unique", "events_counted", SCHEMA_CHECK]
    (written,) = [c for c in new.check_specs if c.name == "events_counted"]
    assert written.description == "Every row of core.project_states counts at least one event."

    result = dg.materialize(
        [*raw_assets(), *assets],
        resources={"fieldsales_api": make_api(demo_server, tmp_path), "warehouse": warehouse},
        selection=["raw_events", "core_events", "core_project_states"],
    )

    assert result.success
    (materialization,) = result.asset_materializations_for_node("core_project_states")
    metadata = materialization.metadata
    with read_lake(warehouse) as conn:
        expected = conn.execute(
            "SELECT count(*) FROM (SELECT DISTINCT project_id, event_state FROM core.events)"
        ).fetchone()[0]
        built = conn.execute(
            "SELECT count(*), sum(events), (SELECT count(*) FROM core.events) "
            "FROM core.project_states"
        ).fetchone()
        comment = conn.execute(
            "SELECT comment FROM duckdb_columns() "
            "WHERE table_name = 'project_states' AND column_name = 'events'"
        ).fetchone()[0]
    assert expected > 1 and built == (expected, built[2], built[2])
    assert metadata["dagster/row_count"].value == expected
    assert comment == "How many events of the project are in it."
    lineage = metadata["dagster/column_lineage"].value
    assert [d.asset_key.to_user_string() for d in lineage.deps_by_column["project_id"]] == [
        "core_events"
    ]
    evaluations = {
        e.check_name: e
        for e in result.get_asset_check_evaluations()
        if e.asset_key == dg.AssetKey("core_project_states")
    }
    assert evaluations["ids_unique"].passed
    assert evaluations["ids_unique"].metadata["key"].value == "project_id, event_state"
    assert evaluations["ids_unique"].metadata["duplicated_rows"].value == 0
    # The check written out in the YAML: its query's columns are the result.
    assert evaluations["events_counted"].passed
    assert evaluations["events_counted"].severity == dg.AssetCheckSeverity.ERROR
    assert evaluations["events_counted"].metadata["groups"].value == expected
    assert evaluations["events_counted"].metadata["sample_projects"].value == ""


def _edit(folder: Path, name: str, old: str, new: str) -> None:
    path = folder / name
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def test_an_unknown_check_fails_the_load_naming_the_file_and_the_field(tmp_path):
    folder = sql_folder(tmp_path)
    _edit(folder, "core_areas.yaml", "  - ids_unique\n", "  - ids_unique\n  - ids_uniqe\n")
    with pytest.raises(TableFileError) as failed:
        assets_of(folder)
    message = str(failed.value)
    assert str(folder / "core_areas.yaml") in message
    assert "checks names 'ids_uniqe'" in message and "ids_unique" in message


@pytest.mark.parametrize(
    ("old", "new", "complaint"),
    [
        ("key: [area_id]\n", "", "missing required field `key`"),
        ("key: [area_id]\n", "key: [area_id]\nkeys: [area_id]\n", "unknown field `keys`"),
        ("key: [area_id]\n", "key: [area]\n", "key names area, which columns does not declare"),
        ("  - ids_unique\n", "  - {ids_unique: true}\n", "`$.checks[0]`"),
        (
            "  - ids_unique\n",
            "  - ids_unique\n  - {name: x, description: d, sql: SELECT true AS passed, "
            "severity: fatal}\n",
            "`$.checks[1].severity`",
        ),
        ("  - ids_unique\n", "  - ids_unique\n  - {name: x, sql: SELECT 1}\n", "`description`"),
    ],
)
def test_a_wrong_yaml_fails_the_load_naming_the_file_and_the_field(tmp_path, old, new, complaint):
    folder = sql_folder(tmp_path)
    _edit(folder, "core_areas.yaml", old, new)
    with pytest.raises(TableFileError) as failed:
        derived_tables(folder)
    assert str(folder / "core_areas.yaml") in str(failed.value)
    assert complaint in str(failed.value)


def test_a_written_check_without_a_passed_column_fails_naming_the_file(tmp_path):
    folder = sql_folder(tmp_path)
    _edit(
        folder,
        "core_areas.yaml",
        "  - ids_unique\n",
        "  - ids_unique\n  - {name: counted, description: d, sql: SELECT 1 AS areas}\n",
    )
    (table,) = [t for t in derived_tables(folder) if t.table == "core.areas"]
    (written,) = [c for c in checks_of(table) if c.name == "counted"]
    with pytest.raises(TableFileError, match=r"core_areas\.yaml: the query of check 'counted'"):
        written.kind.evaluate(duckdb.connect(), table, False)


def test_a_check_that_cannot_be_evaluated_fails_its_step_and_its_build_is_not_committed(
    tmp_path, demo_server, warehouse
):
    """The step's checks are evaluated in its build's commit: the table stays as it was."""
    folder = sql_folder(tmp_path)
    written = "  - {name: counted, description: d, sql: SELECT 1 AS areas}\n"
    _edit(folder, "core_areas.yaml", "  - ids_unique\n", f"  - ids_unique\n{written}")
    result = dg.materialize(
        [*raw_assets(), *assets_of(folder)],
        resources={"fieldsales_api": make_api(demo_server, tmp_path), "warehouse": warehouse},
        selection=["raw_events", "core_events", "core_areas"],
        raise_on_error=False,
    )
    (failure,) = [e for e in result.all_events if e.is_step_failure]
    assert failure.step_key == "core_areas"
    assert "core_areas.yaml: the query of check 'counted'" in str(failure.step_failure_data.error)
    with warehouse.get_connection() as conn:
        assert table_exists(conn, "core.events")
        assert not table_exists(conn, "core.areas")


def test_a_written_check_reading_a_table_it_does_not_declare_fails_the_load(tmp_path):
    # Its result is carried while the tables it names are unchanged: one it reads unnamed could
    # change under a carried result, and it could run before that table is built.
    check = "sql: SELECT count(*) > 0 AS passed FROM core.areas JOIN core.events USING (area_id)"

    def areas_with(entry: str, where: Path) -> list:
        folder = sql_folder(where)
        _edit(folder, "core_areas.yaml", "  - ids_unique\n", f"  - ids_unique\n  - {entry}\n")
        (table,) = [t for t in derived_tables(folder) if t.table == "core.areas"]
        return checks_of(table)

    with pytest.raises(TableFileError) as failed:
        areas_with(f"{{name: used, description: d, {check}}}", tmp_path / "undeclared")
    assert str(tmp_path / "undeclared" / "sql" / "core_areas.yaml") in str(failed.value)
    assert "check 'used' reads core.events" in str(failed.value)
    assert "also_reads: [core.events]" in str(failed.value)
    declared = f"{{name: used, description: d, also_reads: [core.events], {check}}}"
    (used,) = [c for c in areas_with(declared, tmp_path / "declared") if c.name == "used"]
    assert used.reads == ["core.areas", "core.events"]


def test_following_an_unknown_decoded_table_fails_the_load(tmp_path):
    folder = sql_folder(tmp_path)
    _edit(folder, "core_transactions.yaml", "decoded: meta.transactions_decoded", "decoded: x.y")
    with pytest.raises(TableFileError, match=r"follows\.decoded is 'x\.y', which is no decoded"):
        derived_tables(folder)


def test_a_query_without_its_yaml_is_refused(tmp_path):
    folder = sql_folder(tmp_path)
    (folder / "mart_new.sql").write_text("SELECT 1 AS one")
    with pytest.raises(TableFileError, match=r"mart_new\.sql has no mart_new\.yaml beside it"):
        derived_tables(folder)


def _declare(folder: Path, asset: str, query: str) -> None:
    (folder / f"{asset}.sql").write_text(query)
    (folder / f"{asset}.yaml").write_text(
        "description: A table.\nkey: [id]\nchecks: [ids_unique]\ncolumns:\n  id: Its id.\n"
    )


def test_tables_come_parents_first_and_a_cycle_is_refused(tmp_path):
    # Parents first: a loop building them one by one (benchmarks, tests) never reads a table
    # before it is built.
    order = [t.asset_name for t in derived_tables()]
    for table in derived_tables():
        assert all(
            order.index(dep) < order.index(table.asset_name) for dep in table.deps if dep in order
        )
    folder = sql_folder(tmp_path)
    _declare(folder, "core_a", "SELECT id FROM core.b")
    _declare(folder, "core_b", "SELECT id FROM core.a")
    with pytest.raises(QueryReadError, match=r"sql/core_a\.sql, sql/core_b\.sql read each other"):
        derived_tables(folder)


def test_the_package_declares_every_table_of_the_spec():
    # Found from sql/, not listed in Python: the tables SPEC.md promises, each with its checks
    # (a table added is its two files, and no more).
    assert {t.table: t.checks for t in derived_tables()}.items() >= {
        "core.areas": ("ids_unique",),
        "core.custom_report_field_types": ("ids_unique", "field_types_known"),
        "core.custom_report_fields": ("ids_unique",),
        "core.custom_report_results": (
            "ids_unique",
            "values_typed",
            "values_finite",
            "slider_values_valid",
            "field_types_resolved",
        ),
        "core.dim_point_of_sale": (
            "ids_unique",
            "values_typed",
            "values_finite",
            "coordinates_in_range",
        ),
        "core.dim_point_of_sale_history": ("ids_unique",),
        "core.event_state_durations": ("ids_unique",),
        "core.event_status_history": ("ids_unique", "event_states_known"),
        "core.events": ("ids_unique", "values_typed", "values_finite"),
        "core.projects": ("ids_unique",),
        "core.transactions": ("ids_unique", "values_typed", "values_finite", "event_ids_known"),
        "core.users": ("ids_unique",),
        "mart.daily_sales": ("ids_unique", "daily_sales_match_transactions"),
        "mart.event_summary": ("ids_unique", "event_summary_matches_events"),
        "mart.user_activity": ("ids_unique", "user_activity_matches_status_changes"),
    }.items()
