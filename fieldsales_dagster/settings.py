"""Every setting of a Field-Sales instance, declared once by ``setting(...)`` as a field of its
concern's model (``api:``, ``storage:``, ...): default, range, ``FIELDSALES_*`` variable, meaning.
Nothing is read from the environment here."""

from __future__ import annotations

import functools
import operator
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from dataclasses import KW_ONLY, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, get_args
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import dagster as dg
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticUndefined

from fieldsales_dagster.catalogs import DEFAULT_CATALOG, check_catalog
from fieldsales_dagster.urls import endpoint_origin, validate_base_url

#: The key of a field's ``json_schema_extra`` that names the setting it holds.
SETTING_KEY = "fieldsales_setting"
#: A setting's default or variable derived from its name: ``FIELDSALES_*``, ``*`` its name in
#: capitals (``pii_hash_key_env_var``'s default: ``FIELDSALES_PII_HASH_KEY``).
DERIVED = "FIELDSALES_*"
#: "A token is valid for 2 months" (API document, section 5): renewal must come before that.
TOKEN_LIFETIME_DAYS = 60
#: DuckDB decodes an item of up to this share of its memory limit (measured: under 192MB 12 MB
#: decode and 16 MB run out of memory; under 1GB 80 MB decode).
ITEM_SHARE_OF_MEMORY = 16
#: The schemas the project rebuilds; any other (``analytics``) is its users', never dropped.
PROJECT_SCHEMAS = frozenset({"raw", "core", "mart", "meta"})
IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MEMORY = re.compile(r"^(\d+(?:\.\d+)?)\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)$", re.IGNORECASE)
_UNITS = {"b": 1e-6, "kb": 1e-3, "mb": 1, "gb": 1e3, "tb": 1e6}
_UNITS |= {"kib": 1024 / 1e6, "mib": 1.048576, "gib": 1073.741824, "tib": 1099511.627776}
#: ``{{ env.NAME }}`` or ``{{ env('NAME') }}``: the only accepted form of a secret in YAML.
_ENV_REFERENCE = re.compile(r"""^\{\{\s*env(?:\.(\w+)|\(\s*['"](\w+)['"]\s*\))\s*\}\}$""")
#: ``api_token`` of a YAML holding no ``env`` reference: ``build_resources`` then fails without
#: quoting the YAML line (Dagster's own errors would, and the line is the token).
NOT_AN_ENV_REFERENCE = "<not an environment variable reference>"
_ENV_READ = re.compile(r"""\benv(?:\.|\(\s*['"])([A-Za-z_][A-Za-z0-9_]*)""")
#: What the ``defs.yaml`` being loaded calls the shipped one's variables (``_variables``).
_VARIABLES: ContextVar[dict[str, str] | None] = ContextVar("variables", default=None)


def named(variable: str) -> str:
    return (_VARIABLES.get() or {}).get(variable, variable)


#: The values of ``refresh_mode``: the setting, and the run config of ``raw_transactions``.
RefreshMode = Literal["auto", "full", "incremental"]
REFRESH_MODES = get_args(RefreshMode)


def validate_refresh_mode(value: object) -> object:
    """The run config's ``refresh_mode`` (``raw_transactions``): unset, or a mode in any case."""
    mode = value.strip().lower() if isinstance(value, str) else value
    if mode is not None and mode not in REFRESH_MODES:
        raise ValueError(f"refresh_mode must be one of {', '.join(REFRESH_MODES)}; got {value!r}")
    return mode


class SettingError(ValueError):
    """A setting of the component is missing or out of range."""


def invalid(spelling: str, variable: str, why: str) -> SettingError:
    """Every setting's error: ``why``, then where to set it, naming the variable the loading
    ``defs.yaml`` reads (``ACME_FIELDSALES_BASE_URL`` in a scaffolded tenant's)."""
    variable = named(variable)
    read = variable not in ("", spelling)
    where, through = (f" (from {variable})", f" or through {variable}") if read else ("", "")
    return SettingError(
        f"Field-Sales setting {spelling}{where} is invalid: {why}; set it in defs.yaml{through} "
        "and load again."
    )


