"""One GET, with the limits a hostile or broken server cannot stretch.

* **A deadline per request**, from connecting to the last byte of the body. Timeouts only bound
  each read, so a server dripping a byte a second holds a request open for ever; a watchdog timer
  shuts the request's socket down at the deadline, which wakes whatever read is blocked on it.
* **A cap on the body**, counted after decompression and decompressed as it streams in, so a small
  gzip body cannot expand into gigabytes of memory.
* **No proxy for loopback.** ``HTTP_PROXY``/``HTTPS_PROXY`` are for the way out; a loopback
  instance is reached directly (other hosts still honour them, as corporate networks need).
* **Redirects stay on the origin.** A redirect to another scheme, host or port is refused: the
  token was configured for one origin, and pages from elsewhere are not this instance's data.
  Redirects within the origin are followed (a few hops): a reverse proxy that normalises paths
  is common, and the answer still comes from the server the token was meant for. A loop is
  reported as one.
* **Every failure in our words.** Whatever ``requests`` raises while building or sending the
  request is turned into an error whose text is scrubbed of the token and which chains nothing.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import socket
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin

import requests
import urllib3
from requests.adapters import HTTPAdapter
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import NameResolutionError, NewConnectionError

from fieldsales_dagster.client.errors import (
    FieldSalesAPIError,
    RedirectRefusedError,
    ResponseTooLargeError,
    TransientHTTPError,
)
from fieldsales_dagster.client.urls import Origin, origin_of

#: Bytes read (and decompressed) per step: large enough that the loop costs nothing next to the
#: network, small enough that the cap is overshot by at most this much.
CHUNK_BYTES = 1 << 20
#: An uncompressed body that declares its length (within the cap) is read in steps of up to
#: this: one read of a ~2.5 MB page instead of three, each copied again (0.6 -> 0.4 CPU-s per GB).
#: A step is allocated before its bytes arrive, so a lying Content-Length costs at most this.
WHOLE_BODY_BYTES = 32 << 20
MAX_REDIRECTS = 5
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})

#: A request's query parameters (skip, limit, filters such as eventId).
QueryParams = Mapping[str, str | int]

_current = threading.local()


class _Watch:
    """Ends one request at its deadline by shutting its socket down."""

    def __init__(self, seconds: float):
        self.expired = False
        self.done = False
        self._seconds = seconds
        self._lock = threading.Lock()
        self._conn: urllib3.connection.HTTPConnection | None = None

    def attach(self, conn: urllib3.connection.HTTPConnection) -> None:
        with self._lock:
            self._conn = conn
            expired = self.expired
        if expired:
            self._shutdown(conn)

    def expire(self) -> None:
        with self._lock:
            if self.done:
                return
            self.expired = True
            conn = self._conn
        if conn is not None:
            self._shutdown(conn)

    @staticmethod
    def _shutdown(conn: urllib3.connection.HTTPConnection) -> None:
        sock = getattr(conn, "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> _Watch:
        _current.watch = self
        _WATCHDOG.watch(self, time.monotonic() + self._seconds)
        return self

    def __exit__(self, *exc_info: object) -> None:
        with self._lock:
            self.done = True
        _WATCHDOG.forget()
        _current.watch = None


class _Watchdog:
    """One thread that expires each request's watch at its deadline.

    A timer thread per request cost a thread start per page (milliseconds of latency on a busy
    machine). Watches that ended are dropped from the heap lazily: when they reach its top, or
    when they outnumber the live ones.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, _Watch]] = []
        self._order = itertools.count()
        self._live = 0
        self._thread: threading.Thread | None = None

    def watch(self, watch: _Watch, deadline: float) -> None:
        with self._cond:
            self._live += 1
            if len(self._heap) > 2 * self._live + 64:
                self._heap = [entry for entry in self._heap if not entry[2].done]
                heapq.heapify(self._heap)
            heapq.heappush(self._heap, (deadline, next(self._order), watch))
            if self._thread is None or not self._thread.is_alive():  # first use, or a fork
                self._thread = threading.Thread(
                    target=self._run, name="fieldsales-deadlines", daemon=True
                )
                self._thread.start()
            self._cond.notify()

    def forget(self) -> None:
        with self._cond:
            self._live -= 1

    def _next_due(self) -> _Watch:
        with self._cond:
            while True:
                while self._heap and self._heap[0][2].done:
                    heapq.heappop(self._heap)
                now = time.monotonic()
                if self._heap and self._heap[0][0] <= now:
                    return heapq.heappop(self._heap)[2]
                self._cond.wait(self._heap[0][0] - now if self._heap else None)

    def _run(self) -> None:
        while True:
            self._next_due().expire()


