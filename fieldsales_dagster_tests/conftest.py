"""Shared fixtures: the bundled demo API on an ephemeral loopback port, a client, a lake; and
the scan every test passes: no run it made failed without saying why."""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import dagster as dg
import duckdb
import pytest

from fieldsales_dagster.client.api import FieldSalesAPI
from fieldsales_dagster.warehouse import lake as lake_module
from fieldsales_dagster.warehouse.warehouse import FieldSalesWarehouse


@pytest.fixture(autouse=True)
def isolated_state(tmp_path, monkeypatch):
    """Keep every test's token store and lake under its own tmp_path (no export)."""
    monkeypatch.setenv("FIELDSALES_TOKEN_STORE", str(tmp_path / "token_store.json"))
    catalog, data_path = lake_paths(tmp_path)
    monkeypatch.setenv("FIELDSALES_DUCKLAKE_CATALOG", catalog)
    monkeypatch.setenv("FIELDSALES_DUCKLAKE_DATA_PATH", data_path)
    for variable in ("FIELDSALES_DUCKDB_PATH", "DAGSTER_HOME"):
        monkeypatch.delenv(variable, raising=False)


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "silent_failures_expected: the test makes runs fail silently (kills them); no scan",
    )


@pytest.fixture(autouse=True)
def no_silent_failure(request, tmp_path, monkeypatch):
    """Fail a test whose runs failed without saying why (``silent_failures``): the in-process
    runs it started (``dg.materialize`` and the like all go through ``execute_in_process``) and
    the runs of every instance it made under its ``tmp_path`` (``dg launch``, ``dagster asset
    materialize`` with ``DAGSTER_HOME`` there)."""
    results: list[dg.ExecuteInProcessResult] = []
    execute = dg.JobDefinition.execute_in_process

    def recorded(job, *args, **kwargs):
        results.append(execute(job, *args, **kwargs))
        return results[-1]

    monkeypatch.setattr(dg.JobDefinition, "execute_in_process", recorded)
    yield
    if request.node.get_closest_marker("silent_failures_expected"):
        return
    found = [line for r in results for line in silent_failures(r.run_id, r.all_events)]
    for runs_db in tmp_path.glob("**/history/runs.db"):
        found += silent_failures_in(runs_db.parent.parent)
    assert not found, "runs failed without saying why:\n" + "\n".join(found)


def silent_failures_in(home: Path) -> list[str]:
    """``silent_failures`` of every failed or unfinished run of the instance in ``home``."""
    unfinished = {dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.STARTED}
    with dg.DagsterInstance.local_temp(str(home)) as instance:
        return [
            line
            for run in instance.get_runs()
            if run.status in unfinished
            for line in silent_failures(
                run.run_id,
                [
                    entry.dagster_event
                    for entry in instance.all_logs(run.run_id)
                    if entry.dagster_event
                ],
            )
        ]


def silent_failures(run: str, events: Iterable[dg.DagsterEvent]) -> list[str]:
    """What a run's events leave unsaid: a step that started and never ended (its process died:
    no STEP_FAILURE), a step failure whose error (the innermost cause) has no message, a run
    failure that does not name each failed step or, with none, says nothing."""
    started: set[str] = set()
    failed: dict[str, str] = {}
    ended: set[str] = set()
    run_failure = None
    for event in events:
        step, kind = event.step_key or "", event.event_type
        error = getattr(event.event_specific_data, "error", None)
        if kind == dg.DagsterEventType.STEP_START:
            started.add(step)
        elif kind == dg.DagsterEventType.STEP_SUCCESS:
            ended.add(step)
        elif kind == dg.DagsterEventType.STEP_FAILURE:
            while error is not None and error.cause is not None:  # past Dagster's wrappers
                error = error.cause
            failed[step] = error.message.partition(":")[2].strip() if error else ""
        elif kind == dg.DagsterEventType.RUN_FAILURE:
            run_failure = f"{event.message or ''} {error.to_string() if error else ''}".strip()
        elif kind == dg.DagsterEventType.RUN_CANCELED:
            return []  # stopped on purpose
    found = [
        f"step {step} started and never ended: no STEP_FAILURE (did its process die?)"
        for step in sorted(started - ended - failed.keys())
    ]
    found += [
        f"step {step} failed with no error message" for step, why in failed.items() if not why
    ]
    if run_failure is not None:
        found += [
            f"the run failure does not name step {step}"
            for step in failed
            if step not in run_failure
        ]
        if not (failed or run_failure):
            found.append("the run failed saying nothing")
    return [f"run {run}: {line}" for line in found]


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


def attach_again(warehouse: FieldSalesWarehouse) -> None:
    """The next connection to ``warehouse``'s lake attaches it again, as a new process's first
    does (a lake an earlier release changed is upgraded then: ``lake.upgrade``)."""
    for key in [key for key in lake_module._INSTANCES if warehouse.lake in key]:
        lake_module._INSTANCES.pop(key).close()


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
