"""Every core and mart query holds within a small memory limit on a tenant of realistic weight.

The demo API's ``heavy`` profile gives events ~4x the demo's (long status histories, several
custom reports, full point-of-sale objects, many events per point of sale); ``wide-events`` gives
every point of sale 300 custom fields (~16 KB): a query that parsed them several times per row
outgrew the default limit on a few hundred points of sale. A query that parses
whole payloads in 2,048-row vectors, or carries payloads through a join or a window, needs far
more than the limit below at this size; the restructured queries parse each payload once, in
slices, and carry narrow columns only.
"""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import pytest

from fieldsales_dagster.assets import decode
from fieldsales_dagster.assets.core import RETRIED
from fieldsales_dagster.assets.tables import derived_tables
from fieldsales_dagster.demo_api import DemoConfig, DemoServer
from fieldsales_dagster.demo_api.data import PROFILES, Shape
from fieldsales_dagster.warehouse import lake as lake_module
from fieldsales_dagster_tests import core_payloads as p
from fieldsales_dagster_tests.conftest import lake_at, make_api, read_lake
from fieldsales_dagster_tests.project import core_assets, mart_assets, raw_assets

#: Small enough that reading a whole vector of these payloads at once fails (one parsed vector of
#: ~14 KB events is ~75 MB per thread); the default is 192MB.
MEMORY_LIMIT = "64MB"


def _why(error: str) -> str:
    """The line of a step's error that names the table and DuckDB's reason."""
    lines = error.splitlines()
    return next((line for line in lines if "Building" in line), lines[0])


#: Each profile and the limit its queries must hold in: the wide points of sale, the default.
LIMITS = {"heavy": MEMORY_LIMIT, "wide-events": "192MB"}


@pytest.fixture(scope="module", params=sorted(LIMITS))
def heavy_raw(request, tmp_path_factory):
    """Raw tables of a heavy tenant (2,100 events: more than a 2,048-row vector) over HTTP, and
    the memory limit its queries must hold in."""
    database = tmp_path_factory.mktemp("heavy") / "heavy.duckdb"
    config = DemoConfig(transactions=4200, events=2100, seed=7, shape=PROFILES[request.param])
    with DemoServer(config, host="127.0.0.1", port=0) as server:
        api = make_api(server, database.parent, page_size=500)
        result = dg.materialize(
            raw_assets(),
            resources={
                "fieldsales_api": api,
                "warehouse": lake_at(database),
            },
        )
        assert result.success
        counts = {name: server.dataset.count(name) for name in ("events", "transactions")}
    return database, counts, LIMITS[request.param]


def _materialize(database, table, memory_limit: str) -> dg.ExecuteInProcessResult:
    warehouse = lake_at(database, duckdb_memory_limit=memory_limit, threads=1)
    return dg.materialize(
        [*p.RAW_STAND_INS, *core_assets(), *mart_assets()],
        selection=[table.asset_name],
        resources={"warehouse": warehouse},
        raise_on_error=False,
    )


def _assert_builds(database, table: str, memory_limit: str) -> None:
    """``table`` (its name, e.g. ``mart.daily_sales``) builds under ``memory_limit``."""
    (found,) = [t for t in derived_tables() if t.table == table]
    result = _materialize(database, found, memory_limit)
    failures = [e for e in result.all_events if e.is_step_failure]
    assert not failures, _why(str(failures[0].event_specific_data.error))


def test_every_core_and_mart_query_runs_on_a_heavy_tenant_under_a_small_memory_limit(heavy_raw):
    database, counts, limit = heavy_raw
    failures = {}
    # One table at a time, parents first, so that every query runs (and the decoded tables are
    # built by the first table reading them) under the limit, whatever fails before it. A table
    # that fails is built without the limit, so that the tables reading it still run.
    for table in derived_tables():
        result = _materialize(database, table, limit)
        if not result.success:
            (failure,) = [e for e in result.all_events if e.is_step_failure]
            failures[table.table] = _why(str(failure.event_specific_data.error))
            assert _materialize(database, table, "2GB").success, table.table

    assert failures == {}
    with read_lake(database) as conn:
        for table in derived_tables():
            (rows,) = conn.execute(f"SELECT count(*) FROM {table.table}").fetchone()
            assert rows > 0, table.table
        assert conn.execute("SELECT count(*) FROM core.events").fetchone()[0] == counts["events"]
        (transactions,) = conn.execute("SELECT count(*) FROM core.transactions").fetchone()
        assert transactions == counts["transactions"]
        (versions,) = conn.execute(
            "SELECT count(*) FROM core.dim_point_of_sale_history WHERE NOT is_current"
        ).fetchone()
        assert versions > 0  # points of sale with many events change between them


