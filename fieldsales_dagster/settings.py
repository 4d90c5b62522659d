"""Every setting of a Field-Sales instance, defined once: default, range, variable and meaning.

The component's model (``component.py``) declares each setting as a field made here
(``setting_field``); a resource or policy that receives a setting (``FieldSalesAPI``,
``FieldSalesWarehouse``) declares its field the same way, so a resource built by hand (README,
"Build on it") has the component's default and range, and no number is written twice. The
default ``defs.yaml`` only names each setting's variable (an unset one leaves the default
below), and a test walks every setting against the component, the resources, ``defs.yaml`` and
the README's table. No Dagster here, and nothing is read from the environment.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import Field
from pydantic_core import PydanticUndefined

#: The key of a field's ``json_schema_extra`` that names the setting it holds.
SETTING_KEY = "fieldsales_setting"
#: "A token is valid for 2 months" (API document, section 5): renewal must come before that.
TOKEN_LIFETIME_DAYS = 60
#: DuckDB reads and decodes an item of up to this share of its memory limit. Measured under the
#: default 192MB: a 20 MB item is read into a table, 12 MB are decoded (``payload->>'key'``), 16 MB
#: run out of memory; under 1GB an 80 MB item is decoded.
ITEM_SHARE_OF_MEMORY = 16


@dataclass(frozen=True)
class Setting:
    """One setting: its default (``PydanticUndefined``: required), the ``FIELDSALES_*`` variable
    the default ``defs.yaml`` reads it from (``""``: none), and what it accepts, in words."""

    name: str
    default: Any
    description: str
    accepts: str
    variable: str = ""
    #: Numeric bounds: ``gt``/``ge`` below, ``lt``/``le`` above (one of each, or none).
    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None
    #: What an unset (``None``) default means, for the README and the field's description.
    unset: str = "none"

    @property
    def bounds(self) -> dict[str, float]:
        given = {"gt": self.gt, "ge": self.ge, "lt": self.lt, "le": self.le}
        return {key: value for key, value in given.items() if value is not None}

    @property
    def range_text(self) -> str:
        """The bounds in words, e.g. ``from 1 to 10000`` or ``above 0, at most 366``."""
        if not self.bounds:
            return ""
        if self.ge is not None and self.le is not None:
            return f"from {self.ge:g} to {self.le:g}"
        low = f"above {self.gt:g}" if self.gt is not None else f"at least {self.ge:g}"
        high = f"and below {self.lt:g}" if self.lt is not None else f"at most {self.le:g}"
        return f"{low}{',' if self.le is not None else ''} {high}"

    @property
    def help(self) -> str:
        """What the setting accepts, as an error message says it (``accepts`` names the range
        with ``{range}``)."""
        return self.accepts.format(range=self.range_text)

    @property
    def shown_default(self) -> str:
        """The default as the README shows it."""
        if self.default is PydanticUndefined:
            return "required"
        if self.default is None:
            return self.unset
        if isinstance(self.default, bool):
            return str(self.default).lower()
        if isinstance(self.default, float):
            return f"{self.default:g}"
        if isinstance(self.default, list):
            return ", ".join(self.default)
        return str(self.default)

    def inside(self, value: float) -> bool:
        return (
            (self.gt is None or value > self.gt)
            and (self.ge is None or value >= self.ge)
            and (self.lt is None or value < self.lt)
            and (self.le is None or value <= self.le)
        )

    def field(self, *, bounded: bool = True) -> Any:
        """The pydantic field: default, description and (if ``bounded``) the range."""
        where = f" ({self.variable})" if self.variable else ""
        unset = f" Default: {self.unset}." if self.default is None else ""
        if isinstance(self.default, list):
            default: dict[str, Any] = {"default_factory": lambda: list(self.default)}
        else:
            default = {"default": self.default}
        bounds: dict[str, Any] = self.bounds if bounded else {}  # ge/gt/le/lt
        return Field(
            **default,
            description=f"{self.description}{where}.{unset}",
            # Names the setting a resource's field receives (the field's name may differ).
            json_schema_extra={SETTING_KEY: self.name},
            **bounds,
        )


_DAYS = "a number of days {range}"

SETTINGS: dict[str, Setting] = {
    setting.name: setting
    for setting in (
        Setting(
            "base_url",
            PydanticUndefined,
            "Base URL of the instance, e.g. https://yourcompany.example.com",
            "an https:// URL of your instance, e.g. https://yourcompany.example.com (plain "
            "http:// only for loopback hosts such as the bundled demo API)",
            "FIELDSALES_BASE_URL",
        ),
        Setting(
            "api_token",
            PydanticUndefined,
            "'{{ env.FIELDSALES_API_TOKEN }}': the variable holding the API token",
            "a token from your Field-Sales profile's API tab",
            "FIELDSALES_API_TOKEN",
        ),
        Setting(
            "token_store_path",
            "data/fieldsales_token.json",
            "Where the current (renewed) token is kept; must be on a persistent volume",
            "a file path on a persistent volume",
            "FIELDSALES_TOKEN_STORE",
        ),
        Setting(
            "duckdb_path",
            None,
            "The optional single-file export: each run that changed tables ends by writing one "
            "lake snapshot into this DuckDB file, replaced atomically, for tools that open only a "
            "file. It replaces only a previous export, never another DuckDB file",
            "a file path, e.g. data/fieldsales.duckdb",
            "FIELDSALES_DUCKDB_PATH",
            unset="no export",
        ),
        Setting(
            "create_dirs",
            False,
            "Create a missing folder of duckdb_path or token_store_path. Off by default: a "
            "mistyped volume path fails the load instead of filling local disk",
            "true or false",
            "FIELDSALES_CREATE_DIRS",
        ),
        Setting(
            "duckdb_memory_limit",
            "192MB",
            "DuckDB memory_limit; larger work spills to disk. Kept small so a nightly refresh "
            "of millions of rows runs in well under a gigabyte",
            "a size such as 192MB or 2GB",
            "FIELDSALES_DUCKDB_MEMORY_LIMIT",
        ),
        Setting(
            "ducklake_catalog",
            None,
            "The lake's catalog database: sqlite:<file> for one host (any number of processes), "
            "or postgres:dbname=... host=... user=... for several machines (no password: it is "
            "read from ducklake_password_env_var)",
            "the lake's catalog database: sqlite:FILE (one host) or postgres:dbname=NAME "
            "host=HOST user=USER (the password in FIELDSALES_DUCKLAKE_PASSWORD)",
            "FIELDSALES_DUCKLAKE_CATALOG",
            unset="sqlite:data/fieldsales.ducklake.sqlite",
        ),
        Setting(
            "ducklake_data_path",
            None,
            "The folder (or s3:// URL) of the lake's Parquet files. The default folder is "
            "created with a new lake; a folder you set must exist (an unmounted volume fails the "
            "run before anything is written)",
            "an existing folder (or s3:// URL) the lake's Parquet files go to",
            "FIELDSALES_DUCKLAKE_DATA_PATH",
            unset="lake/ beside a SQLite catalog (data/lake), created when needed; required with "
            "PostgreSQL",
        ),
        Setting(
            "ducklake_schema",
            None,
            "This tenant's schema in the catalog database (DuckLake's "
            "METADATA_SCHEMA), so that tenants share one catalog; its files go under "
            "<data_path>/<schema>",
            "a plain name: this tenant's schema in the catalog database",
            unset="the whole catalog",
        ),
        Setting(
            "ducklake_password_env_var",
            "FIELDSALES_DUCKLAKE_PASSWORD",
            "The variable holding the PostgreSQL catalog's password (never the password)",
            "the name of an environment variable",
        ),
        Setting(
            "retain_snapshots_days",
            7.0,
            "The lake's upkeep expires snapshots older than this (days); time travel "
            "reaches back this far",
            _DAYS,
            gt=0,
            le=3660,
        ),
        Setting(
            "page_size",
            500,
            "`limit` asked for per page (8 in flight at ~5 KB an item: ~20 MB)",
            "a whole number {range}",
            "FIELDSALES_PAGE_SIZE",
            ge=1,
            le=10_000,
        ),
        Setting(
            "max_item_mb",
            4,
            "The largest item (one transaction, event, ...) a list may hold, in MB; a larger one "
            "fails the load naming it. duckdb_memory_limit must be 16 times as large",
            "a whole number of MB {range}, at most a sixteenth of duckdb_memory_limit",
            "FIELDSALES_MAX_ITEM_MB",
            ge=1,
            le=256,  # the largest page an answer may hold (max_page_bytes)
        ),
        Setting(
            "concurrency",
            8,
            "Pages in flight at once",
            "a whole number {range}",
            "FIELDSALES_CONCURRENCY",
            ge=1,
            le=64,
        ),
        Setting(
            "schedule_cron",
            "0 5 * * *",
            "When the refresh runs",
            "a cron expression such as '0 5 * * *'",
            "FIELDSALES_SCHEDULE_CRON",
        ),
        Setting(
            "schedule_timezone",
            "UTC",
            "Time zone of the cron",
            "an IANA time zone such as UTC or Europe/Vienna",
            "FIELDSALES_SCHEDULE_TIMEZONE",
        ),
        Setting(
            "token_renew_after_days",
            45.0,
            "Renew the token once it is this old (days)",
            _DAYS + " (the token's lifetime)",
            "FIELDSALES_TOKEN_RENEW_AFTER_DAYS",
            gt=0,
            lt=TOKEN_LIFETIME_DAYS,
        ),
        Setting(
            "refresh_mode",
            "auto",
            "How raw.transactions is refreshed: auto (incremental when a complete load exists "
            "and the last full refresh is younger than full_refresh_every_days, full otherwise), "
            "full or incremental; run config on raw_transactions overrides it for one run",
            "auto, full or incremental",
            "FIELDSALES_REFRESH_MODE",
        ),
        Setting(
            "full_refresh_every_days",
            7.0,
            "In auto mode, a full refresh once the last one is this old (days)",
            _DAYS,
            gt=0,
            le=366,
        ),
        Setting(
            "lookback_days",
            30.0,
            "Incremental mode re-fetches the transactions of events whose last state change is "
            "this recent (days), besides new and changed events",
            _DAYS,
            ge=0,
            le=3660,
        ),
        Setting(
            "pii",
            "keep",
            "Personal data (names, emails, client IPs) in core.* and mart.*: keep as received, "
            "hash (keyed HMAC-SHA256; joins still work) or drop (stored as NULL). See "
            "warehouse/pii.py",
            "keep, hash or drop",
            "FIELDSALES_PII",
        ),
        Setting(
            "pii_hash_key_env_var",
            "FIELDSALES_PII_HASH_KEY",
            "The variable holding the secret key of pii: hash (never the key itself)",
            "the name of an environment variable",
        ),
        Setting(
            "redact_pii_in_raw",
            False,
            "Set the personal keys (firstName, lastName, email, ip) of raw.* payloads to null at "
            "ingest, before the new table replaces the old one",
            "true or false",
            "FIELDSALES_REDACT_PII_IN_RAW",
        ),
        Setting(
            "alert_webhook_url_env_var",
            "FIELDSALES_ALERT_WEBHOOK_URL",
            "The variable holding the webhook URL alerts are posted to, as Slack-compatible JSON "
            "(a webhook URL is a secret, so the YAML names only its variable); setting that "
            "variable turns alerts on (docs/alerts.md)",
            "the name of an environment variable",
        ),
        Setting(
            "alert_email_to",
            None,
            "Comma-separated addresses alerts are mailed to through SMTP; setting it turns "
            "alerts on (docs/alerts.md)",
            "e-mail addresses separated by commas",
            "FIELDSALES_ALERT_EMAIL_TO",
            unset="no e-mail",
        ),
        Setting(
            "alert_email_from",
            "fieldsales-dagster@localhost",
            "The sender of alert e-mails",
            "an e-mail address",
            "FIELDSALES_ALERT_EMAIL_FROM",
        ),
        Setting(
            "alert_smtp_host",
            "localhost",
            "The SMTP server alert e-mails go through (STARTTLS when it offers it)",
            "a host name",
            "FIELDSALES_ALERT_SMTP_HOST",
        ),
        Setting(
            "alert_smtp_port",
            25,
            "The SMTP server's port",
            "a port number {range}",
            "FIELDSALES_ALERT_SMTP_PORT",
            ge=1,
            le=65535,
        ),
        Setting(
            "alert_smtp_user",
            None,
            "The SMTP login, if the server wants one (its password in alert_smtp_password_env_var)",
            "a user name",
            "FIELDSALES_ALERT_SMTP_USER",
            unset="no login",
        ),
        Setting(
            "alert_smtp_password_env_var",
            "FIELDSALES_ALERT_SMTP_PASSWORD",
            "The variable holding the SMTP password (never the password)",
            "the name of an environment variable",
        ),
        Setting(
            "ui_base_url",
            None,
            "The Dagster UI's address, e.g. https://dagster.example.com: an alert links to its "
            "run there",
            "an http:// or https:// URL",
            "FIELDSALES_UI_BASE_URL",
            unset="no link",
        ),
        Setting(
            "key_prefix",
            None,
            "Asset-key prefix of this instance; set it for every tenant but the first",
            "a name of letters, digits and underscores, starting with a letter",
        ),
        Setting(
            "group_prefix",
            None,
            "Prefix of the asset groups (unset: key_prefix)",
            "a name of letters, digits and underscores, starting with a letter",
        ),
        Setting(
            "owners",
            ["team:data"],
            "Owners shown on every asset (emails or team:NAME)",
            "a list of emails or team:NAME",
        ),
        Setting(
            "user_schema",
            "analytics",
            "Where fieldsales_io_manager stores user assets' DataFrames (schema.<asset name>); "
            "never one of the project's schemas (raw, core, mart, meta)",
            "a plain name other than raw, core, mart and meta, e.g. analytics",
        ),
    )
}


def setting_field(name: str, *, bounded: bool = True) -> Any:
    """The pydantic field of setting ``name`` (see ``Setting.field``)."""
    return SETTINGS[name].field(bounded=bounded)


#: Settings of earlier releases the component still reads, only to say what became of them:
#: name -> its variable. ``storage`` (file or ducklake): DuckLake is the only storage now.
RETIRED_SETTINGS = {"storage": "FIELDSALES_STORAGE"}
