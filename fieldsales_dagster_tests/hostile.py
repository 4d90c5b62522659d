"""A hostile HTTP server on 127.0.0.1: every connection is handed to a test's own function.

The demo API follows the API document; this one does what a broken or malicious server does:
drips bytes, never answers, redirects in circles, sends gzip bombs, echoes the token. A handler
reads requests off the connection and writes whatever bytes it likes::

    def handler(conn):
        while (request := conn.read_request()) is not None:
            conn.respond(200, b"[]")

    with HostileServer(handler) as server:
        ...server.base_url, server.requests, server.connections...
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlsplit


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    at: float = field(default_factory=time.monotonic)


class Conn:
    """One accepted connection, as the handler sees it."""

    def __init__(self, sock: socket.socket, server: HostileServer):
        self.sock = sock
        self.server = server
        self._buffer = b""

    def read_request(self) -> Request | None:
        """The next request's head (bodies are not expected), or ``None`` once the peer closed."""
        while b"\r\n\r\n" not in self._buffer:
            try:
                data = self.sock.recv(65536)
            except OSError:
                return None
            if not data:
                return None
            self._buffer += data
        head, self._buffer = self._buffer.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        url = urlsplit(target)
        request = Request(method, url.path, dict(parse_qsl(url.query)), headers)
        with self.server.lock:
            self.server.requests.append(request)
        return request

    def send(self, data: bytes) -> bool:
        try:
            self.sock.sendall(data)
            return True
        except OSError:
            return False

    def respond(
        self,
        status: int,
        body: bytes = b"",
        headers: tuple[tuple[str, str], ...] = (),
        content_type: str = "application/json",
    ) -> bool:
        lines = [f"HTTP/1.1 {status} X", f"Content-Type: {content_type}"]
        if not any(name.lower() == "content-length" for name, _ in headers):
            lines.append(f"Content-Length: {len(body)}")
        lines += [f"{name}: {value}" for name, value in headers]
        return self.send(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)

    def drip(self, data: bytes, every_s: float) -> None:
        """Send ``data`` one byte at a time, ``every_s`` apart, until done or the server stops."""
        for i in range(len(data)):
            if not self.send(data[i : i + 1]) or self.server.stopping.wait(every_s):
                return


class HostileServer:
    """Accepts on 127.0.0.1 (an ephemeral port) and runs ``handler(conn)`` per connection."""

    def __init__(self, handler: Callable[[Conn], None]):
        self.handler = handler
        self.requests: list[Request] = []
        self.connections = 0
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)  # so the accept loop sees `stopping`
        self.port = self._listener.getsockname()[1]
        self._socks: list[socket.socket] = []
        self._threads: list[threading.Thread] = []

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def paths(self) -> list[str]:
        with self.lock:
            return [request.path for request in self.requests]

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                sock, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            sock.settimeout(None)
            with self.lock:
                self.connections += 1
                self._socks.append(sock)
            thread = threading.Thread(target=self._serve, args=(sock,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, sock: socket.socket) -> None:
        with contextlib.suppress(OSError):
            self.handler(Conn(sock, self))
        with contextlib.suppress(OSError):
            sock.close()

    def __enter__(self) -> HostileServer:
        thread = threading.Thread(target=self._accept, daemon=True)
        self._threads.append(thread)
        thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stopping.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self.lock:
            socks = list(self._socks)
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        for thread in self._threads:
            thread.join(timeout=5)


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.create_server(("127.0.0.1", 0)) as sock:
        return sock.getsockname()[1]