def setting_error(setting: str, why: str) -> SettingError:
    """``invalid`` for the setting named ``setting``: its spelling and variable, then ``why``."""
    return invalid(SETTINGS[setting].spelling, SETTINGS[setting].variable, why)


@dataclass
class Setting:
    """One setting (named by its field's ``json_schema_extra``): ``default``
    (``PydanticUndefined``: required), ``accepts`` in words (``{range}``: its bounds), the variable
    the shipped ``defs.yaml`` reads; ``name`` is a resource's field, ``group`` (its model's
    ``GROUP``) and ``key`` its YAML place."""

    default: Any
    description: str
    #: ``""``: what its type takes (``_ACCEPTS``).
    accepts: str = ""
    #: ``""``: none, as for a ``*_env_var`` (its default is a variable).
    variable: str = DERIVED
    _: KW_ONLY
    name: str = ""
    key: str = ""
    #: The default as the docs show it, if not itself, or what unset (``None``) means.
    shown: str = ""
    #: Checked by ``_check``, not pydantic: Dagster copies constraints onto the YAML model.
    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None
    #: Its value's own check, given a value that is set: returns it (normalized) or raises.
    check: Callable[[Any], Any] | None = None
    group: str = ""
    field: str = ""

    def __set_name__(self, model: type[SettingsModel], field: str) -> None:
        """Declared as ``field`` of ``model``: its names are filled in, then its pydantic field
        replaces it before pydantic collects the model's fields."""
        self.name, self.key = self.name or model.PREFIX + field, self.key or field
        derived = f"FIELDSALES_{self.name.removesuffix('_env_var').upper()}"
        self.default = derived if self.default == DERIVED else self.default
        if self.variable == DERIVED:  # none for a ``*_env_var``: its value names a variable
            self.variable = "" if self.name.endswith("_env_var") else derived
        self.accepts = self.accepts or _ACCEPTS[type(self.default)]
        self.group, self.field = model.GROUP, field
        SETTINGS[self.name] = self
        setattr(model, field, self.as_field(in_model=True))

    @property
    def spelling(self) -> str:
        return f"{self.group}.{self.key}" if self.group else self.key

    @property
    def bounds(self) -> dict[str, float]:
        return {op: b for op in ("gt", "ge", "lt", "le") if (b := getattr(self, op)) is not None}

    @property
    def range_text(self) -> str:
        if not self.bounds:
            return ""
        if self.ge is not None and self.le is not None:
            return f"from {self.ge:g} to {self.le:g}"
        low = f"above {self.gt:g}" if self.gt is not None else f"at least {self.ge:g}"
        high = f"and below {self.lt:g}" if self.lt is not None else f"at most {self.le:g}"
        return f"{low}{',' if self.le is not None else ''} {high}"

    @property
    def help(self) -> str:
        return self.accepts.format(range=self.range_text)

    @property
    def shown_default(self) -> str:
        if self.shown or self.default in (None, PydanticUndefined):
            return self.shown or ("none" if self.default is None else "required")
        shown = {bool: lambda default: str(default).lower(), float: "{:g}".format, list: ", ".join}
        return shown.get(type(self.default), str)(self.default)

    def as_field(self, *, in_model: bool = False) -> Any:
        """In its concern's model a required setting is None until given, so "it is not set"
        can name it. Its description names its variable, and its default if unset is none."""
        extra: Any = {SETTING_KEY: self.name}
        required = in_model and self.default is PydanticUndefined
        given: Any = None if required else self.default  # pydantic copies a list per instance
        where = f" ({self.variable})" if self.variable else ""
        unset = f" Default: {self.shown_default}." if self.default is None else ""
        description = f"{self.description}{where}.{unset}"
        return Field(
            given, validate_default=required, json_schema_extra=extra, description=description
        )


_ACCEPTS: dict[Any, str] = {
    bool: "true or false",
    int: "a whole number {range}",
    float: "a number of days {range}",
    str: "the name of an environment variable",  # a ``*_env_var``'s
}
#: Every setting, by flat name, in the order declared.
SETTINGS: dict[str, Setting] = {}


