"""Core and mart assets depend on the tables their queries read, read from the SQL itself; and
every asset reaches its resources through the key it declared."""

from __future__ import annotations

import dataclasses

import dagster as dg
import pytest

from fieldsales_dagster.assets import tables
from fieldsales_dagster.assets.core import build_core_asset
from fieldsales_dagster.assets.decode import EVENTS_DECODED, TRANSACTIONS_DECODED
from fieldsales_dagster.assets.lineage import QueryReadError, reads_of
from fieldsales_dagster.assets.tables import CoreTable, derived_tables, query_reads
from fieldsales_dagster.names import InstanceNames
from fieldsales_dagster_tests import core_payloads as p
from fieldsales_dagster_tests.project import ASSETS, DEFAULT, OWNERS, core_assets, mart_assets

TABLES = {table.table: table for table in derived_tables()}

#: What each shipped query reads, as the lineage the UI shows: written out as the specification.
LINEAGE = {
    "core_transactions": {"raw_transactions"},
    "core_events": {"raw_events"},
    "core_projects": {"raw_events", "core_events"},
    "core_areas": {"raw_events", "core_events"},
    "core_users": {"raw_events", "core_events"},
    "core_dim_point_of_sale": {"raw_events", "core_events"},
    "core_dim_point_of_sale_history": {"raw_events", "core_events"},
    "core_event_status_history": {"raw_events"},
    "core_event_state_durations": {"core_event_status_history", "raw_events"},
    "core_custom_report_fields": {"raw_transactions", "core_transactions"},
    "core_custom_report_results": {"raw_transactions", "raw_events", "core_custom_report_fields"},
    "core_custom_report_field_types": {"core_custom_report_fields", "core_custom_report_results"},
    "mart_daily_sales": {"core_transactions", "core_events"},
    "mart_event_summary": {"core_events", "core_transactions", "core_event_state_durations"},
    "mart_user_activity": {
        "core_events",
        "core_event_status_history",
        "core_transactions",
        "core_users",
    },
}


def _deps(asset: dg.AssetsDefinition) -> set[str]:
    (spec,) = asset.specs
    return {dep.asset_key.to_user_string() for dep in spec.deps}


def _built_on(monkeypatch, table: CoreTable, query: str) -> tuple[CoreTable, dg.AssetsDefinition]:
    """``table``'s asset as it would be built if its ``.sql`` file held ``query``."""
    shipped = tables.core_query

    def edited(of: CoreTable) -> str:
        return query if of.table == table.table else shipped(of)

    monkeypatch.setattr(tables, "core_query", edited)
    fresh = dataclasses.replace(table)  # nothing read from the shipped file is kept
    return fresh, build_core_asset(DEFAULT, fresh, OWNERS, freshness_policy=None)


def test_each_asset_depends_on_exactly_the_tables_its_query_reads():
    assets = {a.key.to_user_string(): a for a in [*core_assets(), *mart_assets()]}
    assert set(assets) == {table for table in ASSETS if table.startswith(("core_", "mart_"))}
    # The tables specified above; which tables there are, the table files say (ASSETS).
    assert {name: _deps(assets[name]) for name in LINEAGE} == LINEAGE


def test_a_join_added_to_a_mart_query_makes_the_joined_table_a_dependency(monkeypatch):
    table = TABLES["mart.daily_sales"]
    query = tables.core_query(table)
    assert "core.users" not in query
    joined = query.replace(
        "FROM core.transactions AS t",
        "FROM core.transactions AS t\nLEFT JOIN core.users AS u ON u.user_id = t.transaction_id",
    )
    assert joined != query

    _, asset = _built_on(monkeypatch, table, joined)

    assert _deps(asset) == LINEAGE["mart_daily_sales"] | {"core_users"}


def test_a_core_query_reading_a_decoded_table_depends_on_its_raw_table_and_refreshes_it(
    monkeypatch,
):
    table = TABLES["core.custom_report_fields"]
    assert table.decoded == ()
    joined = f"""WITH built AS ({tables.core_query(table)})
SELECT built.* FROM built
LEFT JOIN temp.events_decoded AS e ON e.id = built.config_id"""

    fresh, asset = _built_on(monkeypatch, table, joined)

    assert _deps(asset) == {"raw_transactions", "core_transactions", "raw_events"}
    # The step brings temp.events_decoded up to date with raw.events before the query reads it.
    assert fresh.decoded == (EVENTS_DECODED,)


def test_decoded_rows_is_the_followed_decoded_table():
    assert TABLES["core.transactions"].decoded == (TRANSACTIONS_DECODED,)
    assert TABLES["core.custom_report_results"].decoded == (TRANSACTIONS_DECODED, EVENTS_DECODED)


