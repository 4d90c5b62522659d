"""Privacy settings and the analyst rules on the demo data, end to end: the demo API over HTTP,
raw load, core and mart tables and every check, in real DuckDB files."""

from __future__ import annotations

import hashlib
import hmac
import re
from pathlib import Path

import dagster as dg
import pytest

from fieldsales_dagster.demo_run import EXPECTED_DEMO_FINDINGS
from fieldsales_dagster.warehouse.pii import (
    PII_PAYLOAD_KEYS,
    PiiSettingError,
    hmac_pads,
)
from fieldsales_dagster.warehouse.warehouse import FieldSalesWarehouse
from fieldsales_dagster_tests.conftest import lake_at, make_api, read_lake
from fieldsales_dagster_tests.project import (
    core_assets,
    core_checks,
    mart_assets,
    materialize,
    raw_assets,
)

HASH_KEY = "test-key-0123456789abcdef"


@pytest.fixture(scope="module")
def server():
    from fieldsales_dagster.demo_api import DemoConfig, DemoServer

    with DemoServer(DemoConfig(transactions=1200, seed=3), host="127.0.0.1", port=0) as server:
        yield server


@pytest.fixture(scope="module")
def load(server, tmp_path_factory):
    """Materialize everything from the demo API with the given warehouse settings."""

    def run(name: str, **settings) -> tuple[str, dg.ExecuteInProcessResult]:
        folder = tmp_path_factory.mktemp(name)
        database = str(folder / "fieldsales.duckdb")
        result = materialize(
            [*raw_assets(), *core_assets(True), *mart_assets(True), *core_checks()],
            resources={
                "fieldsales_api": make_api(server, folder),
                "warehouse": lake_at(database, threads=2, **settings),
            },
            raise_on_error=False,
        )
        assert result.success
        return database, result

    return run


@pytest.fixture(scope="module")
def kept(load):
    return load("keep")


@pytest.fixture(scope="module")
def personal_values(kept) -> set[str]:
    """Every name, email and client IP the demo API served."""
    keys = ", ".join(f"'{k}'" for k in PII_PAYLOAD_KEYS)
    with read_lake(kept[0]) as conn:
        rows = conn.execute(
            f"""
            SELECT DISTINCT node.value ->> '$'
            FROM raw.events, json_tree(raw.events.payload) AS node
            WHERE node.key IN ({keys}) AND node.type = 'VARCHAR' AND (node.value ->> '$') <> ''
            """
        ).fetchall()
    values = {v for (v,) in rows}
    assert len(values) > 20
    return values


def leaks(database: str, values: set[str]) -> list[str]:
    """Every (table.column) of the database that holds one of ``values``."""
    pattern = '"(' + "|".join(re.escape(v) for v in sorted(values)) + ')"'
    found = []
    with read_lake(database) as conn:
        columns = conn.execute(
            "SELECT schema_name, table_name, column_name, data_type FROM duckdb_columns() "
            "WHERE data_type IN ('VARCHAR', 'VARCHAR[]', 'JSON')"
        ).fetchall()
        for schema, table, column, data_type in columns:
            target = f'"{schema}"."{table}"."{column}"'
            where = {
                "VARCHAR": f"list_contains($values, {target})",
                "VARCHAR[]": f"len(list_intersect({target}, $values)) > 0",
                "JSON": f"regexp_matches({target}::VARCHAR, $pattern)",
            }[data_type]
            params = {"pattern": pattern} if data_type == "JSON" else {"values": sorted(values)}
            (n,) = conn.execute(
                f'SELECT count(*) FROM "{schema}"."{table}" WHERE {where}', params
            ).fetchone()
            if n:
                found.append(f"{schema}.{table}.{column}")
    return found


def query(database: str, sql: str) -> list[tuple]:
    with read_lake(database) as conn:
        return conn.execute(sql).fetchall()


# --- privacy --------------------------------------------------------------------------------


def test_keep_stores_personal_values_so_the_scan_can_find_them(kept, personal_values):
    assert set(leaks(kept[0], personal_values)) >= {
        "raw.events.payload",
        "core.users.email",
        "core.event_status_history.client_ip",
    }


def test_the_decoded_events_never_touch_the_lake(kept):
    # They hold every name, email and IP: a TEMP table of each step reading them. Written to the
    # lake, their Parquet files were on disk during the step (and, after a failed step, stayed
    # there, unknown to the catalog, until the upkeep deletes orphans a day later).
    database = kept[0]
    with read_lake(database) as conn:
        ever = {
            name
            for (name,) in conn.execute(
                "SELECT table_name FROM __ducklake_metadata_fieldsales.main.ducklake_table"
            ).fetchall()
        }
    assert {"events", "transactions_decoded"} <= ever  # every table, dropped ones too
    assert {name for name in ever if "events_decoded" in name} == set()
    folder = Path(lake_at(database).lake.data_folder)
    assert list(folder.rglob("*transactions_decoded*"))  # where a lake table's files go
    assert list(folder.rglob("*events_decoded*")) == []


def test_no_personal_value_survives_drop_with_raw_redaction(load, personal_values):
    database, _ = load("drop", pii="drop", redact_pii_in_raw=True)
    assert leaks(database, personal_values) == []
    assert query(database, "SELECT count(*), count(email) FROM core.users")[0][1] == 0


@pytest.fixture(scope="module")
def hashed(load):
    return load("hash", pii="hash", pii_hash_key=HASH_KEY)


