"""The demo API's pre-rendered mode serves exactly the bytes of the rendering mode, from memory."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest
import requests

from fieldsales_dagster.demo_api import DemoConfig, DemoServer

TX = "/public/v1/api/transaction/all"
EV = "/public/v1/api/event/all"
EG = "/public/v1/api/eventgroup/all"

# Aligned and unaligned windows, a filter, the last partial page and a page past the end.
REQUESTS = [
    (TX, {"skip": 0, "limit": 500}),
    (TX, {"skip": 737, "limit": 333}),
    (TX, {"skip": 1900, "limit": 500}),
    (TX, {"skip": 5000, "limit": 500}),
    (TX, {"skip": 0, "limit": 1}),
    (EV, {"skip": 0, "limit": 30}),
    (EV, {"skip": 45, "limit": 30}),
    (EG, {"skip": 0, "limit": 500}),
    (EG, {"skip": 3, "limit": 2}),
]


def body(server: DemoServer, path: str, params: dict) -> bytes:
    headers = {"Authorization": f"Bearer {server.token}"}
    resp = requests.get(server.base_url + path, headers=headers, params=params, timeout=10)
    assert resp.status_code == 200, resp.text[:200]
    return resp.content


@pytest.fixture
def pair():
    config = DemoConfig(transactions=2000, seed=3)
    with DemoServer(config) as live, DemoServer(config) as fast:
        assert fast.prerender() == 2000 + 50 + 5
        yield live, fast


def test_prerendered_pages_are_the_bytes_of_rendered_pages(pair):
    live, fast = pair
    for path, params in REQUESTS:
        assert body(fast, path, params) == body(live, path, params), (path, params)
    # Every request but the one past the end came from the pre-rendered items.
    assert fast.prerendered_responses == len(REQUESTS) - 1


def test_prerendered_faults_cut_the_same_bytes(pair):
    live, fast = pair
    params = {"skip": 100, "limit": 200}
    for server in pair:
        server.behaviour.inject(TX, "truncate")
    cut = [
        requests.get(
            s.base_url + TX,
            params=params,
            headers={"Authorization": f"Bearer {s.token}"},
            timeout=10,
        ).content
        for s in pair
    ]
    assert cut[0] == cut[1]
    assert 0 < len(cut[1]) < len(body(fast, TX, params))


def test_prerendered_filtered_pages_are_the_bytes_of_rendered_pages(pair):
    live, fast = pair
    event_id = live.dataset.item("events", 7)["_id"]
    params = {"eventId": event_id, "skip": 0, "limit": 500}
    assert body(fast, TX, params) == body(live, TX, params)
    assert json.loads(body(fast, TX, params))["transactions"]


def test_prerendered_server_serves_inserted_and_deleted_items_like_a_rendering_server(pair):
    live, fast = pair
    for server in pair:
        server.behaviour.mutate("transactions", insert=7, delete=3, at=480)
    for path, params in REQUESTS:
        assert body(fast, path, params) == body(live, path, params), (path, params)


def test_prerendered_server_serves_evolved_data_like_a_rendering_server(pair):
    live, fast = pair
    before = body(fast, EV, {"skip": 0, "limit": 50})
    for server in pair:
        server.behaviour.evolve(1)
    assert body(fast, EV, {"skip": 0, "limit": 50}) != before
    for path, params in REQUESTS:
        assert body(fast, path, params) == body(live, path, params), (path, params)


def test_cli_prerender_flag_serves_the_rendered_bytes():
    proc = subprocess.Popen(
        [sys.executable, "-m", "fieldsales_dagster.demo_api", "--port", "0",
         "--transactions", "300", "--seed", "3", "--prerender"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        ready = json.loads(proc.stdout.readline())
        headers = {"Authorization": f"Bearer {ready['token']}"}
        params = {"skip": 17, "limit": 100}
        served = requests.get(ready["base_url"] + TX, headers=headers, params=params, timeout=10)
        with DemoServer(DemoConfig(transactions=300, seed=3)) as live:
            assert served.content == body(live, TX, params)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