#: A setting, declared as a field of its concern's model (``Setting.__set_name__``).
setting: Callable[..., Any] = Setting


def values(*models: SettingsModel) -> dict[str, Any]:
    given = {s.name: getattr(model, s.field) for model in models for s in model.settings().values()}
    return {**given, "variables": {k: v for model in models for k, v in model._variables.items()}}


class SettingsResource(dg.ConfigurableResource):
    """What ``settings_resource`` builds on: its errors name the variables as its tenant's
    ``defs.yaml`` reads them (``SettingsModel._variables``, given by the component)."""

    #: What errors call a variable of the shipped defs.yaml: the one this tenant's defs.yaml
    #: reads instead, or the setting itself; unlisted: its own name.
    variables: dict[str, str] = Field(default_factory=dict)

    def named(self, variable: str) -> str:
        return self.variables.get(variable, variable)


def settings_resource(name: str, *models: type[SettingsModel], but: tuple[str, ...] = ()) -> Any:
    """A resource base with a field per setting of ``models`` but ``but``: a new setting needs no
    resource field. Values are checked by their concern's model (an ``EnvVar`` once read)."""
    fields: dict[str, Any] = {}
    for model in models:
        for field, declared in model.settings().items():
            annotation: Any = model.model_fields[field].annotation
            if declared.default is PydanticUndefined:  # None only until the component gets it
                annotation = next(a for a in get_args(annotation) if a is not type(None))
            if declared.name not in but:
                fields[declared.name] = (annotation, declared.as_field())

    def check(cls: Any, given: Any) -> Any:
        for model in models if isinstance(given, dict) else ():
            mine = {s.name: f for f, s in model.settings().items() if s.name not in but}
            read = {k: v for k, v in given.items() if k in mine and not isinstance(v, dg.EnvVar)}
            model(**{mine[k]: v for k, v in read.items()})
        return given

    validators: Any = {"check_settings": model_validator(mode="before")(check)}
    return create_model(name, __base__=SettingsResource, __validators__=validators, **fields)


def trimmed(value: Any) -> Any:
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, list):
        return [trimmed(item) for item in value]
    return value


def memory_megabytes(limit: str) -> float:
    match = _MEMORY.match(limit.strip())
    assert match is not None, limit
    return float(match.group(1)) * _UNITS[match.group(2).lower()]


def schedule_interval(cron: str, timezone: str) -> timedelta:
    """The longest gap between the next few ticks of ``cron``, by Dagster's public time windows
    (its schedules' own cron rules); a bad one raises ``DagsterInvalidDefinitionError``."""
    now = datetime.now(UTC)
    ticks = dg.TimeWindowPartitionsDefinition(
        cron_schedule=cron, start=now, timezone=timezone, fmt="%Y-%m-%dT%H:%M:%S", end_offset=8
    )
    windows = map(ticks.time_window_for_partition_key, ticks.get_partition_keys(current_time=now))
    return max(window.end - window.start for window in windows)


def secret_env_var(context: dg.ResolutionContext | None, raw: Any) -> str:
    """The variable of a ``{{ env.NAME }}`` secret, never the secret: the resource reads it as an
    ``EnvVar`` at run time, so the UI and run config show the name only."""
    match = _ENV_REFERENCE.match(raw.strip()) if isinstance(raw, str) else None
    return (match[1] or match[2]) if match else NOT_AN_ENV_REFERENCE


def _unknown_keys(model: BaseModel, path: list[Any]) -> Iterator[list[Any]]:
    for key, value in model:
        if key in (model.model_extra or {}):
            yield [*path, key]
        elif isinstance(value, BaseModel):
            yield from _unknown_keys(value, [*path, key])


def _accepted(test: Callable[[str], object], why: str, errors: Any = ()) -> Callable[[str], str]:
    """A setting's check: ``test(value)`` true, raising none of ``errors``; else ``why``."""

    def check(value: str) -> str:
        with suppress(*errors):
            if test(value):
                return value
        raise ValueError(why)

    return check


