"""Alerts of a failed run or ERROR check, to a webhook or by e-mail (docs/alerts.md). A failed
check does not fail its run (dagster #29896), so a second sensor reads successful runs' checks.
"""

from __future__ import annotations

import logging
import os
import smtplib
import ssl
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from email.message import EmailMessage
from typing import Any, NamedTuple
from urllib.parse import urlsplit

import dagster as dg

from fieldsales_dagster.names import InstanceNames
from fieldsales_dagster.settings import AlertsSettings
from fieldsales_dagster.token.secret import MASK, mask_secrets
from fieldsales_dagster.token.store import TokenStore

#: Seconds a receiver gets to answer: a sensor tick must not hang on it.
SEND_TIMEOUT_S = 10
CAUSE_CHARS = 300

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AlertSettings:
    """Where alerts go, and which variables hold secrets (never the values)."""

    alerts: AlertsSettings = field(default_factory=AlertsSettings)
    #: Variables whose values never appear in a message (the API token's, the PII key's, ...).
    secret_env_vars: tuple[str, ...] = ()
    token_store: TokenStore | None = None  # a renewed token is a secret too

    @property
    def webhook_url(self) -> str | None:
        return (os.environ.get(self.alerts.webhook_url_env_var) or "").strip() or None

    @property
    def channels(self) -> list[str]:
        """Where alerts go (``webhook``, ``email``); none: alerts are off."""
        channels = {"webhook": self.webhook_url, "email": self.alerts.email_to}
        return [name for name, on in channels.items() if on]

    def secrets(self) -> list[str]:
        names = {*self.secret_env_vars, *self.alerts.secret_variables()}
        values = [(os.environ.get(name) or "").strip() for name in names]
        if self.token_store is not None:
            with suppress(Exception):  # an unreadable store holds nothing to hide from here
                if stored := self.token_store.read():
                    values.append(stored.token)
        return [value for value in values if len(value) >= 4]

    def scrub(self, text: str) -> str:
        """``text`` without any secret. The webhook URL's path, query and user info are masked
        only whole; not its scheme and host, which a run link and plain words share."""
        url = urlsplit(self.webhook_url or "")
        parts = (url.path, url.query, url.netloc.rpartition("@")[0], url.password or "")
        for part in sorted({part for part in parts if len(part) > 1}, key=len, reverse=True):
            text = text.replace(part, MASK)
        # The URL itself is masked by its parts above, never whole: its host is a run link's.
        return mask_secrets(text, [s for s in self.secrets() if s != self.webhook_url])


class Alert(NamedTuple):
    tenant: str
    headline: str
    subject: str
    cause: str
    run_id: str | None = None

    def text(self, settings: AlertSettings) -> str:
        # Only the cause is scrubbed (whole, then cut): the other lines are the project's own.
        lines = [
            f"Field-Sales [{self.tenant}]: {self.headline}",
            self.subject,
            f"Cause: {one_line(settings.scrub(self.cause))}",
        ]
        if self.run_id and (base := settings.alerts.ui_base_url):
            lines.append(f"Run: {base}/runs/{self.run_id}")  # its trailing / dropped as set
        elif self.run_id:
            lines.append(f"Run id: {self.run_id}")
        return "\n".join(lines)


def one_line(text: str) -> str:
    line = next((line.strip() for line in text.splitlines() if line.strip()), "no cause given")
    return line if len(line) <= CAUSE_CHARS else line[: CAUSE_CHARS - 1] + "…"


class Delivery(NamedTuple):
    """The channels one alert reached, and the failures, already scrubbed."""

    sent: list[str]
    failed: list[str]


def send_alert(
    settings: AlertSettings, alert: Alert, warn: Callable[[str], None] | None = None
) -> Delivery:
    """Post and mail ``alert``, as configured. Never raises: a failure is logged, given to
    ``warn`` (the sensor's log) and returned."""
    text, alerts, delivery = alert.text(settings), settings.alerts, Delivery([], [])
    named = alerts.named  # this tenant's variables
    for name in settings.channels:
        try:
            if name == "webhook":
                _post(settings.webhook_url or "", text)
            else:
                _mail(alerts, text)
        except Exception as exc:
            if isinstance(exc, smtplib.SMTPAuthenticationError):
                what = f"{named('FIELDSALES_ALERT_SMTP_USER')} and {alerts.smtp_password_env_var}"
            elif name == "webhook":
                what = f"{alerts.webhook_url_env_var} and that the receiver is up"
            else:
                smtp = (named("FIELDSALES_ALERT_SMTP_HOST"), named("FIELDSALES_ALERT_SMTP_PORT"))
                what = "/".join(smtp) + " and that it is up"
            message = (
                f"Field-Sales [{alert.tenant}]: the {name} alert ({alert.headline}) could not be "
                f"sent: {type(exc).__name__}: {one_line(settings.scrub(str(exc)))}. The run is not "
                f"affected; check {what}."
            )
            logger.warning(message)
            if warn is not None:
                warn(message)
            delivery.failed.append(message)
        else:
            delivery.sent.append(name)
    return delivery


def _post(url: str, text: str) -> None:
    import requests  # here: its import is not part of the definitions' load

    requests.post(url, json={"text": text}, timeout=SEND_TIMEOUT_S).raise_for_status()


