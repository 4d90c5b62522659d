"""HTTP server of the demo Field-Sales API (stdlib only).

``ThreadingHTTPServer`` with HTTP/1.1 keep-alive and ``TCP_NODELAY``; every response carries
``Content-Length`` and its body goes out in one ``write`` (small responses together with the head,
large ones right after it, to spare a copy of megabytes). Behaviour switches and fault injection let
tests and benchmarks make the server misbehave the ways the API document leaves open.
"""

from __future__ import annotations

import collections
import contextlib
import hmac
import json
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NamedTuple
from urllib.parse import parse_qsl, urlsplit

from fieldsales_dagster.demo_api.data import LIST_NAMES, Dataset, Shape, take
from fieldsales_dagster.demo_api.openapi import build_openapi

TRANSACTIONS_PATH = "/public/v1/api/transaction/all"
EVENTS_PATH = "/public/v1/api/event/all"
EVENT_GROUPS_PATH = "/public/v1/api/eventgroup/all"
TOKEN_PATH = "/api/bearer/generatetoken"
SELLOUT_PATH = "/api/sellout/all"
DOCS_PATH = "/api-docs"
LIST_PATHS = {
    TRANSACTIONS_PATH: "transactions",
    EVENTS_PATH: "events",
    EVENT_GROUPS_PATH: "event_groups",
}
DEFAULT_LIMIT = 100

FAULT_KINDS = ("status", "truncate", "drop", "close", "non_json", "not_list")
EVENT_ENVELOPES = ("list", "events_total", "data_count", "items_only")
_JSON = "application/json; charset=utf-8"