_plain_name = _accepted(IDENTIFIER.match, "it is not a plain name")
_size = _accepted(_MEMORY.match, "it is not a size")
_url_style = _accepted(re.compile("^(vhost|path)$").match, "it is neither vhost nor path")
_cron = _accepted(
    lambda value: schedule_interval(value, "UTC"),
    "it is not a cron expression",
    (dg.DagsterInvalidDefinitionError,),
)
_timezone = _accepted(ZoneInfo, "it is not an IANA time zone", (ZoneInfoNotFoundError, ValueError))


def _export_path(value: str) -> str:
    if (stem := Path(value).stem.lower()) in PROJECT_SCHEMAS:
        raise ValueError(f"DuckDB names its catalog {stem}, which would shadow the {stem} schema")
    return value


def _addresses(value: str) -> str | None:
    addresses = [a.strip() for a in value.split(",") if a.strip()]
    if any("@" not in address or " " in address for address in addresses):
        raise ValueError("it is not a list of e-mail addresses")
    return ", ".join(addresses) or None


def _ui_url(value: str) -> str:
    if not re.match(r"^https?://[^/\s]+", value):
        raise ValueError("it is not an http:// or https:// URL")
    return value.rstrip("/")


def _user_schema(value: str) -> str:
    if _plain_name(value).lower() in PROJECT_SCHEMAS:
        raise ValueError("the project rebuilds that schema, so it would overwrite your tables")
    return value


class SettingsModel(dg.Model, dg.Resolvable):
    """The settings of one concern (``GROUP``). An empty value (an unset variable renders as
    nothing) keeps the default; values are trimmed; a bad one fails in one paragraph."""

    GROUP: ClassVar[str] = ""
    #: What its settings' flat names (``name``) start with, unless declared.
    PREFIX: ClassVar[str] = ""
    #: What its errors call a shipped ``defs.yaml`` variable its own does not read: the one it
    #: reads (``ACME_FIELDSALES_BASE_URL``), or the setting (``api.page_size``) if none.
    _variables: dict[str, str] = PrivateAttr(default_factory=dict)

    @classmethod
    @functools.cache
    def model(cls) -> type[BaseModel]:
        """Dagster's model of its YAML, taking unknown keys for ``resolve_from_model`` to refuse
        by name: Dagster's own error would print their values (a misplaced token)."""
        derived: Any = super().model()
        return type(derived.__name__, (derived,), {"model_config": ConfigDict(extra="allow")})

    @classmethod
    def resolve_from_model(cls, context: dg.ResolutionContext, model: Any) -> Any:
        """A key that is no setting fails first, by its line, never its value."""
        tree = context.source_position_tree
        unknown = [
            f"Field-Sales: {'.'.join(map(str, path))} "
            f"({tree.lookup_closest_and_path(path, None)[0] if tree else 'defs.yaml'}) is no "
            "setting: remove it, or move it where docs/configuration.md lists it."
            for path in _unknown_keys(model, list(context.path))
        ]
        if unknown:
            raise SettingError("\n".join(unknown))
        variables = {}
        for declared in cls.settings().values():
            read = _ENV_READ.findall(str(getattr(model, declared.key, None) or ""))
            if declared.variable and read[:1] != [declared.variable]:
                variables[declared.variable] = read[0] if read else declared.spelling
        with variables_named(variables):
            built = super().resolve_from_model(context, model)
        for value in dict(built).values():
            if isinstance(value, SettingsModel):
                variables |= value._variables
        built._variables = variables
        return built

    def named(self, variable: str) -> str:
        return self._variables.get(variable, variable)

    def secret_variables(self) -> list[str]:
        """Its and its concerns' ``*_env_var`` settings' values."""
        found = [value for field, value in self if field.endswith("_env_var")]
        concerns = [value for _, value in self if isinstance(value, SettingsModel)]
        return found + [variable for concern in concerns for variable in concern.secret_variables()]

    @classmethod
    def settings(cls) -> dict[str, Setting]:
        """Its settings, by field: those of its group."""
        return {s.field: s for s in SETTINGS.values() if s.group == cls.GROUP}

    @model_validator(mode="wrap")
    @classmethod
    def _explain(cls, values: Any, handler: Any) -> Any:
        if isinstance(values, dict):  # trimmed; an empty value of a setting: unset
            values = {key: trimmed(value) for key, value in values.items()}
            values = {
                k: v for k, v in values.items() if v not in (None, "") or k not in cls.settings()
            }
        try:
            return handler(values)
        except ValidationError as exc:
            errors = exc.errors()
        first = errors[0]
        cause = (first.get("ctx") or {}).get("error")
        if isinstance(cause, SettingError):  # a concern's own paragraph, or a check of several
            raise cause from None
        field = str(first["loc"][0]) if first["loc"] else "?"
        unknown = Setting(None, "", "a valid value", "", key=field, group=cls.GROUP)
        declared = cls.settings().get(field, unknown)
        same = [error for error in errors if error["loc"][:1] == first["loc"][:1]]
        why = "; ".join(error["msg"].removeprefix("Value error, ").rstrip(".") for error in same)
        value = values.get(field) if isinstance(values, dict) else None
        shown = "" if declared.name == "api_token" else f" Got {value!r}."
        why = f"{why}.{shown} It takes {declared.help}"
        raise invalid(declared.spelling, declared.variable, why)

    @field_validator("*")
    @classmethod
    def _check(cls, value: Any, info: Any) -> Any:
        declared = cls.settings().get(info.field_name)
        if declared is None:
            return value
        if value is None and declared.default is PydanticUndefined:
            raise ValueError("it is not set")
        if not all(getattr(operator, op)(value, b) for op, b in declared.bounds.items()):
            raise ValueError("it is out of range")
        return declared.check(value) if declared.check and value is not None else value


