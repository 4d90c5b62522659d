"""Each setting is declared once, a field of its concern's model (``settings.py``): the
component, the resources that receive it, the default ``defs.yaml`` and the settings tables of
docs/configuration.md and docs/alerts.md all agree with that one declaration; a key that is no
setting fails the load, naming it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml
from pydantic import ValidationError
from pydantic_core import PydanticUndefined

from fieldsales_dagster.client.api import FieldSalesAPI
from fieldsales_dagster.component import FieldSalesComponent, SettingError
from fieldsales_dagster.settings import (
    SETTING_KEY,
    SETTINGS,
    FieldSalesSettings,
    Setting,
    SettingsModel,
)
from fieldsales_dagster.warehouse.warehouse import FieldSalesWarehouse
from fieldsales_dagster_tests.project import component, spelled, value_of

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
#: The models of the component's concerns, by their YAML key.
CONCERNS: dict[str, type[SettingsModel]] = {
    name: info.annotation
    for name, info in FieldSalesSettings.model_fields.items()
    if isinstance(info.annotation, type) and issubclass(info.annotation, SettingsModel)
}


def field_info(name: str) -> Any:
    """The pydantic field that declares setting ``name``."""
    setting = SETTINGS[name]
    return (CONCERNS[setting.group] if setting.group else FieldSalesSettings).model_fields[
        setting.field
    ]


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
    field = field_info(name)
    if name == "api_token":  # the field holds the variable's name, never a token
        assert field.default == setting.variable
        return
    assert field.description and setting.description in field.description
    if setting.default is PydanticUndefined:  # None until given, then "it is not set"
        assert field.default is None and field.validate_default
        with pytest.raises(ValidationError, match=rf"{setting.spelling} .* it is not set"):
            component(**spelled(name, None))
        return
    assert default_of(field) == setting.default
    assert not field.is_required()


def test_every_component_field_is_a_concern_or_a_setting():
    assert set(CONCERNS) == {"api", "storage", "refresh", "pii", "alerts"}
    fields = {
        f"{group}.{field}" if group else field
        for group, model in [("", FieldSalesComponent), *CONCERNS.items()]
        for field in model.model_fields
    }
    declared = {f"{s.group}.{s.field}" if s.group else s.field for s in SETTINGS.values()}
    assert fields == declared | set(CONCERNS)
    assert {setting.spelling for setting in SETTINGS.values()} == {
        name.replace("api_token_env_var", "api_token") for name in declared
    }


@pytest.mark.parametrize("name", [name for name, s in sorted(SETTINGS.items()) if s.bounds])
def test_the_component_takes_exactly_the_range_its_message_names(name):
    setting = SETTINGS[name]
    accepted, refused = values_around(setting)
    for value in accepted:
        assert accepts(component, **spelled(name, value)), value
    for value in refused:
        assert not accepts(component, **spelled(name, value)), value
    assert setting.range_text in setting.help


@pytest.mark.parametrize(
    ("resource", "field", "setting"),
    resource_fields(),
    ids=[f"{r.__name__}.{f}" for r, f, _ in resource_fields()],
)
def test_every_resource_field_of_a_setting_has_its_type_default_and_range(resource, field, setting):
    info = resource.model_fields[field]
    component_field = field_info(setting.name)
    # A required setting is optional in the component only so that "it is not set" can say so.
    optional = setting.default is PydanticUndefined and info.annotation is not None
    assert info.annotation == component_field.annotation or (
        optional and info.annotation | None == component_field.annotation
    )
    assert default_of(info) == setting.default  # required: PydanticUndefined in both
    if not optional:
        assert default_of(info) == default_of(component_field)
    required = REQUIRED.get(resource, {})
    accepted, refused = values_around(setting) if setting.bounds else ([], [])
    for value in accepted:
        assert accepts(resource, **{**required, field: value}), value
    for value in refused:
        assert not accepts(resource, **{**required, field: value}), value


def test_the_resources_receive_every_setting_from_the_component(monkeypatch, tmp_path):
    """Each resource field of a setting holds the component's value, not a default of its own;
    the resources take their concerns' settings whole (a new setting needs no resource field)."""
    monkeypatch.setenv("FIELDSALES_API_TOKEN", "settings-test-token")
    given = dict(
        api={
            "token_store_path": str(tmp_path / "token.json"),
            "page_size": 123,
            "concurrency": 5,
            "max_item_mb": 50,
            "token_renew_after_days": 30,
        },
        storage={
            "duckdb_path": str(tmp_path / "other.duckdb"),
            "create_dirs": True,
            "duckdb_memory_limit": "1GB",
            "ducklake_catalog": f"sqlite:{tmp_path / 'lake.sqlite'}",
            "ducklake_data_path": str(tmp_path / "lake"),
            "ducklake_schema": "acme",
            "ducklake_password_env_var": "ACME_LAKE_PASSWORD",
            "retain_snapshots_days": 3,
        },
        refresh={
            "schedule_cron": "0 6 * * *",
            "schedule_timezone": "Europe/Vienna",
            "refresh_mode": "full",
            "full_refresh_every_days": 366,
            "lookback_days": 3,
        },
        pii={"mode": "drop", "redact_in_raw": True, "hash_key_env_var": "ACME_PII_KEY"},
    )
    built = component(**given)
    resources = built.build_resources()
    received = {
        (type(resource), name): getattr(resource, name)
        for resource in resources.values()
        if isinstance(resource, RESOURCES)
        for name in type(resource).model_fields
    }
    fields = resource_fields()
    concerns = {"api": FieldSalesAPI, "storage": FieldSalesWarehouse, "pii": FieldSalesWarehouse}
    concerns["refresh"] = FieldSalesWarehouse
    expected = {(concerns[s.group], s.name) for s in SETTINGS.values() if s.group in concerns} - {
        (FieldSalesAPI, "api_token")
    }
    assert {(resource, field) for resource, field, _ in fields} == expected
    for resource, field, setting in fields:
        assert received[resource, field] == value_of(built, setting.name), field
        if setting.key in given.get(setting.group, {}):
            assert received[resource, field] != setting.default, field  # really passed on


