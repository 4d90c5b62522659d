"""The lake's files on object storage, for real: moto's S3 server on loopback (object_store.py),
checking every request's signature; httpfs from its wheel; the demo API over HTTP; real
materializations. A SQLite catalog unless PostgreSQL is the point (the fleet's shape, last)."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from fieldsales_dagster.assets.upkeep import build_upkeep_asset
from fieldsales_dagster.warehouse.lake import LakeError, analyst_sql
from fieldsales_dagster.warehouse.warehouse import FieldSalesWarehouse
from fieldsales_dagster_tests import test_ducklake
from fieldsales_dagster_tests.conftest import make_api, make_warehouse
from fieldsales_dagster_tests.object_store import running_object_store
from fieldsales_dagster_tests.postgres import _free_port
from fieldsales_dagster_tests.processes import clean_env
from fieldsales_dagster_tests.project import DEFAULT, component
from fieldsales_dagster_tests.test_ducklake import ALL, RAW, assert_lakes_equal, refresh

OURS = ("FIELDSALES_S3_ACCESS_KEY_ID", "FIELDSALES_S3_SECRET_ACCESS_KEY")
AWS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION")
#: The PostgreSQL server and a catalog database of its own (the fleet's test, last).
postgres, catalog = test_ducklake.postgres, test_ducklake.catalog
#: A demo API of 300 transactions, for the test that refreshes two lakes to compare them.
small_demo = test_ducklake.small_demo


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    with running_object_store(tmp_path_factory.mktemp("moto")) as server:
        yield server


@pytest.fixture
def bucket(store, monkeypatch) -> str:
    """A new bucket, and our variables holding the server's keys (no AWS variable set)."""
    for variable in (*AWS, "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv(OURS[0], store.key_id)
    monkeypatch.setenv(OURS[1], store.secret)
    return store.new_bucket()


def s3_warehouse(tmp_path: Path, data_path: str, endpoint: str | None) -> FieldSalesWarehouse:
    """A warehouse with a SQLite catalog in ``tmp_path`` and its files at ``data_path``."""
    return FieldSalesWarehouse(
        ducklake_catalog=f"sqlite:{tmp_path / 'catalog.sqlite'}",
        ducklake_data_path=data_path,
        s3_endpoint=endpoint,
    )


def run_with_logs(server, tmp_path, warehouse, assets) -> tuple[dg.ExecuteInProcessResult, str]:
    """Materialize ``assets``; the result, and everything the run recorded (its events, log
    lines, metadata, errors and run config) as text."""
    instance = dg.DagsterInstance.ephemeral()
    result = dg.materialize(
        assets,
        resources={"fieldsales_api": make_api(server, tmp_path), "warehouse": warehouse},
        instance=instance,
        raise_on_error=False,
    )
    recorded = [str(entry) for entry in instance.all_logs(result.run_id)]
    return result, "\n".join([*recorded, str(result.dagster_run.run_config)])


def listed_files(warehouse: FieldSalesWarehouse) -> set[str]:
    """Every data file the lake's catalog lists for its tables, at its latest snapshot."""
    with warehouse.get_connection() as conn:
        tables = conn.execute(
            "SELECT schema_name, table_name FROM duckdb_tables() WHERE database_name = 'fieldsales'"
        ).fetchall()
        return {
            path
            for schema, table in tables
            for (path,) in conn.execute(
                "SELECT data_file FROM ducklake_list_files('fieldsales', ?, schema => ?)",
                [table, schema],
            ).fetchall()
        }


def test_a_refresh_writes_its_files_to_the_bucket_and_the_tables_read_back_exact(
    small_demo, store, bucket, tmp_path
):
    lake = s3_warehouse(tmp_path, f"s3://{bucket}/lake/", store.endpoint)
    result, recorded = run_with_logs(small_demo, tmp_path, lake, ALL)
    assert result.success

    objects = {f"s3://{bucket}/{key}" for key in store.keys(bucket)}
    listed = listed_files(lake)
    assert listed and listed <= objects  # every table's files are in the bucket ...
    assert all(key.startswith(f"s3://{bucket}/lake/") for key in objects)
    assert not list(tmp_path.rglob("*.parquet"))  # ... and none on local disk
    local = make_warehouse(tmp_path, "local")
    refresh(small_demo, tmp_path, local)
    assert assert_lakes_equal(lake, local) >= 10
    assert store.secret not in recorded
    with lake.read_connection() as conn:
        (transactions,) = conn.execute("SELECT count(*) FROM core.transactions").fetchone()
    assert cli_count(lake, store, "core.transactions", tmp_path) == transactions


def cli_count(lake: FieldSalesWarehouse, store, table: str, folder: Path) -> int:
    """``count(*)`` of ``table`` read by the DuckDB CLI through the analysts' lines
    (``analyst_sql``), their secret line filled in with the keys as an analyst does."""
    lines = analyst_sql(lake.lake).splitlines()
    (template,) = [line for line in lines if line.startswith("-- the object store's keys")]
    keys = f"KEY_ID '{store.key_id}', SECRET '{store.secret}'"
    filled = template.split(": ", 1)[1].replace("KEY_ID '...', SECRET '...'", keys)
    init = folder / "open_lake.sql"
    init.write_text("\n".join(filled if line == template else line for line in lines))
    done = subprocess.run(
        [str(Path(sys.executable).parent / "duckdb"), "-csv", "-noheader", "-init", str(init)],
        input=f"SELECT count(*) FROM {table};\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip().splitlines()[-1])


def test_the_standard_aws_variables_work_with_no_setting_of_ours(
    demo_server, store, bucket, tmp_path, monkeypatch
):
    for variable in OURS:
        monkeypatch.delenv(variable)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", store.key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", store.secret)
    monkeypatch.setenv("AWS_REGION", "eu-central-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", store.endpoint)
    lake = s3_warehouse(tmp_path, f"s3://{bucket}/lake/", None)
    refresh(demo_server, tmp_path, lake, assets=RAW)
    assert listed_files(lake) <= {f"s3://{bucket}/{key}" for key in store.keys(bucket)}
    with lake.read_connection() as conn:
        assert conn.execute("SELECT count(*) FROM raw.transactions").fetchone() == (1200,)


def test_plain_http_to_an_endpoint_off_loopback_is_refused_naming_its_variable(monkeypatch):
    with pytest.raises(ValueError, match="FIELDSALES_S3_ENDPOINT"):
        s3_warehouse(Path("data"), "s3://lake/", "http://minio.internal:9000")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://minio.internal:9000")
    with pytest.raises(ValueError, match="AWS_ENDPOINT_URL") as refused:
        _ = s3_warehouse(Path("data"), "s3://lake/", None).lake
    assert "clear text" in str(refused.value)


@pytest.mark.parametrize("variable", ["FIELDSALES_S3_ENDPOINT", "AWS_ENDPOINT_URL"])
def test_the_analysts_lines_refuse_plain_http_off_loopback_naming_the_variable_that_held_it(
    variable,
):
    """``python -m fieldsales_dagster.warehouse.lake`` applies the runs' rule to either
    variable, and names the one that held the endpoint."""
    env = clean_env(FIELDSALES_DUCKLAKE_DATA_PATH="s3://lake/")
    env.pop("AWS_ENDPOINT_URL", None)
    env[variable] = "http://minio.internal:9000"
    cli = [sys.executable, "-m", "fieldsales_dagster.warehouse.lake"]
    done = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=120)
    other = ({"FIELDSALES_S3_ENDPOINT", "AWS_ENDPOINT_URL"} - {variable}).pop()
    assert done.returncode != 0 and done.stdout == ""
    assert "plain http://" in done.stderr and "minio.internal" in done.stderr
    assert variable in done.stderr and other not in done.stderr


