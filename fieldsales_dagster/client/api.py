"""The Field-Sales read API: requests, the token, retries and page decoding (docs/refresh.md).

429, 5xx, 408, dropped connections, timeouts and bodies cut off mid-JSON are retried with bounded
backoff; a complete body that is not JSON fails at once. The token is masked in every error."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Container
from typing import TYPE_CHECKING, NoReturn, cast

import dagster as dg
import msgspec
import tenacity
from pydantic import Field, PrivateAttr
from urllib3.exceptions import InvalidHeader
from urllib3.util import Retry

from fieldsales_dagster.client.endpoints import CHECK_TOKEN_PATH, ListEndpoint
from fieldsales_dagster.client.envelope import (
    ListStats,
    Page,
    digest,
    replace_lone_surrogates,
    split_envelope,
)
from fieldsales_dagster.client.errors import (
    AuthenticationError,
    FieldSalesAPIError,
    NotJSONError,
    TransientHTTPError,
    UnreachableError,
    token_refused,
)
from fieldsales_dagster.settings import ApiSettings, settings_resource
from fieldsales_dagster.token.catalog import open_token_store
from fieldsales_dagster.token.secret import TokenFormatError, clean_token, mask_secrets
from fieldsales_dagster.token.store import RENEWAL_WAIT_S, TokenStore
from fieldsales_dagster.urls import Origin, origin_of, validate_base_url

if TYPE_CHECKING:
    # Imported where a request is sent: its ``requests`` (~70 ms) is not part of the definitions'
    # load.
    from fieldsales_dagster.client.transport import QueryParams

#: Where a ``catalog`` token store's row is: the settings ``CatalogTokenStore`` takes.
TOKEN_ROW = ("ducklake_catalog", "ducklake_password_env_var", "ducklake_schema")


def _raised(state: tenacity.RetryCallState) -> TransientHTTPError:
    """What the attempt ``state`` follows raised: a retried failure, so a TransientHTTPError."""
    return cast(TransientHTTPError, cast(tenacity.Future, state.outcome).exception())


def _clean(token: str, source: str) -> str:
    try:
        return clean_token(token, source)
    except TokenFormatError as exc:
        raise AuthenticationError(str(exc)) from None


class FieldSalesAPI(settings_resource("ApiSettings", ApiSettings, but=("api_token",))):  # type: ignore[misc]
    """Client of one Field-Sales instance's read API. The token comes from
    ``FIELDSALES_API_TOKEN`` and, once seen, from the token store the renewal job keeps current."""

    api_token: str = Field(
        description="API token; set it with EnvVar('FIELDSALES_API_TOKEN'), never as a literal.",
        repr=False,
    )
    use_token_store: bool = Field(default=True, description="Read the token from the store.")
    ducklake_catalog: str | None = Field(
        default=None, description="With token_store_path 'catalog': the row's PostgreSQL catalog."
    )
    ducklake_password_env_var: str = Field(default="FIELDSALES_DUCKLAKE_PASSWORD")
    ducklake_schema: str | None = Field(default=None, description="The lake's row's key.")
    connect_timeout_s: float = Field(default=10.0, gt=0)
    read_timeout_s: float = Field(default=120.0, gt=0)
    request_deadline_s: float = Field(
        default=180.0, gt=0, le=3600, description="Longest one request, to the body's last byte."
    )
    retry_budget_s: float = Field(
        default=300.0, gt=0, le=86400, description="Longest one request with all its retries."
    )
    unreachable_budget_s: float = Field(
        default=10.0, ge=0, le=3600, description="How long a host that cannot connect is retried."
    )
    max_page_bytes: int = Field(
        default=256 * 1024 * 1024, ge=1024, description="Largest body, once decompressed."
    )
    max_retries: int = Field(default=6, ge=0, description="Retries of one request.")
    backoff_initial_s: float = Field(default=1.0, ge=0)
    backoff_max_s: float = Field(default=60.0, ge=0)
    max_list_passes: int = Field(
        default=3, ge=1, description="Passes over a list whose ids disagree with its total."
    )
    max_pages_per_pass: int = Field(
        default=100_000, ge=1, le=10_000_000, description="Most pages of one pass over a list."
    )
    max_retry_after_s: float = Field(
        default=300.0, ge=0, description="Longest Retry-After honoured before giving up."
    )

    _local: threading.local = PrivateAttr(default_factory=threading.local)
    _env_verdicts: dict[str, bool] = PrivateAttr(default_factory=dict)
    _settled: bool = PrivateAttr(default=False)

    @property
    def root(self) -> str:
        return validate_base_url(self.base_url)

    @property
    def origin(self) -> Origin:
        return cast(Origin, origin_of(self.root))  # validate_base_url accepted it

    def token_store(self) -> TokenStore | None:
        """The store of this instance's token, bound to its origin: another server's is refused."""
        if not self.use_token_store:
            return None
        keywords = {name: getattr(self, name) for name in TOKEN_ROW}
        return open_token_store(self.token_store_path, str(self.origin), self.variables, **keywords)

    def env_token(self) -> str:
        return _clean(self.api_token, self.named("FIELDSALES_API_TOKEN"))

    def current_token(self) -> str:
        env_token, store = self.env_token(), self.token_store()
        return store.current(env_token, accept=self.server_accepts).token if store else env_token

    def server_accepts(self, env_token: str) -> bool:
        """Whether the server takes a new ``FIELDSALES_API_TOKEN`` the store has never seen (asked
        once per process and token); until it does, the store's token stays in use."""
        verdicts = self._env_verdicts
        if env_token not in verdicts:
            try:
                self.get(CHECK_TOKEN_PATH, token=env_token, max_retries=1)
                verdicts[env_token] = True
            except FieldSalesAPIError as exc:
                verdicts[env_token] = False
                dg.get_dagster_logger().warning(
                    f"{self.named('FIELDSALES_API_TOKEN')} holds a new token the server did not "
                    f"accept ({type(exc).__name__}); the stored one stays: check it for a typo."
                )
        return verdicts[env_token]

    def _scrub(self, text: str, *tokens: str, limit: int | None = None) -> str:
        return mask_secrets(text, (self.api_token, self.api_token.strip(), *tokens), limit)

    def _snippet(self, body: bytes, token: str) -> str:
        """The start of ``body`` as text (its first 64 KiB searched): the token masked, then cut."""
        return self._scrub(body[: 64 * 1024].decode("utf-8", "replace"), token, limit=200)

    def _get_once(
        self,
        path: str,
        params: QueryParams | None,
        token: str,
        deadline_s: float,
        parse: Callable[[bytes, str], object] | None = None,
        stats: ListStats | None = None,
    ) -> object:
        """One request (no retries); its body, or ``parse(body, on)`` (``on`` names the request)."""
        from fieldsales_dagster.client.transport import Limits, fetch, new_session

        where = f"GET {path}" + (f" (skip={params['skip']})" if params and "skip" in params else "")
        on = f"{where} on {self.origin.host}:{self.origin.port}"
        limits = Limits(
            connect_timeout_s=self.connect_timeout_s,
            read_timeout_s=self.read_timeout_s,
            deadline_s=deadline_s,
            max_body_bytes=self.max_page_bytes,
            deadline_source=f"what was left of retry_budget_s={self.retry_budget_s:g}"
            if deadline_s < self.request_deadline_s
            else f"request_deadline_s={self.request_deadline_s:g}",
            base_url=self.named("FIELDSALES_BASE_URL"),
        )
        if not hasattr(self._local, "session"):  # one per thread
            self._local.session = new_session(self.origin)
        resp, body = fetch(
            self._local.session,
            self.origin,
            self.root + path,
            params=params,
            token=token,
            on=on,
            limits=limits,
            scrub=lambda text: self._scrub(text, token),
        )
        if (status := resp.status_code) in (401, 403):
            raise token_refused(status, where, self.named("FIELDSALES_API_TOKEN"))
        if status == 429 or status >= 500 or status == 408:
            retry_after = None
            with contextlib.suppress(InvalidHeader):  # absent or neither seconds nor a date
                retry_after = Retry(0).parse_retry_after(resp.headers.get("Retry-After", ""))
            raise TransientHTTPError(f"{on}: HTTP {status}", retry_after)
        if status != 200:
            snippet = self._snippet(body, token)
            raise FieldSalesAPIError(f"{on} answered HTTP {status}: {snippet!r}")
        if parse is None:
            return body
        # Parsed here, telling a body cut off (retried) from one that is not JSON (not).
        answer, replaced = body, 0
        what = f"{resp.headers.get('Content-Type') or 'no Content-Type'}, {len(body)} bytes"
        while True:
            try:
                result = parse(body, on)
            except msgspec.DecodeError as exc:
                reason = str(exc)
            except RecursionError:
                raise NotJSONError(
                    f"{on} answered JSON nested deeper than the decoder allows ({what})."
                ) from None
            else:
                if replaced and stats:
                    stats.count(surrogates_replaced=replaced)
                return result
            # A lone surrogate escape (a string cut mid-emoji) trips the decoder: replace it
            # with U+FFFD, count it, and decode again.
            if replaced or not (fixed := replace_lone_surrogates(body))[1]:
                break
            body, replaced = fixed
        if "truncated" in reason:
            raise TransientHTTPError(f"{on}: body cut off mid-JSON ({reason})")
        raise NotJSONError(
            f"{on} answered a body that is not JSON ({what}; {reason}): "
            f"{self._snippet(answer, token)!r}. Check {self.named('FIELDSALES_BASE_URL')}."
        )

    def _wait(self, state: tenacity.RetryCallState) -> float:
        """The backoff, or the server's Retry-After if longer; one beyond ``max_retry_after_s``
        fails."""
        exc = _raised(state)
        backoff = tenacity.wait_exponential_jitter(
            initial=self.backoff_initial_s, max=self.backoff_max_s, jitter=self.backoff_initial_s
        )
        if (retry_after := exc.retry_after) is not None and retry_after > self.max_retry_after_s:
            raise FieldSalesAPIError(
                f"{exc}: the server asks to wait {retry_after:.0f} s (Retry-After), longer "
                f"than max_retry_after_s={self.max_retry_after_s:.0f}; try again later."
            )
        # `Retry-After: 0` from a struggling server must not turn into a burst of requests.
        return max(retry_after or 0.0, backoff(state))

    def get(
        self,
        path: str,
        params: QueryParams | None = None,
        *,
        token: str | None = None,
        parse: Callable[[bytes, str], object] | None = None,
        stats: ListStats | None = None,
        max_retries: int | None = None,
    ) -> object:
        """GET ``path`` with retries; ``parse(body, on)`` runs inside them (a cut-off body is
        fetched again). A given ``token`` is used as it is (no store, no re-read on 401)."""
        retries = self.max_retries if max_retries is None else max_retries
        fixed_token = None if token is None else _clean(token, "the token given")
        current = fixed_token or self.current_token()
        stats, reread, started = stats or ListStats(), False, time.monotonic()
        while True:

            def attempt(token: str = current) -> object:
                stats.count(requests=1)
                remaining = self.retry_budget_s - (time.monotonic() - started)
                deadline_s = min(self.request_deadline_s, max(remaining, 1.0))
                return self._get_once(path, params, token, deadline_s, parse, stats)

            try:  # a new token: a new series of attempts
                result = self._retrying(started, retries, stats)(attempt)
            except AuthenticationError as refused:
                # A renewal may have replaced the token since this run read it: re-read once.
                store = None if reread or fixed_token is not None else self.token_store()
                if store is not None:
                    store.wait_for_renewal(RENEWAL_WAIT_S)
                if store is None or (fresh := self.current_token()) == current:
                    raise refused from None
                current, reread = fresh, True
                stats.count(token_rereads=1)
            else:
                # Accepted: the store may record the token now (once per resource).
                if fixed_token is None and not self._settled and (store := self.token_store()):
                    store.settle(self.env_token(), current)
                    self._settled = True
                return result

    def _retrying(self, started: float, retries: int, stats: ListStats) -> tenacity.Retrying:
        # Only a TransientHTTPError is retried: it is what ``_raised`` finds in these callbacks.
        def stop(state: tenacity.RetryCallState) -> bool:
            unreachable = _raised(state).unreachable
            budget = self.unreachable_budget_s if unreachable else self.retry_budget_s
            spent = time.monotonic() - started + state.upcoming_sleep
            return state.attempt_number > retries or spent > budget

        def before_sleep(state: tenacity.RetryCallState) -> None:
            stats.count(retries=1)
            # Counted in attempts, as the final error is: attempt 1 is the first request.
            dg.get_dagster_logger("fieldsales_dagster.client").warning(
                f"{_raised(state)}; attempt {state.attempt_number} of at most {retries + 1} "
                f"failed, next in {state.upcoming_sleep:.1f} s"
            )

        def give_up(state: tenacity.RetryCallState) -> NoReturn:
            exc = _raised(state)
            spent = (
                f"{exc}; gave up after attempt {state.attempt_number} of at most {retries + 1}, "
                f"{time.monotonic() - started:.1f} s after the first"
            )
            if exc.unreachable:
                raise UnreachableError(
                    f"{spent} (unreachable_budget_s={self.unreachable_budget_s:g}). Check "
                    f"{self.named('FIELDSALES_BASE_URL')} ({self.origin}) and that the host is up."
                )
            raise FieldSalesAPIError(
                f"{spent} (max_retries={retries}, retry_budget_s={self.retry_budget_s:g}). "
                "Try again later, or raise max_retries or retry_budget_s."
            )

        return tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(TransientHTTPError),
            stop=stop,
            wait=self._wait,
            before_sleep=before_sleep,
            retry_error_callback=give_up,
        )

    def check_token(self, token: str | None = None) -> None:
        self.get(CHECK_TOKEN_PATH, token=token)

    def fetch_page(
        self,
        endpoint: ListEndpoint,
        skip: int,
        stats: ListStats | None = None,
        known: Container[int] = (),
    ) -> Page:
        """One page of ``endpoint`` from ``skip``. A body whose ``digest`` is in ``known`` (one
        already parsed) is not parsed again: its page has no items."""
        params = {"skip": skip, "limit": self.page_size, **dict(endpoint.params)}

        def parse(body: bytes, on: str) -> Page:
            key = digest(body)
            items, total = ([], None) if key in known else split_envelope(body, endpoint, on)
            return Page(skip, items, total, len(body), digest=key)

        return cast(Page, self.get(endpoint.path, params, parse=parse, stats=stats))
