"""Tenants of one code location never share a lake, a file, a token store, a key prefix or a pool.

Each test writes a real dg project of its own in ``tmp_path`` with one ``defs/<tenant>/defs.yaml``
per tenant and loads it the way ``dg`` and ``dagster`` do.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from fieldsales_dagster_tests.project import ASSETS, error_chain, instance_yaml
from fieldsales_dagster_tests.test_component import BIN, load_project, write_project

BASE_URL = "http://127.0.0.1:9"


@pytest.fixture(autouse=True)
def tenant_env(monkeypatch):
    monkeypatch.setenv("MAIN_TOKEN", "tenant-isolation-main-token")
    monkeypatch.setenv("ACME_TOKEN", "tenant-isolation-acme-token")


def tenant(token_variable: str, **settings: object) -> str:
    return instance_yaml(base_url=BASE_URL, api_token=f"{{{{ env.{token_variable} }}}}", **settings)


def two_tenants(tmp_path: Path, main: dict[str, object], acme: dict[str, object]) -> Path:
    """``defs/main`` (no key prefix) and ``defs/acme``; each gets files of its own unless told."""
    main = {
        "ducklake_catalog": f"sqlite:{tmp_path / 'main.ducklake.sqlite'}",
        "ducklake_data_path": tmp_path / "main_lake",
        "token_store_path": tmp_path / "main_token.json",
        **main,
    }
    acme = {
        "ducklake_catalog": f"sqlite:{tmp_path / 'acme.ducklake.sqlite'}",
        "ducklake_data_path": tmp_path / "acme_lake",
        "token_store_path": tmp_path / "acme_token.json",
        "key_prefix": "acme",
        **acme,
    }
    return write_project(
        tmp_path / "project",
        {"main": tenant("MAIN_TOKEN", **main), "acme": tenant("ACME_TOKEN", **acme)},
    )


def refusal(package: Path, monkeypatch) -> str:
    with pytest.raises(Exception) as failure:
        load_project(package, monkeypatch)
    return error_chain(failure.value)


def test_tenants_with_their_own_files_prefix_and_pool_load(tmp_path, monkeypatch):
    defs = load_project(two_tenants(tmp_path, {}, {}), monkeypatch)
    assert {job.name for job in defs.jobs} == {
        "refresh_all",
        "acme_refresh_all",
        "lake_upkeep",
        "acme_lake_upkeep",
        "renew_token",
        "acme_renew_token",
    }


def test_second_tenant_on_the_first_tenants_lake_is_refused_at_load(tmp_path, monkeypatch):
    shared = f"sqlite:{tmp_path / 'main.ducklake.sqlite'}"
    message = refusal(two_tenants(tmp_path, {}, {"ducklake_catalog": shared}), monkeypatch)
    assert "defs/main" in message and "defs/acme" in message
    assert "key_prefix acme" in message
    assert (
        f"the DuckLake {tmp_path / 'main.ducklake.sqlite'} (schema main) (ducklake_catalog of both)"
    ) in message
    assert "tenant-isolation" not in message  # no token


def test_one_catalog_with_a_schema_per_tenant_loads(tmp_path, monkeypatch):
    shared = f"sqlite:{tmp_path / 'shared.ducklake.sqlite'}"
    package = two_tenants(
        tmp_path,
        {"ducklake_catalog": shared, "ducklake_schema": "main_lake"},
        {"ducklake_catalog": shared, "ducklake_schema": "acme_lake"},
    )
    assert "acme_warehouse" in load_project(package, monkeypatch).resources


def test_tenant_whose_catalog_is_a_link_to_another_tenants_catalog_is_refused(
    tmp_path, monkeypatch
):
    volume = tmp_path / "volume"
    volume.mkdir()
    (volume / "lake.sqlite").write_bytes(b"")
    link = tmp_path / "acme_link.sqlite"
    link.symlink_to(volume / "lake.sqlite")
    package = two_tenants(
        tmp_path,
        {"ducklake_catalog": f"sqlite:{volume / 'lake.sqlite'}"},
        {"ducklake_catalog": f"sqlite:{link}"},
    )
    message = refusal(package, monkeypatch)
    assert (
        f"the DuckLake {link} (schema main) and {volume / 'lake.sqlite'} (schema main) "
        "(ducklake_catalog of each: one file, links and relative paths followed)"
    ) in message
    assert "defs/main" in message and "defs/acme" in message


def test_a_data_folder_inside_another_tenants_data_folder_is_refused_at_load(tmp_path, monkeypatch):
    """The first tenant's upkeep would delete the second's files, which its catalog does not list
    (reached through a link and a ``..`` segment here)."""
    (tmp_path / "main_lake" / "acme").mkdir(parents=True)
    (tmp_path / "volume").symlink_to(tmp_path / "main_lake")
    inside = f"{tmp_path}/volume/../volume/acme"
    package = two_tenants(tmp_path, {}, {"ducklake_data_path": inside})
    message = refusal(package, monkeypatch)
    assert "defs/main" in message and "defs/acme" in message
    outer = tmp_path / "main_lake"
    assert f"the lake data folder {inside} and {outer} (ducklake_data_path of each" in message
    assert "one folder holds the other" in message


def test_tenants_sharing_an_export_file_are_refused_at_load(tmp_path, monkeypatch):
    shared = tmp_path / "export.duckdb"
    package = two_tenants(tmp_path, {"duckdb_path": shared}, {"duckdb_path": shared})
    message = refusal(package, monkeypatch)
    assert f"the DuckDB export {shared} (duckdb_path of both)" in message


def test_tenants_sharing_a_token_store_are_refused_at_load(tmp_path, monkeypatch):
    shared = tmp_path / "main_token.json"
    message = refusal(two_tenants(tmp_path, {}, {"token_store_path": shared}), monkeypatch)
    assert f"the token store {shared} (token_store_path of both)" in message
    assert "defs/main" in message and "defs/acme" in message


def test_token_store_linked_to_another_tenants_store_is_refused_at_load(tmp_path, monkeypatch):
    real = tmp_path / "stores" / "main_token.json"
    real.parent.mkdir()
    link = tmp_path / "acme_token.json"
    link.symlink_to(real)  # the store need not exist yet: the link is followed anyway
    package = two_tenants(tmp_path, {"token_store_path": real}, {"token_store_path": link})
    message = refusal(package, monkeypatch)
    assert f"the token store {link} and {real} (token_store_path of each: one file" in message


def test_tenants_with_one_key_prefix_are_refused_naming_the_prefix_and_the_pool(
    tmp_path, monkeypatch
):
    package = two_tenants(tmp_path, {"key_prefix": "acme"}, {})
    message = refusal(package, monkeypatch)
    assert "defs/main" in message and "defs/acme" in message
    assert "the key prefix acme" in message
    assert "the pool fieldsales_duckdb_acme" in message


def test_two_tenants_without_a_key_prefix_are_refused(tmp_path, monkeypatch):
    package = two_tenants(tmp_path, {}, {"key_prefix": None})
    message = refusal(package, monkeypatch)
    assert "the key prefix (none)" in message
    assert "the pool fieldsales_duckdb" in message


def test_dg_check_defs_and_dagster_materialize_refuse_tenants_sharing_a_lake(tmp_path):
    """The CLIs operators run: both fail before any run, naming both tenants and the lake."""
    shared = tmp_path / "main.ducklake.sqlite"
    package = two_tenants(tmp_path, {}, {"ducklake_catalog": f"sqlite:{shared}"})
    (package / "definitions.py").write_text(
        "from pathlib import Path\n\nimport dagster as dg\n\n\n@dg.definitions\ndef defs():\n"
        "    return dg.load_from_defs_folder(path_within_project=Path(__file__).parent)\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(package.parent),
        "DAGSTER_HOME": str(tmp_path),
        "MAIN_TOKEN": "tenant-isolation-main-token",
        "ACME_TOKEN": "tenant-isolation-acme-token",
    }
    commands = [
        [str(BIN / "dg"), "check", "defs"],
        [
            str(BIN / "dagster"),
            "asset",
            "materialize",
            "-m",
            f"{package.name}.definitions",
            "--select",
            "*",
        ],
    ]
    for command in commands:
        done = subprocess.run(
            command, cwd=package.parent, env=env, capture_output=True, text=True, timeout=180
        )
        output = done.stdout + done.stderr
        assert done.returncode != 0, output[-3000:]
        assert f"the DuckLake {shared}" in output, output[-3000:]
        assert "defs/main" in output and "defs/acme" in output
    assert not shared.exists()  # refused before anything was written


def test_a_component_built_on_its_own_is_compared_with_nothing(monkeypatch):
    """Dagster's test helper builds one component outside any defs folder: nothing to compare."""
    from dagster.components.core.load_defs import build_defs_for_component

    from fieldsales_dagster.component import FieldSalesComponent

    monkeypatch.setenv("FIELDSALES_API_TOKEN", "tenant-isolation-main-token")
    # The default paths' folder (data/) need not exist here: create_dirs lets the load pass.
    defs = build_defs_for_component(
        FieldSalesComponent(api={"base_url": BASE_URL}, storage={"create_dirs": True})
    )
    assert {key.to_user_string() for asset in defs.assets for key in asset.keys} == ASSETS
