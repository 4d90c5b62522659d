"""Each setting is defined once (``settings.py``): the component, the resources that receive it,
the default ``defs.yaml`` and the settings table of docs/configuration.md all agree with that one
definition."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError
from pydantic_core import PydanticUndefined

from fieldsales_dagster.client.api import FieldSalesAPI
from fieldsales_dagster.component import FieldSalesComponent, SettingError
from fieldsales_dagster.settings import RETIRED_SETTINGS, SETTING_KEY, SETTINGS, Setting
from fieldsales_dagster.warehouse.warehouse import FieldSalesWarehouse

REPO_ROOT = Path(__file__).resolve().parents[1]
CONFIGURATION = REPO_ROOT / "docs" / "configuration.md"
#: The pages a user reads: the README and docs/*.md.
USER_DOCS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
#: The pages whose Configuration table documents settings (alerts have a page of their own).
SETTINGS_DOCS = (CONFIGURATION, REPO_ROOT / "docs" / "alerts.md")
DEFS_YAML = REPO_ROOT / "fieldsales_dagster" / "defs" / "fieldsales" / "defs.yaml"
RESOURCES = (FieldSalesAPI, FieldSalesWarehouse)
#: Enough for a component or a resource to be built; the setting under test is added.
REQUIRED = {FieldSalesAPI: {"base_url": "http://127.0.0.1:9", "api_token": "x"}}
COMPONENT_REQUIRED = {"base_url": "http://127.0.0.1:9"}
#: The component field of each setting (the token's field holds its variable's name).
COMPONENT_FIELD = {"api_token": "api_token_env_var"}


def resource_fields() -> list[tuple[type, str, Setting]]:
    """Every (resource, field, setting) whose field receives one of the component's settings."""
    found = []
    for resource in RESOURCES:
        for name, info in resource.model_fields.items():
            extra = info.json_schema_extra
            if isinstance(extra, dict) and SETTING_KEY in extra:
                found.append((resource, name, SETTINGS[str(extra[SETTING_KEY])]))
    return found


def default_of(info: Any) -> Any:
    return info.default_factory() if info.default_factory is not None else info.default


def values_around(setting: Setting) -> tuple[list[float], list[float]]:
    """Values a setting must accept (its closed bounds, a value inside) and must refuse."""
    step = 1 if isinstance(setting.default, int) else 0.001
    accepted, refused = [setting.default], []
    for bound, inside, outside in (
        (setting.ge, setting.ge, (setting.ge or 0) - step),
        (setting.gt, (setting.gt or 0) + step, setting.gt),
        (setting.le, setting.le, (setting.le or 0) + step),
        (setting.lt, (setting.lt or 0) - step, setting.lt),
    ):
        if bound is not None:
            accepted.append(inside)
            refused.append(outside)
    return accepted, refused


def accepts(build: Any, **values: Any) -> bool:
    try:
        build(**values)
    except (ValidationError, SettingError, ValueError):
        return False
    return True


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_every_setting_is_a_component_field_with_its_default(name):
    setting = SETTINGS[name]
    field = FieldSalesComponent.model_fields[COMPONENT_FIELD.get(name, name)]
    if name == "api_token":  # the field holds the variable's name, never a token
        assert field.default == setting.variable
        return
    assert default_of(field) == setting.default
    assert field.is_required() == (setting.default is PydanticUndefined)
    assert field.description and setting.description in field.description


def test_every_component_field_is_a_setting_or_a_retired_one():
    fields = set(FieldSalesComponent.model_fields)
    assert fields == {COMPONENT_FIELD.get(name, name) for name in SETTINGS} | set(RETIRED_SETTINGS)


@pytest.mark.parametrize("name", [name for name, s in sorted(SETTINGS.items()) if s.bounds])
def test_the_component_takes_exactly_the_range_its_message_names(name):
    setting = SETTINGS[name]
    accepted, refused = values_around(setting)
    for value in accepted:
        assert accepts(FieldSalesComponent, **COMPONENT_REQUIRED, **{name: value}), value
    for value in refused:
        assert not accepts(FieldSalesComponent, **COMPONENT_REQUIRED, **{name: value}), value
    assert setting.range_text in setting.help


@pytest.mark.parametrize(
    ("resource", "field", "setting"),
    resource_fields(),
    ids=[f"{r.__name__}.{f}" for r, f, _ in resource_fields()],
)
def test_every_resource_field_of_a_setting_has_its_type_default_and_range(resource, field, setting):
    info = resource.model_fields[field]
    component_field = FieldSalesComponent.model_fields[setting.name]
    # A required setting is optional in the component only so that "it is not set" can say so.
    optional = setting.default is PydanticUndefined and info.annotation is not None
    assert info.annotation == component_field.annotation or (
        optional and info.annotation | None == component_field.annotation
    )
    assert default_of(info) == default_of(component_field)
    required = REQUIRED.get(resource, {})
    accepted, refused = values_around(setting) if setting.bounds else ([], [])
    for value in accepted:
        assert accepts(resource, **{**required, field: value}), value
    for value in refused:
        assert not accepts(resource, **{**required, field: value}), value


