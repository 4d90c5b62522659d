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

import functools
import ipaddress
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from urllib.parse import urlsplit

import dagster as dg
import msgspec
import requests
import tenacity
import urllib3
from pydantic import Field, PrivateAttr

from fieldsales_dagster.endpoints import CHECK_TOKEN_PATH, TOTAL_KEYS, ListEndpoint
from fieldsales_dagster.token_store import TokenStore

RENEW_TOKEN_INSTRUCTION = (
    "Regenerate it in your Field-Sales user profile (API tab, refresh button) and set "
    "FIELDSALES_API_TOKEN to the new token."
)


class FieldSalesAPIError(RuntimeError):
    """Anything the API did that stops a load. Messages name the endpoint, never the token."""


class AuthenticationError(FieldSalesAPIError):
    """The server refused the token (401) or its rights (403)."""


class PageFormatError(FieldSalesAPIError):
    """A page answered 200 but holds no list of items."""


class InsecureURLError(FieldSalesAPIError):
    """``http://`` to a host other than loopback."""


class _Transient(Exception):
    """A failure worth another attempt; ``retry_after`` is the server's wish, in seconds."""

    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


@dataclass
class Page:
    """One answer of a list endpoint: its items as raw JSON, and the total it reported."""

    skip: int
    items: list[msgspec.Raw]
    total: int | None
    nbytes: int

    @property
    def n(self) -> int:
        return len(self.items)


@dataclass
class ListStats:
    """What one pass over a list cost, for asset metadata and progress lines."""

    requests: int = 0
    retries: int = 0
    pages: int = 0
    items: int = 0
    bytes: int = 0
    token_rereads: int = 0
    #: The total the server reported last (by arrival), ``None`` where it reports none.
    total: int | None = None
    #: Every distinct total the server reported during the pass, in order of arrival.
    totals_seen: list[int] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                setattr(self, name, getattr(self, name) + delta)


_ENVELOPE = msgspec.json.Decoder(list[msgspec.Raw] | dict[str, msgspec.Raw])
_LIST = msgspec.json.Decoder(list[msgspec.Raw])
_ANY = msgspec.json.Decoder()


def _is_loopback(host: str) -> bool:
    if host.lower() in {"localhost", "localhost.localdomain"}:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def validate_base_url(base_url: str) -> str:
    """The base URL without a trailing slash; ``http://`` only for loopback hosts."""
    parts = urlsplit(base_url.strip())
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise FieldSalesAPIError(
            f"FIELDSALES_BASE_URL must be an https:// URL such as https://example.com, got "
            f"{base_url!r}."
        )
    if parts.scheme == "http" and not _is_loopback(parts.hostname):
        raise InsecureURLError(
            f"Refusing plain http:// to {parts.hostname}: the API token would travel in clear "
            "text. Use https:// (plain http is allowed for loopback hosts only)."
        )
    return base_url.strip().rstrip("/")


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


def _first_byte(raw: msgspec.Raw) -> bytes:
    return bytes(raw).lstrip()[:1]


@functools.cache
def _documented_envelope(endpoint: ListEndpoint) -> msgspec.json.Decoder | None:
    """A decoder of the envelope the API document shows for ``endpoint``, if it shows one."""
    if not endpoint.items_key or not endpoint.total_key:
        return None
    struct = msgspec.defstruct(
        f"{endpoint.name.title()}Page",
        [
            (
                "items",
                list[msgspec.Raw] | None,
                msgspec.field(default=None, name=endpoint.items_key),
            ),
            ("total", int | None, msgspec.field(default=None, name=endpoint.total_key)),
        ],
    )
    return msgspec.json.Decoder(struct)