def test_an_incremental_decode_parses_its_slices_one_at_a_time_under_a_small_memory_limit(
    tmp_path,
):
    # At 10M demo transactions a nightly load left 101,483 rows to decode, and parsing its four
    # slices in one statement (each slice's join and scan held at once) ran out of 192MB. Here
    # 3,500 of 20,000 ~5 KB payloads: in one statement they needed over 72MB.
    database = tmp_path / "t.duckdb"
    p.write_raw_tables(database)
    item = p.transaction("t-X") | {"notes": [f"note {j} " * 10 for j in range(50)]}
    warehouse = lake_at(database, threads=2)
    with warehouse.get_connection() as conn:
        conn.execute(
            "INSERT INTO raw.transactions SELECT 't-' || i, NULL, replace(?, 't-X', 't-' || i), "
            "now()::TIMESTAMP FROM range(20000) AS r(i)",
            [json.dumps(item)],
        )
        decode.refresh_decoded(conn, decode.TRANSACTIONS_DECODED, warehouse.lake)
        # An incremental raw load's write: 3,500 rows stamped anew.
        conn.execute("UPDATE raw.transactions SET loaded_at = now()::TIMESTAMP WHERE rowid < 3500")
    warehouse = lake_at(database, duckdb_memory_limit=MEMORY_LIMIT, threads=1)
    with warehouse.get_connection() as conn:
        refreshed = decode.refresh_decoded(conn, decode.TRANSACTIONS_DECODED, warehouse.lake)
    assert refreshed == decode.DecodeRefresh("incremental", 3500)


#: Sales at many points of sale: 1.5M day x event x product rows into 150k day x point-of-sale
#: groups (10M demo transactions: 3.7M rows into 250k groups, which ran out of 192MB).
SALES_EVENTS, SALES_PER_EVENT = 50_000, 30