_WATCHDOG = _Watchdog()


def _attach_to_watch(conn: urllib3.connection.HTTPConnection) -> None:
    watch = getattr(_current, "watch", None)
    if watch is not None:
        watch.attach(conn)


if TYPE_CHECKING:
    _Connection = urllib3.connection.HTTPConnection  # what _Watched is mixed into
else:
    _Connection = object


class _Watched(_Connection):
    """Registers a connection with the calling thread's watch (requests run in the caller's
    thread); mixed into urllib3's HTTP and HTTPS connections below."""

    def connect(self) -> None:
        super().connect()
        _attach_to_watch(self)

    def request(self, *args: Any, **kwargs: Any) -> None:
        _attach_to_watch(self)
        super().request(*args, **kwargs)


class _WatchedHTTPConnection(_Watched, urllib3.connection.HTTPConnection):
    pass


class _WatchedHTTPSConnection(_Watched, urllib3.connection.HTTPSConnection):
    pass


class _WatchedHTTPPool(HTTPConnectionPool):
    ConnectionCls = _WatchedHTTPConnection


class _WatchedHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _WatchedHTTPSConnection


_POOLS = {"http": _WatchedHTTPPool, "https": _WatchedHTTPSPool}


class _WatchedAdapter(HTTPAdapter):
    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = _POOLS

    def proxy_manager_for(self, proxy: str, **kwargs: Any) -> urllib3.ProxyManager:
        manager = super().proxy_manager_for(proxy, **kwargs)
        manager.pool_classes_by_scheme = _POOLS
        return manager


class _Bearer(requests.auth.AuthBase):
    """The token as an auth object: ``requests`` then never swaps in ``.netrc`` credentials."""

    def __init__(self, token: str):
        self._token = token

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        request.headers["Authorization"] = f"Bearer {self._token}"
        return request

    def __repr__(self) -> str:
        return "_Bearer(***)"


def new_session(origin: Origin) -> requests.Session:
    """A session for one thread: one connection, no retries of its own, no proxy for loopback."""
    session = requests.Session()
    session.trust_env = not origin.is_loopback
    adapter = _WatchedAdapter(pool_connections=1, pool_maxsize=1, max_retries=0)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    session.headers["Accept"] = "application/json"
    # Only what `read_body` decodes itself (requests would add br/zstd where installed).
    session.headers["Accept-Encoding"] = "gzip, deflate"
    return session


@dataclass
class Answer:
    status: int
    headers: Mapping[str, str]
    body: bytes

    @property
    def content_type(self) -> str:
        return self.headers.get("Content-Type") or "no Content-Type"


@dataclass
class Limits:
    connect_timeout_s: float
    read_timeout_s: float
    deadline_s: float
    max_body_bytes: int
    #: The setting that set ``deadline_s``, for error messages.
    deadline_source: str = "request_deadline_s"


