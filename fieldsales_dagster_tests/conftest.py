"""Shared fixtures: the bundled demo API on an ephemeral loopback port, a client, a lake."""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb
import pytest

from fieldsales_dagster.client.api import FieldSalesAPI
from fieldsales_dagster.warehouse.warehouse import FieldSalesWarehouse


@pytest.fixture(autouse=True)
def isolated_state(tmp_path, monkeypatch):
    """Keep every test's token store and lake under its own tmp_path (no export)."""
    monkeypatch.setenv("FIELDSALES_TOKEN_STORE", str(tmp_path / "token_store.json"))
    catalog, data_path = lake_paths(tmp_path)
    monkeypatch.setenv("FIELDSALES_DUCKLAKE_CATALOG", catalog)
    monkeypatch.setenv("FIELDSALES_DUCKLAKE_DATA_PATH", data_path)
    for variable in ("FIELDSALES_DUCKDB_PATH", "FIELDSALES_STORAGE", "DAGSTER_HOME"):
        monkeypatch.delenv(variable, raising=False)


def lake_paths(folder: Path, name: str = "fieldsales") -> tuple[str, str]:
    """The catalog and the (created) data folder of a lake named ``name`` under ``folder``."""
    data = folder / f"{name}_lake"
    data.mkdir(parents=True, exist_ok=True)
    return f"sqlite:{folder / f'{name}.ducklake.sqlite'}", str(data)


def make_warehouse(folder: Path, name: str = "fieldsales", **settings) -> FieldSalesWarehouse:
    """A warehouse on a lake of its own under ``folder`` (``name`` tells two lakes apart)."""
    catalog, data_path = lake_paths(folder, name)
    return FieldSalesWarehouse(ducklake_catalog=catalog, ducklake_data_path=data_path, **settings)


def lake_at(database: Path | str, **settings) -> FieldSalesWarehouse:
    """The warehouse on the lake tests name by a path, as they named DuckDB files: the lake
    ``<stem>`` in ``database``'s folder (``tmp_path / "fieldsales.duckdb"`` is the lake the
    environment of ``isolated_state`` points at)."""
    path = Path(database)
    return make_warehouse(path.parent, path.stem, **settings)


@contextmanager
def read_lake(
    warehouse: FieldSalesWarehouse | Path | str,
) -> Iterator[duckdb.DuckDBPyConnection]:
    """What an analyst opens: a read-only connection to the warehouse's lake (or ``lake_at``)."""
    if not isinstance(warehouse, FieldSalesWarehouse):
        warehouse = lake_at(warehouse)
    with warehouse.read_connection() as conn:
        yield conn


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
    return make_warehouse(tmp_path)


@pytest.fixture
def demo_env(monkeypatch, demo_server):
    """The environment the default instance's defs.yaml reads, pointed at the demo API."""
    monkeypatch.setenv("FIELDSALES_BASE_URL", demo_server.base_url)
    monkeypatch.setenv("FIELDSALES_API_TOKEN", demo_server.token)
    return demo_server