PLAIN_NAME = "a name of letters, digits and underscores, starting with a letter"


class ApiSettings(SettingsModel):
    """``api:``: the Field-Sales instance, its token and how its lists are read; resolves into
    the ``FieldSalesAPI`` resource and the token-renewal policy."""

    GROUP: ClassVar[str] = "api"

    base_url: str | None = setting(
        PydanticUndefined,
        "Base URL of the instance, e.g. https://yourcompany.example.com",
        "an https:// URL of your instance (plain http:// only for loopback hosts)",
        check=functools.partial(validate_base_url, name="it"),  # ``invalid`` names it
    )
    api_token_env_var: Annotated[
        str, dg.Resolver(secret_env_var, model_field_name="api_token", inject_before_resolve=False)
    ] = setting(
        DERIVED,
        "'{{ env.FIELDSALES_API_TOKEN }}': the variable holding the API token",
        "a token from your Field-Sales profile's API tab",
        name="api_token",
        key="api_token",
        shown="required",
    )
    token_store_path: str = setting(
        "data/fieldsales_token.json",
        "Where the renewed token is kept, or catalog: a row of the lake's PostgreSQL catalog",
        "a file path on a persistent volume, or catalog (with a PostgreSQL ducklake_catalog)",
        "FIELDSALES_TOKEN_STORE",
    )
    page_size: int = setting(500, "`limit` asked for per page", ge=1, le=10_000)
    max_item_mb: int = setting(
        4,
        "The largest item a list may hold, in MB; duckdb_memory_limit must be 16 times as large",
        "a whole number of MB {range}, at most a sixteenth of duckdb_memory_limit",
        ge=1,
        le=256,  # the largest page an answer may hold (max_page_bytes)
    )
    concurrency: int = setting(8, "Pages in flight at once", ge=1, le=64)
    token_renew_after_days: float = setting(
        45.0,
        "Renew the token once it is this old (days)",
        "a number of days {range} (the token's lifetime)",
        gt=0,
        lt=TOKEN_LIFETIME_DAYS,
    )