class _Inflater:
    """Streaming gzip/deflate decoder handing out at most ``CHUNK_BYTES`` per piece."""

    def __init__(self, encoding: str):
        self.gzip = encoding != "deflate"
        self.wbits = zlib.MAX_WBITS | 32 if self.gzip else zlib.MAX_WBITS
        self.decoder = zlib.decompressobj(self.wbits)
        self.started = False

    def feed(self, data: bytes) -> Iterator[bytes]:
        while True:
            try:
                out = self.decoder.decompress(data, CHUNK_BYTES)
            except zlib.error:
                if self.started or self.gzip:
                    raise
                # "deflate" is sometimes sent without its zlib header: raw deflate.
                self.wbits = -zlib.MAX_WBITS
                self.decoder = zlib.decompressobj(self.wbits)
                out = self.decoder.decompress(data, CHUNK_BYTES)
            self.started = True
            if out:
                yield out
            data = self.decoder.unconsumed_tail
            if self.gzip and self.decoder.eof and self.decoder.unused_data:
                data = self.decoder.unused_data  # another gzip member follows
                self.decoder = zlib.decompressobj(self.wbits)
                continue
            if not data and len(out) < CHUNK_BYTES:
                return

    def finish(self) -> bytes:
        return self.decoder.flush()


def read_body(resp: requests.Response, where: str, max_bytes: int) -> bytes:
    """The whole body, decompressed as it streams in; ``ResponseTooLargeError`` past the cap."""
    encoding = (resp.headers.get("Content-Encoding") or "identity").strip().lower()
    inflater = None
    if encoding in {"gzip", "x-gzip", "deflate"}:
        inflater = _Inflater(encoding)
    elif encoding != "identity":
        raise FieldSalesAPIError(
            f"{where} answered with Content-Encoding {encoding[:40]!r}, which was not asked for "
            "(the client asks for gzip or deflate only); a proxy in between may be rewriting "
            "answers."
        )

    def too_large() -> ResponseTooLargeError:
        what = f"once {encoding}-decompressed " if inflater else ""
        return ResponseTooLargeError(
            f"{where}: the body {what}is larger than max_page_bytes={max_bytes} bytes, far more "
            "than a page should hold (a compression bomb, or a broken server). Not retried; if "
            "pages really are this large, raise max_page_bytes or lower page_size."
        )

    declared = resp.headers.get("Content-Length", "")
    step = CHUNK_BYTES
    if inflater is None and declared.isdigit():
        if int(declared) > max_bytes:
            raise too_large()
        step = max(CHUNK_BYTES, min(int(declared), WHOLE_BODY_BYTES))
    parts: list[bytes] = []
    size = 0
    while chunk := resp.raw.read(step, decode_content=False):
        pieces = inflater.feed(chunk) if inflater else (chunk,)
        for piece in pieces:
            size += len(piece)
            if size > max_bytes:
                raise too_large()
            parts.append(piece)
    if inflater:
        tail = inflater.finish()
        size += len(tail)
        if size > max_bytes:
            raise too_large()
        parts.append(tail)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _cannot_connect(exc: requests.ConnectionError) -> str | None:
    """What a failure to connect at all looks like, or ``None`` for a dropped connection."""
    reason = exc.args[0] if exc.args else None
    reason = getattr(reason, "reason", reason)  # MaxRetryError wraps the cause
    if isinstance(reason, NameResolutionError):
        return "the host name cannot be resolved"
    if isinstance(reason, NewConnectionError):
        detail = str(reason).rsplit("Failed to establish a new connection: ", 1)[-1]
        return f"cannot connect ({detail})"
    return None


