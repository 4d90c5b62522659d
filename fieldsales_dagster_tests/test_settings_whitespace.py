"""Whitespace around a setting (issue 31, class 4): a stray space in an env file or a compose
file is trimmed for every setting, and a path that differs from an existing one only by
whitespace is refused, naming the setting.

Before: a trailing space in FIELDSALES_DUCKDB_PATH gave a green run that wrote a new file whose
name ends in a space, while the analysts' file stayed stale.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic_core import PydanticUndefined

from fieldsales_dagster.component import SettingError
from fieldsales_dagster.settings import SETTINGS
from fieldsales_dagster.warehouse.warehouse import FieldSalesWarehouse
from fieldsales_dagster_tests.project import component, load_project_defs, spelled, value_of

BASE_URL = "http://127.0.0.1:9"
#: A valid value of the settings whose default is unset (or required), as a variable holds it.
SAMPLES = {
    "base_url": BASE_URL,
    "api_token": "ACME_FIELDSALES_TOKEN",
    "ducklake_catalog": "sqlite:acme.ducklake.sqlite",
    "duckdb_path": "data/acme.duckdb",
    "ducklake_data_path": "lake_files",
    "ducklake_schema": "acme",
    "key_prefix": "acme",
    "group_prefix": "acme_group",
    "alert_email_to": "data@example.com, oncall@example.com",
    "alert_smtp_user": "alerts",
    "ui_base_url": "http://dagster.example:3000",
    "s3_endpoint": "objects.example.com:9000",
    "s3_region": "eu-central-1",
    "s3_url_style": "path",
}
PADDING = [" ", "\t", "\r\n", " \n "]


def sample(name: str) -> Any:
    """A valid value of setting ``name`` as an env file gives it: text (a list stays a list)."""
    default = SETTINGS[name].default
    if name in SAMPLES or default is None or default is PydanticUndefined:
        return SAMPLES[name]
    if isinstance(default, bool):
        return str(default).lower()
    return default if isinstance(default, list) else str(default)


def padded(value: Any, pad: str) -> Any:
    if isinstance(value, list):
        return [f"{pad}{item}{pad}" for item in value]
    return f"{pad}{value}{pad}"


@pytest.mark.parametrize("pad", PADDING, ids=repr)
@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_whitespace_around_every_setting_is_trimmed(name, pad):
    value = sample(name)
    clean = value_of(component(**spelled(name, value)), name)
    assert value_of(component(**spelled(name, padded(value, pad))), name) == clean
    if isinstance(clean, str):
        assert clean == clean.strip()


def test_a_trailing_space_in_the_duckdb_path_variable_reaches_the_warehouse_trimmed(
    monkeypatch, tmp_path
):
    """The issue's case, through defs.yaml and the environment as a deployment sets it."""
    monkeypatch.setenv("FIELDSALES_BASE_URL", BASE_URL + " ")
    monkeypatch.setenv("FIELDSALES_API_TOKEN", "whitespace-test-token")
    monkeypatch.setenv("FIELDSALES_DUCKDB_PATH", f"{tmp_path / 'fieldsales.duckdb'} ")
    monkeypatch.setenv("FIELDSALES_TOKEN_STORE", f" {tmp_path / 'token.json'}\r\n")
    monkeypatch.setenv("FIELDSALES_PAGE_SIZE", " 250 ")
    catalog = f"sqlite:{tmp_path / 'fieldsales.ducklake.sqlite'}"
    monkeypatch.setenv("FIELDSALES_DUCKLAKE_CATALOG", f"{catalog}\t")
    defs = load_project_defs()
    api, warehouse = defs.resources["fieldsales_api"], defs.resources["warehouse"]
    assert warehouse.duckdb_path == str(tmp_path / "fieldsales.duckdb")
    assert warehouse.ducklake_catalog == catalog
    assert api.token_store_path == str(tmp_path / "token.json")
    assert (api.base_url, api.page_size) == (BASE_URL, 250)


@pytest.mark.parametrize("setting", ["duckdb_path", "token_store_path"])
def test_a_path_that_differs_from_an_existing_one_only_by_whitespace_is_refused(
    monkeypatch, tmp_path, setting
):
    """An earlier run with a stray space left ``name `` beside ``name``: which one holds the
    data? The load refuses to guess, naming the setting and both files."""
    monkeypatch.setenv("FIELDSALES_API_TOKEN", "whitespace-test-token")
    paths = {"duckdb_path": tmp_path / "fieldsales.duckdb", "token_store_path": tmp_path / "t.json"}
    twin = tmp_path / f"{paths[setting].name} "
    twin.write_text("written by a run whose setting ended in a space")
    built = component(
        api={"token_store_path": str(paths["token_store_path"])},
        storage={"duckdb_path": str(paths["duckdb_path"])},
    )
    with pytest.raises(SettingError) as raised:
        built.build_resources()
    message = str(raised.value)
    assert f"setting {SETTINGS[setting].spelling} (from {SETTINGS[setting].variable})" in message
    assert "differs only by whitespace" in message and repr(str(twin)) in message


def test_a_warehouse_built_by_hand_with_a_spaced_export_name_is_refused(tmp_path):
    folder = tmp_path / "export"
    folder.mkdir()
    warehouse = FieldSalesWarehouse(duckdb_path=f"{folder / 'fieldsales.duckdb'} ")
    with pytest.raises(Exception, match=r"duckdb_path .* has whitespace around its name"):
        warehouse.export()
    assert list(folder.iterdir()) == []
