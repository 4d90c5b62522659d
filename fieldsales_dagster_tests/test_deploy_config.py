"""deploy/: the production instance and the Docker/Kubernetes run launchers, as Dagster reads them.

No container engine runs here: each run-launcher snippet is merged into deploy/dagster.yaml and
validated against the instance schema and against its launcher class's own config schema.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import yaml
from dagster import DagsterInstance
from dagster._config import process_config
from dagster._core.instance.config import dagster_instance_config

from fieldsales_dagster.automation.schedule import REFRESH_TAG

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"


def load_instance_config(tmp_path: Path, *snippets: str) -> dict:
    """deploy/dagster.yaml with ``snippets`` merged in, validated as a DAGSTER_HOME would be."""
    config = yaml.safe_load((DEPLOY / "dagster.yaml").read_text())
    for snippet in snippets:
        config.update(yaml.safe_load((DEPLOY / snippet).read_text()))
    (tmp_path / "dagster.yaml").write_text(yaml.safe_dump(config))
    validated, _ = dagster_instance_config(str(tmp_path))
    return validated


def run_launcher_errors(run_launcher: dict) -> list:
    klass = getattr(importlib.import_module(run_launcher["module"]), run_launcher["class"])
    result = process_config(klass.config_type(), run_launcher.get("config", {}))
    return list(result.errors or [])


def test_production_instance_keeps_runs_events_and_ticks_in_postgres_from_the_url(tmp_path):
    config = load_instance_config(tmp_path)
    assert config["storage"] == {"postgres": {"postgres_url": {"env": "DAGSTER_POSTGRES_URL"}}}


def test_production_queue_runs_one_refresh_at_a_time(tmp_path):
    config = load_instance_config(tmp_path)
    assert config["run_coordinator"]["class"] == "QueuedRunCoordinator"
    limits = config["concurrency"]["runs"]["tag_concurrency_limits"]
    assert {"key": REFRESH_TAG, "limit": 1} in limits


def test_production_pools_let_one_duckdb_writer_run_at_a_time(tmp_path):
    config = load_instance_config(tmp_path)
    assert config["concurrency"]["pools"]["default_limit"] == 1


@pytest.mark.parametrize(
    ("snippet", "launcher"),
    [
        ("run_launcher.docker.yaml", "DockerRunLauncher"),
        ("run_launcher.k8s.yaml", "K8sRunLauncher"),
    ],
)
def test_container_run_launcher_snippet_is_valid_instance_config(tmp_path, snippet, launcher):
    config = load_instance_config(tmp_path, snippet)
    assert config["run_launcher"]["class"] == launcher
    assert run_launcher_errors(config["run_launcher"]) == []


def test_misspelt_run_launcher_setting_is_refused(tmp_path):
    config = load_instance_config(tmp_path, "run_launcher.k8s.yaml")
    run_launcher = config["run_launcher"]
    run_launcher["config"]["job_namespaces"] = run_launcher["config"].pop("job_namespace")
    assert run_launcher_errors(run_launcher)


@pytest.mark.parametrize(
    ("config_file", "snippet"),
    [
        ("deploy/dagster.yaml", None),
        ("deploy/dagster.yaml", "run_launcher.docker.yaml"),
        ("deploy/dagster.yaml", "run_launcher.k8s.yaml"),
        ("dagster.yaml", None),
    ],
)
def test_every_instance_config_retries_a_run_whose_worker_died(tmp_path, config_file, snippet):
    # A run killed by its host (evicted pod, OOM-killed container) is launched again by the
    # daemon: the instance, as Dagster builds it from the file, has run retries on.
    config = yaml.safe_load((DEPLOY.parent / config_file).read_text())
    if snippet:
        config.update(yaml.safe_load((DEPLOY / snippet).read_text()))
    config.pop("storage", None)  # PostgreSQL, or a folder relative to the project: not here
    (tmp_path / "dagster.yaml").write_text(yaml.safe_dump(config))
    validated, _ = dagster_instance_config(str(tmp_path))
    assert validated["run_retries"]["enabled"] is True
    assert validated["run_retries"]["max_retries"] >= 1
    # Only a dead worker is retried (a step's failure would repeat), and only monitoring sees it.
    assert validated["run_retries"]["retry_on_asset_or_op_failure"] is False
    assert validated["run_monitoring"]["enabled"] is True
    if snippet is None:  # the container launchers need a Docker or Kubernetes API to start
        instance = DagsterInstance.from_config(str(tmp_path))
        assert instance.run_retries_enabled
        assert instance.run_retries_max_retries == validated["run_retries"]["max_retries"]
        assert not instance.run_retries_retry_on_asset_or_op_failure
        assert instance.run_monitoring_enabled