def _mail(settings: AlertsSettings, text: str) -> None:
    message = EmailMessage()
    message["Subject"] = text.splitlines()[0]
    message["From"] = settings.email_from
    message["To"] = settings.email_to
    message.set_content(text)
    with smtplib.SMTP(settings.smtp_host, settings.smtp_port, timeout=SEND_TIMEOUT_S) as smtp:
        smtp.ehlo()
        if smtp.has_extn("starttls"):
            smtp.starttls(context=ssl.create_default_context())  # login and send greet again
        if settings.smtp_user:
            smtp.login(settings.smtp_user, os.environ.get(settings.smtp_password_env_var) or "")
        smtp.send_message(message)


def run_assets(run: dg.DagsterRun, instance: dg.DagsterInstance) -> set[dg.AssetKey]:
    """The assets a run was launched for (its checks' too); for a whole job, those it planned."""
    checked = {key.asset_key for key in run.asset_check_selection or ()}
    if selected := set(run.asset_selection or ()) | checked:
        return selected
    records = instance.get_records_for_run(
        run.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION_PLANNED
    ).records
    events = [record.event_log_entry.dagster_event for record in records]
    return {event.asset_key for event in events if event is not None and event.asset_key}


def root_cause(error: Any) -> str:
    """The innermost error of a Dagster failure (its ``SerializableErrorInfo``: ``message``,
    ``cls_name``, ``cause``), in one line, rather than Dagster's wrapper."""
    while error.cause is not None:
        error = error.cause
    first = next((line for line in error.message.splitlines() if line.strip()), "").strip()
    name = f"{error.cls_name}: " if error.cls_name else ""
    return name + first.split(name, 1)[-1] if name and name in first else first


def launched(run: dg.DagsterRun, instance: dg.DagsterInstance, shown: int = 3) -> str:
    """What a run ran, as its user knows it: its job, or its assets when its job is one Dagster
    makes and hides (``__ASSET_JOB``: ``dg launch --assets``, the UI's Materialize, automation)."""
    if not run.job_name.startswith("__"):
        return run.job_name
    names = sorted(key.to_user_string() for key in run_assets(run, instance))
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more if names else "assets"


def _metadata_cause(metadata: Mapping[str, object]) -> str:
    return "; ".join(
        f"{key}: {getattr(value, 'value', value)}"
        for key, value in list(metadata.items())[:3]
        if not key.startswith("dagster/")
    )


def build_alert_sensors(
    names: InstanceNames,
    settings: AlertSettings,
    job_names: Iterable[str],
    asset_keys: Iterable[dg.AssetKey],
) -> Sequence[dg.SensorDefinition]:
    if not settings.channels:
        return []
    jobs, keys, where = frozenset(job_names), frozenset(asset_keys), ", ".join(settings.channels)

    def not_ours(context: dg.RunStatusSensorContext) -> dg.SkipReason | None:
        run = context.dagster_run
        if run.job_name in jobs or run_assets(run, context.instance) & keys:
            return None
        return dg.SkipReason(f"not a run of {names.tenant}")

    # Every code location's runs, told apart by ``not_ours``: a run launched in-process (``dg
    # launch``) has no origin to match a location by, so a location's sensor would never see it.
    @dg.run_failure_sensor(
        name=names.alert_sensor,
        monitor_all_code_locations=True,
        default_status=dg.DefaultSensorStatus.RUNNING,
        minimum_interval_seconds=30,
        description=(
            f"Alerts ({where}) when a run of this Field-Sales instance ({names.tenant}) fails: "
            "its refresh, its token renewal, or any run of its assets (docs/alerts.md)."
        ),
    )
    def _run_failed(context: dg.RunFailureSensorContext) -> dg.SkipReason | None:
        if skip := not_ours(context):
            return skip
        run = context.dagster_run
        ran = launched(run, context.instance)
        failures = context.get_step_failure_events()
        failed = ", ".join(event.step_key or "?" for event in failures) or ran
        if failures and (error := failures[0].step_failure_data.error):
            cause = root_cause(error)
        else:
            cause = (failures[0] if failures else context.failure_event).message or "the run failed"
        alert = Alert(names.tenant, f"run of {ran} failed", f"Failed: {failed}", cause, run.run_id)
        send_alert(settings, alert, warn=context.log.warning)
        return None

    @dg.run_status_sensor(
        name=names.check_alert_sensor,
        run_status=dg.DagsterRunStatus.SUCCESS,
        monitor_all_code_locations=True,
        default_status=dg.DefaultSensorStatus.RUNNING,
        minimum_interval_seconds=30,
        description=(
            f"Alerts ({where}) when a check of ERROR severity fails in a successful run of this "
            f"Field-Sales instance ({names.tenant}): a failed check does not fail its run."
        ),
    )
    def _checks_failed(context: dg.RunStatusSensorContext) -> dg.SkipReason | None:
        if skip := not_ours(context):
            return skip
        run = context.dagster_run
        records = context.instance.get_records_for_run(
            run.run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION
        ).records
        alerts = [
            Alert(
                names.tenant,
                f"check {e.check_name} failed (ERROR)",
                f"Check: {e.asset_key.to_user_string()} / {e.check_name}",
                e.description or _metadata_cause(e.metadata) or "check failed",
                run.run_id,
            )
            for record in records
            for e in [record.event_log_entry.get_dagster_event().asset_check_evaluation_data]
            if not e.passed and e.severity == dg.AssetCheckSeverity.ERROR and e.asset_key in keys
        ]
        for alert in alerts:
            send_alert(settings, alert, warn=context.log.warning)
        return None if alerts else dg.SkipReason("no check of ERROR severity failed")

    return [_run_failed, _checks_failed]