def test_ctes_comments_strings_and_table_functions_are_not_tables():
    sql = """
    -- Reads FROM core.users only in this comment.
    WITH events AS (SELECT * FROM core.events), numbers AS (SELECT * FROM range(3) AS r(n))
    SELECT e.*, 'JOIN core.areas' AS note, s.*
    FROM events AS e
    JOIN numbers ON true
    JOIN field_type_kinds() AS k ON true
    CROSS JOIN unnest([1, 2]) AS u(x)
    JOIN raw.transactions AS s ON s.event_id = e.event_id
    """
    reads = reads_of(sql, "test.sql")
    assert reads.tables == {"core.events", "raw.transactions"}
    assert reads.table_functions == {"field_type_kinds"}


def test_a_table_a_shared_macro_reads_is_read_by_the_query_calling_it():
    reads = query_reads("SELECT id FROM raw_events_in_slices()", "test.sql")
    assert reads.tables == {"raw.events"}
    # The value-typing macros read no table; macros a query does not call add nothing.
    assert query_reads("SELECT json_number(x) FROM core.events", "test.sql").tables == {
        "core.events"
    }


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("SELECT * FROM events", "reads events, which is neither one of its CTEs"),
        ("SELECT * FROM analytics.kpi", "in schema analytics, which this project does not build"),
        ("SELECT * FROM core.nope", "no query of this project builds (there is no sql/core_nope"),
        ("SELECT * FROM raw.nope", "reads raw.nope, which no raw asset loads"),
        ("SELECT * FROM decoded_rows()", "calls decoded_rows(), which only a table that follows"),
        ("SELECT * FROM core.events WHERE", "sqlglot cannot parse the query"),
    ],
)
def test_a_query_whose_tables_cannot_be_told_fails_when_its_asset_is_built(
    monkeypatch, query, message
):
    with pytest.raises(QueryReadError, match="sql/mart_daily_sales.sql") as raised:
        _built_on(monkeypatch, TABLES["mart.daily_sales"], query)
    assert message in str(raised.value)


class NotAWarehouse(dg.ConfigurableResource):
    database: str


def test_a_resource_of_the_wrong_kind_under_the_warehouse_key_is_named(tmp_path):
    result = dg.materialize(
        [*p.RAW_STAND_INS, *core_assets()],
        selection=["core_event_state_durations"],
        resources={"warehouse": NotAWarehouse(database=str(tmp_path / "t.duckdb"))},
        raise_on_error=False,
    )

    assert not result.success
    (failure,) = [e for e in result.all_events if e.is_step_failure]
    error = str(failure.event_specific_data.error)
    assert "The resource 'warehouse' is a NotAWarehouse" in error
    assert "need a FieldSalesWarehouse" in error


def test_an_instance_whose_prefixed_resource_is_missing_fails_when_definitions_load():
    acme = InstanceNames("acme")
    assets = [build_core_asset(acme, TABLES["core.events"], OWNERS, freshness_policy=None)]
    assert "acme_warehouse" in assets[0].required_resource_keys
    defs = dg.Definitions(assets=assets, resources={"warehouse": NotAWarehouse(database="x")})

    with pytest.raises(dg.DagsterInvalidDefinitionError, match="acme_warehouse"):
        defs.get_repository_def()


def test_a_query_is_parsed_once_per_machine_and_a_broken_cache_is_parsed_around(
    monkeypatch, tmp_path
):
    from fieldsales_dagster.assets import lineage

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    sql = "WITH c AS (SELECT * FROM raw.events) SELECT * FROM c JOIN core.users USING (id)"
    columns = ("id",)

    def fresh_process() -> None:  # what a new process starts with: nothing parsed in memory
        for cached in (lineage._stored, lineage.reads_of, lineage.column_sources):
            cached.cache_clear()

    fresh_process()
    reads = reads_of(sql, "q.sql")
    sources = lineage.column_sources(sql, columns)
    assert reads.tables == {"raw.events", "core.users"}
    assert (tmp_path / "fieldsales_dagster").is_dir()

    def no_parse(*args):
        raise AssertionError("parsed again")

    fresh_process()
    with monkeypatch.context() as patched:
        patched.setattr(lineage, "_parse_reads", no_parse)
        patched.setattr(lineage, "_column_sources", no_parse)
        assert reads_of(sql, "q.sql") == reads
        assert lineage.column_sources(sql, columns) == sources

    for stored in (tmp_path / "fieldsales_dagster").iterdir():
        stored.write_text("{not json")
    fresh_process()
    assert reads_of(sql, "q.sql") == reads
    fresh_process()