def test_mart_daily_sales_counts_products_of_many_groups_under_a_small_memory_limit(tmp_path):
    """count(DISTINCT product_id) in the last grouping held every group's products in memory:
    10M demo transactions ran out of the default 192MB; plain sums spill. The core tables are
    written here: this many groups would take ~1.5M demo transactions over HTTP."""
    database = tmp_path / "sales.duckdb"
    with lake_at(database).get_connection() as conn:
        conn.execute("CREATE SCHEMA core")
        conn.execute(
            "CREATE TABLE core.events AS SELECT 'e' || i AS event_id, 'p' || i % 7 AS project_id, "
            f"'s' || i AS pos_id, 'a' || i % 13 AS area_id FROM range({SALES_EVENTS}) AS r(i)"
        )
        conn.execute(
            "CREATE TABLE core.transactions AS SELECT 't' || i AS transaction_id, "
            f"'e' || i // {SALES_PER_EVENT} AS event_id, 'product' || i % 997 AS product_id, "
            "TIMESTAMP '2026-01-01' + INTERVAL (i % 3) DAY AS sale_time, 1 + i % 5 AS qty, "
            f"(i % 100) * 0.5 AS total_value FROM range({SALES_EVENTS * SALES_PER_EVENT}) AS r(i)"
        )

    _assert_builds(database, "mart.daily_sales", MEMORY_LIMIT)

    with read_lake(database) as conn:
        assert conn.execute(
            "SELECT count(*), sum(transactions), max(distinct_products) FROM mart.daily_sales"
        ).fetchone() == (3 * SALES_EVENTS, SALES_EVENTS * SALES_PER_EVENT, SALES_PER_EVENT // 3)


def test_dim_point_of_sale_parses_the_chosen_objects_in_slices_under_a_small_memory_limit(
    tmp_path,
):
    """Every JSON function keeps, per thread, the working memory of the largest vector it parsed,
    and does not spill: three parses (and a patch) of whole 2,048-row vectors of point-of-sale
    objects ran 10M demo transactions (61k points of sale, 2 threads) out of the default 192MB.
    Here about one point of sale per event (5k), so that most of a vector is chosen objects: the
    old query needed more than 96MB on one thread; the decode it reads needs more than 56MB."""
    database = tmp_path / "pos.duckdb"
    config = DemoConfig(transactions=8000, events=8000, seed=7, shape=Shape(events_per_pos=1))
    with DemoServer(config, host="127.0.0.1", port=0) as server:
        api = make_api(server, tmp_path, page_size=500)
        resources = {"fieldsales_api": api, "warehouse": lake_at(database)}
        assert dg.materialize(raw_assets(), selection=["raw_events"], resources=resources).success
    _assert_builds(database, "core.events", "2GB")

    _assert_builds(database, "core.dim_point_of_sale", "80MB")

    with read_lake(database) as conn:
        (points_of_sale,) = conn.execute(
            "SELECT count(DISTINCT pos_id) FROM core.events"
        ).fetchone()
        assert points_of_sale > 5000
        assert conn.execute(
            "SELECT count(*), count(DISTINCT pos_id), count(untyped_values) "
            "FROM core.dim_point_of_sale"
        ).fetchone() == (points_of_sale, points_of_sale, 0)


#: Events of one or two users each, their sales on one day: 2.25M transactions, 3M joined to
#: their users, into ~300k user x day rows (10M demo transactions: 13M joined into 727k rows,
#: which ran out of the default 192MB). The old query needed over 56MB here, on one thread.
ACTIVITY_EVENTS, ACTIVITY_USERS, ACTIVITY_PER_EVENT = 75_000, 9_000, 30
MEMORY_LIMIT_USER_ACTIVITY = "48MB"


def _activity_tables(tmp_path) -> Path:
    """The core tables mart.user_activity reads, with ids as long as the API's."""
    database = tmp_path / "activity.duckdb"
    with lake_at(database).get_connection() as conn:
        conn.execute("CREATE SCHEMA core")
        conn.execute("CREATE MACRO uid(kind, i) AS left(md5(kind || i), 24)")
        conn.execute(
            "CREATE TABLE core.events AS SELECT uid('e', i) AS event_id, "
            "TIMESTAMP '2026-01-01' + INTERVAL (i % 365) DAY AS planned_start, "
            f"[uid('u', i % {ACTIVITY_USERS}), uid('u', CASE i % 300 WHEN 5 THEN i ELSE 7 * i + 1 "
            f"END % {ACTIVITY_USERS})][:1 + i % 3 // 2] AS assigned_user_ids "
            f"FROM range({ACTIVITY_EVENTS}) AS r(i)"
        )
        conn.execute(
            f"CREATE TABLE core.transactions AS SELECT uid('e', i // {ACTIVITY_PER_EVENT}) "
            f"AS event_id, TIMESTAMP '2026-01-01' + INTERVAL (i // {ACTIVITY_PER_EVENT} % 365) "
            "DAY AS sale_time, 1.0 + i % 5 AS qty, (i % 100) * 0.5 AS total_value "
            f"FROM range({ACTIVITY_EVENTS * ACTIVITY_PER_EVENT}) AS r(i)"
        )
        conn.execute(
            "CREATE TABLE core.event_status_history AS SELECT uid('e', i) AS event_id, "
            f"uid('u', i % {ACTIVITY_USERS}) AS user_id, TIMESTAMP '2026-01-01' AS changed_at "
            f"FROM range({ACTIVITY_EVENTS}) AS r(i)"
        )
        conn.execute(
            "CREATE TABLE core.users AS SELECT uid('u', i) AS user_id, 'Ann' AS first_name, "
            f"'Lee' AS last_name FROM range({ACTIVITY_USERS}) AS r(i)"
        )

    return database


def test_mart_user_activity_counts_events_of_many_groups_under_a_small_memory_limit(tmp_path):
    """Every transaction joined to its event's users, then grouped per user and day with a count
    of distinct events, held the groups' distinct sets in memory: a 10M demo nightly run ran out
    of the default 192MB."""
    database = _activity_tables(tmp_path)
    _assert_builds(database, "mart.user_activity", MEMORY_LIMIT_USER_ACTIVITY)

    with read_lake(database) as conn:
        # A third of the events have two users: their sales count for both; 250 of them list
        # one user twice, whose sales count twice and the event once.
        assignments = ACTIVITY_EVENTS * 4 // 3
        assert conn.execute(
            "SELECT sum(transactions), sum(events_with_sales), sum(status_changes) "
            "FROM mart.user_activity"
        ).fetchone() == (assignments * ACTIVITY_PER_EVENT, assignments - 250, ACTIVITY_EVENTS)


def test_a_build_out_of_memory_on_two_threads_runs_once_more_on_one(tmp_path):
    """Hash tables and buffers are per thread: the query of mart.user_activity needs more than
    48MB here on two threads, less on one. A 10M demo first run ran out of the default 192MB so,
    now and then. The step runs once more, on one thread, says so, and leaves the instance on two.
    """
    database = _activity_tables(tmp_path)
    warehouse = lake_at(database, duckdb_memory_limit=MEMORY_LIMIT_USER_ACTIVITY, threads=2)
    result = dg.materialize(
        [*p.RAW_STAND_INS, *core_assets(), *mart_assets()],
        selection=["mart_user_activity"],
        resources={"warehouse": warehouse},
        raise_on_error=False,
    )

    retries = [
        e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_UP_FOR_RETRY
    ]
    (retry,) = retries
    assert "Out of Memory" in str(retry.event_specific_data.error)
    assert result.success
    (materialization,) = result.asset_materializations_for_node("mart_user_activity")
    assert materialization.metadata[RETRIED].value.startswith("out of DuckDB's memory_limit")
    with warehouse.get_connection() as conn:
        assert conn.execute("SELECT current_setting('threads')").fetchone() == (2,)
    with read_lake(database) as conn:
        (status_changes,) = conn.execute(
            "SELECT sum(status_changes) FROM mart.user_activity"
        ).fetchone()
    assert status_changes == ACTIVITY_EVENTS


def test_a_step_rebuilding_a_table_the_lake_holds_works_on_one_thread(tmp_path):
    """A first run builds whole tables, on the threads set; a later step reads the catalog, and
    what changed, in small statements, each of which cost about twice the CPU on two threads.
    Every other connection (a data team's own asset's) works on the threads set."""
    database = tmp_path / "t.duckdb"
    p.write_raw_tables(database)
    warehouse = lake_at(database, threads=2)

    def threads(builds: str | None) -> int:
        with warehouse.get_connection(builds=builds) as conn:
            return conn.execute("SELECT current_setting('threads')").fetchone()[0]

    assert threads("core.events") == 2  # not in the lake yet
    assert threads("raw.transactions") == 1
    assert threads(None) == 2  # set anew: the instance is the process's
    assert threads("raw.transactions") == 1
    assert threads("core.events") == 2


def test_warehouses_of_one_lake_asking_other_threads_share_its_instance(tmp_path):
    """A process keeps one DuckDB instance a lake (loading one checks the extensions' signatures:
    ~0.4 CPU-s). Threads are set on each connection, so a warehouse asking other threads (a data
    team's own, beside the run's) shares it, and each connection works on its warehouse's."""
    database = tmp_path / "t.duckdb"
    p.write_raw_tables(database)  # by a warehouse of the default threads
    two, three = lake_at(database, threads=2), lake_at(database, threads=3)
    seen = []
    for warehouse in (two, three, two):
        with warehouse.get_connection() as conn:
            seen.append(conn.execute("SELECT current_setting('threads')").fetchone()[0])
    assert seen == [2, 3, 2]
    assert len([key for key in lake_module._INSTANCES if two.lake in key]) == 1