def test_a_warehouse_built_by_hand_checks_its_settings_as_the_component_does(tmp_path):
    with pytest.raises(ValidationError, match="storage.duckdb_memory_limit .* not a size"):
        FieldSalesWarehouse(duckdb_memory_limit="lots")
    with pytest.raises(ValidationError, match="storage.ducklake_data_path .* PostgreSQL"):
        FieldSalesWarehouse(ducklake_catalog="postgres:dbname=x host=127.0.0.1")
    with pytest.raises(
        ValidationError, match="lookback_days is invalid: it is out of range.* from 0 to 3660"
    ):
        FieldSalesWarehouse(lookback_days=-1)
    # A value given as an EnvVar is checked once read, at run time.
    assert FieldSalesWarehouse(ducklake_catalog=dg.EnvVar("SOME_CATALOG")).ducklake_catalog


def test_a_warehouse_checks_a_hash_key_given_as_an_env_var_where_it_is_built(monkeypatch):
    """The one check of the key (the component's load uses it too) reads the variable. Before,
    an EnvVar reached the check as its name, and a name of 16 characters passed for a key."""
    key = dg.EnvVar("ACME_PII_HASH_KEY_VARIABLE")
    monkeypatch.delenv(key.env_var_name, raising=False)
    with pytest.raises(ValidationError, match=f"hash needs a secret key in {key.env_var_name}"):
        FieldSalesWarehouse(pii="hash", pii_hash_key=key)
    monkeypatch.setenv(key.env_var_name, "k" * 32)
    assert FieldSalesWarehouse(pii="hash", pii_hash_key=key).pii_hash_key == key


def test_a_storage_setting_that_is_a_duckdb_option_reaches_duckdb(tmp_path):
    warehouse = FieldSalesWarehouse(
        ducklake_catalog=f"sqlite:{tmp_path / 'lake.sqlite'}", duckdb_memory_limit="300MB"
    )
    with warehouse.get_connection() as conn:
        (limit,) = conn.execute("SELECT current_setting('memory_limit')").fetchone()
    assert limit == "286.1 MiB"  # 300 MB, as DuckDB shows it