class StorageSettings(SettingsModel):
    """``storage:``: the lake, its upkeep, the optional single-file export and DuckDB's memory;
    resolves into the ``FieldSalesWarehouse`` resource."""

    GROUP: ClassVar[str] = "storage"

    duckdb_path: str | None = setting(
        None,
        "The optional single-file export: a DuckDB file that holds the lake's last snapshot",
        "a file path, e.g. data/fieldsales.duckdb",
        check=_export_path,
        shown="no export",
    )
    create_dirs: bool = setting(False, "Create a missing folder of duckdb_path or token_store_path")
    duckdb_memory_limit: str = setting(
        "192MB",
        "DuckDB memory_limit; larger work spills to disk",
        "a size such as 192MB or 2GB",
        check=_size,
    )
    ducklake_catalog: str | None = setting(
        None,
        "The lake's catalog database: SQLite for one host, PostgreSQL for several machines",
        "sqlite:FILE, or postgres:dbname=NAME host=HOST user=USER without a password",
        check=check_catalog,
        shown=DEFAULT_CATALOG,
    )
    ducklake_data_path: str | None = setting(
        None,
        "The folder (or s3:// URL) of the lake's Parquet files; a folder you set must exist",
        "an existing folder (or s3:// URL) the lake's Parquet files go to",
        shown="lake/ beside a SQLite catalog (data/lake), created when needed; required with "
        "PostgreSQL",
    )
    ducklake_schema: str | None = setting(
        None,
        "This tenant's schema in the catalog database, so that tenants share one catalog",
        "a plain name",
        "",
        check=_plain_name,
        shown="the whole catalog",
    )
    ducklake_password_env_var: str = setting(
        DERIVED, "The variable holding the PostgreSQL catalog's password"
    )
    s3_endpoint: str | None = setting(
        None,
        "The S3-compatible server of an s3:// data path: host:port or URL",
        "host:port or an https:// URL of the object store (plain http:// only for loopback hosts)",
        check=endpoint_origin,
        shown="AWS_ENDPOINT_URL if set; AWS S3 otherwise",
    )
    s3_region: str | None = setting(
        None,
        "The object store's region",
        "a region name such as eu-central-1",
        shown="AWS_REGION if set; us-east-1 otherwise",
    )
    s3_url_style: str | None = setting(
        None,
        "How the object store addresses a bucket: bucket.host/key (vhost) or host/bucket/key",
        "vhost or path",
        check=_url_style,
        shown="path with an endpoint; vhost otherwise",
    )
    s3_access_key_id_env_var: str = setting(
        DERIVED, "The variable holding the object store's access key id (unset: AWS_ACCESS_KEY_ID)"
    )
    s3_secret_access_key_env_var: str = setting(
        DERIVED, "The variable holding the object store's secret key (unset: AWS_SECRET_ACCESS_KEY)"
    )
    retain_snapshots_days: float = setting(
        7.0,
        "The lake's upkeep expires snapshots older than this (days)",
        variable="",
        gt=0,
        le=3660,
    )

    @model_validator(mode="after")
    def _postgres_needs_a_data_path(self) -> StorageSettings:
        if (self.ducklake_catalog or "").startswith("postgres:") and not self.ducklake_data_path:
            raise setting_error(
                "ducklake_data_path",
                "a PostgreSQL catalog (storage.ducklake_catalog) needs a folder every machine "
                "sees, or an s3:// URL",
            )
        return self


class RefreshSettings(SettingsModel):
    """``refresh:``: when the refresh runs and how raw.transactions is refreshed; resolves into
    the schedule and the warehouse's refresh policy."""

    GROUP: ClassVar[str] = "refresh"

    schedule_cron: str = setting(
        "0 5 * * *", "When the refresh runs", "a cron expression such as '0 5 * * *'", check=_cron
    )
    schedule_timezone: str = setting(
        "UTC",
        "Time zone of the cron",
        "an IANA time zone such as UTC or Europe/Vienna",
        check=_timezone,
    )
    refresh_mode: RefreshMode = setting(
        "auto",
        "How raw.transactions is refreshed; run config on raw_transactions overrides it",
        "one of auto, full, incremental",
    )
    full_refresh_every_days: float = setting(
        7.0,
        "In auto mode, a full refresh once the last one is this old (days)",
        variable="",
        gt=0,
        le=366,
    )
    lookback_days: float = setting(
        30.0,
        "Incremental mode re-fetches the transactions of events changed this recently (days)",
        variable="",
        ge=0,
        le=3660,
    )


