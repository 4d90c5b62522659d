"""A check that passed at its table's last build, when a follow changed only some rows, is
evaluated over the rows the follow inserted, and gives the result an evaluation of every row
gives; after a failure, it reads every row again."""

from __future__ import annotations

import json

import dagster as dg
import duckdb
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from fieldsales_dagster.assets import checks
from fieldsales_dagster.assets.columns import TableDoc
from fieldsales_dagster.assets.follow import FOLLOW_KEYS, FOLLOW_ROWS
from fieldsales_dagster.assets.lineage import over_rows
from fieldsales_dagster.assets.tables import CoreTable
from fieldsales_dagster.warehouse.lake import run_transaction
from fieldsales_dagster_tests import core_payloads as p
from fieldsales_dagster_tests.conftest import lake_at

SLIDER = p.field("f-slider", "Slider", minimum=0, maximum=10, step=1)
CONFIG = p.config("cfg-1", [SLIDER, p.field("f-count", "number")])
NARROWED = "over the keys of the rows the follow inserted: it passed at the build that read "


def good(transaction_id: str) -> dict:
    """Passes every check; its report leaves the number field unanswered."""
    return p.transaction(
        transaction_id, report_config=CONFIG, report_results=p.results(**{"f-slider": 3})
    )


def bad(transaction_id: str) -> dict:
    """Fails every row-wise check of core.transactions and core.custom_report_results."""
    values = {"f-slider": 11, "f-count": "many", "f-unknown": 1}
    report = good(transaction_id)["_customReport"] | {"reportResults": p.results(**values)}
    return good(transaction_id) | {"price": "NaN", "qty": "four", "_customReport": report}


@pytest.fixture(scope="module")
def mixed_rows(tmp_path_factory) -> dict[str, object]:
    """Every core table's rows, of good and bad transactions, events and points of sale."""
    database = tmp_path_factory.mktemp("mixed") / "t.duckdb"
    transactions = [good(f"t-{i}") for i in range(6)] + [bad("t-bad"), bad("t-worse")]
    events = [
        p.event("e1", history=[p.history_entry("h-1", "", "Planned", p.T0)]),
        p.event("e2", pos=p.point_of_sale("pos-swapped", location=[200.0, 95.0])),
        p.event("e3", starts=("not a time",)),
    ]
    p.materialize_core(database, transactions=transactions, events=events, raise_on_error=False)
    with lake_at(database).get_connection() as conn:
        return {
            check.table.table: conn.execute(f"FROM {check.table.table}").fetch_arrow_table()
            for check in checks.core_checks()
            if check.kind.narrows
        }


NARROWABLE = {
    f"{check.table.table}.{check.name}": check
    for check in checks.core_checks()
    if check.kind.narrows
}


def test_every_row_wise_check_of_a_following_table_can_be_narrowed():
    names = {(c.table.table, c.name) for c in NARROWABLE.values()}
    for table in ("core.transactions", "core.events", "core.custom_report_results"):
        assert {(table, "values_typed"), (table, "values_finite")} <= names
    assert ("core.custom_report_results", "slider_values_valid") in names
    assert ("core.custom_report_results", "field_types_resolved") in names
    assert ("core.dim_point_of_sale", "coordinates_in_range") in names
    # Reading another table: a row of it can make an unchanged row offend.
    assert ("core.transactions", "event_ids_known") not in names
    assert ("mart.daily_sales", "daily_sales_match_transactions") not in names


@pytest.mark.parametrize(
    "sql",
    [
        # The duplicates among rows kept: old rows pass the filter too.
        "SELECT count(*) = 0 AS passed FROM (SELECT k FROM core.t WHERE k IS NOT NULL "
        "GROUP BY k HAVING count(*) > 1)",
        "SELECT count(*) > 0 AS passed FROM core.t WHERE x",
        "SELECT count(*) = 0 AS passed FROM core.t",
        "SELECT count(*) = 0 AS passed, (SELECT count(*) FROM core.t) AS n FROM core.t WHERE x",
        "WITH o AS (SELECT * FROM core.t WHERE x) SELECT count(*) = 0 AS passed FROM o WHERE y",
        "WITH o AS (SELECT k, count(*) OVER () AS n FROM core.t WHERE x) "
        "SELECT count(*) = 0 AS passed FROM o",
        "SELECT count(*) = 0 AS passed FROM core.t JOIN core.u USING (k) WHERE x",
    ],
)
def test_a_written_check_not_counting_its_own_offending_rows_is_not_narrowed(sql):
    assert over_rows(sql, "core.t", FOLLOW_ROWS) is None


