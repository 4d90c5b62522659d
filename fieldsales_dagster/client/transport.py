"""One GET, with limits a hostile server cannot stretch: a body cap after decompression, no proxy
for loopback, redirects within the origin only, and a deadline to the body's last byte. urllib3's
timeouts bound each socket read only, so each read gets what is left of the deadline
(``_DeadlineReader``), headers included, which only the connection's ``response_class`` reaches.
"""

from __future__ import annotations

import http.client
import io
import math
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple
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
from fieldsales_dagster.urls import Origin, is_loopback_host, origin_of

#: Decoded bytes per step: the loop costs nothing next to the network; the cap overshoots by this.
CHUNK_BYTES = 1 << 20
#: Step of a body of declared length: one read of a ~2.5 MB page instead of three (0.6 -> 0.4
#: CPU-s per GB); allocated before its bytes arrive, so a lying Content-Length costs at most this.
WHOLE_BODY_BYTES = 32 << 20
MAX_REDIRECTS = 5
#: Content codings asked for, all of which urllib3 decodes (it would add br/zstd where installed).
ACCEPT_ENCODING = "gzip, deflate"
_DECODED = frozenset({"identity", "gzip", "x-gzip", "deflate"})

QueryParams = Mapping[str, str | int]

#: The deadline of this thread's request: no parameter of requests reaches the response it builds.
_sending = threading.local()


class _DeadlineReader(io.RawIOBase):
    """The socket's reader, each read given at most what is left of the request's deadline."""

    def __init__(self, sock: Any, raw: io.RawIOBase, deadline: float):
        super().__init__()
        self._sock, self._raw, self._deadline = sock, raw, deadline

    def readable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._raw.fileno()

    def readinto(self, buffer: Any) -> int | None:
        if (left := self._deadline - time.monotonic()) <= 0:
            raise TimeoutError("the request's deadline passed")
        if left < (self._sock.gettimeout() or math.inf):  # the read timeout urllib3 set, or less
            self._sock.settimeout(left)
        return self._raw.readinto(buffer)

    def close(self) -> None:
        self._raw.close()
        super().close()


class _DeadlineResponse(http.client.HTTPResponse):
    def __init__(self, sock: Any, *args: Any, **kwargs: Any):
        super().__init__(sock, *args, **kwargs)
        deadline = getattr(_sending, "deadline", math.inf)
        self.fp = io.BufferedReader(_DeadlineReader(sock, self.fp.detach(), deadline))


def _deadline_pool(pool: type[HTTPConnectionPool]) -> type[HTTPConnectionPool]:
    connection = type(f"_Deadline{pool.ConnectionCls.__name__}", (pool.ConnectionCls,), {})
    connection.response_class = _DeadlineResponse  # type: ignore[attr-defined]
    return type(f"_Deadline{pool.__name__}", (pool,), {"ConnectionCls": connection})


_POOLS = {"http": _deadline_pool(HTTPConnectionPool), "https": _deadline_pool(HTTPSConnectionPool)}


class _DeadlineAdapter(HTTPAdapter):
    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = _POOLS

    def proxy_manager_for(self, proxy: str, **kwargs: Any) -> Any:
        manager = super().proxy_manager_for(proxy, **kwargs)
        manager.pool_classes_by_scheme = _POOLS
        return manager


def new_session(origin: Origin) -> requests.Session:
    """A session for one thread: one connection, no retries of its own, no proxy for loopback."""
    session = requests.Session()
    session.trust_env = not is_loopback_host(origin.host)
    adapter = _DeadlineAdapter(pool_connections=1, pool_maxsize=1, max_retries=0)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    session.headers.update({"Accept": "application/json", "Accept-Encoding": ACCEPT_ENCODING})
    return session


class Limits(NamedTuple):
    connect_timeout_s: float
    read_timeout_s: float
    deadline_s: float
    max_body_bytes: int
    #: For error messages: the setting behind ``deadline_s``, the base URL's variable.
    deadline_source: str = "request_deadline_s"
    base_url: str = "FIELDSALES_BASE_URL"


def read_body(resp: requests.Response, where: str, max_bytes: int) -> bytes:
    """The whole body, decoded as it streams in; ``ResponseTooLargeError`` past the cap."""
    encoding = (resp.headers.get("Content-Encoding") or "identity").strip().lower()
    if encoding not in _DECODED:
        raise FieldSalesAPIError(
            f"{where} answered with Content-Encoding {encoding[:40]!r}, not {ACCEPT_ENCODING} as "
            "asked: a proxy in between may rewrite answers."
        )
    too_large = ResponseTooLargeError(
        f"{where}: the body {'' if encoding == 'identity' else f'once {encoding}-decompressed '}"
        f"is larger than max_page_bytes={max_bytes}: raise it, or lower page_size."
    )
    declared = resp.headers.get("Content-Length", "")
    step = CHUNK_BYTES
    if encoding == "identity" and declared.isdigit():
        if int(declared) > max_bytes:
            raise too_large
        step = max(1, min(int(declared), WHOLE_BODY_BYTES))
    parts: list[bytes] = []
    for piece in resp.raw.stream(step, decode_content=True):
        parts.append(piece)
        if sum(map(len, parts)) > max_bytes:
            raise too_large
    return parts[0] if len(parts) == 1 else b"".join(parts)