class PiiSettings(SettingsModel):
    """``pii:``: personal data in the tables; resolves into the warehouse's PII policy."""

    GROUP: ClassVar[str] = "pii"

    mode: Literal["keep", "hash", "drop"] = setting(
        "keep",
        "Personal data in core.* and mart.*: keep, hash (keyed HMAC-SHA256) or drop",
        "keep, hash or drop",
        name="pii",
    )
    hash_key_env_var: str = setting(
        DERIVED, "The variable holding the secret key of pii: hash", name="pii_hash_key_env_var"
    )
    redact_in_raw: bool = setting(
        False, "Null the personal keys of raw.* payloads at ingest", name="redact_pii_in_raw"
    )


class AlertsSettings(SettingsModel):
    """``alerts:``: where a failed run's alert goes, off unless a webhook or an address is set;
    resolves into the alert policy (``automation/alerts.py``)."""

    GROUP: ClassVar[str] = "alerts"
    PREFIX: ClassVar[str] = "alert_"

    webhook_url_env_var: str = setting(
        DERIVED,
        "The variable holding the webhook URL alerts are posted to; setting it turns alerts on",
    )
    email_to: str | None = setting(
        None,
        "Comma-separated addresses alerts are mailed to; setting it turns alerts on",
        "e-mail addresses separated by commas",
        check=_addresses,
        shown="no e-mail",
    )
    email_from: str = setting(
        "fieldsales-dagster@localhost",
        "The sender of alert e-mails",
        "an e-mail address",
        check=_addresses,
    )
    smtp_host: str = setting("localhost", "The SMTP server alert e-mails go through", "a host name")
    smtp_port: int = setting(25, "The SMTP server's port", "a port number {range}", ge=1, le=65535)
    smtp_user: str | None = setting(
        None, "The SMTP login, if the server wants one", "a user name", shown="no login"
    )
    smtp_password_env_var: str = setting(DERIVED, "The variable holding the SMTP password")
    ui_base_url: str | None = setting(
        None,
        "The Dagster UI's address: an alert links to its run there",
        "an http:// or https:// URL",
        name="ui_base_url",
        check=_ui_url,
        shown="no link",
    )


class FieldSalesSettings(SettingsModel):
    """One instance's settings: a model per concern, and the instance's own names."""

    api: ApiSettings
    storage: StorageSettings = Field(default_factory=StorageSettings)
    refresh: RefreshSettings = Field(default_factory=RefreshSettings)
    pii: PiiSettings = Field(default_factory=PiiSettings)
    alerts: AlertsSettings = Field(default_factory=AlertsSettings)
    key_prefix: str | None = setting(
        None,
        "Asset-key prefix of this instance; set it for every tenant but the first",
        PLAIN_NAME,
        "",
        check=_plain_name,
    )
    group_prefix: str | None = setting(
        None, "Prefix of the asset groups (unset: key_prefix)", PLAIN_NAME, "", check=_plain_name
    )
    owners: list[str] = setting(
        ["team:data"], "Owners shown on every asset", "a list of emails or team:NAME", ""
    )
    user_schema: str = setting(
        "analytics",
        "Where fieldsales_io_manager stores user assets' DataFrames (schema.<asset name>)",
        "a plain name other than raw, core, mart and meta, e.g. analytics",
        "",
        check=_user_schema,
    )


@contextmanager
def variables_named(variables: dict[str, str]) -> Iterator[None]:
    """Errors of settings checked inside (``invalid``) name the variables as ``variables`` does."""
    outer = _VARIABLES.set(variables)
    try:
        yield
    finally:
        _VARIABLES.reset(outer)
