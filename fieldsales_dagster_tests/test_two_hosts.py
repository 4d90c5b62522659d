"""Several machines with no shared disk, for real: two "hosts" and a reader that share nothing
but moto's S3 server (object_store.py, checking signatures and policies) and PostgreSQL (the lake's
catalog and the token's row). Each host has a Dagster home, a temporary folder and a working
directory of its own, and runs ``dagster job execute`` subprocesses with only its environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import boto3
import botocore.exceptions
import dagster as dg
import psycopg2.errors
import pytest

from fieldsales_dagster.client.endpoints import GENERATE_TOKEN_PATH
from fieldsales_dagster.warehouse.warehouse import FieldSalesWarehouse
from fieldsales_dagster_tests import test_ducklake, test_lake_s3, test_token_catalog
from fieldsales_dagster_tests.object_store import REGION
from fieldsales_dagster_tests.processes import clean_env
from fieldsales_dagster_tests.test_lake_s3 import listed_files
from fieldsales_dagster_tests.test_token_catalog import (
    PASSWORD_VARIABLE,
    admin,
    backdate,
    row,
)
from fieldsales_dagster_tests.test_token_renewal_sensor import accepted, host_env, requests_to

#: PostgreSQL, a catalog database owned by a login role of its own; moto; 300 transactions.
postgres, catalog = test_token_catalog.postgres, test_token_catalog.catalog
store, small_demo = test_lake_s3.store, test_ducklake.small_demo
#: The guard of every process a host runs (not a timing assertion: a hung run fails the test).
GUARD_S = 300
DAGSTER = str(Path(sys.executable).parent / "dagster")


class Fleet:
    """The lake of one test: its bucket, its catalog, the settings every host is given."""

    def __init__(self, root: Path, server, store, catalog: str):
        self.root, self.server, self.store, self.catalog = root, server, store, catalog
        self.bucket = store.new_bucket()
        self.data_path = f"s3://{self.bucket}/lake/"
        self.settings = {
            "FIELDSALES_BASE_URL": server.base_url,
            "FIELDSALES_API_TOKEN": server.token,
            "FIELDSALES_TOKEN_STORE": "catalog",
            "FIELDSALES_DUCKLAKE_CATALOG": catalog,
            PASSWORD_VARIABLE: os.environ[PASSWORD_VARIABLE],
            "FIELDSALES_DUCKLAKE_DATA_PATH": self.data_path,
            "FIELDSALES_S3_ENDPOINT": store.endpoint,
            "FIELDSALES_S3_ACCESS_KEY_ID": store.key_id,
            "FIELDSALES_S3_SECRET_ACCESS_KEY": store.secret,
        }

    def host(self, name: str, **settings: str) -> tuple[Path, dict[str, str]]:
        """A host's folder (its working directory) and its whole environment."""
        folder = self.root / name
        return folder, clean_env(**host_env(folder), **{**self.settings, **settings})

    def start(self, host: str, *args: str) -> subprocess.Popen:
        """``dagster job execute`` of this project's job on ``host``."""
        folder, env = self.host(host)
        return subprocess.Popen(
            [DAGSTER, "job", "execute", "-m", "fieldsales_dagster", *args],
            cwd=folder,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def lake(self, monkeypatch) -> FieldSalesWarehouse:
        """The lake as the test reads it (the keys in our variables, as a host has them)."""
        monkeypatch.setenv("FIELDSALES_S3_ACCESS_KEY_ID", self.store.key_id)
        monkeypatch.setenv("FIELDSALES_S3_SECRET_ACCESS_KEY", self.store.secret)
        return FieldSalesWarehouse(
            ducklake_catalog=self.catalog,
            ducklake_data_path=self.data_path,
            s3_endpoint=self.store.endpoint,
        )

    def objects(self) -> set[str]:
        return {f"s3://{self.bucket}/{key}" for key in self.store.keys(self.bucket)}


def finished(*procs: subprocess.Popen) -> list[tuple[int, str]]:
    """Each process's exit code and output, once all have ended (each within the guard)."""
    outputs = [proc.communicate(timeout=GUARD_S)[0] for proc in procs]
    return [(proc.returncode, out) for proc, out in zip(procs, outputs, strict=True)]


def assert_exact(lake: FieldSalesWarehouse, server) -> None:
    """The lake's last complete refresh holds the demo API's lists, each id once."""
    with lake.read_connection() as conn:
        for table, column in (
            ("raw.transactions", "id"),
            ("raw.events", "id"),
            ("raw.event_groups", "id"),
            ("core.transactions", "transaction_id"),
            ("core.events", "event_id"),
        ):
            ids = [id_ for (id_,) in conn.execute(f"SELECT {column} FROM {table}").fetchall()]
            assert sorted(ids) == sorted(server.dataset.ids(table.partition(".")[2])), table


def read_only_keys(store, bucket: str) -> tuple[str, str]:
    """Keys of a moto user whose policy lets it list and read ``bucket``, nothing more."""
    iam = boto3.client(
        "iam",
        endpoint_url=store.endpoint,
        region_name=REGION,
        aws_access_key_id=store.key_id,
        aws_secret_access_key=store.secret,
    )
    user = f"reader-{bucket}"
    iam.create_user(UserName=user)
    read = {
        "Effect": "Allow",
        "Action": ["s3:GetObject", "s3:ListBucket"],
        "Resource": [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"],
    }
    iam.put_user_policy(
        UserName=user,
        PolicyName="read",
        PolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": [read]}),
    )
    keys = iam.create_access_key(UserName=user)["AccessKey"]
    return keys["AccessKeyId"], keys["SecretAccessKey"]


def read_only_role(postgres, catalog: str) -> tuple[str, str]:
    """A login role that may only SELECT the lake's catalog tables, those the lake's role
    creates later too (not the token's schema); its catalog string and password."""
    owner = catalog.rpartition("user=")[2]
    role, password = f"reader_{owner}"[:60], "reader-password-0451"
    with admin(postgres) as cur:
        cur.execute(f'CREATE ROLE "{role}" LOGIN PASSWORD %s', (password,))
    with test_token_catalog.connect(catalog) as cur:
        cur.execute(f'GRANT USAGE ON SCHEMA public TO "{role}"')
        cur.execute(f'GRANT SELECT ON ALL TABLES IN SCHEMA public TO "{role}"')
        cur.execute(f'ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT ON TABLES TO "{role}"')
    return f"{catalog.rpartition('user=')[0]}user={role}", password


READER_SCRIPT = """
import sys, duckdb
opening = open("open_lake.sql").read()
counts = "SELECT (SELECT count(*) FROM core.transactions), (SELECT count(*) FROM raw.events)"
held = duckdb.connect()
held.execute(opening)
print(*held.execute(counts).fetchone(), flush=True)
sys.stdin.readline()  # another host's refresh has committed meanwhile
print(*held.execute(counts).fetchone(), flush=True)
again = duckdb.connect()
again.execute(opening)
print(*again.execute(counts).fetchone(), flush=True)
"""


def start_reader(fleet: Fleet, catalog: str, password: str, keys: tuple[str, str]):
    """A reader on a host of its own, with read-only credentials, the analysts' way
    (docs/storage.md): ``open_lake.sql`` written by ``python -m fieldsales_dagster.warehouse.lake``,
    its secret lines filled in, run by a DuckDB client that holds the connection it opened."""
    folder, env = fleet.host(
        "reader",
        FIELDSALES_DUCKLAKE_CATALOG=catalog,
        FIELDSALES_S3_ACCESS_KEY_ID=keys[0],
        FIELDSALES_S3_SECRET_ACCESS_KEY=keys[1],
    )
    for variable in ("FIELDSALES_API_TOKEN", PASSWORD_VARIABLE):
        env.pop(variable)
    written = subprocess.run(
        [sys.executable, "-m", "fieldsales_dagster.warehouse.lake"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=GUARD_S,
    )
    assert written.returncode == 0, written.stderr
    endpoint = f"ENDPOINT '{urlsplit(fleet.store.endpoint).netloc}', USE_SSL false"
    filled = []
    for line in written.stdout.splitlines():
        if line.startswith("-- the password: "):
            line = f"CREATE TEMPORARY SECRET (TYPE postgres, PASSWORD '{password}');"
        elif line.startswith("-- the object store's keys"):  # with an S3-compatible endpoint
            assert endpoint in line  # from FIELDSALES_S3_ENDPOINT, as the runs read it
            line = line.split(": ", 1)[1].replace(
                "KEY_ID '...', SECRET '...'", f"KEY_ID '{keys[0]}', SECRET '{keys[1]}'"
            )
        filled.append(line)
    (folder / "open_lake.sql").write_text("\n".join(filled))
    return subprocess.Popen(
        [sys.executable, "-c", READER_SCRIPT],
        cwd=folder,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def hold_the_renewals_answer(server, monkeypatch) -> None:
    """The server rotates the token at once but answers the renewal only after a request with the
    old token was refused, and a second later: a slow network, during which the other host must
    wait for the row's lock instead of reading the old token again."""
    rotate = server.renew_token

    def slow_answer() -> str:
        token = rotate()
        deadline = time.monotonic() + GUARD_S / 2
        while not any(r.status == 401 for r in server.requests) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)
        return token

    monkeypatch.setattr(server, "renew_token", slow_answer)


def test_two_hosts_and_a_reader_share_only_the_object_store_and_postgresql(
    small_demo, store, catalog, postgres, tmp_path, monkeypatch
):
    fleet = Fleet(tmp_path, small_demo, store, catalog)
    lake = fleet.lake(monkeypatch)
    old_token = small_demo.token

    # 1. Host A's and host B's refresh at once: each succeeds or fails naming the conflict.
    outcomes = finished(*(fleet.start(h, "-j", "refresh_all") for h in ("host_a", "host_b")))
    for code, out in outcomes:
        assert code == 0 or "conflicted with another writer" in out, out[-4000:]
    assert any(code == 0 for code, _ in outcomes), [out[-2000:] for _, out in outcomes]
    assert_exact(lake, small_demo)
    assert listed_files(lake) <= fleet.objects()  # no file of the lake missing from the bucket

    # 2. A reader with read-only credentials opens the lake; they may not write.
    keys = read_only_keys(store, fleet.bucket)
    reader_catalog, password = read_only_role(postgres, catalog)
    reader_s3 = boto3.client(
        "s3",
        endpoint_url=store.endpoint,
        region_name=REGION,
        aws_access_key_id=keys[0],
        aws_secret_access_key=keys[1],
    )
    with pytest.raises(botocore.exceptions.ClientError, match="AccessDenied"):
        reader_s3.put_object(Bucket=fleet.bucket, Key="lake/written-by-the-reader", Body=b"x")
    with (
        pytest.raises(psycopg2.errors.InsufficientPrivilege),
        test_token_catalog.connected(reader_catalog.removeprefix("postgres:"), password) as cur,
    ):
        cur.execute("DELETE FROM ducklake_snapshot")
    reader = start_reader(fleet, reader_catalog, password, keys)
    try:
        before = reader.stdout.readline().split()
        assert before == ["300", str(small_demo.dataset.count("events"))], reader.stderr.read()

        # 3. The data changes, the token is due; host A's renewal and host B's refresh at once.
        changes = small_demo.behaviour.evolve(1)
        backdate(catalog, 46)
        hold_the_renewals_answer(small_demo, monkeypatch)
        (renewed, renewal), (refreshed, refresh) = finished(
            fleet.start("host_a", "-j", "renew_token"), fleet.start("host_b", "-j", "refresh_all")
        )
        assert renewed == 0, renewal[-4000:]
        assert refreshed == 0, refresh[-4000:]

        out, err = reader.communicate("go\n", timeout=GUARD_S)
    finally:
        reader.kill()
    assert reader.returncode == 0, err
    held, reopened = (line.split() for line in out.splitlines())
    assert held == before  # the reader's snapshot, whole, while B's refresh committed
    transactions = 300 + changes["transactions_added"] - changes["transactions_deleted"]
    assert reopened == [str(transactions), str(small_demo.dataset.count("events"))] != before
    assert requests_to(small_demo, GENERATE_TOKEN_PATH) == 1
    assert any(r.status == 401 for r in small_demo.requests)  # B met the renewal
    assert row(catalog)["token"] == small_demo.token != old_token
    assert accepted(small_demo, small_demo.token)
    assert_exact(lake, small_demo)

    # 4. Host A's upkeep deletes an orphaned object under the data path, and only it.
    one = sorted(store.keys(fleet.bucket))[0]
    body = store.client().get_object(Bucket=fleet.bucket, Key=one)["Body"].read()
    orphan = f"{one.rpartition('/')[0]}/ducklake-killed-run.parquet"
    beside = "lake-archive/ducklake-kept.parquet"
    for key in (orphan, beside):
        store.client().put_object(Bucket=fleet.bucket, Key=key, Body=body)
    config = tmp_path / "upkeep.yaml"
    config.write_text(json.dumps({"ops": {"ducklake_upkeep": {"config": {"orphan_age_hours": 0}}}}))
    [(code, upkeep)] = finished(fleet.start("host_a", "-j", "lake_upkeep", "-c", str(config)))
    assert code == 0, upkeep[-4000:]
    after = fleet.objects()
    assert f"s3://{fleet.bucket}/{orphan}" not in after
    assert f"s3://{fleet.bucket}/{beside}" in after
    assert listed_files(lake) <= after
    with dg.DagsterInstance.local_temp(str(tmp_path / "host_a" / "dagster_home")) as instance:
        event = instance.get_latest_materialization_event(dg.AssetKey("ducklake_upkeep"))
    assert event.asset_materialization.metadata["orphans_deleted"].value == 1
    assert_exact(lake, small_demo)

    shown = "".join(o for _, o in outcomes) + renewal + refresh + out + err + upkeep
    for secret in (store.secret, keys[1], password, old_token, small_demo.token):
        assert secret not in shown