def test_the_resources_receive_every_setting_from_the_component(monkeypatch, tmp_path):
    """Each resource field of a setting holds the component's value, not a default of its own."""
    monkeypatch.setenv("FIELDSALES_API_TOKEN", "settings-test-token")
    component = FieldSalesComponent(
        base_url="http://127.0.0.1:9",
        token_store_path=str(tmp_path / "token.json"),
        duckdb_path=str(tmp_path / "other.duckdb"),
        create_dirs=True,
        duckdb_memory_limit="1GB",
        ducklake_catalog=f"sqlite:{tmp_path / 'lake.sqlite'}",
        ducklake_data_path=str(tmp_path / "lake"),
        ducklake_schema="acme",
        ducklake_password_env_var="ACME_LAKE_PASSWORD",
        page_size=123,
        concurrency=5,
        max_item_mb=50,
        refresh_mode="full",
        full_refresh_every_days=366,
        lookback_days=3,
        pii="drop",
        redact_pii_in_raw=True,
    )
    resources = component.build_resources()
    received = {
        (type(resource), name): getattr(resource, name)
        for resource in resources.values()
        if isinstance(resource, RESOURCES)
        for name in type(resource).model_fields
    }
    fields = resource_fields()
    assert fields
    for resource, field, setting in fields:
        assert received[resource, field] == getattr(component, setting.name), field
        assert received[resource, field] != setting.default, field  # really passed on


def test_defs_yaml_reads_each_setting_from_its_variable_and_states_no_default():
    attributes = yaml.safe_load(DEFS_YAML.read_text())["attributes"]
    for name, setting in SETTINGS.items():
        if not setting.variable:
            assert name not in attributes, name
            continue
        if name == "token_store_path":  # the shipped instance keeps it under $DAGSTER_HOME
            assert attributes[name].startswith(f"{{{{ env.{setting.variable} or ")
            continue
        assert attributes[name] == f"{{{{ env.{setting.variable} }}}}", name


def readme_settings_rows() -> dict[str, tuple[str, str, str]]:
    """The Configuration tables of docs/configuration.md and docs/alerts.md: setting ->
    (variable, meaning, default), backticks off."""
    sections = [
        doc.read_text().split("# Configuration", 1)[1].split("\n## ", 1)[0] for doc in SETTINGS_DOCS
    ]
    rows: dict[str, tuple[str, str, str]] = {}
    for line in "\n".join(sections).splitlines():
        cells = [cell.strip().replace("`", "") for cell in line.strip().strip("|").split("|")]
        if len(cells) != 4 or cells[0] in ("setting (YAML)", "---") or set(cells[0]) <= {"-"}:
            continue
        names, variables = cells[0].split(", "), cells[1].split(", ")
        defaults = cells[3].split(", ") if len(names) > 1 else [cells[3]]
        for i, name in enumerate(names):
            rows[name] = (
                variables[min(i, len(variables) - 1)],
                cells[2],
                defaults[min(i, len(defaults) - 1)],
            )
    return rows


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_the_readme_shows_each_settings_variable_default_and_range(name):
    setting = SETTINGS[name]
    variable, meaning, default = readme_settings_rows()[name]
    assert variable == (setting.variable or "–")
    # token_store_path: "$DAGSTER_HOME/fieldsales_token.json, else <the setting's default>".
    assert default.rpartition("else ")[2] == setting.shown_default
    assert setting.range_text in meaning


def test_every_other_readme_table_that_names_a_variable_shows_its_settings_default():
    """Tables elsewhere (Personal data, in any page) name settings by variable: their defaults
    agree too."""
    by_variable = {setting.variable: setting for setting in SETTINGS.values() if setting.variable}
    checked = []
    lines = [
        line for doc in USER_DOCS if doc != CONFIGURATION for line in doc.read_text().splitlines()
    ]
    for line in lines:
        cells = [cell.strip().replace("`", "") for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) >= 3 and cells[0] in by_variable:
            checked.append(cells[0])
            assert cells[-1] == by_variable[cells[0]].shown_default, line
    assert {"FIELDSALES_PII", "FIELDSALES_REDACT_PII_IN_RAW"} <= set(checked)


def test_the_readme_table_names_no_setting_that_does_not_exist():
    assert set(readme_settings_rows()) == set(SETTINGS)


def test_full_refresh_every_days_takes_366_as_its_message_says():
    component = FieldSalesComponent(base_url="http://127.0.0.1:9", full_refresh_every_days=366)
    assert component.full_refresh_every_days == 366
    with pytest.raises(ValidationError, match="above 0, at most 366"):
        FieldSalesComponent(base_url="http://127.0.0.1:9", full_refresh_every_days=367)


def test_the_api_resource_refuses_a_page_size_the_component_refuses():
    with pytest.raises(ValidationError, match="from 1 to 10000"):
        FieldSalesComponent(base_url="http://127.0.0.1:9", page_size=50_000)
    with pytest.raises(ValidationError, match="page_size"):
        FieldSalesAPI(base_url="http://127.0.0.1:9", api_token="x", page_size=50_000)