@dataclass
class DemoConfig:
    """Size, seed and shape (how heavy each item is, ``data.PROFILES``) of the demo dataset."""

    transactions: int = 2000
    events: int | None = None  # default max(1, transactions // shape.tx_per_event)
    event_groups: int | None = None  # default max(1, events // 10)
    seed: int = 0
    shape: Shape = Shape()
    #: Events' ``_id`` as JSON numbers (see ``Dataset.numeric_event_ids``).
    numeric_event_ids: bool = False
    #: Events advanced per generation (``Dataset.changed_events``; default 1% of them).
    changed_events: int | None = None

    def resolved(self) -> tuple[int, int, int]:
        events = self.events
        if events is None:
            events = max(1, self.transactions // self.shape.tx_per_event)
        groups = self.event_groups if self.event_groups is not None else max(1, events // 10)
        if self.transactions < 0 or events < 1 or groups < 1:
            raise ValueError("need transactions >= 0, events >= 1 and event_groups >= 1")
        return self.transactions, events, groups


class RequestRecord(NamedTuple):
    method: str
    path: str
    query: dict[str, str]
    status: int  # 0 when the connection was closed without a response


@dataclass
class _Fault:
    path: str
    kind: str
    remaining: int
    skip: int
    options: dict[str, Any]


@dataclass
class _Mutation:
    list_name: str
    after: int  # apply once this many requests to the list arrived since registration
    seen: int
    insert: int
    delete: int
    at: int


class Behaviour:
    """Mutable switches of a running ``DemoServer``; safe to change while it serves."""

    def __init__(self, dataset: Dataset) -> None:
        self._dataset = dataset
        self._lock = threading.Lock()
        self._faults: list[_Fault] = []
        self._mutations: list[_Mutation] = []
        self.limit_cap: int | None = None
        self.omit_totals: bool = False
        self._event_envelope = "list"
        self.latency_s: float = 0.0
        #: Answer ``eventId``-filtered transaction lists as if no filter had been given.
        self.ignore_event_filter: bool = False
        self.request_counts: collections.Counter[str] = collections.Counter()

    @property
    def event_envelope(self) -> str:
        return self._event_envelope

    @event_envelope.setter
    def event_envelope(self, value: str) -> None:
        if value not in EVENT_ENVELOPES:
            raise ValueError(f"event_envelope must be one of {EVENT_ENVELOPES}")
        self._event_envelope = value

    def inject(
        self, path: str, kind: str, times: int = 1, *, skip_first: int = 0, **options: Any
    ) -> None:
        """Fault the next ``times`` requests whose path is ``path`` (``"*"``: any path).

        ``skip_first=k`` lets the first k matching requests through before the faults start.
        Options: ``status`` (429/500/502/503, kind ``status``), ``retry_after`` (header value).
        Queued faults apply in order, one per request.
        """
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {kind!r}; known: {FAULT_KINDS}")
        if kind == "status":
            options.setdefault("status", 503)
            if not 400 <= int(options["status"]) <= 599:
                raise ValueError("status faults need an error status (400-599)")
        if times < 1:
            raise ValueError("times must be >= 1")
        with self._lock:
            self._faults.append(_Fault(path, kind, times, skip_first, options))

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    @property
    def pending_faults(self) -> int:
        with self._lock:
            return sum(f.remaining for f in self._faults)

    def mutate(
        self,
        list_name: str,
        after_requests: int = 0,
        insert: int = 0,
        delete: int = 0,
        at: int = 0,
    ) -> None:
        """After ``after_requests`` more requests to the list's endpoint, change the list.

        Deletes ``delete`` items at list position ``at``, then inserts ``insert`` new items
        (new ids, deterministic) there. ``after_requests=0`` applies at once. Every request to the
        endpoint counts from the moment it arrives (faulted and refused ones too), so with
        ``after_requests=k`` the first k requests see the old list and the next one the new.
        """
        if list_name not in LIST_NAMES:
            raise ValueError(f"unknown list {list_name!r}; known: {LIST_NAMES}")
        if min(after_requests, insert, delete, at) < 0:
            raise ValueError("after_requests, insert, delete and at must be >= 0")
        if after_requests == 0:
            self._dataset.views[list_name].mutate(insert=insert, delete=delete, at=at)
            return
        with self._lock:
            self._mutations.append(_Mutation(list_name, after_requests, 0, insert, delete, at))

    def evolve(self, generation: int) -> dict[str, int]:
        """Advance the data to ``generation`` (see ``Dataset.evolve``); returns what changed."""
        with self._lock:
            return self._dataset.evolve(generation)

    # ---- used by the server ------------------------------------------------------------

    def _take_fault(self, path: str) -> _Fault | None:
        with self._lock:
            chosen = None
            for fault in self._faults:
                if fault.path != "*" and fault.path != path:
                    continue
                if fault.skip > 0:
                    fault.skip -= 1
                    continue
                if chosen is None:
                    chosen = fault
            if chosen is not None:
                chosen.remaining -= 1
                if chosen.remaining == 0:
                    self._faults.remove(chosen)
            return chosen

    def _arrive(self, list_name: str) -> None:
        """A request to a list endpoint arrived: apply due mutations, then count it."""
        with self._lock:
            self.request_counts[list_name] += 1
            due = []
            for m in self._mutations:
                if m.list_name != list_name:
                    continue
                if m.seen >= m.after:
                    due.append(m)
                m.seen += 1
            for m in due:
                self._mutations.remove(m)
                self._dataset.views[list_name].mutate(insert=m.insert, delete=m.delete, at=m.at)


class _Response(NamedTuple):
    status: int
    body: bytes
    content_type: str = _JSON
    headers: tuple[tuple[str, str], ...] = ()


def _json_response(status: int, obj: Any) -> _Response:
    return _Response(status, json.dumps(obj, separators=(",", ":")).encode())


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def _error(status: int, message: str) -> _Response:
    return _json_response(status, {"error": _phrase(status), "message": message})


class _BadRequest(Exception):
    pass


def _int_param(query: dict[str, str], name: str, default: int) -> int:
    raw = query.get(name)
    if raw is None:
        return default
    raw = raw.strip()
    if not raw.isdigit() or not raw.isascii():
        raise _BadRequest(f"{name} must be a non-negative integer")
    return int(raw)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    request_queue_size = 128

    demo: DemoServer

    def handle_error(self, request: Any, client_address: Any) -> None:  # quiet on disconnects
        pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "FieldSalesDemo/1.0"
    sys_version = ""
    timeout = 300  # idle keep-alive connections are dropped eventually

    server: _HTTPServer

    def setup(self) -> None:
        super().setup()
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.demo._track(self.connection, True)

    def finish(self) -> None:
        self.server.demo._track(self.connection, False)
        with contextlib.suppress(OSError):
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        self.server.demo._handle(self)

    def _not_allowed(self) -> None:
        self.server.demo._handle(self, allowed=False)

    do_POST = do_PUT = do_PATCH = do_DELETE = _not_allowed  # noqa: N815


class DemoServer:
    """The demo API on a loopback port, in a background thread. Use as a context manager."""

    def __init__(
        self,
        config: DemoConfig | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
    ) -> None:
        self.config = config or DemoConfig()
        n_tx, n_events, n_groups = self.config.resolved()
        self.dataset = Dataset(
            n_tx,
            n_events,
            n_groups,
            self.config.seed,
            self.config.shape,
            self.config.numeric_event_ids,
            self.config.changed_events,
        )
        self.behaviour = Behaviour(self.dataset)
        self._requests: collections.deque[RequestRecord] = collections.deque(maxlen=10_000)
        self.host = host
        self._port = port
        self._token = token or secrets.token_urlsafe(32)
        self._token_lock = threading.Lock()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        self._docs = json.dumps(build_openapi(), separators=(",", ":")).encode()
        #: list name -> (src, index) -> the item's bytes, once ``prerender`` ran (else None).
        self._rendered: dict[str, dict[tuple[int, int], bytes]] | None = None
        self._rendered_generation = 0
        self._rendered_lock = threading.Lock()
        #: Responses served from pre-rendered items.
        self.prerendered_responses = 0
        self._admin = {
            **self.dataset.user_obj(0),
            "usertype": "admin",
            "isAdmin": True,
        }

    # ---- lifecycle -------------------------------------------------------------------------

    def start(self) -> DemoServer:
        if self._httpd is not None:
            return self
        server_cls: type[_HTTPServer] = _HTTPServer
        if ":" in self.host:
            server_cls = type("_HTTPServer6", (_HTTPServer,), {"address_family": socket.AF_INET6})
        httpd = server_cls((self.host, self._port), _Handler)
        httpd.demo = self
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"demo-api:{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        httpd, thread = self._httpd, self._thread
        if httpd is None:
            return
        self._httpd = self._thread = None
        httpd.shutdown()
        with self._conns_lock:
            conns = list(self._conns)
        for conn in conns:  # wake handler threads blocked on idle keep-alive connections
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        httpd.server_close()
        if thread is not None:
            thread.join(timeout=5)

    def __enter__(self) -> DemoServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("server not started")
        return self._httpd.server_address[1]

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def requests(self) -> list[RequestRecord]:
        """The last 10,000 requests, oldest first: a snapshot, safe to iterate while serving."""
        return list(self._requests)

    def clear_requests(self) -> None:
        self._requests.clear()

    # ---- token -------------------------------------------------------------------------------

    @property
    def token(self) -> str:
        return self._token

    def renew_token(self) -> str:
        """Replace the token (what ``/api/bearer/generatetoken`` does); the old one is refused."""
        with self._token_lock:
            self._token = secrets.token_urlsafe(32)
            return self._token

    def expire_token(self) -> str:
        """Invalidate the current token without a client renewing it; returns the new valid one."""
        return self.renew_token()

    def _authorized(self, header: str | None) -> bool:
        if not header or not header.startswith("Bearer "):
            return False
        return hmac.compare_digest(header[7:].strip().encode(), self._token.encode())

    # ---- request handling ----------------------------------------------------------------------

    def _track(self, conn: socket.socket, add: bool) -> None:
        with self._conns_lock:
            if add:
                self._conns.add(conn)
            else:
                self._conns.discard(conn)

    def _handle(self, h: _Handler, allowed: bool = True) -> None:
        length = h.headers.get("Content-Length")
        if length and length.isdigit() and int(length) > 0:
            h.rfile.read(int(length))
        url = urlsplit(h.path)
        path = url.path
        query = dict(parse_qsl(url.query, keep_blank_values=True))
        list_name = LIST_PATHS.get(path)
        if list_name is not None:
            self.behaviour._arrive(list_name)
        fault = self.behaviour._take_fault(path)
        latency = self.behaviour.latency_s
        if latency > 0:
            time.sleep(latency)
        if fault is not None:
            status = self._send_fault(h, fault, path, query, allowed)
            self._requests.append(RequestRecord(h.command, path, query, status))
            return
        resp = self._respond(h, path, query, allowed)
        # Logged before it is sent, so a client that has its answer finds it in the log.
        self._requests.append(RequestRecord(h.command, path, query, resp.status))
        self._send(h, resp)

    def _send(
        self,
        h: _Handler,
        resp: _Response,
        declared: int | None = None,
        body_part: int | None = None,
    ) -> int:
        body = resp.body if body_part is None else resp.body[:body_part]
        lines = [
            f"HTTP/1.1 {resp.status} {_phrase(resp.status)}",
            f"Server: {h.server_version}",
            f"Date: {formatdate(usegmt=True)}",
            f"Content-Type: {resp.content_type}",
            f"Content-Length: {len(body) if declared is None else declared}",
        ]
        lines.extend(f"{k}: {v}" for k, v in resp.headers)
        if h.close_connection:
            lines.append("Connection: close")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        try:
            if len(body) <= 65536:
                h.wfile.write(head + body)
            else:  # no copy of a multi-megabyte body just to prepend the head
                h.wfile.write(head)
                h.wfile.write(body)
        except OSError:
            h.close_connection = True
        return resp.status

    def _send_fault(
        self, h: _Handler, fault: _Fault, path: str, query: dict[str, str], allowed: bool
    ) -> int:
        kind, opts = fault.kind, fault.options
        if kind == "status":
            status = int(opts["status"])
            headers: tuple[tuple[str, str], ...] = ()
            if opts.get("retry_after") is not None:
                headers = (("Retry-After", str(opts["retry_after"])),)
            resp = _error(status, "injected fault")
            return self._send(h, resp._replace(headers=headers))
        if kind == "close":
            h.close_connection = True
            return 0
        if kind == "non_json":
            body = b"<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>"
            return self._send(h, _Response(200, body, "text/html; charset=utf-8"))
        if kind == "not_list":
            return self._send(h, _json_response(200, {"error": "something"}))
        resp = self._respond(h, path, query, allowed)
        half = len(resp.body) // 2
        if kind == "truncate":
            return self._send(h, resp, body_part=half)
        # drop: declare the whole body, send half of it, close the connection
        h.close_connection = True
        self._send(h, resp, declared=len(resp.body), body_part=half)
        with contextlib.suppress(OSError):
            h.connection.shutdown(socket.SHUT_RDWR)
        return resp.status

    def _respond(self, h: _Handler, path: str, query: dict[str, str], allowed: bool) -> _Response:
        if path == DOCS_PATH and allowed:
            return _Response(200, self._docs)
        known = path in LIST_PATHS or path in (TOKEN_PATH, SELLOUT_PATH, DOCS_PATH)
        if not known:
            return _error(404, f"no route for {path}")
        if not allowed:
            return _error(405, "only GET is supported")
        if not self._authorized(h.headers.get("Authorization")):
            return _error(401, "missing, invalid or replaced bearer token")
        try:
            if path == TRANSACTIONS_PATH:
                return self._transactions(query)
            if path == EVENTS_PATH:
                return self._events(query)
            if path == EVENT_GROUPS_PATH:
                return self._event_groups(query)
        except _BadRequest as exc:
            return _error(400, str(exc))
        if path == TOKEN_PATH:
            token = self.renew_token()
            return _json_response(200, {"token": token, "user": self._admin})
        return _json_response(200, {"success": True, "data": [], "count": 0})

    def _paging(self, query: dict[str, str]) -> tuple[int, int, int]:
        skip = _int_param(query, "skip", 0)
        limit = _int_param(query, "limit", DEFAULT_LIMIT)
        cap = self.behaviour.limit_cap
        return skip, limit, limit if cap is None else min(limit, cap)

    def _page(
        self, name: str, segs: list, skip: int, limit: int, prefix: str, suffix: str
    ) -> bytes:
        """``prefix`` + the items at ``skip..skip+limit`` joined by commas + ``suffix``, as UTF-8.

        Items are wire text (see ``data.wire``); the envelope is glued to the first and last item
        so the page is built with one join and one latin-1 encode (two plain copies).
        """
        keys = take(segs, skip, limit)
        if self._rendered is not None and keys:
            self.prerendered_responses += 1
            parts = self._rendered_items(name, keys)
            parts[0] = prefix.encode("latin-1") + parts[0]
            parts[-1] = parts[-1] + suffix.encode("latin-1")
            return b",".join(parts)
        render = self.dataset.render
        items = [render(name, src, idx) for src, idx in keys]
        if not items:
            return (prefix + suffix).encode()
        items[0] = prefix + items[0]
        items[-1] = items[-1] + suffix
        return ",".join(items).encode("latin-1")

    # ---- pre-rendered items -----------------------------------------------------------------

    def prerender(self) -> int:
        """Render every listed item once and serve pages from memory from now on.

        A page is then the stored bytes of its items joined, the same bytes as rendering them
        (the items are wire text, so the latin-1 encoding of each item is its part of the body).
        Items that appear later (``mutate``) are rendered on first use and kept; after ``evolve``
        the store starts again, since an evolved item renders differently. Memory: about the
        size of the data (~5 KB per transaction). Returns the number of items rendered.
        """
        with self._rendered_lock:
            if self._rendered is None:
                self._rendered = {name: {} for name in LIST_NAMES}
                self._rendered_generation = self.dataset.generation
        rendered = 0
        for name in LIST_NAMES:
            for src, a, b in self.dataset.views[name].segments:
                self._rendered_items(name, [(src, i) for i in range(a, b)])
                rendered += b - a
        return rendered

    @property
    def prerendered(self) -> bool:
        return self._rendered is not None

    def _rendered_items(self, name: str, keys: list[tuple[int, int]]) -> list[bytes]:
        generation = self.dataset.generation
        if generation != self._rendered_generation:
            with self._rendered_lock:
                if generation != self._rendered_generation:
                    self._rendered = {n: {} for n in LIST_NAMES}
                    self._rendered_generation = generation
        rendered = self._rendered
        assert rendered is not None, "pages are served from memory only once prerender ran"
        store = rendered[name]
        render = self.dataset.render
        out = []
        for key in keys:
            item = store.get(key)
            if item is None:
                item = store[key] = render(name, *key).encode("latin-1")
            out.append(item)
        return out

    def _transactions(self, query: dict[str, str]) -> _Response:
        skip, limit, served = self._paging(query)
        event_id = query.get("eventId")
        type_ = query.get("type")
        filter_id = None if self.behaviour.ignore_event_filter else event_id
        segs = self.dataset.transaction_segments(filter_id, type_)
        debug = json.dumps(
            {"query": {"skip": skip, "limit": limit, "eventId": event_id, "type": type_ or "sale"}},
            separators=(",", ":"),
        )  # ASCII (json.dumps escapes), so it is valid wire text
        total = "" if self.behaviour.omit_totals else f',"count":{_count(segs)}'
        suffix = f'{total},"debug":{debug}}}'
        return _Response(
            200, self._page("transactions", segs, skip, served, '{"transactions":[', "]" + suffix)
        )

    def _events(self, query: dict[str, str]) -> _Response:
        skip, _, served = self._paging(query)
        segs = self.dataset.views["events"].segments
        envelope = self.behaviour.event_envelope
        total = None if self.behaviour.omit_totals else _count(segs)
        if envelope == "list":
            prefix, suffix = "[", "]"
        elif envelope == "items_only":
            prefix, suffix = '{"items":[', "]}"
        else:
            if envelope == "events_total":
                key, total_key = "events", "total"
            else:
                key, total_key = "data", "count"
            prefix = f'{{"{key}":['
            suffix = "]}" if total is None else f'],"{total_key}":{total}}}'
        return _Response(200, self._page("events", segs, skip, served, prefix, suffix))

    def _event_groups(self, query: dict[str, str]) -> _Response:
        skip, _, served = self._paging(query)
        segs = self.dataset.group_segments(query.get("project_name"))
        prefix = '{"data":[' if self.behaviour.omit_totals else f'{{"total":{_count(segs)},"data":['
        return _Response(200, self._page("event_groups", segs, skip, served, prefix, "]}"))


def _count(segs: list[tuple[int, int, int]]) -> int:
    return sum(b - a for _, a, b in segs)