def test_a_written_check_is_narrowed_in_its_text_as_written():
    sql = 'SELECT count(*) = 0 AS passed, count(*) FROM core."t" WHERE t.x -- core.t\n'
    narrowed = (
        f"SELECT count(*) = 0 AS passed, count(*) FROM {FOLLOW_ROWS} AS t WHERE t.x -- core.t\n"
    )
    assert over_rows(sql, "core.t", FOLLOW_ROWS) == narrowed


def evaluate(check: checks.CoreCheck, conn, inserted: bool) -> dg.AssetCheckResult:
    return check.kind.evaluate(conn, check.table, inserted)[check.name]


def result_of(found: dg.AssetCheckResult) -> tuple:
    metadata = {k: v for k, v in found.metadata.items() if k != "fieldsales/check"}
    return found.passed, found.severity, metadata


#: ids_unique of the tables whose key holds the column their follow replaces rows by.
REPLACING = {
    name
    for name, check in NARROWABLE.items()
    if check.name == "ids_unique"
    and check.table.follows
    and check.table.follows.key in check.table.key
}


@pytest.mark.parametrize("name", NARROWABLE)
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_a_narrowed_check_gives_the_result_of_every_row(name, mixed_rows, data):
    """The table's rows before the follow pass; the follow inserts any rows, copies of kept ones
    among them: over the inserted rows, the check finds what it finds over every row. Where its
    key holds the follow's, the follow first deletes every row of the keys it replaces
    (``FOLLOW_KEYS``, a NULL among them or not), of the inserted rows' or not: ids_unique reads
    the inserted rows alone where each has a replaced key."""
    check = NARROWABLE[name]
    table = check.table.table
    conn = duckdb.connect()
    conn.execute(f"CREATE SCHEMA {check.table.schema}")
    conn.register("source", mixed_rows[table])
    conn.execute("CREATE TABLE rows AS SELECT row_number() OVER () AS i, * FROM source")
    (count,) = conn.execute("SELECT count(*) FROM rows").fetchone()
    assert count > 0, f"no row of {table} to draw from"
    kept = data.draw(st.sets(st.integers(1, count)), label="kept")
    inserted = data.draw(st.lists(st.integers(1, count), max_size=6), label="inserted")

    def rows(ids: list[int]) -> str:
        return f"SELECT rows.* EXCLUDE (i) FROM unnest({ids}::BIGINT[]) AS k(i) JOIN rows USING (i)"

    conn.execute(f"CREATE TABLE {table} AS {rows(sorted(kept))}")
    assume(evaluate(check, conn, inserted=False).passed)
    if name in REPLACING and check.table.follows:
        replaced = data.draw(st.sets(st.integers(1, count)), label="replaced")
        if data.draw(st.booleans(), label="every inserted row's key replaced"):
            replaced |= set(inserted)
        key = check.table.follows.key
        null = " UNION ALL SELECT NULL" * data.draw(st.booleans(), label="a NULL key replaced")
        conn.execute(
            f"CREATE TEMP TABLE {FOLLOW_KEYS} AS SELECT {key} AS id "
            f"FROM ({rows(sorted(replaced))}){null}; "
            f"DELETE FROM {table} WHERE {key} IN (SELECT id FROM {FOLLOW_KEYS})"
        )
    conn.execute(f"CREATE TEMP TABLE {FOLLOW_ROWS} AS {rows(inserted)}")
    conn.execute(f"INSERT INTO {table} FROM {FOLLOW_ROWS}")
    whole = evaluate(check, conn, inserted=False)
    assert result_of(evaluate(check, conn, inserted=True)) == result_of(whole)