@pytest.mark.parametrize("fault", ["missing bucket", "wrong keys", "unreachable endpoint"])
def test_a_bucket_keys_or_endpoint_that_fail_fail_the_run_before_anything_is_written(
    fault, demo_server, store, bucket, tmp_path, monkeypatch
):
    data_path, endpoint = f"s3://{bucket}/lake/", store.endpoint
    if fault == "missing bucket":
        data_path = f"s3://{bucket}-missing/lake/"
    elif fault == "wrong keys":
        monkeypatch.setenv(OURS[1], "not-the-secret-4711")
    else:
        endpoint = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    lake = s3_warehouse(tmp_path, data_path, endpoint)

    result, recorded = run_with_logs(demo_server, tmp_path, lake, RAW)

    assert not result.success
    failure = result.get_step_failure_events()[0].event_specific_data.error.to_string()
    assert "FIELDSALES_DUCKLAKE_DATA_PATH" in failure and "nothing was written" in failure
    expected = {
        "missing bucket": "its bucket does not exist",
        "wrong keys": f"refused the keys in {OURS[0]} and {OURS[1]}",
        "unreachable endpoint": f"at {endpoint} could not be reached",
    }[fault]
    assert expected in failure
    assert fault != "unreachable endpoint" or "FIELDSALES_S3_ENDPOINT" in failure
    assert store.keys(bucket) == set()  # no object written ...
    with sqlite3.connect(tmp_path / "catalog.sqlite") as db:  # ... and no snapshot committed
        made = db.execute("SELECT name FROM sqlite_master WHERE name = 'ducklake_snapshot'")
        assert made.fetchall() == []
    assert store.secret not in recorded and "not-the-secret-4711" not in recorded