def test_what_defs_yaml_reads_is_each_settings_own_variable_with_no_default_stated():
    """The default ``defs.yaml`` binds variables to settings: each line it holds reads the
    variable its setting declares and states no default of its own (the model's applies). A new
    setting needs no line there (its variable is read once the line is added)."""
    attributes = yaml.safe_load(DEFS_YAML.read_text())["attributes"]
    found = {
        f"{group}.{key}": value
        for group, keys in attributes.items()
        for key, value in (keys.items() if isinstance(keys, dict) else [])
    }
    found |= {key: value for key, value in attributes.items() if not isinstance(value, dict)}
    expected = {
        setting.spelling: f"{{{{ env.{setting.variable} }}}}"
        for setting in SETTINGS.values()
        if setting.variable
    }
    # The shipped instance keeps its token store under $DAGSTER_HOME.
    store = found.pop("api.token_store_path")
    assert store.startswith(f"{{{{ env.{SETTINGS['token_store_path'].variable} or ")
    assert {"api.base_url", "api.api_token"} <= set(found)
    assert {spelling: expected.get(spelling) for spelling in found} == found


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
            continue  # rows are keyed by spelling (api.page_size)
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
    variable, meaning, default = readme_settings_rows()[setting.spelling]
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
    assert set(readme_settings_rows()) == {setting.spelling for setting in SETTINGS.values()}


def test_full_refresh_every_days_takes_366_as_its_message_says():
    built = component(refresh={"full_refresh_every_days": 366})
    assert built.refresh.full_refresh_every_days == 366
    with pytest.raises(ValidationError, match="above 0, at most 366"):
        component(refresh={"full_refresh_every_days": 367})


def test_the_api_resource_refuses_a_page_size_the_component_refuses():
    with pytest.raises(ValidationError, match="from 1 to 10000"):
        component(api={"page_size": 50_000})
    with pytest.raises(ValidationError, match="page_size"):
        FieldSalesAPI(base_url="http://127.0.0.1:9", api_token="x", page_size=50_000)


#: A token-like literal written where no setting is: never printed.
LITERAL = "fsk_live_7Hq2ZpX9mW4tR8vN"


@pytest.mark.parametrize(
    ("attributes", "named"),
    [
        (f"api_token: {LITERAL}", "attributes.api_token"),
        ("base_url: http://127.0.0.1:9", "attributes.base_url"),
        (f"storage:\n  password: {LITERAL}", "attributes.storage.password"),
        ("storage:\n  engine: file", "attributes.storage.engine"),
    ],
)
def test_a_key_that_is_no_setting_fails_the_load_naming_it_and_not_its_value(
    tmp_path, monkeypatch, attributes, named
):
    """A flat key (``base_url:`` for ``api.base_url``) or a retired one is as unknown as a typo;
    what it holds may be a secret written in the wrong place."""
    from fieldsales_dagster_tests.project import error_chain, load_project, write_project

    api = "api:\n  base_url: http://127.0.0.1:9\n  api_token: '{{ env.FIELDSALES_API_TOKEN }}'\n"
    package = write_project(tmp_path, {"main": f"{api}{attributes}"})
    with pytest.raises(Exception) as failure:
        load_project(package, monkeypatch)
    message = error_chain(failure.value)
    assert LITERAL not in message
    line = 6 + attributes.count("\n")  # type:, attributes:, the api: block of 3 lines
    at = package / "defs" / "main" / "defs.yaml"
    assert f"{named} ({at}:{line}) is no setting" in message, message


def test_dg_check_defs_names_a_key_that_is_no_setting_and_never_prints_its_value(tmp_path):
    from fieldsales_dagster_tests.test_dg_tooling import dg, project_copy

    project = project_copy(tmp_path)
    defs_yaml = project / DEFS_YAML.relative_to(REPO_ROOT)
    shipped = defs_yaml.read_text()
    written = shipped.replace("attributes:\n", f"attributes:\n  api_token: {LITERAL}\n", 1)
    written = written.replace("  storage:\n", f"  storage:\n    passwd: {LITERAL}\n", 1)
    defs_yaml.write_text(written)
    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env = {
        "DAGSTER_HOME": str(tmp_path),
        "PYTHONPATH": str(project),
        "FIELDSALES_BASE_URL": "http://127.0.0.1:9",
        "FIELDSALES_API_TOKEN": "dg-check-unknown-key-token",
    }
    said = dg("check", "defs", cwd=project, env=env, fails=True)
    assert LITERAL not in said, said[-3000:]
    lines = written.splitlines()
    for key, named in [(f"  api_token: {LITERAL}", "api_token"), ("    passwd:", "storage.passwd")]:
        line = next(at for at, text in enumerate(lines, 1) if text.startswith(key))
        assert f"attributes.{named} ({defs_yaml}:{line}) is no setting" in said, said[-3000:]