@pytest.mark.parametrize(("nullable", "found"), [((), (2, 2)), (("a",), (2, 0))])
def test_uniqueness_over_inserted_rows_screened_by_one_key_column_keeps_a_null_in_it(
    nullable, found
):
    """Over the inserted rows, ids_unique first keeps the rows whose most telling key column (here
    ``a``: two values against one) holds an inserted value, or NULL: an inserted NULL there is a
    NULL key, or, in a nullable column, equal to another NULL."""
    conn = duckdb.connect()
    conn.execute("CREATE SCHEMA core; CREATE TABLE core.t (a INTEGER, b VARCHAR)")
    conn.execute("INSERT INTO core.t VALUES (1, 'p'), (2, 'p')")
    conn.execute(
        f"CREATE TEMP TABLE {FOLLOW_ROWS} AS FROM (VALUES "
        "(NULL::INTEGER, 'p'), (NULL, 'p'), (7, 'p'), (8, 'p')) AS v(a, b)"
    )
    conn.execute(f"INSERT INTO core.t FROM {FOLLOW_ROWS}")
    table = CoreTable("core.t", ("a", "b"), "", TableDoc(()), nullable_key=nullable)

    def counts(inserted: bool) -> tuple[int, int]:
        metadata = checks.ids_unique(conn, table, inserted)["ids_unique"].metadata
        return metadata["duplicated_rows"].value, metadata["rows_with_null_key"].value

    assert counts(inserted=True) == counts(inserted=False) == found


def load_again(database, *changed: dict) -> dict[tuple[str, str], dg.AssetCheckEvaluation]:
    with lake_at(database).get_connection() as conn:
        update = "UPDATE raw.transactions SET payload = ?, loaded_at = now() WHERE id = ?"
        for item in changed:
            run_transaction(
                conn,
                "raw.transactions",
                lambda i=item: conn.execute(update, [json.dumps(i), i["_id"]]),
            )
    result = p.materialize_core_only(database, with_checks=True, raise_on_error=False)
    for m in result.get_asset_materialization_events():
        if m.asset_key.to_user_string() in ("core_transactions", "core_custom_report_results"):
            assert m.materialization.metadata["fieldsales/build"].value.startswith("incremental")
    return {
        (e.asset_key.to_user_string(), e.check_name): e
        for e in result.get_asset_check_evaluations()
    }


ROW_WISE = [
    ("core_transactions", "values_typed"),
    ("core_transactions", "values_finite"),
    ("core_custom_report_results", "values_typed"),
    ("core_custom_report_results", "slider_values_valid"),
    ("core_custom_report_results", "field_types_resolved"),
]


def test_after_a_follow_row_wise_checks_read_the_inserted_rows_and_after_a_failure_every_row(
    tmp_path,
):
    database = tmp_path / "t.duckdb"
    transactions = [good(f"t-{i}") for i in range(10)]
    first = p.materialize_core(
        database, transactions=transactions, events=[p.event("e1")], with_checks=True
    )
    assert all(e.passed for e in first.get_asset_check_evaluations())
    by_name = {(c.table.asset_name, c.name): c for c in checks.core_checks()}

    def whole(key: tuple[str, str]) -> tuple:
        check = by_name[key]
        with lake_at(database).get_connection() as conn:
            return result_of(evaluate(check, conn, inserted=False))

    narrowed = load_again(database, bad("t-3"))
    for key in ROW_WISE:
        assert narrowed[key].metadata["fieldsales/check"].value.startswith(NARROWED), key
        assert not narrowed[key].passed, key
        assert result_of(narrowed[key]) == whole(key), key
    assert (
        narrowed["core_custom_report_results", "slider_values_valid"].metadata["out_of_range"].value
        == 1
    )
    # Failed last: every row read again, the count exact (t-3 still offends, t-5 does not).
    again = load_again(database, good("t-5") | {"qty": 5})
    for key in ROW_WISE:
        assert "fieldsales/check" not in again[key].metadata, key
        assert result_of(again[key]) == whole(key), key
    assert (
        again["core_transactions", "values_finite"].metadata["rows_with_nan_or_infinity"].value == 1
    )
    # Passed last: still over the inserted rows.
    assert (
        again["core_transactions", "ids_unique"]
        .metadata["fieldsales/check"]
        .value.startswith(NARROWED)
    )
