"""The bundled demo API: real HTTP on 127.0.0.1, one behaviour per test."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from urllib.parse import urlsplit

import pytest
import requests

from fieldsales_dagster.demo_api import DemoConfig, DemoServer

TX = "/public/v1/api/transaction/all"
EV = "/public/v1/api/event/all"
EG = "/public/v1/api/eventgroup/all"
TOKEN = "/api/bearer/generatetoken"
SELLOUT = "/api/sellout/all"
HEX24 = re.compile(r"^[0-9a-f]{24}$")
ISO_MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


@pytest.fixture
def server():
    with DemoServer(DemoConfig(transactions=2000, seed=0), host="127.0.0.1", port=0) as srv:
        yield srv


def get(server, path, token=None, **params):
    headers = {"Authorization": f"Bearer {token or server.token}", "Accept": "application/json"}
    return requests.get(server.base_url + path, headers=headers, params=params, timeout=10)


def raw_get(server, path, conn=None):
    """One request over http.client, so broken responses surface as they are."""
    url = urlsplit(server.base_url)
    conn = conn or http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    conn.request("GET", path, headers={"Authorization": f"Bearer {server.token}"})
    return conn, conn.getresponse()


def page_all(server, path, key, limit=100, **params):
    items, skip = [], 0
    while True:
        body = get(server, path, skip=skip, limit=limit, **params).json()
        page = body[key] if key else body
        if not page:
            return items, body
        items.extend(page)
        skip += len(page)


# ---- authentication --------------------------------------------------------------------------


def test_auth_required(server):
    no_header = requests.get(server.base_url + TX, timeout=10)
    wrong = get(server, TX, token="not-the-token")
    for resp in (no_header, wrong):
        assert resp.status_code == 401
        assert "error" in resp.json()
        assert "not-the-token" not in resp.text and server.token not in resp.text
    assert get(server, TX).status_code == 200
    assert get(server, SELLOUT).status_code == 200


def test_token_renewal_returns_new_token_and_refuses_old_at_once(server):
    old = server.token
    resp = get(server, TOKEN)
    assert resp.status_code == 200
    body = resp.json()
    assert body["token"] != old and body["token"] == server.token
    assert HEX24.match(body["user"]["_id"]) and body["user"]["email"]
    assert get(server, SELLOUT, token=old).status_code == 401
    assert get(server, SELLOUT, token=body["token"]).status_code == 200


def test_expire_token_invalidates_without_renewal(server):
    old = server.token
    server.expire_token()
    assert server.token != old
    assert get(server, TX, token=old).status_code == 401
    assert get(server, TX).status_code == 200


# ---- envelopes, caps, totals, filters ---------------------------------------------------------


def test_transaction_envelope_and_debug_query(server):
    body = get(server, TX, skip=5, limit=7).json()
    assert len(body["transactions"]) == 7
    assert body["count"] == 2000
    assert body["debug"]["query"] == {"skip": 5, "limit": 7, "eventId": None, "type": "sale"}
    assert body["transactions"][0]["_id"] == list(server.dataset.ids("transactions"))[5]


@pytest.mark.parametrize(
    ("envelope", "items_key", "total_key"),
    [
        ("list", None, None),
        ("events_total", "events", "total"),
        ("data_count", "data", "count"),
        ("items_only", "items", None),
    ],
)
def test_event_envelopes(server, envelope, items_key, total_key):
    server.behaviour.event_envelope = envelope
    body = get(server, EV, limit=4).json()
    if items_key is None:
        assert isinstance(body, list) and len(body) == 4
        return
    assert set(body) == {items_key} | ({total_key} if total_key else set())
    assert len(body[items_key]) == 4
    if total_key:
        assert body[total_key] == 50


def test_event_groups_envelope_and_defaults(server):
    body = get(server, EG).json()
    assert body["total"] == 5 and len(body["data"]) == 5
    group = body["data"][0]
    assert set(group) == {"_id", "name", "project_name", "events", "created"}
    assert group["events"] and all(HEX24.match(e) for e in group["events"])


def test_default_limit_is_100(server):
    assert len(get(server, TX).json()["transactions"]) == 100
    assert len(get(server, EV).json()) == 50


def test_limit_cap_serves_fewer_items_silently(server):
    server.behaviour.limit_cap = 37
    body = get(server, TX, limit=100).json()
    assert len(body["transactions"]) == 37
    assert body["count"] == 2000
    assert body["debug"]["query"]["limit"] == 100
    items, _ = page_all(server, TX, "transactions", limit=100)
    assert [t["_id"] for t in items] == list(server.dataset.ids("transactions"))


def test_omit_totals_drops_count_and_total(server):
    server.behaviour.omit_totals = True
    assert "count" not in get(server, TX).json()
    assert "total" not in get(server, EG).json()
    server.behaviour.event_envelope = "events_total"
    assert set(get(server, EV).json()) == {"events"}


def test_paging_returns_every_id_once(server):
    items, last = page_all(server, TX, "transactions", limit=300)
    ids = [t["_id"] for t in items]
    assert len(ids) == len(set(ids)) == last["count"] == server.dataset.count("transactions")
    assert ids == list(server.dataset.ids("transactions"))
    events, _ = page_all(server, EV, None, limit=7)
    assert [e["_id"] for e in events] == list(server.dataset.ids("events"))


def test_filters_event_id_type_and_project_name(server):
    event_id = server.dataset.item("events", 10)["_id"]
    body = get(server, TX, eventId=event_id, limit=1000).json()
    assert body["count"] == len(body["transactions"]) > 0
    assert {t["eventId"] for t in body["transactions"]} == {event_id}
    assert body["debug"]["query"]["eventId"] == event_id
    assert get(server, TX, eventId=event_id, type="sale").json()["count"] == body["count"]
    assert get(server, TX, type="refund").json()["count"] == 0
    assert get(server, TX, eventId="0" * 24).json()["count"] == 0
    # A transaction whose event does not exist can still be filtered by its event id.
    all_items, _ = page_all(server, TX, "transactions", limit=1000)
    event_ids = set(server.dataset.ids("events"))
    orphans = [t for t in all_items if t["eventId"] not in event_ids]
    assert 1 <= len(orphans) <= 5
    body = get(server, TX, eventId=orphans[0]["eventId"]).json()
    assert [t["_id"] for t in body["transactions"]] == [orphans[0]["_id"]]
    # Event groups by project name.
    groups = get(server, EG).json()["data"]
    name = groups[0]["project_name"]
    body = get(server, EG, project_name=name).json()
    assert body["total"] == sum(g["project_name"] == name for g in groups)
    assert {g["project_name"] for g in body["data"]} == {name}


def test_bad_paging_parameters_400_and_unknown_path_404(server):
    for params in ({"skip": "-1"}, {"limit": "ten"}, {"limit": "1.5"}):
        resp = get(server, TX, **params)
        assert resp.status_code == 400 and "error" in resp.json()
    resp = get(server, "/public/v1/api/nothing/all")
    assert resp.status_code == 404 and resp.json()["error"]


# ---- faults ----------------------------------------------------------------------------------


def _fault_then_normal(server, kind, **options):
    server.behaviour.inject(TX, kind, **options)
    conn, seen = None, {}
    try:
        conn, resp = raw_get(server, TX + "?limit=20")
        seen["status"] = resp.status
        seen["headers"] = dict(resp.getheaders())
        seen["body"] = resp.read()
    except (http.client.HTTPException, ConnectionError) as exc:
        seen["error"] = exc
    finally:
        if conn is not None:
            conn.close()
    after = get(server, TX, limit=20)
    assert after.status_code == 200 and len(after.json()["transactions"]) == 20
    assert server.behaviour.pending_faults == 0
    return seen


@pytest.mark.parametrize("status", [429, 500, 502, 503])
def test_fault_status_happens_once(server, status):
    seen = _fault_then_normal(server, "status", status=status, retry_after="1")
    assert seen["status"] == status
    assert seen["headers"]["Retry-After"] == "1"
    assert "error" in json.loads(seen["body"])


def test_fault_truncate_sends_half_a_json_body(server):
    seen = _fault_then_normal(server, "truncate")
    assert seen["status"] == 200
    assert len(seen["body"]) == int(seen["headers"]["Content-Length"]) > 0
    with pytest.raises(json.JSONDecodeError):
        json.loads(seen["body"])


def test_fault_drop_cuts_the_body_and_closes(server):
    seen = _fault_then_normal(server, "drop")
    assert isinstance(seen.get("error"), http.client.IncompleteRead)


def test_fault_close_sends_no_response(server):
    seen = _fault_then_normal(server, "close")
    assert isinstance(seen.get("error"), http.client.RemoteDisconnected | ConnectionError)


def test_fault_non_json_is_html(server):
    seen = _fault_then_normal(server, "non_json")
    assert seen["status"] == 200
    assert seen["headers"]["Content-Type"].startswith("text/html")
    assert seen["body"].startswith(b"<html")


def test_fault_not_list_is_an_error_object(server):
    seen = _fault_then_normal(server, "not_list")
    assert seen["status"] == 200 and json.loads(seen["body"]) == {"error": "something"}


def test_fault_storm_with_skip_first_and_any_path(server):
    server.behaviour.inject(TX, "status", times=5, skip_first=2, status=503)
    codes = [get(server, TX, limit=1).status_code for _ in range(8)]
    assert codes == [200, 200, 503, 503, 503, 503, 503, 200]
    server.behaviour.inject("*", "status", times=2, status=500)
    assert get(server, SELLOUT).status_code == 500
    assert get(server, EV).status_code == 500
    assert get(server, EV).status_code == 200
    statuses = [r.status for r in server.requests if r.path == TX]
    assert statuses.count(503) == 5


# ---- mutations mid-paging ----------------------------------------------------------------------


def test_mutation_insert_after_requests_grows_total_and_shifts_pages(server):
    server.behaviour.mutate("transactions", after_requests=2, insert=25, at=0)
    first = get(server, TX, skip=0, limit=100).json()
    second = get(server, TX, skip=100, limit=100).json()
    third = get(server, TX, skip=200, limit=100).json()
    assert first["count"] == second["count"] == 2000
    assert third["count"] == server.dataset.count("transactions") == 2025
    ids = [t["_id"] for t in second["transactions"]]
    shifted = [t["_id"] for t in third["transactions"]]
    assert shifted[:25] == ids[-25:]  # the shift repeats items across pages
    new_ids = list(server.dataset.ids("transactions"))[:25]
    assert not set(new_ids) & {t["_id"] for t in first["transactions"]}
    assert all(HEX24.match(i) for i in new_ids)
    item = server.dataset.item("transactions", 0)
    assert item["_id"] == new_ids[0] and item["eventId"] in set(server.dataset.ids("events"))


def test_mutation_delete_shrinks_total_and_removes_ids(server):
    before = list(server.dataset.ids("transactions"))
    server.behaviour.mutate("transactions", after_requests=1, delete=30, at=10)
    assert get(server, TX).json()["count"] == 2000
    body = get(server, TX, skip=0, limit=50).json()
    assert body["count"] == 1970
    assert [t["_id"] for t in body["transactions"]] == before[:10] + before[40:80]
    assert list(server.dataset.ids("transactions")) == before[:10] + before[40:]


def test_mutation_of_events_and_groups_applies_at_once(server):
    server.behaviour.mutate("events", insert=3, at=5)
    server.behaviour.mutate("event_groups", delete=2, at=0)
    events = get(server, EV, limit=1000).json()
    assert len(events) == 53 == server.dataset.count("events")
    assert [e["_id"] for e in events] == list(server.dataset.ids("events"))
    assert get(server, EG).json()["total"] == 3


# ---- data ------------------------------------------------------------------------------------


def test_same_seed_gives_same_bytes_and_other_seed_differs():
    def fetch(seed):
        with DemoServer(DemoConfig(transactions=300, seed=seed)) as srv:
            return [
                requests.get(
                    srv.base_url + path,
                    params={"skip": 0, "limit": 50},
                    headers={"Authorization": f"Bearer {srv.token}"},
                    timeout=10,
                ).content
                for path in (TX, EV, EG)
            ]

    first, again, other = fetch(1), fetch(1), fetch(2)
    assert first == again
    assert all(a != b for a, b in zip(first, other, strict=True))


def _paths(obj, prefix=""):
    """Dotted paths of ``obj``; list items as ``[]``, 24-hex map keys as ``{id}``."""
    out = set()
    if isinstance(obj, dict):
        for key, value in obj.items():
            name = "{id}" if HEX24.match(key) else key
            path = f"{prefix}.{name}" if prefix else name
            out.add(path)
            out |= _paths(value, path)
    elif isinstance(obj, list):
        for value in obj:
            out |= _paths(value, prefix + "[]")
    return out


def _words(text: str) -> list[str]:
    return text.split()


TRANSACTION_FIELDS = _words("""
_id price qty eventId productId proxyProductName saleTime created date invoice_status invoice_id
prev_invoice_id credits item_credit_state exportDetails.processed
_customReport.reportResults.{id}.value _customReport.reportResults.{id}.name
_customReport.reportResults.{id}.fieldId _customReport._customReportConfig
_customReport._configcreatedTime._id _customReport._customReport._configcreatedTime._id
_customReport._configcreatedTime.type _customReport._configcreatedTime.name
_customReport._configcreatedTime.transactionConfig.useQty1
""")
CONFIG_FIELD_FIELDS = _words("""
_id config._id config.name config.fieldType config.slug config.toolTipTxt config.description
config.active config.enableHintOnClick config.created config.fieldObject.options
config.fieldObject.minimum config.fieldObject.maximum config.fieldObject.step
config.fieldObject.config.forceGps config.fieldObject.config.preferMetaGpsLocationData
required pdf requiredByFieldId relatedReport layout.cols layout.rows layout.inline
visibility.conditions.productGroups visibility.conditions.products
visibility.conditions.hideForDealerRanks visibility.conditions.field.type
visibility.conditions.field.operator visibility.conditions.field.rKey
visibility.conditions.field.conditions visibility.config.multiplyForEachCondition
visibility.config.groupByConditions
""")
EVENT_FIELDS = _words("""
_id project_id._id project_id.name project_id.eventSettings.isCRMLeads
project_id.eventSettings.enableMessenger project_id.eventSettings.useTargets
project_id.viewConfig.user.visibleToClient project_id.viewConfig.location.visibleToClient
project_id.viewConfig.project.visibleToClient
point_of_sale._id point_of_sale.name point_of_sale.number point_of_sale.address.company
point_of_sale.address.city point_of_sale.address.postal point_of_sale.address.streetnumber
point_of_sale.address.additional point_of_sale.address.phone point_of_sale.address.email
point_of_sale.address.fax point_of_sale.address.website point_of_sale.locationGroups[]._id
point_of_sale.locationGroups[].name point_of_sale.location point_of_sale.genericFields
point_of_sale.googleResult.formatted_address point_of_sale.googleResult.formatted_phone_number
point_of_sale.googleResult.international_phone_number point_of_sale.googleResult.place_id
point_of_sale.googleResult.website point_of_sale.googleResult.rating
point_of_sale.googleResult.user_ratings_total point_of_sale.googleResult.geometry.location.lat
point_of_sale.googleResult.geometry.location.lng
pointOfSaleProjectStructure.area._id pointOfSaleProjectStructure.area.name
pointOfSaleProjectStructure.area.number pointOfSaleProjectStructure.area.channel
pointOfSaleProjectStructure.area.relatedUsers pointOfSaleProjectStructure.area.active
pointOfSaleProjectStructure.area.created
times[]._id times[].start times[].stop times[].duration eventState
eventStateHistory[]._id eventStateHistory[].stateNew eventStateHistory[].stateOld
eventStateHistory[].date eventStateHistory[].historyType eventStateHistory[].ip
eventStateHistory[].user eventStateTimestamps.Planned eventStateTimestamps.Published
eventUser[]._id eventUser[].firstName eventUser[].lastName eventUser[].email
eventUser[].language eventUser[].usertype agency_user[]._id agency_user[].user_id
agency_user[].paymentType agency_user[].payment.fixum.amount agency_user[].payment.fixum.per
agency_user[].payment.provision customReportResult[]._id customReportResult[]._event
customReportResult[]._project customReportResult[].created
customReportResult[].reportResults.{id}.name customReportResult[].reportResults.{id}.value
""")


def test_every_documented_field_is_present(server):
    transactions = get(server, TX, limit=400).json()["transactions"]
    events = get(server, EV, limit=50).json()
    tx_paths = set().union(*(_paths(t) for t in transactions))
    assert set(TRANSACTION_FIELDS) - tx_paths == set()
    configs = [
        t["_customReport"].get("_configcreatedTime")
        or t["_customReport"]["_customReport"]["_configcreatedTime"]
        for t in transactions
        if "_customReport" in t
    ]
    entry_paths = set().union(*(_paths(e) for c in configs for e in c["customFields"]))
    assert set(CONFIG_FIELD_FIELDS) - entry_paths == set()
    ev_paths = set().union(*(_paths(e) for e in events))
    assert set(EVENT_FIELDS) - ev_paths == set()
    stamps = {s for e in events for s in e["eventStateTimestamps"]}
    assert stamps <= {
        "Planned", "Published", "Rejected", "Accepted", "LoggedIn", "LoggedOut", "SalesReport",
        "SalesReportUploaded", "SalesReportAccepted", "Invoiced", "Paid",
    }  # fmt: skip
    for t in transactions:
        for key in ("saleTime", "created", "date"):
            assert key not in t or ISO_MS.match(t[key])
        assert HEX24.match(t["_id"]) and isinstance(t["exportDetails"]["processed"], bool)


def test_data_has_the_quirks_decoders_must_meet(server):
    transactions = get(server, TX, limit=1000).json()["transactions"]
    events = get(server, EV, limit=50).json()
    reports = [t["_customReport"] for t in transactions if "_customReport" in t]
    assert 0 < len(reports) < len(transactions)
    nested = [r for r in reports if "_customReport" in r]
    assert 0 < len(nested) < len(reports)
    quirks = set()
    for r in reports:
        config = r.get("_configcreatedTime") or r["_customReport"]["_configcreatedTime"]
        assert r["_customReportConfig"] == config["_id"]
        fields = {e["config"]["_id"]: e["config"] for e in config["customFields"]}
        assert all(e["_id"] != e["config"]["_id"] != config["_id"] for e in config["customFields"])
        for key, result in r["reportResults"].items():
            quirks.add("with fieldId" if "fieldId" in result else "without fieldId")
            assert result.get("fieldId", key) == key and key in fields
            field, value = fields[key], result["value"]
            kind = field["fieldType"]
            if kind == "Slider":
                obj = field["fieldObject"]
                quirks.add(f"step {obj['step']}")
                number = float(value)
                quirks.add("slider string" if isinstance(value, str) else "slider number")
                if not obj["minimum"] <= number <= obj["maximum"]:
                    quirks.add("out of range")
                steps = (number - obj["minimum"]) / obj["step"]
                if abs(steps - round(steps)) > 1e-6:
                    quirks.add("off step")
            elif kind == "number" and isinstance(value, str):
                float(value)
                quirks.add("numeric string")
            elif kind == "text" and isinstance(value, str) and value.isdigit():
                quirks.add("digit text" + (" leading zero" if value[0] == "0" else ""))
            elif kind == "upload":
                assert HEX24.match(value)
                quirks.add("upload")
            elif kind not in ("Slider", "number", "text", "upload"):
                quirks.add("unknown kind")
    assert {
        "with fieldId", "without fieldId", "step 0.1", "step 5", "slider string",
        "slider number", "out of range", "off step", "numeric string", "digit text leading zero",
        "upload", "unknown kind",
    } <= quirks  # fmt: skip
    for key in ("proxyProductName", "invoice_id", "prev_invoice_id", "date"):
        assert 0 < sum(key in t for t in transactions) < len(transactions)
    # Events: unordered history starting from "", shared points of sale with differing names.
    for e in events:
        history = e["eventStateHistory"]
        assert 2 <= len(history) <= 5
        assert [h["date"] for h in history] != sorted(h["date"] for h in history)
        assert min(history, key=lambda h: h["date"])["stateOld"] == ""
        assert e["eventState"] == max(history, key=lambda h: h["date"])["stateNew"]
        assert 1 <= len(e["times"]) <= 3
        lng, lat = e["point_of_sale"]["location"]
        assert 5 < lng < 17 and 47 < lat < 55
    names: dict[str, set[str]] = {}
    for e in events:
        names.setdefault(e["point_of_sale"]["_id"], set()).add(e["point_of_sale"]["name"])
    assert len(names) <= 13 and any(len(n) > 1 for n in names.values())
    assert any(None in e["point_of_sale"]["genericFields"].values() for e in events)
    field_ids = {
        e["config"]["_id"]
        for r in reports
        for e in (r.get("_configcreatedTime") or r["_customReport"]["_configcreatedTime"])[
            "customFields"
        ]
    }
    keys = {
        k
        for e in events
        for c in e.get("customReportResult", [])
        for k, v in c["reportResults"].items()
        if "fieldId" not in v
    }
    assert keys & field_ids and keys - field_ids  # mostly known fields, some unknown


def test_million_transactions_start_fast_and_serve_a_deep_page():
    config = DemoConfig(transactions=1_000_000, seed=5)
    with DemoServer(config) as srv:
        assert srv.dataset.count("transactions") == 1_000_000
        assert srv.dataset.count("events") == 25_000
        body = get(srv, TX, skip=998_500, limit=1000).json()
        assert body["count"] == 1_000_000 and len(body["transactions"]) == 1000
        expected = [
            srv.dataset.item_id("transactions", src, idx)
            for src, idx in srv.dataset.keys("transactions", 998_500, 1000)
        ]
        assert [t["_id"] for t in body["transactions"]] == expected
        event_id = body["transactions"][-1]["eventId"]
        by_event = get(srv, TX, eventId=event_id, limit=100).json()
        assert 30 <= by_event["count"] <= 41
        assert {t["eventId"] for t in by_event["transactions"]} == {event_id}
        assert len(get(srv, EV, skip=24_990).json()) == 10


def test_api_docs_is_openapi_listing_the_paths(server):
    resp = requests.get(server.base_url + "/api-docs", timeout=10)
    assert resp.status_code == 200
    doc = resp.json()
    assert doc["openapi"].startswith("3.")
    assert {TX, EV, EG, TOKEN, SELLOUT} <= set(doc["paths"])
    assert doc["components"]["securitySchemes"]["bearerAuth"]["scheme"] == "bearer"


def test_requests_are_logged(server):
    get(server, TX, skip=3, limit=2)
    requests.get(server.base_url + TX, timeout=10)
    last, before = server.requests[-1], server.requests[-2]
    assert (before.method, before.path, before.query, before.status) == (
        "GET",
        TX,
        {"skip": "3", "limit": "2"},
        200,
    )
    assert last.status == 401


# ---- lifecycle and CLI ---------------------------------------------------------------------


def test_start_stop_repeatedly_leaves_no_threads_even_with_open_connections():
    baseline = threading.active_count()
    srv = DemoServer(DemoConfig(transactions=100))
    for _ in range(3):
        srv.start()
        session = requests.Session()  # keep-alive connection left open across stop()
        resp = session.get(srv.base_url + SELLOUT, headers={"Authorization": f"Bearer {srv.token}"})
        assert resp.status_code == 200
        started = time.monotonic()
        srv.stop()
        assert time.monotonic() - started < 2
        session.close()
    deadline = time.monotonic() + 2
    while threading.active_count() > baseline and time.monotonic() < deadline:
        time.sleep(0.02)
    assert threading.active_count() <= baseline
    assert all(t.daemon for t in threading.enumerate() if t.name.startswith("demo-api"))


def test_cli_refuses_remote_host_without_allow_remote():
    from fieldsales_dagster.demo_api.__main__ import main

    assert main(["--host", "0.0.0.0", "--port", "0"]) == 2


def test_cli_prints_json_line_and_exits_on_sigterm():
    proc = subprocess.Popen(
        [sys.executable, "-m", "fieldsales_dagster.demo_api", "--port", "0"]
        + ["--transactions", "100", "--token", "demo-token", "--limit-cap", "10"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        ready = json.loads(proc.stdout.readline())
        assert ready["token"] == "demo-token"
        assert ready["base_url"].startswith("http://127.0.0.1:")
        resp = requests.get(
            ready["base_url"] + TX,
            headers={"Authorization": "Bearer demo-token"},
            timeout=10,
        )
        assert len(resp.json()["transactions"]) == 10
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        assert proc.stdout.read() == ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _event_weight(server: DemoServer) -> dict[str, float]:
    """Mean event and transaction bytes, status changes, reports, results, events per store."""
    headers = {"Authorization": f"Bearer {server.token}"}
    events = requests.get(f"{server.base_url}{EV}?limit=400", headers=headers, timeout=30)
    tx = requests.get(f"{server.base_url}{TX}?limit=200", headers=headers, timeout=30)
    items = json.loads(events.content)
    stores = {e["point_of_sale"]["_id"] for e in items}
    reports = [r for e in items for r in e.get("customReportResult", [])]
    return {
        "event_bytes": len(events.content) / len(items),
        "tx_results": sum(
            len(t.get("_customReport", {}).get("reportResults", {}))
            for t in tx.json()["transactions"]
        ),
        "history": min(len(e["eventStateHistory"]) for e in items),
        "reports": min(len(e.get("customReportResult", [])) for e in items),
        "results_per_report": sum(len(r["reportResults"]) for r in reports) / len(reports),
        "events_per_store": len(items) / len(stores),
        "pos_bytes": sum(len(json.dumps(e["point_of_sale"])) for e in items) / len(items),
    }


def test_heavy_profile_serves_events_about_four_times_the_demos_weight():
    from fieldsales_dagster.demo_api.data import PROFILES

    config = {"transactions": 16000, "events": 400, "seed": 0}
    with DemoServer(DemoConfig(**config)) as demo:
        light = _event_weight(demo)
    with DemoServer(DemoConfig(**config, shape=PROFILES["heavy"])) as heavy_server:
        heavy = _event_weight(heavy_server)

    assert 3.5 <= heavy["event_bytes"] / light["event_bytes"] <= 4.5
    assert heavy["history"] >= 20 > light["history"]
    assert heavy["reports"] == 4 and light["reports"] == 0
    assert heavy["results_per_report"] > 1.8 * light["results_per_report"]
    assert heavy["tx_results"] > 1.8 * light["tx_results"]
    assert heavy["events_per_store"] > 4 * light["events_per_store"]
    assert heavy["pos_bytes"] > 4 * light["pos_bytes"]


def test_cli_shape_knobs_override_the_profile_and_are_checked(capsys):
    from fieldsales_dagster.demo_api.__main__ import _parser, _shape, main

    shape = _shape(_parser().parse_args(["--profile", "heavy", "--event-reports", "2"]))
    assert (shape.event_reports, shape.status_history) == (2, 20)
    assert main(["--port", "0", "--report-fields", "9"]) == 1
    assert "report_fields must be 1..8, got 9" in capsys.readouterr().err


#: The shapes that change one knob of the demo: what each must show against the demo's weight.
ONE_KNOB_SHAPES = {
    "many-events": lambda s, d: s["events"] == 10 * d["events"],
    "few-events": lambda s, d: s["events"] * 10 == d["events"],
    "long-history": lambda s, d: s["history"] >= 100 > d["history"],
    "deep-reports": lambda s, d: (
        s["tx_results"] > 7 * d["tx_results"]
        and s["results_per_report"] > 6 * d["results_per_report"]
    ),
    "wide-events": lambda s, d: s["pos_bytes"] > 10 * d["pos_bytes"],
}


@pytest.mark.parametrize("name", sorted(ONE_KNOB_SHAPES))
def test_each_shape_changes_its_one_knob_of_the_demo(name):
    from fieldsales_dagster.demo_api.data import PROFILES

    weights = {}
    for profile in ("demo", name):
        with DemoServer(DemoConfig(transactions=4000, shape=PROFILES[profile])) as srv:
            weights[profile] = {**_event_weight(srv), "events": srv.dataset.count("events")}
    assert ONE_KNOB_SHAPES[name](weights[name], weights["demo"]), weights


@pytest.mark.parametrize("name", sorted(ONE_KNOB_SHAPES))
def test_each_shape_loads_exactly(name, tmp_path):
    """Every raw list row for row, every event's status changes and every custom-report value."""
    import dagster as dg

    from fieldsales_dagster.demo_api.data import PROFILES
    from fieldsales_dagster_tests.conftest import lake_at, make_api, read_lake
    from fieldsales_dagster_tests.project import core_assets, mart_assets, raw_assets

    database = tmp_path / "shape.duckdb"
    with DemoServer(DemoConfig(transactions=2000, seed=5, shape=PROFILES[name])) as srv:
        api = make_api(srv, tmp_path, page_size=500)
        assets = [*raw_assets(), *core_assets(), *mart_assets()]
        resources = {"fieldsales_api": api, "warehouse": lake_at(database)}
        assert dg.materialize(assets, resources=resources).success
        data = srv.dataset
        lists = {n: [data.item(n, i) for i in range(data.count(n))] for n in data.views}
    events = lists["events"]
    reports = [r for item in lists["transactions"] for r in [item.get("_customReport", {})]]
    reports += [r for e in events for r in e.get("customReportResult", [])]
    want = {
        **{f"raw.{n}": (len(items), len(items)) for n, items in lists.items()},
        "core.events": (len(events), len(events)),
        "core.event_status_history": (sum(len(e["eventStateHistory"]) for e in events),) * 2,
        "core.custom_report_results": (sum(len(r.get("reportResults", {})) for r in reports),) * 2,
    }
    key = {  # each table's key, as the YAML beside its query names it
        "core.events": "event_id",
        "core.event_status_history": "event_id, seq",
        "core.custom_report_results": "source, report_id, field_id",
    }
    with read_lake(database) as conn:
        got = {
            table: conn.execute(
                f"SELECT count(*), count(DISTINCT concat_ws('/', {key.get(table, 'id')})) "
                f"FROM {table}"
            ).fetchone()
            for table in want
        }
    assert got == want
