"""An S3-compatible server on loopback for the tests: moto's server mode, in a process of its own,
on an ephemeral port. It checks every request's signature against the keys it handed out (its
IAM, enabled after the three requests that make the user, its policy and its keys), so wrong
keys are refused as a real object store refuses them."""

from __future__ import annotations

import json
import re
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import boto3

from fieldsales_dagster_tests.processes import clean_env, process_group, tail

START_TIMEOUT_S = 60.0
#: Requests moto serves before it checks signatures: the user, its policy and its keys.
SETUP_REQUESTS = 3
REGION = "us-east-1"
LISTENING = re.compile(r"Running on (http://127\.0\.0\.1:\d+)")


@dataclass(frozen=True)
class ObjectStoreServer:
    endpoint: str
    key_id: str
    secret: str

    def client(self, secret: str | None = None):
        """A boto3 S3 client of this server, with its keys (or another ``secret``)."""
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=self.key_id,
            aws_secret_access_key=secret or self.secret,
        )

    def new_bucket(self) -> str:
        name = f"lake-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str, prefix: str = "") -> set[str]:
        """Every object's key in ``bucket`` (under ``prefix``)."""
        pages = (
            self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        )
        return {item["Key"] for page in pages for item in page.get("Contents", [])}


@contextmanager
def running_object_store(folder: Path) -> Iterator[ObjectStoreServer]:
    """Start moto's S3 server on 127.0.0.1 (its log in ``folder``), make a user with keys that
    may do anything; stop it after."""
    log = folder / "moto_server.log"
    server = str(Path(sys.executable).parent / "moto_server")
    env = clean_env(INITIAL_NO_AUTH_ACTION_COUNT=str(SETUP_REQUESTS))
    with process_group([server, "-H", "127.0.0.1", "-p", "0"], log, env) as proc:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (found := LISTENING.search(log.read_text(errors="replace"))):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"moto_server did not start:\n{tail(log)}")
            time.sleep(0.1)
        endpoint = found.group(1)
        iam = boto3.client(
            "iam",
            endpoint_url=endpoint,
            region_name=REGION,
            aws_access_key_id="setup",
            aws_secret_access_key="setup",
        )
        iam.create_user(UserName="lake")
        everything = {"Effect": "Allow", "Action": "*", "Resource": "*"}
        iam.put_user_policy(
            UserName="lake",
            PolicyName="everything",
            PolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": [everything]}),
        )
        keys = iam.create_access_key(UserName="lake")["AccessKey"]
        yield ObjectStoreServer(endpoint, keys["AccessKeyId"], keys["SecretAccessKey"])