def fetch(
    session: requests.Session,
    origin: Origin,
    url: str,
    *,
    params: QueryParams | None,
    token: str,
    where: str,
    limits: Limits,
    scrub: Callable[[str], str],
) -> Answer:
    """GET ``url`` within ``limits``, following redirects within ``origin`` only.

    Raises ``TransientHTTPError`` for what another attempt may cure (a dropped connection, a
    timeout, the deadline) and ``FieldSalesAPIError`` subclasses for what it cannot.
    """
    on = f"{where} on {origin.netloc}"
    visited = [url]
    with _Watch(limits.deadline_s) as watch:
        for _ in range(MAX_REDIRECTS + 1):
            answer = _send(session, url, params, token, on, limits, watch, scrub)
            location = answer.headers.get("Location")
            if answer.status not in REDIRECT_STATUSES or not location:
                return answer
            target = urljoin(url, location)
            target_origin = origin_of(target)
            if target_origin != origin:
                shown = str(target_origin) if target_origin else scrub(location[:200])
                raise RedirectRefusedError(
                    f"{on} redirects (HTTP {answer.status}) to another origin, {shown}; refused: "
                    f"the API token is only ever sent to {origin}, and pages from elsewhere are "
                    "not this instance's data. If the instance moved, set FIELDSALES_BASE_URL to "
                    "its new address."
                )
            if target in visited:
                raise RedirectRefusedError(
                    f"{on} redirects in a loop ({' -> '.join(scrub(u) for u in visited)} -> "
                    f"{scrub(target)}): the server is misconfigured; check FIELDSALES_BASE_URL "
                    "or tell the instance's administrators."
                )
            visited.append(target)
            url, params = target, None
    raise RedirectRefusedError(
        f"{on} redirects more than {MAX_REDIRECTS} times ({' -> '.join(map(scrub, visited))}); "
        "check FIELDSALES_BASE_URL or tell the instance's administrators."
    )


def _send(
    session: requests.Session,
    url: str,
    params: QueryParams | None,
    token: str,
    on: str,
    limits: Limits,
    watch: _Watch,
    scrub: Callable[[str], str],
) -> Answer:
    deadline = f"no complete answer within {limits.deadline_source} ({limits.deadline_s:.3g} s)"
    transient: TransientHTTPError | None = None
    unexpected = ""
    try:
        resp = session.get(
            url,
            params=params,
            auth=_Bearer(token),
            timeout=(
                min(limits.connect_timeout_s, limits.deadline_s),
                min(limits.read_timeout_s, limits.deadline_s),
            ),
            stream=True,
            allow_redirects=False,
        )
        try:
            body = b"" if resp.is_redirect else read_body(resp, on, limits.max_body_bytes)
        finally:
            resp.close()
        if watch.expired:  # a body without a length ends at the shutdown as if complete
            transient = TransientHTTPError(f"{on}: {deadline}")
        else:
            return Answer(resp.status_code, resp.headers, body)
    except FieldSalesAPIError:
        raise
    except requests.ConnectTimeout:
        transient = TransientHTTPError(
            f"{on}: cannot connect (no answer within connect_timeout_s)", unreachable=True
        )
    except requests.ConnectionError as exc:
        failed_to_connect = _cannot_connect(exc)
        if watch.expired:
            transient = TransientHTTPError(f"{on}: {deadline}")
        elif failed_to_connect:
            transient = TransientHTTPError(f"{on}: {failed_to_connect}", unreachable=True)
        else:
            transient = TransientHTTPError(f"{on}: connection dropped ({type(exc).__name__})")
    except requests.Timeout:
        transient = TransientHTTPError(
            f"{on}: {deadline}"
            if watch.expired
            else f"{on}: no answer within read_timeout_s={limits.read_timeout_s:g} s"
        )
    except urllib3.exceptions.ReadTimeoutError:
        transient = TransientHTTPError(
            f"{on}: {deadline}"
            if watch.expired
            else f"{on}: the body stalled for read_timeout_s={limits.read_timeout_s:g} s"
        )
    except (requests.exceptions.ChunkedEncodingError, urllib3.exceptions.HTTPError, zlib.error):
        transient = TransientHTTPError(
            f"{on}: {deadline}" if watch.expired else f"{on}: body cut off or corrupt"
        )
    except Exception as exc:  # noqa: BLE001 - InvalidHeader, UnicodeEncodeError, ValueError...
        # Their text may quote the request's headers, so the token: scrub it, chain nothing.
        unexpected = f"{type(exc).__name__}: {scrub(str(exc))[:300]}"
    if transient is not None:
        raise transient
    raise FieldSalesAPIError(
        f"{on}: the request could not be sent ({unexpected}). Check FIELDSALES_BASE_URL and the "
        "API token's format."
    )