def test_no_personal_value_survives_hash_outside_the_raw_payloads(hashed, personal_values):
    # raw.* keeps payloads as received unless redact_pii_in_raw is set (tested with drop above).
    assert leaks(hashed[0], personal_values) == ["raw.events.payload"]


def test_hash_is_the_keyed_hash_of_the_value_so_joins_still_work(hashed, kept):
    database = hashed[0]
    user_id, email = query(kept[0], "SELECT user_id, email FROM core.users LIMIT 1")[0]
    assert query(database, f"SELECT email FROM core.users WHERE user_id = '{user_id}'") == [
        (hmac.new(HASH_KEY.encode(), email.encode(), hashlib.sha256).hexdigest(),)
    ]
    joined = query(
        database,
        "SELECT count(*) FROM mart.user_activity AS a JOIN core.users AS u "
        "ON a.first_name = u.first_name AND a.user_id = u.user_id",
    )
    known = query(
        database, "SELECT count(*) FROM mart.user_activity SEMI JOIN core.users USING (user_id)"
    )
    assert joined == known and known[0][0] > 0


def test_redaction_keeps_everything_but_the_personal_keys(load, kept):
    database, result = load("redact", redact_pii_in_raw=True)
    assert query(database, "SELECT count(*) FROM raw.events") == query(
        kept[0], "SELECT count(*) FROM raw.events"
    )
    assert query(
        database,
        "SELECT count(*) FROM raw.events "
        "WHERE (payload ->> '$.eventUser[0].firstName') IS NOT NULL",
    ) == [(0,)]
    assert query(database, "SELECT count(*) FROM core.users WHERE email IS NOT NULL") == [(0,)]
    total = "SELECT round(sum(total_value), 2) FROM core.transactions"
    assert query(database, total) == query(kept[0], total)
    (event,) = [
        m for m in result.get_asset_materialization_events() if m.asset_key.path == ["raw_events"]
    ]
    assert event.materialization.metadata["pii_redacted_rows"].value > 0


def test_hash_without_a_key_is_refused_naming_the_setting():
    with pytest.raises(ValueError, match="FIELDSALES_PII_HASH_KEY"):
        FieldSalesWarehouse(pii="hash")


def test_unknown_pii_setting_is_refused_naming_the_allowed_values():
    with pytest.raises(ValueError, match="'keep', 'hash' or 'drop'"):
        FieldSalesWarehouse(pii="sometimes")


def test_short_hash_key_is_refused_naming_the_setting():
    with pytest.raises(PiiSettingError, match="pii_hash_key"):
        hmac_pads("short")


# --- the demo data --------------------------------------------------------------------------


def test_demo_checks_fail_only_where_the_demo_data_is_faulty_on_purpose(kept):
    failed = {
        (e.asset_key.to_user_string(), e.check_name)
        for e in kept[1].get_asset_check_evaluations()
        if not e.passed
    }
    assert failed == set(EXPECTED_DEMO_FINDINGS)


def test_demo_every_answered_custom_report_value_is_typed(kept):
    assert query(
        kept[0],
        "SELECT count(*) FROM core.custom_report_results WHERE value_raw IS NOT NULL AND "
        "coalesce(value_number::VARCHAR, value_text, file_ref, value_bool::VARCHAR, "
        "value_json_number::VARCHAR, value_json_text) IS NULL",
    ) == [(0,)]
    assert query(
        kept[0],
        "SELECT count(*) > 0, count(*) = count(value_bool) FROM core.custom_report_results "
        "WHERE field_type = 'checkbox'",
    ) == [(True, True)]


def test_demo_has_no_empty_strings_in_core_or_mart(kept):
    with read_lake(kept[0]) as conn:
        columns = conn.execute(
            "SELECT schema_name, table_name, column_name FROM duckdb_columns() "
            "WHERE schema_name IN ('core', 'mart') AND data_type = 'VARCHAR'"
        ).fetchall()
        for schema, table, column in columns:
            sql = f"SELECT count(*) FROM {schema}.{table} WHERE \"{column}\" = ''"
            assert conn.execute(sql).fetchone() == (0,), f"{schema}.{table}.{column}"


def test_demo_history_keeps_every_name_a_point_of_sale_had(kept):
    names = "SELECT DISTINCT pos_id, {name} FROM {table} WHERE pos_id IS NOT NULL ORDER BY ALL"
    carried = query(kept[0], names.format(name="pos_name", table="core.events"))
    versions = query(kept[0], names.format(name="name", table="core.dim_point_of_sale_history"))
    assert carried == versions
    assert len(carried) > query(kept[0], "SELECT count(*) FROM core.dim_point_of_sale")[0][0]


def test_demo_current_history_versions_are_the_dimension(kept):
    assert query(
        kept[0],
        "SELECT pos_id, name, city, postal, longitude, latitude "
        "FROM core.dim_point_of_sale_history WHERE is_current ORDER BY pos_id",
    ) == query(
        kept[0],
        "SELECT pos_id, name, city, postal, longitude, latitude "
        "FROM core.dim_point_of_sale ORDER BY pos_id",
    )


def test_demo_state_durations_cover_every_status_change(kept):
    assert query(kept[0], "SELECT count(*) FROM core.event_state_durations") == query(
        kept[0], "SELECT count(*) FROM core.event_status_history"
    )