def run_upkeep(warehouse, orphan_age_hours: float) -> dict:
    upkeep = build_upkeep_asset(DEFAULT, ["team:data"], retain_snapshots_days=7)
    config = {"orphan_age_hours": orphan_age_hours}
    result = dg.materialize(
        [upkeep],
        resources={"warehouse": warehouse},
        run_config={"ops": {"ducklake_upkeep": {"config": config}}},
    )
    assert result.success
    (event,) = result.asset_materializations_for_node("ducklake_upkeep")
    return {key: value.value for key, value in event.metadata.items()}


def test_upkeep_deletes_the_orphaned_objects_under_the_data_path_and_only_those(
    demo_server, store, bucket, tmp_path
):
    """A killed run leaves objects no snapshot lists: the upkeep deletes those under the data
    path once older than orphan_age_hours; the lake's own objects and any object beside the data
    path (another prefix, even one that starts with the same letters) stay."""
    lake = s3_warehouse(tmp_path, f"s3://{bucket}/lake/", store.endpoint)
    refresh(demo_server, tmp_path, lake, assets=RAW)
    live = store.keys(bucket)
    one = sorted(live)[0]
    body = store.client().get_object(Bucket=bucket, Key=one)["Body"].read()
    orphan = f"{one.rpartition('/')[0]}/ducklake-killed-run.parquet"
    beside = "lake-archive/ducklake-kept.parquet"
    for key in (orphan, beside):
        store.client().put_object(Bucket=bucket, Key=key, Body=body)

    kept = run_upkeep(lake, orphan_age_hours=24.0)  # the orphan is younger: it stays
    assert kept["orphans_deleted"] == 0 and orphan in store.keys(bucket)
    done = run_upkeep(lake, orphan_age_hours=0.0)  # now it is old enough

    assert done["orphans_deleted"] == 1
    assert store.keys(bucket) == live | {beside}
    with lake.read_connection() as conn:
        assert conn.execute("SELECT count(*) FROM raw.transactions").fetchone() == (1200,)


def test_a_postgresql_catalog_with_its_files_in_the_bucket_the_fleets_shape(
    demo_server, store, bucket, tmp_path, catalog
):
    lake = FieldSalesWarehouse(
        ducklake_catalog=catalog,
        ducklake_data_path=f"s3://{bucket}/fieldsales/",
        s3_endpoint=store.endpoint,
    )
    refresh(demo_server, tmp_path, lake)
    objects = {f"s3://{bucket}/{key}" for key in store.keys(bucket)}
    assert listed_files(lake) <= objects
    # The upkeep counts the files in the catalog (every one is in the bucket), then deletes
    # those no snapshot needs: what stays in the bucket is what the catalog lists.
    done = run_upkeep(lake, orphan_age_hours=0.0)
    assert done["files_before"] == len(objects) and done["counted_in"] == "catalog"
    assert {f"s3://{bucket}/{key}" for key in store.keys(bucket)} == listed_files(lake)
    with lake.get_connection() as conn:
        counts = conn.execute(
            "SELECT (SELECT count(*) FROM raw.transactions), (SELECT count(*) FROM raw.events), "
            "(SELECT count(*) FROM core.transactions)"
        ).fetchone()
    assert counts == (1200, 30, 1200)
    with pytest.raises(LakeError, match="its bucket does not exist"):
        FieldSalesWarehouse(
            ducklake_catalog=catalog,
            ducklake_data_path=f"s3://{bucket}-gone/fieldsales/",
            s3_endpoint=store.endpoint,
        ).get_connection()


def test_an_alert_never_carries_the_object_stores_secret_key(monkeypatch):
    monkeypatch.setenv("FIELDSALES_S3_SECRET_ACCESS_KEY", "ours-secret-0123456789")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret-0123456789")
    secrets = component().alert_settings().secrets()
    assert {"ours-secret-0123456789", "aws-secret-0123456789"} <= set(secrets)
