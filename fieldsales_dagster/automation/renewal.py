"""When and how the API token is renewed (docs/token-lifecycle.md); no Dagster here.

``generatetoken`` is sent once: the server invalidates the old token as it answers, so a lost
answer must never be retried. Otherwise the token is tested once a day: the test route's answer
may be a whole list. The sensor's ``decide`` only reads the store; the run does the rest.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, cast

import msgspec

from fieldsales_dagster.client.endpoints import GENERATE_TOKEN_PATH
from fieldsales_dagster.client.errors import (
    RENEW_TOKEN_INSTRUCTION,
    AuthenticationError,
    FieldSalesAPIError,
)
from fieldsales_dagster.clock import from_the_future
from fieldsales_dagster.settings import TOKEN_LIFETIME_DAYS
from fieldsales_dagster.token.secret import TokenFormatError, clean_token
from fieldsales_dagster.token.store import StoredToken, TokenStore

if TYPE_CHECKING:
    from fieldsales_dagster.client.api import FieldSalesAPI

TOKEN_LIFETIME = timedelta(days=TOKEN_LIFETIME_DAYS)
TICK_INTERVAL = timedelta(hours=6)
# A tick's budget: 15 s a request; a renewal and its test are not retried, a test alone once.
TICK_CONNECT_TIMEOUT_S = 3.0
TICK_READ_TIMEOUT_S = 12.0
TICK_BACKOFF_S = 1.0
RENEWAL_OFF = (
    "Token renewal is off: use_token_store is False, so a renewed token could not be kept; "
    "FIELDSALES_API_TOKEN is used as it is."
)


class TokenRenewalError(FieldSalesAPIError):
    """Renewal failed in a way that needs a person. Messages never carry a token."""


@dataclass(frozen=True)
class RenewalPolicy:
    """Renew a token once it is ``renew_after`` old; test it every day otherwise."""

    renew_after: timedelta

    def renewal_due(self, store: TokenStore, stored: StoredToken, now: datetime) -> str | None:
        """Why ``stored`` is due for renewal at ``now``; ``None`` when it is not."""
        where = f"the token store's issued_at ({store.where})"
        if (future := from_the_future(stored.issued_at, now, where)) is not None:
            return f"renewal due because {future}"
        return "renewal due" if stored.age(now) >= self.renew_after else None

    def valid_until(self, stored: StoredToken) -> str:
        return (stored.issued_at + TOKEN_LIFETIME).astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


class _GeneratedToken(msgspec.Struct):
    """The one field of the renewal answer we need; ``user`` is not even decoded."""

    token: str


def within_tick(api: FieldSalesAPI, retries: int) -> FieldSalesAPI:
    return api.model_copy(
        update={
            "connect_timeout_s": TICK_CONNECT_TIMEOUT_S,
            "read_timeout_s": TICK_READ_TIMEOUT_S,
            "max_retries": retries,
            "backoff_initial_s": TICK_BACKOFF_S,
            "backoff_max_s": TICK_BACKOFF_S,
            "max_retry_after_s": TICK_BACKOFF_S,
            "request_deadline_s": TICK_CONNECT_TIMEOUT_S + TICK_READ_TIMEOUT_S,
            "retry_budget_s": 2 * (TICK_CONNECT_TIMEOUT_S + TICK_READ_TIMEOUT_S) + TICK_BACKOFF_S,
            "unreachable_budget_s": TICK_BACKOFF_S * 2,
        }
    )


def generate_token(api: FieldSalesAPI, old_token: str) -> str:
    """The new token, from one ``generatetoken`` with ``old_token``; any failure here may have
    invalidated the old token, so the message says what to do."""
    instruction = RENEW_TOKEN_INSTRUCTION.format(api.named("FIELDSALES_API_TOKEN"))
    try:
        body = within_tick(api, retries=0).get(GENERATE_TOKEN_PATH, token=old_token)
    except AuthenticationError as exc:
        raise TokenRenewalError(f"Token renewal refused: {exc}") from None
    except FieldSalesAPIError as exc:
        raise TokenRenewalError(
            f"Token renewal failed: {exc} If requests now fail with HTTP 401 (the server renewed "
            f"the token, and its answer was lost): {instruction}"
        ) from None
    new_token = ""  # unless the body decodes: the decoder's message may quote it, never chained
    with contextlib.suppress(msgspec.DecodeError):  # a ValidationError too
        new_token = msgspec.json.decode(cast(bytes, body), type=_GeneratedToken).token
    try:
        if not (new_token := clean_token(new_token, f"the answer of GET {GENERATE_TOKEN_PATH}")):
            raise TokenFormatError(f"GET {GENERATE_TOKEN_PATH} answered 200 without a token.")
    except TokenFormatError as exc:
        raise TokenRenewalError(
            f"{exc} The old token may be invalid already. {instruction}"
        ) from None
    return new_token


def check_token(api: FieldSalesAPI, token: str | None, what: str, *, retries: int) -> None:
    """Test a token (``None``: the stored one, re-read once if refused) on the test route."""
    try:
        within_tick(api, retries=retries).check_token(token=token)
    except AuthenticationError as exc:
        raise TokenRenewalError(f"{what} was refused: {exc}") from None


def decide(
    store: TokenStore, env_token: str, policy: RenewalPolicy, cursor: str | None
) -> tuple[bool, str, str | None]:
    """Whether a run is due, why, and the sensor's new cursor. A run is due if the token is
    ``renew_after`` old, or a day passed since the last test; a sensor's first tick only starts
    that day (the first refresh tests a token not yet due)."""
    now = datetime.now(UTC)
    stored = store.peek(env_token)
    if (due := policy.renewal_due(store, stored, now)) is not None:
        return True, due, now.isoformat()
    if cursor is None:
        first = _not_yet_due(policy, stored, now, checked=False)
        return False, f"{first}; the daily test starts a day from now", now.isoformat()
    with contextlib.suppress(ValueError):  # a last test that does not parse is unknown: test now
        last_run = datetime.fromisoformat(cursor)
        # Half a tick of slack, so 6-hour ticks test the token every 24 hours, not every 30; a
        # last test from the future is unknown: test now.
        if not from_the_future(last_run, now, "the last token test") and (
            now - last_run < timedelta(days=1) - TICK_INTERVAL / 2
        ):
            return False, _not_yet_due(policy, stored, now, checked=False), cursor
    return True, "daily test of the token due", now.isoformat()


def _not_yet_due(policy: RenewalPolicy, stored: StoredToken, now: datetime, checked: bool) -> str:
    days_left = (policy.renew_after - stored.age(now)).total_seconds() / 86400
    return (
        f"not yet due: {days_left:.1f} days left before renewal (token valid until about "
        f"{policy.valid_until(stored)}{'; accepted by the server' if checked else ''})"
    )


def renew_or_check(api: FieldSalesAPI, store: TokenStore, policy: RenewalPolicy) -> str:
    """What the run did: renewed the token (and where it is stored now), or tested it."""
    now = datetime.now(UTC)
    stored = store.current(api.env_token(), accept=api.server_accepts)
    if (due := policy.renewal_due(store, stored, now)) is not None:
        rotation = store.rotate(
            api.api_token,
            lambda old_token: generate_token(api, old_token),
            renew_after=policy.renew_after,
            lock_timeout_s=10.0,
        )
        check_token(api, rotation.stored.token, "The renewed token (stored already)", retries=0)
        verb = "renewed" if rotation.renewed else "renewed by another process"
        stored_in = f"; stored in {store.where}" if rotation.renewed else ""
        valid = f"; valid until {policy.valid_until(rotation.stored)}"
        return f"token {verb}{due.removeprefix('renewal due')}{valid}{stored_in}"
    check_token(api, None, "The current API token", retries=1)
    return _not_yet_due(policy, stored, now, checked=True)
