"""A hostile list server on 127.0.0.1: each test decides what a page answers (paging cases).

``HostileServer(answer)`` serves every GET with ``answer(path, skip, limit)``, which returns the
JSON document to send (any shape) or raises ``Refuse`` for an HTTP error; with
``with_params=True`` the other query parameters (``eventId``) follow as a fourth argument, a
dict. Every request is recorded, so a test can assert on what the client asked for.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NamedTuple
from urllib.parse import parse_qsl, urlsplit

TOKEN = "hostile-test-token-0123456789"


class Asked(NamedTuple):
    path: str
    skip: int
    limit: int
    params: tuple[tuple[str, str], ...] = ()


Answer = Callable[[str, int, int], Any]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    #: The head and the body go out in two writes: without this, each answer waits ~40 ms for
    #: the client's delayed ACK.
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        url = urlsplit(self.path)
        query = dict(parse_qsl(url.query))
        skip, limit = int(query.pop("skip", 0)), int(query.pop("limit", 100))
        asked = Asked(url.path, skip, limit, tuple(sorted(query.items())))
        with self.server.lock:
            self.server.asked.append(asked)
        if self.server.with_params:
            doc = self.server.answer(url.path, skip, limit, query)
        else:
            doc = self.server.answer(url.path, skip, limit)
        body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    answer: Callable[..., Any]
    with_params: bool
    asked: list[Asked]
    lock: threading.Lock


class HostileServer:
    def __init__(self, answer: Callable[..., Any], with_params: bool = False):
        self._httpd = _Server(("127.0.0.1", 0), _Handler)
        self._httpd.answer = answer
        self._httpd.with_params = with_params
        self._httpd.asked = []
        self._httpd.lock = threading.Lock()
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def __enter__(self) -> HostileServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    @property
    def token(self) -> str:
        return TOKEN

    @property
    def asked(self) -> list[Asked]:
        with self._httpd.lock:
            return list(self._httpd.asked)


def items(start: int, stop: int, prefix: str = "t") -> list[dict[str, Any]]:
    """Items ``prefix-start .. prefix-(stop-1)``."""
    return [
        {"_id": f"{prefix}-{i:06d}", "eventId": f"e-{i % 7}", "n": i} for i in range(start, stop)
    ]