def fetch(
    session: requests.Session,
    origin: Origin,
    url: str,
    *,
    params: QueryParams | None,
    token: str,
    on: str,
    limits: Limits,
    scrub: Callable[[str], str],
) -> tuple[requests.Response, bytes]:
    """GET ``url`` within ``limits``, following redirects within ``origin`` only: the response
    (closed) and its body. Raises ``TransientHTTPError`` for what another attempt may cure, else a
    ``FieldSalesAPIError``; ``on`` names the request in errors."""
    visited = [url]
    deadline = time.monotonic() + limits.deadline_s
    _sending.deadline = deadline
    try:
        while True:
            failure = None
            try:
                resp = session.get(
                    url,
                    params=params,
                    headers={"Authorization": f"Bearer {token}"},
                    auth=lambda request: request,  # not None: no .netrc credentials instead
                    # The read timeout bounds each read; _DeadlineReader shortens it near the end.
                    timeout=(
                        min(limits.connect_timeout_s, max(deadline - time.monotonic(), 0.001)),
                        limits.read_timeout_s,
                    ),
                    stream=True,
                    allow_redirects=False,
                )
                with resp:
                    body = b"" if resp.is_redirect else read_body(resp, on, limits.max_body_bytes)
            except FieldSalesAPIError:
                raise
            except Exception as exc:  # noqa: BLE001 - told apart in _failure
                failure = _failure(exc, on, limits, deadline, scrub)
            if failure is not None:  # raised outside the handler: nothing chains its text
                raise failure
            if not resp.is_redirect:
                return resp, body
            location = resp.headers["Location"]
            url, params = urljoin(url, location), None
            if (target_origin := origin_of(url)) != origin:
                shown = str(target_origin) if target_origin else scrub(location[:200])
                raise RedirectRefusedError(
                    f"{on} redirects to {shown}, refused: the token is only sent to {origin}. If "
                    f"the instance moved, set {limits.base_url} to its new address."
                )
            visited.append(url)
            if url in visited[:-1] or len(visited) > MAX_REDIRECTS + 1:
                raise RedirectRefusedError(
                    f"{on} redirects in a loop or more than {MAX_REDIRECTS} times "
                    f"({' -> '.join(map(scrub, visited))}); check {limits.base_url}."
                )
    finally:
        _sending.deadline = math.inf


def _failure(
    exc: Exception, on: str, limits: Limits, deadline: float, scrub: Callable[[str], str]
) -> TransientHTTPError | FieldSalesAPIError:
    """What a request that raised ``exc`` failed of: transient (retried), or not sent at all."""

    def transient(otherwise: str, unreachable: bool = False) -> TransientHTTPError:
        if not unreachable and time.monotonic() >= deadline:
            return TransientHTTPError(
                f"{on}: no complete answer within {limits.deadline_source} "
                f"({limits.deadline_s:.3g} s)"
            )
        return TransientHTTPError(f"{on}: {otherwise}", unreachable=unreachable)

    if isinstance(exc, requests.ConnectTimeout):
        return transient("cannot connect (no answer within connect_timeout_s)", True)
    if isinstance(exc, requests.ConnectionError):
        reason = exc.args[0] if exc.args else None
        reason = getattr(reason, "reason", reason)  # MaxRetryError wraps the cause
        if isinstance(reason, NameResolutionError):
            return transient("the host name cannot be resolved", True)
        if isinstance(reason, NewConnectionError):
            detail = str(reason).rsplit("Failed to establish a new connection: ", 1)[-1]
            return transient(f"cannot connect ({detail})", True)
        return transient(f"connection dropped ({type(exc).__name__})")
    if isinstance(exc, requests.Timeout | urllib3.exceptions.ReadTimeoutError):
        return transient(f"no answer within read_timeout_s={limits.read_timeout_s:g} s")
    if isinstance(exc, requests.exceptions.ChunkedEncodingError | urllib3.exceptions.HTTPError):
        return transient("body cut off or corrupt")
    # Anything else's text may quote the request's headers, so the token: scrub, chain nothing.
    unexpected = f"{type(exc).__name__}: {scrub(str(exc))[:300]}"
    return FieldSalesAPIError(
        f"{on}: the request could not be sent ({unexpected}). Check {limits.base_url} and the "
        "API token's format."
    )