def split_envelope(
    body: bytes, endpoint: ListEndpoint, where: str
) -> tuple[list[msgspec.Raw], int | None]:
    """Items and total of one page body, whatever envelope holds them.

    Raises ``msgspec.DecodeError`` for a body that is not complete JSON (the caller retries it) and
    ``PageFormatError`` for complete JSON that holds no list of items.
    """
    documented = _documented_envelope(endpoint)
    if documented is not None:
        # One pass for the documented shape (items and total under their documented keys);
        # anything else takes the general path below.
        try:
            page = documented.decode(body)
            if page.items is not None and page.total is not None and page.total >= 0:
                return page.items, page.total
        except msgspec.ValidationError:
            pass
    try:
        doc = _ENVELOPE.decode(body)
    except msgspec.ValidationError as exc:
        raise PageFormatError(
            f"{where} answered JSON that is neither a list nor an object ({exc}); expected a list "
            "of items or an object holding one."
        ) from None
    if isinstance(doc, list):
        return doc, None

    list_keys = [key for key, value in doc.items() if _first_byte(value) == b"["]
    if endpoint.items_key in list_keys:
        items_key = endpoint.items_key
    elif len(list_keys) == 1:
        items_key = list_keys[0]
    else:
        found = ", ".join(sorted(doc)) or "none"
        why = "no list" if not list_keys else f"several lists ({', '.join(sorted(list_keys))})"
        raise PageFormatError(
            f"{where} answered an object with {why} of items (keys: {found}); expected a list "
            f"of items{f' under {endpoint.items_key!r}' if endpoint.items_key else ''}."
        )
    items = _LIST.decode(doc[items_key])

    total = None
    for key in (endpoint.total_key, *TOTAL_KEYS):
        if key and key in doc:
            value = _ANY.decode(doc[key])
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                total = value
                break
            if isinstance(value, str) and value.isdigit():
                total = int(value)
                break
    return items, total


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
        """One GET; returns the whole body or raises ``_Transient``/an API error."""
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
            raise _Transient(f"{where}: {type(exc).__name__}") from None
        except (requests.exceptions.ChunkedEncodingError, urllib3.exceptions.HTTPError) as exc:
            raise _Transient(f"{where}: body cut off ({type(exc).__name__})") from None
        finally:
            if "resp" in locals():
                resp.close()
        status = resp.status_code
        if status in (401, 403):
            raise _AuthRefused(status, where)
        if status == 429 or status >= 500 or status == 408:
            raise _Transient(
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
                raise _Transient(f"GET {path}: body is not complete JSON ({exc})") from None

        def before_sleep(state: tenacity.RetryCallState) -> None:
            if stats:
                stats.count(retries=1)

        while True:
            retrying = tenacity.Retrying(
                retry=tenacity.retry_if_exception_type(_Transient),
                stop=tenacity.stop_after_attempt(retries + 1),
                wait=self._wait,
                before_sleep=before_sleep,
                reraise=True,
            )
            try:
                return retrying(attempt)
            except _Transient as exc:
                raise FieldSalesAPIError(
                    f"{exc}; gave up after {retries + 1} attempts. The server or the "
                    "network is failing; try again later or raise max_retries."
                ) from None
            except _AuthRefused as refused:
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
        yield from _Pager(self, endpoint, stats, progress).run()


class _AuthRefused(Exception):
    def __init__(self, status: int, where: str):
        super().__init__(f"{where}: HTTP {status}")
        self.status = status
        self.where = where

    def error(self) -> AuthenticationError:
        if self.status == 401:
            return AuthenticationError(
                f"{self.where}: the Field-Sales API refused the API token (HTTP 401): it is "
                f"invalid, expired or was replaced by a renewal. {RENEW_TOKEN_INSTRUCTION}"
            )
        return AuthenticationError(
            f"{self.where}: the Field-Sales API accepted the API token but denies access (HTTP "
            "403). The token's user needs admin rights for the public API; regenerate the token "
            f"as such a user. {RENEW_TOKEN_INSTRUCTION}"
        )


class _Pager:
    """Schedules the requests of one pass.

    Windows ``[start, end)`` of the list are asked for from ``start``; a page that returns fewer
    items than its window holds leaves the rest of the window to a follow-up request, so a server
    that caps ``limit`` (at any depth) still yields every item. The first page sets the stride.
    With a total, every window is known at once and fetched concurrently; without one, windows
    are opened ``concurrency`` ahead until a page comes back empty.
    """

    def __init__(
        self,
        api: FieldSalesAPI,
        endpoint: ListEndpoint,
        stats: ListStats,
        progress: Callable[[ListStats], None] | None,
    ):
        self.api = api
        self.endpoint = endpoint
        self.stats = stats
        self.progress = progress
        self.pending: deque[tuple[int, int]] = deque()
        self.end: int | None = None  # first skip known to be past the list (no total)
        self.opened_to = 0  # windows exist for [0, opened_to)
        self.stride = 0

    def _record(self, page: Page) -> None:
        self.stats.count(pages=1, items=page.n, bytes=page.nbytes)
        if page.total is not None:
            with self.stats._lock:
                if not self.stats.totals_seen or self.stats.totals_seen[-1] != page.total:
                    self.stats.totals_seen.append(page.total)
                self.stats.total = page.total

    def _open_windows(self, limit: int) -> None:
        """Plan windows up to ``limit`` (the total)."""
        while self.opened_to < limit:
            end = min(self.opened_to + self.stride, limit)
            self.pending.append((self.opened_to, end))
            self.opened_to = end

    def _open_speculative(self, in_flight: int) -> None:
        while self.end is None and len(self.pending) + in_flight < self.api.concurrency:
            self.pending.append((self.opened_to, self.opened_to + self.stride))
            self.opened_to += self.stride

    def run(self) -> Iterator[Page]:
        first = self.api.fetch_page(self.endpoint, 0, self.stats)
        self._record(first)
        started = time.monotonic()
        last_progress = started
        yield first
        if first.n == 0:
            return
        self.stride = first.n
        self.opened_to = first.n
        first_item = bytes(first.items[0])
        known_total = first.total
        if known_total is not None:
            self._open_windows(known_total)

        pool = ThreadPoolExecutor(
            max_workers=self.api.concurrency, thread_name_prefix=f"fieldsales-{self.endpoint.name}"
        )
        in_flight: dict[Future[Page], tuple[int, int]] = {}
        try:
            while True:
                if known_total is None:
                    self._open_speculative(len(in_flight))
                while self.pending and len(in_flight) < self.api.concurrency:
                    start, end = self.pending.popleft()
                    if self.end is not None and start >= self.end:
                        continue
                    future = pool.submit(self.api.fetch_page, self.endpoint, start, self.stats)
                    in_flight[future] = (start, end)
                if not in_flight:
                    return
                done, _ = wait(in_flight, return_when=FIRST_COMPLETED)
                for future in done:
                    start, end = in_flight.pop(future)
                    page = future.result()
                    self._record(page)
                    if page.n and bytes(page.items[0]) == first_item:
                        raise PageFormatError(
                            f"GET {self.endpoint.path} (skip={start}) answered the same items as "
                            "skip=0: the server ignores `skip`, so the list cannot be paged."
                        )
                    if page.n == 0:
                        # The list ends here (or shrank under us: the loader's check decides).
                        self.end = start if self.end is None else min(self.end, start)
                    elif start + page.n < end:
                        self.pending.appendleft((start + page.n, end))
                    grew = page.total is not None and page.total > self.opened_to
                    if grew and known_total is not None:
                        self._open_windows(page.total)  # the list grew: ask for the rest
                    if page.n:
                        yield page
                now = time.monotonic()
                if self.progress and now - last_progress >= 5.0:
                    last_progress = now
                    self.progress(self.stats)
        finally:
            for future in in_flight:
                future.cancel()
            pool.shutdown(wait=True, cancel_futures=True)
