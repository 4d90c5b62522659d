"""The floor: fetch every page of every list endpoint, read each body, throw it away.

The cost no loader of this API can avoid: the same requests as the project (its page size,
8 in flight), one keep-alive ``http.client`` connection per thread, no JSON parsing except the
first page of the transaction and event-group lists (for their ``count``/``total``). Events carry
no total: pages are asked for 8 ahead until one comes back empty (``[]``).

    FIELDSALES_API_TOKEN=... python -m benchmarks.floor --base-url http://127.0.0.1:8765

Prints one JSON line: per endpoint the total read, pages fetched (non-empty) and bytes.
The token comes from the environment only, so it never shows in a process list or a log.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from urllib.parse import urlsplit

TRANSACTIONS_PATH = "/public/v1/api/transaction/all"
EVENTS_PATH = "/public/v1/api/event/all"
EVENT_GROUPS_PATH = "/public/v1/api/eventgroup/all"


class Fetcher:
    """GET pages over one keep-alive connection per thread."""

    def __init__(self, base_url: str, token: str, page_size: int, attempts: int = 3):
        parts = urlsplit(base_url)
        if parts.scheme != "http":
            raise SystemExit("the floor speaks plain http to the loopback demo API only")
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.prefix = parts.path.rstrip("/")
        self.headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        self.page_size = page_size
        self.attempts = attempts
        self.local = threading.local()
        self.requests = 0
        self.bytes = 0
        self.lock = threading.Lock()

    def _conn(self, fresh: bool = False) -> http.client.HTTPConnection:
        conn = getattr(self.local, "conn", None)
        if conn is None or fresh:
            if conn is not None:
                conn.close()
            conn = http.client.HTTPConnection(self.host, self.port, timeout=300)
            self.local.conn = conn
        return conn

    def get(self, path: str, skip: int) -> bytes:
        url = f"{self.prefix}{path}?skip={skip}&limit={self.page_size}"
        for attempt in range(self.attempts):
            try:
                conn = self._conn(fresh=attempt > 0)
                conn.request("GET", url, headers=self.headers)
                resp = conn.getresponse()
                body = resp.read()
            except (OSError, http.client.HTTPException):
                if attempt + 1 == self.attempts:
                    raise
                continue
            if resp.status != 200:
                raise SystemExit(f"GET {path} (skip={skip}) answered HTTP {resp.status}")
            with self.lock:
                self.requests += 1
                self.bytes += len(body)
            return body
        raise AssertionError("unreachable")


def _total(body: bytes, key: str) -> int:
    return int(json.loads(body)[key])


def fetch_counted(fetcher: Fetcher, pool: ThreadPoolExecutor, path: str, key: str) -> dict:
    """A list with a total: the first page tells it, the other pages go out all at once."""
    first = fetcher.get(path, 0)
    total = _total(first, key)
    skips = range(fetcher.page_size, total, fetcher.page_size)
    nbytes = len(first)
    for body in pool.map(lambda skip: fetcher.get(path, skip), skips):
        nbytes += len(body)
    pages = (1 if total else 0) + len(skips)
    return {"total": total, "pages": pages, "bytes": nbytes}


def _is_empty(body: bytes) -> bool:
    stripped = body.strip()
    if stripped.startswith(b"["):
        return stripped[1:].lstrip() == b"]"
    # Not the documented bare list: fall back to looking for a non-empty list in the object.
    doc = json.loads(body)
    return not any(isinstance(v, list) and v for v in doc.values())


def fetch_until_empty(
    fetcher: Fetcher, pool: ThreadPoolExecutor, path: str, concurrency: int
) -> dict:
    """A list without a total: ``concurrency`` pages in flight until one comes back empty."""
    step = fetcher.page_size
    next_skip = 0
    end: int | None = None  # skip of the first empty page seen
    pages = 0
    nbytes = 0
    in_flight: dict[Future[bytes], int] = {}
    while True:
        while end is None and len(in_flight) < concurrency:
            in_flight[pool.submit(fetcher.get, path, next_skip)] = next_skip
            next_skip += step
        if not in_flight:
            break
        done, _ = wait(in_flight, return_when=FIRST_COMPLETED)
        for future in done:
            skip = in_flight.pop(future)
            body = future.result()
            nbytes += len(body)
            if _is_empty(body):
                end = skip if end is None else min(end, skip)
            else:
                pages += 1
    # Pages past the first empty one that came back non-empty would mean a list that grew.
    return {"total": None, "pages": pages, "bytes": nbytes, "end_skip": end}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--page-size", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args(argv)
    token = os.environ.get("FIELDSALES_API_TOKEN")
    if not token:
        print("set FIELDSALES_API_TOKEN", file=sys.stderr)
        return 2

    fetcher = Fetcher(args.base_url, token, args.page_size)
    started = time.perf_counter()
    result: dict[str, object] = {}
    with ThreadPoolExecutor(max_workers=args.concurrency, thread_name_prefix="floor") as pool:
        result["events"] = fetch_until_empty(fetcher, pool, EVENTS_PATH, args.concurrency)
        result["transactions"] = fetch_counted(fetcher, pool, TRANSACTIONS_PATH, "count")
        result["event_groups"] = fetch_counted(fetcher, pool, EVENT_GROUPS_PATH, "total")
    result["requests"] = fetcher.requests
    result["bytes"] = fetcher.bytes
    result["seconds"] = round(time.perf_counter() - started, 3)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
