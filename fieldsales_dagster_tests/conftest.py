"""Shared fixtures: the bundled demo API on an ephemeral loopback port, a client, a DuckDB file."""

from __future__ import annotations

import urllib.parse

import pytest

from fieldsales_dagster.client.resource import FieldSalesAPI
from fieldsales_dagster.warehouse.resource import FieldSalesWarehouse


@pytest.fixture(autouse=True)
def isolated_state(tmp_path, monkeypatch):
    """Keep every test's token store and DuckDB file under its own tmp_path."""
    monkeypatch.setenv("FIELDSALES_TOKEN_STORE", str(tmp_path / "token_store.json"))
    monkeypatch.setenv("FIELDSALES_DUCKDB_PATH", str(tmp_path / "fieldsales.duckdb"))
    monkeypatch.delenv("DAGSTER_HOME", raising=False)


@pytest.fixture
def demo_server():
    from fieldsales_dagster.demo_api import DemoConfig, DemoServer

    with DemoServer(DemoConfig(transactions=1200, seed=3), host="127.0.0.1", port=0) as server:
        yield server


def make_api(server, tmp_path, **overrides) -> FieldSalesAPI:
    settings = {
        "base_url": server.base_url,
        "api_token": server.token,
        # A token store belongs to one server (another server's client refuses it): tests that
        # refresh from two demo servers get a store per server.
        "token_store_path": str(
            tmp_path / f"token_store_{urllib.parse.urlsplit(server.base_url).port}.json"
        ),
        "page_size": 100,
        "concurrency": 4,
        "backoff_initial_s": 0.01,
        "backoff_max_s": 0.05,
        "max_retries": 4,
        "read_timeout_s": 10.0,
    }
    settings.update(overrides)
    return FieldSalesAPI(**settings)


@pytest.fixture
def api(demo_server, tmp_path) -> FieldSalesAPI:
    return make_api(demo_server, tmp_path)


@pytest.fixture
def warehouse(tmp_path) -> FieldSalesWarehouse:
    return FieldSalesWarehouse(database=str(tmp_path / "fieldsales.duckdb"), busy_timeout_s=1.0)


@pytest.fixture
def demo_env(monkeypatch, demo_server):
    """The environment the default instance's defs.yaml reads, pointed at the demo API."""
    monkeypatch.setenv("FIELDSALES_BASE_URL", demo_server.base_url)
    monkeypatch.setenv("FIELDSALES_API_TOKEN", demo_server.token)
    return demo_server
