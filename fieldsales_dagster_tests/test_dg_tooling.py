"""`dg` knows the component: it lists it with its docs, scaffolds a tenant that loads, and lists
the variables the shipped defs.yaml reads."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fieldsales_dagster.component import ScaffoldNameError, tenant_defs_yaml
from fieldsales_dagster.settings import SETTINGS

REPO_ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
DEFS_YAML = REPO_ROOT / "fieldsales_dagster" / "defs" / "fieldsales" / "defs.yaml"
COMPONENT = "fieldsales_dagster.FieldSalesComponent"


def variables_read(attributes: dict) -> set[str]:
    """Every ``env.NAME`` the attributes' templates read (``DAGSTER_HOME`` is Dagster's own)."""
    return set(re.findall(r"\benv\.([A-Za-z_][A-Za-z0-9_]*)", json.dumps(attributes))) - {
        "DAGSTER_HOME"
    }


def dg(
    *args: str, cwd: Path = REPO_ROOT, env: dict[str, str] | None = None, fails: bool = False
) -> str:
    """``dg args`` must succeed (``fails``: must fail): its standard output (``fails``: and
    error)."""
    done = subprocess.run(
        [str(BIN / "dg"), *args],
        cwd=cwd,
        env={
            **os.environ,
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "VIRTUAL_ENV": str(BIN.parent),
            **(env or {}),
        },
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (done.returncode != 0) == fails, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout + done.stderr if fails else done.stdout


def project_copy(tmp_path: Path) -> Path:
    """A copy of this project (its package and configuration) in ``tmp_path / "project"``."""
    project = tmp_path / "project"
    project.mkdir()
    for name in ("pyproject.toml", "dagster.yaml", "workspace.yaml"):
        shutil.copy(REPO_ROOT / name, project / name)
    shutil.copytree(
        REPO_ROOT / "fieldsales_dagster",
        project / "fieldsales_dagster",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    return project


def test_dg_list_components_lists_the_component_with_its_docs():
    listed = {item["key"]: item for item in json.loads(dg("list", "components", "--json"))["items"]}
    assert listed[COMPONENT]["summary"].startswith("One Field-Sales instance")
    description = dg("utils", "inspect-component", COMPONENT, "--description")
    assert "dg scaffold defs fieldsales_dagster.FieldSalesComponent acme" in description


def test_defs_yaml_requires_every_variable_it_reads():
    document = yaml.safe_load(DEFS_YAML.read_text())
    read = variables_read(document["attributes"])
    # ... and the variables holding secrets, read by name at run time (pii_hash_key_env_var, ...)
    secrets = {s.default for name, s in SETTINGS.items() if name.endswith("_env_var")}
    assert read | secrets == set(document["requirements"]["env"])
    assert {s.variable for s in SETTINGS.values() if s.variable} <= read


def test_dg_list_env_shows_the_fieldsales_variables():
    shown = dg("list", "env")
    document = yaml.safe_load(DEFS_YAML.read_text())
    for variable in document["requirements"]["env"]:
        assert variable in shown, variable


def test_scaffolded_tenant_folder_loads_beside_the_shipped_one(tmp_path):
    project = project_copy(tmp_path)
    dg("scaffold", "defs", COMPONENT, "acme", cwd=project)
    written = project / "fieldsales_dagster" / "defs" / "acme" / "defs.yaml"
    document = yaml.safe_load(written.read_text())
    assert document["type"] == COMPONENT
    assert document["attributes"]["key_prefix"] == "acme"
    assert document["attributes"]["api"]["api_token"] == "{{ env.ACME_FIELDSALES_API_TOKEN }}"
    # ... and the variables of its own holding its secrets (lake password, PII key, alerts').
    secrets = {
        value
        for concern in document["attributes"].values()
        if isinstance(concern, dict)
        for key, value in concern.items()
        if key.endswith("_env_var")
    }
    assert set(document["requirements"]["env"]) == variables_read(document["attributes"]) | secrets
    token = "scaffold-test-token-0123456789"
    env = {
        "DAGSTER_HOME": str(tmp_path),
        "FIELDSALES_BASE_URL": "http://127.0.0.1:9",
        "FIELDSALES_API_TOKEN": token,
        "ACME_FIELDSALES_BASE_URL": "http://127.0.0.1:9",
        "ACME_FIELDSALES_API_TOKEN": token + "-acme",
        "FIELDSALES_CREATE_DIRS": "true",
    }
    (project / "data").mkdir()
    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    dg("check", "defs", cwd=project, env=env)
    # The copy's definitions were loaded (the acme folder exists only there), both tenants in it.
    listed = json.loads(dg("list", "defs", "--json", cwd=project, env=env))
    assert sorted(job["name"] for job in listed["jobs"]) == [
        "acme_lake_upkeep",
        "acme_refresh_all",
        "acme_renew_token",
        "lake_upkeep",
        "refresh_all",
        "renew_token",
    ]
    keys = {asset["asset_key"] for asset in listed["assets"]}
    assert {"acme/raw_events", "raw_events"} <= keys
    assert token not in written.read_text()
    shown = dg("list", "env", cwd=project)
    assert "ACME_FIELDSALES_API_TOKEN" in shown and "acme" in shown


def test_scaffolding_a_folder_that_cannot_be_a_key_prefix_names_the_rule():
    with pytest.raises(ScaffoldNameError, match="key_prefix, which must be a name of letters"):
        tenant_defs_yaml(COMPONENT, "acme-eu")
