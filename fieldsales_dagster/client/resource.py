"""The Field-Sales read API: HTTP, authentication, retries and pagination, nothing about storage.

Every rule of SPEC "Behaviour the API document implies" that concerns HTTP lives here:

* ``skip`` advances by the items a page returned, never by the ``limit`` asked for, so a server
  that caps ``limit`` silently still yields every item;
* the total comes from ``count`` or ``total`` where the server gives one; without one, the list
  ends at the first empty page;
* any envelope is accepted: a bare JSON list, or an object holding one list (and maybe a total);
* 429, 5xx, dropped connections, timeouts and bodies cut off mid-JSON are retried with bounded
  exponential backoff (tenacity), honouring ``Retry-After``;
* 401/403 stop with an error naming the endpoint and what to do, never the token;
* plain ``http://`` is refused for any host but loopback.

Where the total is known, pages are fetched concurrently: the API is random access by ``skip``.
Checking the pass against the final total (distinct ids) needs the stored rows, so it lives with
the loader (``raw_load.py``), which asks for another pass when they disagree.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from email.utils import parsedate_to_datetime

import dagster as dg
import msgspec
import requests
import tenacity
import urllib3
from pydantic import Field, PrivateAttr

from fieldsales_dagster.client.endpoints import CHECK_TOKEN_PATH, ListEndpoint
from fieldsales_dagster.client.envelope import split_envelope
from fieldsales_dagster.client.errors import (
    AuthRefused,
    FieldSalesAPIError,
    TransientHTTPError,
)
from fieldsales_dagster.client.pager import ListStats, Page, Pager
from fieldsales_dagster.client.urls import validate_base_url
from fieldsales_dagster.token.store import TokenStore


def _retry_after_seconds(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


class FieldSalesAPI(dg.ConfigurableResource):
    """Client of one Field-Sales instance's read API.

    The token comes from ``FIELDSALES_API_TOKEN`` (an ``EnvVar``) and, once seen, from the token
    store, which the renewal sensor keeps current.
    """

    base_url: str = Field(description="Base URL of the instance, e.g. https://example.com.")
    api_token: str = Field(
        description="API token; set it with EnvVar('FIELDSALES_API_TOKEN'), never as a literal.",
        repr=False,
    )
    use_token_store: bool = Field(
        default=True,
        description="Read the current token from the token store (seeded from api_token).",
    )
    token_store_path: str | None = Field(
        default=None,
        description="Token store file (FIELDSALES_TOKEN_STORE); default under DAGSTER_HOME.",
    )
    page_size: int = Field(
        default=500,
        ge=1,
        description="`limit` asked for on each page (8 in flight at ~5 KB an item: ~20 MB).",
    )
    concurrency: int = Field(default=8, ge=1, le=64, description="Pages in flight at once.")
    connect_timeout_s: float = Field(default=10.0, gt=0)
    read_timeout_s: float = Field(default=120.0, gt=0)
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

    # --- plumbing ---------------------------------------------------------------------------

    @property
    def root(self) -> str:
        return validate_base_url(self.base_url)

    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            adapter = requests.adapters.HTTPAdapter(pool_connections=1, pool_maxsize=1)
            session.mount("http://", adapter)
            session.mount("https://", adapter)
            session.headers["Accept"] = "application/json"
            self._local.session = session
        return session

    def token_store(self) -> TokenStore | None:
        return TokenStore.at(self.token_store_path) if self.use_token_store else None

    def current_token(self) -> str:
        store = self.token_store()
        return store.current_token(self.api_token) if store else self.api_token

    def _scrub(self, text: str, *tokens: str) -> str:
        for secret in (self.api_token, *tokens):
            if secret:
                text = text.replace(secret, "***")
        return text

    def _get_once(self, path: str, params: dict[str, object] | None, token: str) -> bytes:
        """One GET; returns the whole body or raises ``TransientHTTPError``/an API error."""
        where = f"GET {path}" + (f" (skip={params['skip']})" if params and "skip" in params else "")
        try:
            resp = self._session().get(
                self.root + path,
                params=params,
                headers={"Authorization": f"Bearer {token}"},
                timeout=(self.connect_timeout_s, self.read_timeout_s),
                stream=True,
            )
            # One read of the whole body: `resp.content` reads it in 10 KB chunks, which cost
            # 2.5x the CPU on 5 MB pages. urllib3 still checks Content-Length.
            body = resp.raw.read(decode_content=True)
        except (requests.ConnectionError, requests.Timeout) as exc:
            raise TransientHTTPError(f"{where}: {type(exc).__name__}") from None
        except (requests.exceptions.ChunkedEncodingError, urllib3.exceptions.HTTPError) as exc:
            raise TransientHTTPError(f"{where}: body cut off ({type(exc).__name__})") from None
        finally:
            if "resp" in locals():
                resp.close()
        status = resp.status_code
        if status in (401, 403):
            raise AuthRefused(status, where)
        if status == 429 or status >= 500 or status == 408:
            raise TransientHTTPError(
                f"{where}: HTTP {status}", _retry_after_seconds(resp.headers.get("Retry-After"))
            )
        if status != 200:
            snippet = self._scrub(body[:200].decode("utf-8", "replace"), token)
            raise FieldSalesAPIError(f"{where} answered HTTP {status}: {snippet!r}")
        return body

    def _wait(self, state: tenacity.RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        retry_after = getattr(exc, "retry_after", None)
        if retry_after is not None:
            if retry_after > self.max_retry_after_s:
                raise FieldSalesAPIError(
                    f"{exc}: the server asks to wait {retry_after:.0f} s (Retry-After), longer "
                    f"than max_retry_after_s={self.max_retry_after_s:.0f}; try again later."
                )
            return retry_after
        backoff = tenacity.wait_exponential_jitter(
            initial=self.backoff_initial_s, max=self.backoff_max_s, jitter=self.backoff_initial_s
        )
        return min(backoff(state), self.backoff_max_s)

    def get(
        self,
        path: str,
        params: dict[str, object] | None = None,
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
        """
        retries = self.max_retries if max_retries is None else max_retries
        fixed_token = token
        token = fixed_token or self.current_token()
        reread = False

        def attempt() -> object:
            if stats:
                stats.count(requests=1)
            body = self._get_once(path, params, token)
            if parse is None:
                return body
            try:
                return parse(body)
            except msgspec.DecodeError as exc:
                raise TransientHTTPError(f"GET {path}: body is not complete JSON ({exc})") from None

        def before_sleep(state: tenacity.RetryCallState) -> None:
            if stats:
                stats.count(retries=1)

        while True:
            retrying = tenacity.Retrying(
                retry=tenacity.retry_if_exception_type(TransientHTTPError),
                stop=tenacity.stop_after_attempt(retries + 1),
                wait=self._wait,
                before_sleep=before_sleep,
                reraise=True,
            )
            try:
                return retrying(attempt)
            except TransientHTTPError as exc:
                raise FieldSalesAPIError(
                    f"{exc}; gave up after {retries + 1} attempts. The server or the "
                    "network is failing; try again later or raise max_retries."
                ) from None
            except AuthRefused as refused:
                # A renewal may have replaced the token since this run read it: re-read once.
                if not reread and fixed_token is None and self.use_token_store:
                    reread = True
                    fresh = self.current_token()
                    if fresh != token:
                        token = fresh
                        if stats:
                            stats.count(token_rereads=1)
                        continue
                raise refused.error() from None

    # --- endpoints --------------------------------------------------------------------------

    def check_token(self, token: str | None = None) -> None:
        """Raise ``AuthenticationError`` unless the server accepts the token (test route)."""
        self.get(CHECK_TOKEN_PATH, token=token)

    def fetch_page(self, endpoint: ListEndpoint, skip: int, stats: ListStats | None = None) -> Page:
        params = {"skip": skip, "limit": self.page_size}
        where = f"GET {endpoint.path} (skip={skip})"
        holder: dict[str, int] = {}

        def parse(body: bytes) -> tuple[list[msgspec.Raw], int | None]:
            holder["nbytes"] = len(body)
            return split_envelope(body, endpoint, where)

        items, total = self.get(endpoint.path, params, parse=parse, stats=stats)  # type: ignore[misc]
        return Page(skip=skip, items=items, total=total, nbytes=holder["nbytes"])

    def iter_pages(
        self,
        endpoint: ListEndpoint,
        stats: ListStats | None = None,
        progress: Callable[[ListStats], None] | None = None,
    ) -> Iterator[Page]:
        """Every page of one pass over ``endpoint``, in arrival order.

        At most ``concurrency`` requests are in flight and pages are yielded as they arrive, so
        memory holds a few pages whatever the list's size. ``stats`` collects what the pass cost;
        ``stats.total`` ends as the last total the server reported.
        """
        stats = stats if stats is not None else ListStats()
        yield from Pager(self, endpoint, stats, progress).run()
