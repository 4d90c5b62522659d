"""The token-renewal sensor: renews the API token well before its two months run out.

Each tick reads the stored token's age. Past ``FIELDSALES_TOKEN_RENEW_AFTER_DAYS`` (default 45 of
the 60 days) it renews through ``TokenStore.rotate``: ``GET /api/bearer/generatetoken`` with the
current token, sent once (the server invalidates the old token as it answers, so a lost answer
must not be followed by a retry), the new token stored durably before anything else, then tested
with ``GET /api/sellout/all``. Otherwise the token is tested at most once a day (the last check's
time is the sensor cursor): the test route's answer is not documented and may be a whole list, so
every 6-hour tick would be more traffic than a token that changes every 45 days deserves, while a
daily check still reports a token regenerated in the UI or expired before the next refresh fails.

A refused token fails the tick, with what to do; the tick never shows the token.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

import dagster as dg
import msgspec

from fieldsales_dagster.client.endpoints import GENERATE_TOKEN_PATH
from fieldsales_dagster.client.errors import (
    RENEW_TOKEN_INSTRUCTION,
    AuthenticationError,
    FieldSalesAPIError,
)
from fieldsales_dagster.client.resource import FieldSalesAPI
from fieldsales_dagster.token.store import StoredToken

RENEW_AFTER_ENV_VAR = "FIELDSALES_TOKEN_RENEW_AFTER_DAYS"
DEFAULT_RENEW_AFTER_DAYS = 45.0
#: "A token is valid for 2 months" (API document, section 5).
TOKEN_LIFETIME = timedelta(days=60)
#: How often a token that is not due for renewal is tested against the server.
CHECK_EVERY = timedelta(days=1)
TICK_INTERVAL = timedelta(hours=6)


class TokenRenewalError(FieldSalesAPIError):
    """Renewal failed in a way that needs a person. Messages never carry a token."""


class _GeneratedToken(msgspec.Struct):
    """The one field of the renewal answer we need first; ``user`` is not even decoded."""

    token: str


_GENERATED_TOKEN = msgspec.json.Decoder(_GeneratedToken)


def renew_after() -> timedelta:
    raw = os.environ.get(RENEW_AFTER_ENV_VAR, "").strip()
    if not raw:
        return timedelta(days=DEFAULT_RENEW_AFTER_DAYS)
    try:
        days = float(raw)
    except ValueError:
        days = -1.0
    if not 0 < days < TOKEN_LIFETIME.days:
        raise ValueError(
            f"{RENEW_AFTER_ENV_VAR}={raw!r} must be a number of days between 0 and "
            f"{TOKEN_LIFETIME.days} (the token's lifetime); the default is "
            f"{DEFAULT_RENEW_AFTER_DAYS:g}."
        )
    return timedelta(days=days)


def generate_token(api: FieldSalesAPI, old_token: str) -> str:
    """``GET /api/bearer/generatetoken`` once with ``old_token``; returns the new token.

    The body is read for its ``token`` and nothing else; any failure here may have left the old
    token invalidated, so the message says what to do.
    """
    try:
        body = api.get(GENERATE_TOKEN_PATH, token=old_token, max_retries=0)
    except AuthenticationError as exc:
        raise TokenRenewalError(f"Token renewal refused: {exc}") from None
    except FieldSalesAPIError as exc:
        raise TokenRenewalError(
            f"Token renewal failed: {exc} If the server renewed the token before its answer was "
            "lost, the stored token is no longer valid; if requests now fail with HTTP 401: "
            f"{RENEW_TOKEN_INSTRUCTION}"
        ) from None
    try:
        new_token = _GENERATED_TOKEN.decode(body).token  # type: ignore[arg-type]
    except (msgspec.DecodeError, msgspec.ValidationError):
        new_token = ""  # the decoder's message may quote the body: never chain it
    if not new_token:
        raise TokenRenewalError(
            f"GET {GENERATE_TOKEN_PATH} answered 200 without a token string; the old token may "
            f"already be invalid. {RENEW_TOKEN_INSTRUCTION}"
        )
    return new_token


def _valid_until(stored: StoredToken) -> str:
    return (stored.issued_at + TOKEN_LIFETIME).astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def _check(api: FieldSalesAPI, token: str | None, what: str) -> None:
    """Test a token (``None``: the stored one, re-read once if refused) on the test route."""
    try:
        api.check_token(token=token)
    except AuthenticationError as exc:
        raise TokenRenewalError(f"{what} was refused: {exc}") from None


def _last_check(cursor: str | None) -> datetime | None:
    try:
        return datetime.fromisoformat(cursor) if cursor else None
    except ValueError:
        return None


@dg.sensor(
    minimum_interval_seconds=int(TICK_INTERVAL.total_seconds()),
    default_status=dg.DefaultSensorStatus.RUNNING,
    description=(
        "Renews the Field-Sales API token (valid 2 months) once it is older than "
        f"{RENEW_AFTER_ENV_VAR} days (default {DEFAULT_RENEW_AFTER_DAYS:g}): stores the new token "
        "durably in the token store, then tests it. Tests the current token once a day "
        "otherwise. A refused token fails the tick: regenerate it in your Field-Sales user "
        "profile (API tab) and set FIELDSALES_API_TOKEN. Requests no runs."
    ),
)
def token_renewal_sensor(context: dg.SensorEvaluationContext, fieldsales_api: FieldSalesAPI):
    store = fieldsales_api.token_store()
    if store is None:
        return dg.SkipReason(
            "token renewal is off: fieldsales_api.use_token_store is False, so a renewed token "
            "could not be kept; FIELDSALES_API_TOKEN is used as it is."
        )
    threshold = renew_after()
    now = datetime.now(UTC)
    stored = store.current(fieldsales_api.api_token)

    if stored.age(now) >= threshold:
        rotation = store.rotate(
            fieldsales_api.api_token,
            lambda old_token: generate_token(fieldsales_api, old_token),
            renew_after=threshold,
        )
        _check(fieldsales_api, rotation.token, "The renewed token (stored already)")
        verb = "renewed" if rotation.renewed else "renewed by another process"
        message = f"token {verb}; valid until {_valid_until(rotation.stored)}"
        context.log.info(f"Field-Sales API {message}; stored in {store.path}.")
        return dg.SensorResult(skip_reason=message, cursor=now.isoformat())

    last_check = _last_check(context.cursor)
    # Half a tick of slack, so 6-hour ticks test the token every 24 hours, not every 30.
    checked = last_check is None or now - last_check >= CHECK_EVERY - TICK_INTERVAL / 2
    if checked:
        _check(fieldsales_api, None, "The current API token")
    days_left = (threshold - stored.age(now)).total_seconds() / 86400
    message = (
        f"not yet due: {days_left:.1f} days left before renewal (token valid until about "
        f"{_valid_until(stored)}{'; accepted by the server' if checked else ''})"
    )
    return dg.SensorResult(
        skip_reason=message, cursor=now.isoformat() if checked else context.cursor
    )


#: Evaluates the core assets' `AutomationCondition.eager()`: after any raw table is refreshed
#: (the schedule, the UI, the CLI), the core tables that read it are rebuilt. On by default, like
#: the schedule; Dagster's own default automation sensor starts stopped.
core_automation_sensor = dg.AutomationConditionSensorDefinition(
    "core_automation_sensor",
    target=dg.AssetSelection.all(),
    default_status=dg.DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=60,
    description=(
        "Rebuilds core tables once their raw parents were refreshed (AutomationCondition.eager)."
    ),
)

all_sensors = [token_renewal_sensor, core_automation_sensor]
