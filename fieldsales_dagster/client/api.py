"""The Field-Sales read API: HTTP, authentication, retries and pagination, nothing about storage.

Every rule of SPEC "Behaviour the API document implies" that concerns HTTP lives here:

* ``skip`` advances by the items a page returned, never by the ``limit`` asked for, so a server
  that caps ``limit`` silently still yields every item;
* the total comes from ``count`` or ``total`` where the server gives one; without one, the list
  ends at the first empty page;
* any envelope is accepted: a bare JSON list, or an object holding one list (and maybe a total);
* 429, 5xx, dropped connections, timeouts and bodies cut off mid-JSON are retried with bounded
  exponential backoff (tenacity), honouring ``Retry-After`` but never waiting less than the
  backoff; retries stop at ``max_retries`` or ``retry_budget_s`` (``unreachable_budget_s`` for a
  host that cannot be connected to), and each is logged as a warning while it happens;
* a complete 200 body that is not JSON, or JSON nested too deep, fails at once, quoting what
  came back; lone surrogate escapes are replaced by U+FFFD and counted;
* 401/403 stop with an error naming the endpoint and what to do, never the token;
* the token is cleaned where it enters and masked (whole and in fragments) in every error;
* the HTTP limits (deadline per request, body cap, redirects, proxies) live in ``transport.py``;
  the base URL is validated with urllib3's parser in ``urls.py``: plain ``http://`` only for
  loopback.

Where the total is known, pages are fetched concurrently: the API is random access by ``skip``.
Checking the pass against the final total (distinct ids) needs the stored rows, so it lives with
the loader (``raw_load.py``), which asks for another pass when they disagree.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Container
from typing import TYPE_CHECKING, cast

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
    AuthRefused,
    FieldSalesAPIError,
    NotJSONError,
    TransientHTTPError,
    UnreachableError,
)
from fieldsales_dagster.settings import ApiSettings, settings_resource
from fieldsales_dagster.token.catalog import open_token_store
from fieldsales_dagster.token.secret import TokenFormatError, clean_token, mask_secrets
from fieldsales_dagster.token.store import RENEWAL_WAIT_S, TokenStore
from fieldsales_dagster.urls import Origin, origin_of, validate_base_url

if TYPE_CHECKING:
    # Imported where a request is sent (``_session``, ``_get_once``): ``requests`` and its
    # encodings (~70 ms) are not part of the definitions' load.
    import requests

    from fieldsales_dagster.client.transport import Answer, QueryParams

#: Characters of a body quoted in an error, after the token is masked.
SNIPPET_CHARS = 200
#: Characters of a body searched for the token before the snippet is cut from them.
_SCRUB_WINDOW = 64 * 1024
_RETRY_AFTER = Retry(0)


def _retry_after_seconds(value: str | None) -> float | None:
    """Seconds the server asks to wait (delta or HTTP date), as urllib3 reads ``Retry-After``."""
    if not value:
        return None
    try:
        return _RETRY_AFTER.parse_retry_after(value)
    except InvalidHeader:
        return None


def _given_token(token: str) -> str:
    """A token passed to ``get`` as it is, checked as the store checks one."""
    try:
        return clean_token(token, "the token given")
    except TokenFormatError as exc:
        raise AuthenticationError(str(exc)) from None


class FieldSalesAPI(settings_resource("ApiSettings", ApiSettings, but=("api_token",))):  # type: ignore[misc]
    """Client of one Field-Sales instance's read API; takes every ``api:`` setting by name.

    The token comes from ``FIELDSALES_API_TOKEN`` (an ``EnvVar``) and, once seen, from the token
    store, which the renewal job (requested by the renewal sensor) keeps current.
    """

    api_token: str = Field(
        description="API token; set it with EnvVar('FIELDSALES_API_TOKEN'), never as a literal.",
        repr=False,
    )
    use_token_store: bool = Field(
        default=True,
        description="Read the current token from the token store (seeded from api_token).",
    )
    ducklake_catalog: str | None = Field(
        default=None,
        description="The lake's catalog (storage.ducklake_catalog): with token_store_path "
        "'catalog', the PostgreSQL database whose row holds the token.",
    )
    ducklake_password_env_var: str = Field(default="FIELDSALES_DUCKLAKE_PASSWORD")
    ducklake_schema: str | None = Field(default=None, description="The lake's row's key.")
    connect_timeout_s: float = Field(default=10.0, gt=0)
    read_timeout_s: float = Field(default=120.0, gt=0)
    request_deadline_s: float = Field(
        default=180.0,
        gt=0,
        le=3600,
        description="Longest one request may take, from connecting to the body's last byte; a "
        "server dripping bytes cannot hold a request open longer.",
    )
    retry_budget_s: float = Field(
        default=300.0,
        gt=0,
        le=24 * 3600,
        description="Longest one request may take with all its retries and waits, whatever "
        "max_retries allows: a silent or failing server is given up after this.",
    )
    unreachable_budget_s: float = Field(
        default=10.0,
        ge=0,
        le=3600,
        description="How long to keep retrying a host that refuses connections, cannot be "
        "resolved or never accepts one: an instance that is down is reported within seconds.",
    )
    max_page_bytes: int = Field(
        default=256 * 1024 * 1024,
        ge=1024,
        description="Largest body of one answer once decompressed; a larger one (a gzip bomb, a "
        "broken server) fails at once, without being held in memory.",
    )
    max_retries: int = Field(default=6, ge=0, description="Retries of one request.")
    backoff_initial_s: float = Field(default=1.0, ge=0)
    backoff_max_s: float = Field(default=60.0, ge=0)
    max_list_passes: int = Field(
        default=3,
        ge=1,
        description="Passes over a list whose distinct ids disagree with the final total.",
    )
    max_pages_per_pass: int = Field(
        default=100_000,
        ge=1,
        le=10_000_000,
        description=(
            "Most pages one pass over a list may take (100,000 pages of 500 items is 50 million "
            "items); a server that pages forever fails the load when it is reached."
        ),
    )
    max_retry_after_s: float = Field(
        default=300.0, ge=0, description="Longest Retry-After honoured before giving up."
    )

    _local: threading.local = PrivateAttr(default_factory=threading.local)
    _env_verdicts: dict[str, bool] = PrivateAttr(default_factory=dict)
    _settled: bool = PrivateAttr(default=False)

    # --- plumbing ---------------------------------------------------------------------------

    @property
    def root(self) -> str:
        return validate_base_url(self.base_url)

    @property
    def origin(self) -> Origin:
        origin = origin_of(self.root)
        assert origin is not None  # validate_base_url accepted it
        return origin

    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            from fieldsales_dagster.client.transport import new_session

            session = new_session(self.origin)
            self._local.session = session
        return session

    def token_store(self) -> TokenStore | None:
        """The store of this instance's token, bound to its origin: another server's is refused."""
        if not self.use_token_store:
            return None
        return open_token_store(
            self.token_store_path,
            str(self.origin),
            self.variables,
            ducklake_catalog=self.ducklake_catalog,
            ducklake_password_env_var=self.ducklake_password_env_var,
            ducklake_schema=self.ducklake_schema,
        )

    def env_token(self) -> str:
        """``api_token`` without surrounding whitespace; refuses one a header cannot carry."""
        try:
            return clean_token(self.api_token, self.named("FIELDSALES_API_TOKEN"))
        except TokenFormatError as exc:
            raise AuthenticationError(str(exc)) from None

    def current_token(self) -> str:
        env_token = self.env_token()
        store = self.token_store()
        if store is None:
            return env_token
        return store.current(env_token, accept=self.server_accepts).token

    def server_accepts(self, env_token: str) -> bool:
        """Whether the server takes a new ``FIELDSALES_API_TOKEN`` the store has never seen.

        Asked once per process and token. Until the server accepts it, the store's token stays in
        use, and a warning says so (the new token may be mistyped; the stored one was renewed).
        """
        verdicts = self._env_verdicts
        if env_token not in verdicts:
            try:
                self.get(CHECK_TOKEN_PATH, token=env_token, max_retries=1)
                verdicts[env_token] = True
            except FieldSalesAPIError as exc:
                verdicts[env_token] = False
                dg.get_dagster_logger().warning(
                    f"{self.named('FIELDSALES_API_TOKEN')} holds a new token that could not be "
                    f"confirmed ({type(exc).__name__}); keeping the one in "
                    f"{self.token_store_path}. Check the new token for a typo."
                )
        return verdicts[env_token]

    def _settle(self, token: str) -> None:
        """A request with ``token`` succeeded: the store may record it now (once per resource)."""
        if self._settled or not self.use_token_store:
            return
        store = self.token_store()
        if store is not None:
            store.settle(self.env_token(), token)
        self._settled = True

    def _scrub(self, text: str, *tokens: str, limit: int | None = None) -> str:
        return mask_secrets(text, (self.api_token, self.api_token.strip(), *tokens), limit)

    def _snippet(self, body: bytes, token: str) -> str:
        """The start of ``body`` as text: the token masked first, then cut."""
        text = body[:_SCRUB_WINDOW].decode("utf-8", "replace")
        return self._scrub(text, token, limit=SNIPPET_CHARS)

    def _get_once(
        self, path: str, params: QueryParams | None, token: str, deadline_s: float
    ) -> Answer:
        """One GET; returns the 200 answer or raises ``TransientHTTPError``/an API error."""
        from fieldsales_dagster.client.transport import Limits, fetch

        where = f"GET {path}" + (f" (skip={params['skip']})" if params and "skip" in params else "")
        origin = self.origin
        limits = Limits(
            connect_timeout_s=self.connect_timeout_s,
            read_timeout_s=self.read_timeout_s,
            deadline_s=deadline_s,
            max_body_bytes=self.max_page_bytes,
            base_url=self.named("FIELDSALES_BASE_URL"),
        )
        if deadline_s < self.request_deadline_s:
            limits.deadline_source = f"what was left of retry_budget_s={self.retry_budget_s:g}"
        else:
            limits.deadline_source = f"request_deadline_s={self.request_deadline_s:g}"
        answer = fetch(
            self._session(),
            origin,
            self.root + path,
            params=params,
            token=token,
            where=where,
            limits=limits,
            scrub=lambda text: self._scrub(text, token),
        )
        status = answer.status
        on = f"{where} on {origin.netloc}"
        if status in (401, 403):
            raise AuthRefused(status, where)
        if status == 429 or status >= 500 or status == 408:
            raise TransientHTTPError(
                f"{on}: HTTP {status}", _retry_after_seconds(answer.headers.get("Retry-After"))
            )
        if status != 200:
            snippet = self._snippet(answer.body, token)
            raise FieldSalesAPIError(f"{on} answered HTTP {status}: {snippet!r}")
        return answer

    def _parse(
        self,
        answer: Answer,
        parse: Callable[[bytes], object],
        on: str,
        token: str,
        stats: ListStats | None,
    ) -> object:
        """``parse(body)``, telling a body cut off (retried) from one that is not JSON (not)."""
        body = answer.body
        replaced = 0
        for _ in range(2):
            try:
                result = parse(body)
            except msgspec.DecodeError as exc:
                reason = str(exc)
            except RecursionError:
                raise NotJSONError(
                    f"{on} answered JSON nested deeper than the decoder allows "
                    f"({answer.content_type}, {len(answer.body)} bytes). Not retried."
                ) from None
            else:
                if replaced and stats:
                    stats.count(surrogates_replaced=replaced)
                return result
            if replaced:
                break
            # A lone surrogate escape (a string cut mid-emoji) trips the decoder: replace it
            # with U+FFFD, count it, and decode again.
            body, replaced = replace_lone_surrogates(body)
            if not replaced:
                break
        if "truncated" in reason:
            raise TransientHTTPError(f"{on}: body cut off mid-JSON ({reason})")
        raise NotJSONError(
            f"{on} answered HTTP 200 with a complete body that is not JSON "
            f"({answer.content_type}, {len(answer.body)} bytes; {reason}): "
            f"{self._snippet(answer.body, token)!r}. Not retried: check "
            f"{self.named('FIELDSALES_BASE_URL')} (a login or proxy page?)."
        )

    def _wait(self, state: tenacity.RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        backoff = tenacity.wait_exponential_jitter(
            initial=self.backoff_initial_s, max=self.backoff_max_s, jitter=self.backoff_initial_s
        )
        wait = min(backoff(state), self.backoff_max_s)
        retry_after = getattr(exc, "retry_after", None)
        if retry_after is not None:
            if retry_after > self.max_retry_after_s:
                raise FieldSalesAPIError(
                    f"{exc}: the server asks to wait {retry_after:.0f} s (Retry-After), longer "
                    f"than max_retry_after_s={self.max_retry_after_s:.0f}; try again later."
                )
            # `Retry-After: 0` from a struggling server must not turn into a burst of requests:
            # the backoff is the least we wait.
            return max(retry_after, wait)
        return wait

    def get(
        self,
        path: str,
        params: QueryParams | None = None,
        *,
        token: str | None = None,
        parse: Callable[[bytes], object] | None = None,
        stats: ListStats | None = None,
        max_retries: int | None = None,
    ) -> object:
        """GET ``path`` with retries; returns ``parse(body)`` (the raw body if ``parse`` is None).

        ``parse`` runs inside the retry loop, so a body cut off mid-JSON is fetched again.
        With ``token`` given, that token is used as it is (no store, no re-read on 401).
        ``max_retries=0`` is for requests that must not be repeated (token renewal).
        Retries stop at ``max_retries``, at ``retry_budget_s`` (``unreachable_budget_s`` while
        the host cannot be connected to at all), whichever comes first; each is logged as a
        warning as it happens.
        """
        retries = self.max_retries if max_retries is None else max_retries
        fixed_token = None if token is None else _given_token(token)
        current = fixed_token or self.current_token()
        where = f"GET {path}" + (f" (skip={params['skip']})" if params and "skip" in params else "")
        on = f"{where} on {self.origin.netloc}"
        reread = False
        started = time.monotonic()
        attempts = [0]
        while True:
            attempts[0] = 0  # a re-read token starts a new series of attempts

            def attempt(token: str = current) -> object:
                attempts[0] += 1
                if stats:
                    stats.count(requests=1)
                remaining = self.retry_budget_s - (time.monotonic() - started)
                deadline_s = min(self.request_deadline_s, max(remaining, 1.0))
                answer = self._get_once(path, params, token, deadline_s)
                if parse is None:
                    return answer.body
                return self._parse(answer, parse, on, token, stats)

            try:
                answer = self._retrying(started, retries, stats, attempts)(attempt)
            except TransientHTTPError as exc:
                raise self._gave_up(exc, attempts[0], retries, started) from None
            except AuthRefused as refused:
                # A renewal may have replaced the token since this run read it: re-read once.
                store = None if reread or fixed_token is not None else self.token_store()
                if store is not None:
                    reread = True
                    store.wait_for_renewal(RENEWAL_WAIT_S)
                    fresh = self.current_token()
                    if fresh != current:
                        current = fresh
                        if stats:
                            stats.count(token_rereads=1)
                        continue
                raise refused.error(self.named("FIELDSALES_API_TOKEN")) from None
            if fixed_token is None:
                self._settle(current)  # the server accepted it: the store may record it now
            return answer

    def _retrying(
        self, started: float, retries: int, stats: ListStats | None, attempts: list[int]
    ) -> tenacity.Retrying:
        """Retries of transient failures within ``retries`` and the time budgets, each logged."""
        log = dg.get_dagster_logger("fieldsales_dagster.client")

        def stop(state: tenacity.RetryCallState) -> bool:
            if state.attempt_number > retries:
                return True
            exc = state.outcome.exception() if state.outcome else None
            budget = (
                self.unreachable_budget_s
                if getattr(exc, "unreachable", False)
                else self.retry_budget_s
            )
            return time.monotonic() - started + state.upcoming_sleep > budget

        def before_sleep(state: tenacity.RetryCallState) -> None:
            if stats:
                stats.count(retries=1)
            exc = state.outcome.exception() if state.outcome else None
            # Counted in attempts, as the final error is: attempt 1 is the first request.
            log.warning(
                f"{exc}; attempt {attempts[0]} of at most {retries + 1} failed, next in "
                f"{state.upcoming_sleep:.1f} s"
            )

        return tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(TransientHTTPError),
            stop=stop,
            wait=self._wait,
            before_sleep=before_sleep,
            reraise=True,
        )

    def _gave_up(
        self, exc: TransientHTTPError, attempts: int, retries: int, started: float
    ) -> FieldSalesAPIError:
        spent = (
            f"gave up after attempt {attempts} of at most {retries + 1}, "
            f"{time.monotonic() - started:.1f} s after the first"
        )
        if exc.unreachable:
            return UnreachableError(
                f"{exc}; {spent} (unreachable_budget_s={self.unreachable_budget_s:g}). "
                f"Check {self.named('FIELDSALES_BASE_URL')} ({self.origin}) and that the instance "
                "is up and reachable from here."
            )
        return FieldSalesAPIError(
            f"{exc}; {spent} (max_retries={retries}, retry_budget_s="
            f"{self.retry_budget_s:g}). The server or the network is failing; try again "
            "later or raise max_retries / retry_budget_s."
        )

    # --- endpoints --------------------------------------------------------------------------

    def check_token(self, token: str | None = None) -> None:
        """Raise ``AuthenticationError`` unless the server accepts the token (test route)."""
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
        where = f"GET {endpoint.path} (skip={skip})"
        holder: dict[str, int] = {}

        def parse(body: bytes) -> tuple[list[msgspec.Raw], int | None] | None:
            holder["nbytes"], holder["digest"] = len(body), digest(body)
            return None if holder["digest"] in known else split_envelope(body, endpoint, where)

        counted = ListStats(parent=stats)  # this page's counts, added to the list's too
        parsed = cast(
            "tuple[list[msgspec.Raw], int | None] | None",  # what parse returns
            self.get(endpoint.path, params, parse=parse, stats=counted),
        )
        items, total = parsed or ([], None)
        return Page(
            skip=skip,
            items=items,
            total=total,
            nbytes=holder["nbytes"],
            surrogates_replaced=counted.surrogates_replaced,
            digest=holder["digest"],
        )
