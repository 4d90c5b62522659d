"""The HTTP layer against hostile or broken servers (issue 9), each one real on 127.0.0.1.

What each test holds: the token never leaks, the URL is the one connected to, a body is bounded
in size and time, redirects stay on the origin, and every failure says what the server did.
"""

from __future__ import annotations

import gzip
import json
import re
import types

import dagster as dg
import pydantic
import pytest

from fieldsales_dagster.client.endpoints import CHECK_TOKEN_PATH, EVENTS
from fieldsales_dagster.client.errors import (
    FieldSalesAPIError,
    NotJSONError,
    RedirectRefusedError,
    ResponseTooLargeError,
    UnreachableError,
)
from fieldsales_dagster.token.secret import TokenFormatError, clean_token, mask_secrets
from fieldsales_dagster.token.store import FileTokenStore, TokenStoreError
from fieldsales_dagster.urls import InsecureURLError, validate_base_url
from fieldsales_dagster_tests.conftest import make_api, read_lake
from fieldsales_dagster_tests.hostile import Conn, HostileServer, closed_port
from fieldsales_dagster_tests.project import materialize, raw_assets

EV = EVENTS.path
TOKEN = "hostile-test-token-" + "k" * 24


def hostile_api(server: HostileServer, tmp_path, **overrides):
    return make_api(
        types.SimpleNamespace(base_url=server.base_url, token=TOKEN), tmp_path, **overrides
    )


def events_handler(events: list[bytes], *, gzipped: bool = False):
    """Serves ``events`` (JSON texts) as a bare list paged by skip/limit; anything else: 200 []."""

    def handler(conn: Conn) -> None:
        while (request := conn.read_request()) is not None:
            skip = int(request.query.get("skip", 0))
            limit = int(request.query.get("limit", 100))
            body = b"[" + b",".join(events[skip : skip + limit]) + b"]"
            headers: tuple[tuple[str, str], ...] = ()
            if gzipped:
                body, headers = gzip.compress(body), (("Content-Encoding", "gzip"),)
            conn.respond(200, body, headers)

    return handler


def materialize_events(api, warehouse, instance=None):
    return materialize(
        raw_assets(),
        selection=["raw_events"],
        resources={"fieldsales_api": api, "warehouse": warehouse},
        instance=instance,
        raise_on_error=False,
    )


def run_text(result, instance) -> str:
    """Everything a person can see of a run: its events, its event log, its failure."""
    parts = [str(event) for event in result.all_events]
    parts += [str(entry) for entry in instance.all_logs(result.run_id)]
    parts.append(str(result.dagster_run.run_config))
    return "\n".join(parts)


def failure_message(result, node: str = "raw_events") -> str:
    return result.failure_data_for_node(node).error.to_string()


# --- 1. the token: cleaned where it enters, refused (unprinted) when a header cannot carry it ---


@pytest.mark.parametrize("raw", [f"{TOKEN}\n", f"{TOKEN}\r\n", f"  {TOKEN} ", f"\t{TOKEN}\r"])
def test_surrounding_whitespace_is_stripped_from_a_token(raw):
    assert clean_token(raw, "FIELDSALES_API_TOKEN") == TOKEN


@pytest.mark.parametrize(
    "inner",
    ["\x07", "\r\n", "\u201c", "\u0085", " "],
    ids=["bell", "crlf", "quote", "nel", "space"],
)
def test_token_with_a_character_no_header_carries_is_refused_without_printing_it(inner):
    raw = TOKEN[:10] + inner + TOKEN[10:]
    with pytest.raises(TokenFormatError) as raised:
        clean_token(raw, "FIELDSALES_API_TOKEN")
    message = str(raised.value)
    assert "FIELDSALES_API_TOKEN" in message and "position 11" in message
    assert TOKEN[:10] not in message and TOKEN[10:] not in message


@pytest.mark.parametrize("ending", ["\r\n", "\n"], ids=["crlf", "lf"])
def test_token_ending_in_a_line_break_still_materializes(demo_server, tmp_path, warehouse, ending):
    """CRLF env files and mounted secret files: requests used to refuse the header, quoting it."""
    api = make_api(demo_server, tmp_path, api_token=demo_server.token + ending)
    result = materialize_events(api, warehouse)
    assert result.success
    with read_lake(warehouse) as conn:
        rows = conn.execute("SELECT count(*) FROM raw.events").fetchone()[0]
    assert rows == demo_server.dataset.count("events")


@pytest.mark.parametrize("inner", ["\x07", "\u201c"], ids=["control", "curly_quote"])
def test_token_with_inner_control_character_fails_the_run_without_leaking(
    demo_server, tmp_path, warehouse, capfd, inner
):
    token = demo_server.token
    api = make_api(demo_server, tmp_path, api_token=token[:10] + inner + token[10:])
    instance = dg.DagsterInstance.ephemeral()
    result = materialize_events(api, warehouse, instance)
    assert not result.success
    message = failure_message(result)
    assert "FIELDSALES_API_TOKEN" in message
    captured = capfd.readouterr()
    for text in (message, run_text(result, instance), captured.out, captured.err):
        assert token not in text and token[10:] not in text
    assert demo_server.requests == []


def test_token_store_holding_a_line_break_is_read_without_it(tmp_path):
    store = FileTokenStore(tmp_path / "store.json")
    store.current(TOKEN)
    doc = json.loads(store.path.read_text())
    doc["token"] = TOKEN + "\r\n"
    store.path.write_text(json.dumps(doc))
    assert store.read().token == TOKEN


def test_token_store_holding_a_control_character_names_the_file_not_the_token(tmp_path):
    store = FileTokenStore(tmp_path / "store.json")
    store.current(TOKEN)
    doc = json.loads(store.path.read_text())
    doc["token"] = TOKEN[:10] + "\x00" + TOKEN[10:]
    store.path.write_text(json.dumps(doc))
    with pytest.raises(TokenStoreError) as raised:
        store.read()
    assert str(store.path) in str(raised.value)
    assert TOKEN[10:] not in str(raised.value)


def test_errors_requests_raises_while_sending_are_scrubbed_and_unchained(demo_server, api):
    """Defence in depth: a token that slipped past cleaning makes requests raise InvalidHeader
    quoting it; what reaches the caller names the endpoint, holds no token and chains nothing."""
    bad = demo_server.token + "\nX-Injected: 1"
    with pytest.raises(FieldSalesAPIError) as raised:
        api._get_once(CHECK_TOKEN_PATH, None, bad, 5.0)
    error = raised.value
    assert CHECK_TOKEN_PATH in str(error) and demo_server.token not in str(error)
    assert error.__cause__ is None and error.__context__ is None


# --- 2. the base URL: parsed by the parser that connects -------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "http://evil.example:8080\\@127.0.0.1",
        "http://evil.example:8080\\@127.0.0.1/",
        "http://evil.example\\.127.0.0.1",
        "http://user:secret-pw@127.0.0.1:1",
        "https://user@example.com",
        "http://127.0.0.1%2f@evil.example",
        "http://127.0.0.1:1 /x",
        "http://127.0.0.1\t:1",
        "http://127.0.0.1:1/\x00",
        "http://127.0.0.1:1/api?x=1",
        "http://127.0.0.1:1/#frag",
        "https://\uff45xample.com",
        "http:///public",
        "https://",
        "ftp://example.com",
        "127.0.0.1:8080",
        "//127.0.0.1:8080",
        "http://127.0.0.1:99999",
    ],
)
def test_ambiguous_base_urls_are_refused(url):
    with pytest.raises(ValueError) as raised:
        validate_base_url(url)
    assert "secret-pw" not in str(raised.value)


def test_backslash_url_sends_nothing_to_the_host_urllib3_would_pick(tmp_path):
    """urlsplit saw 127.0.0.1 here and let plain http pass; urllib3 connects to the other host."""
    with HostileServer(events_handler([])) as decoy:
        url = f"http://localhost:{decoy.port}\\@127.0.0.1"
        # Refused when the resource is built (its api: model checks the URL), before any request.
        with pytest.raises(pydantic.ValidationError, match="FIELDSALES_BASE_URL") as refused:
            make_api(types.SimpleNamespace(base_url=url, token=TOKEN), tmp_path)
        assert TOKEN not in str(refused.value)
        assert decoy.connections == 0


def test_plain_http_to_a_remote_host_is_refused_whatever_the_spelling():
    with pytest.raises(InsecureURLError, match="example.com"):
        validate_base_url("HTTP://Example.COM:80/")


def test_base_url_is_rebuilt_from_urllib3_parts():
    assert (
        validate_base_url(" HTTPS://Example.com:8443/base/ \n") == "https://example.com:8443/base"
    )


# --- 3. error bodies: mask first, then cut ----------------------------------------------------


def test_error_body_echoing_a_token_across_the_cut_leaks_no_fragment(tmp_path):
    token = "T0k" + "".join(chr(ord("a") + i % 26) for i in range(294))  # 297 characters
    body = (b"x" * 14 + b"Bearer " + token.encode() + b" was refused").ljust(600, b"y")

    def handler(conn: Conn) -> None:
        while conn.read_request() is not None:
            conn.respond(400, body, content_type="text/plain")

    with HostileServer(handler) as server:
        api = hostile_api(server, tmp_path, api_token=token)
        with pytest.raises(FieldSalesAPIError) as raised:
            api.check_token()
    message = str(raised.value)
    assert "HTTP 400" in message
    assert not any(token[i : i + 8] in message for i in range(len(token) - 7))


def test_a_prefix_of_the_token_cut_by_the_server_is_masked():
    token = "abcdefghijklmnopqrstuvwxyz0123456789"
    text = f"header was 'Bearer {token[:17]}...' (truncated), caller {token[-9:]}"
    masked = mask_secrets(text, [token], limit=200)
    assert token[:8] not in masked and token[-8:] not in masked
    assert "truncated" in masked


# --- 4. bodies that are not (clean) JSON ------------------------------------------------------


def test_html_login_page_fails_at_once_with_a_scrubbed_snippet(tmp_path):
    page = f"<html><body>Login required for {TOKEN}</body></html>".encode()

    def handler(conn: Conn) -> None:
        while conn.read_request() is not None:
            conn.respond(200, page, content_type="text/html")

    with HostileServer(handler) as server:
        api = hostile_api(server, tmp_path)
        with pytest.raises(NotJSONError) as raised:
            api.fetch_page(EVENTS, 0)
        assert len(server.requests) == 1
    message = str(raised.value)
    assert EV in message and "text/html" in message and "Login required" in message
    assert TOKEN not in message


def test_lone_surrogate_is_stored_as_replacement_character_and_counted(tmp_path, warehouse):
    events = [
        b'{"_id": "e1", "name": "cut mid-emoji \\ud83d"}',
        b'{"_id": "e2", "name": "whole \\ud83d\\ude00"}',
        b'{"_id": "e3", "name": "\\ude00 low alone, escaped \\\\ud83d stays"}',
    ]
    with HostileServer(events_handler(events)) as server:
        result = materialize_events(hostile_api(server, tmp_path), warehouse)
    assert result.success
    (materialization,) = result.asset_materializations_for_node("raw_events")
    assert materialization.metadata["surrogates_replaced"].value == 2
    with read_lake(warehouse) as conn:
        names = dict(conn.execute("SELECT id, payload->>'name' FROM raw.events").fetchall())
    assert names == {
        "e1": "cut mid-emoji \ufffd",
        "e2": "whole \U0001f600",
        "e3": "\ufffd low alone, escaped \\ud83d stays",
    }


def test_deeply_nested_json_fails_in_our_words(tmp_path):
    def handler(conn: Conn) -> None:
        while conn.read_request() is not None:
            conn.respond(200, b"[" * 5000 + b"]" * 5000)

    with HostileServer(handler) as server:
        api = hostile_api(server, tmp_path)
        with pytest.raises(NotJSONError, match="nested deeper") as raised:
            api.fetch_page(EVENTS, 0)
        assert len(server.requests) == 1
    assert EV in str(raised.value)


# --- 5. compressed bodies: decompressed as they stream, capped ---------------------------------


def test_gzip_pages_are_decompressed_and_loaded(tmp_path, warehouse):
    events = [json.dumps({"_id": f"e{i}", "pad": "x" * 500}).encode() for i in range(250)]
    with HostileServer(events_handler(events, gzipped=True)) as server:
        result = materialize_events(hostile_api(server, tmp_path), warehouse)
    assert result.success
    with read_lake(warehouse) as conn:
        assert conn.execute("SELECT count(*) FROM raw.events").fetchone()[0] == 250


def test_gzip_bomb_fails_naming_the_endpoint_and_the_cap(tmp_path):
    bomb = gzip.compress(b"[" + b" " * (8 * 1024 * 1024) + b"]")  # ~8 KB expanding to 8 MB

    def handler(conn: Conn) -> None:
        while conn.read_request() is not None:
            conn.respond(200, bomb, (("Content-Encoding", "gzip"),))

    with HostileServer(handler) as server:
        api = hostile_api(server, tmp_path, max_page_bytes=1024 * 1024)
        with pytest.raises(ResponseTooLargeError) as raised:
            api.fetch_page(EVENTS, 0)
        assert len(server.requests) == 1
    message = str(raised.value)
    assert EV in message and "max_page_bytes=1048576" in message


# --- 6. time: a deadline per request, a budget per request with its retries --------------------


def test_body_dripping_a_byte_at_a_time_hits_the_request_deadline(tmp_path):
    def handler(conn: Conn) -> None:
        while conn.read_request() is not None:
            conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
            conn.drip(b"[" + b" " * 998 + b"]", every_s=0.2)

    with HostileServer(handler) as server:
        api = hostile_api(
            server, tmp_path, request_deadline_s=1.0, retry_budget_s=2.5, max_retries=20
        )
        with pytest.raises(FieldSalesAPIError) as raised:
            api.fetch_page(EVENTS, 0)
    message = str(raised.value)
    assert "request_deadline_s=1" in message and f"127.0.0.1:{server.port}" in message
    assert EV in message


def test_body_without_a_length_dripping_is_abandoned_at_the_request_deadline(tmp_path):
    """A body without Content-Length ends when the server closes, so http.client takes the
    socket away from the connection (shutting the connection's socket down would miss it);
    gzip-encoded, urllib3 decodes while reading, and a file name that never ends decodes to
    nothing. The client must still hang up at the deadline, not wait for the server to finish."""
    body = b"\x1f\x8b\x08\x08" + b"\x00" * 6 + b"n" * 50
    hung_up_at: list[int] = []

    def handler(conn: Conn) -> None:
        while conn.read_request() is not None:
            conn.send(b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\n\r\n")
            for i in range(len(body)):
                if not conn.send(body[i : i + 1]):
                    hung_up_at.append(i)
                    return
                if conn.server.stopping.wait(0.05):
                    return

    with HostileServer(handler) as server:
        api = hostile_api(server, tmp_path, request_deadline_s=1.0, retry_budget_s=1.5)
        with pytest.raises(FieldSalesAPIError) as raised:
            api.fetch_page(EVENTS, 0)
    message = str(raised.value)
    assert "request_deadline_s=1" in message and EV in message
    assert hung_up_at, "the client waited for the whole body instead of hanging up at its deadline"


def test_deadline_of_a_finished_request_does_not_cut_the_next_on_its_connection(tmp_path):
    def handler(conn: Conn) -> None:
        while (request := conn.read_request()) is not None:
            if request.query.get("skip") != "0":
                conn.server.stopping.wait(0.8)  # answers across the first request's deadline
            conn.respond(200, b'[{"_id": "a"}]')

    with HostileServer(handler) as server:
        api = hostile_api(server, tmp_path, request_deadline_s=1.0, max_retries=0)
        assert api.fetch_page(EVENTS, 0).n == 1
        server.stopping.wait(0.5)
        assert api.fetch_page(EVENTS, 1).n == 1  # from 0.5 s to 1.3 s: one connection
    assert len(server.requests) == 2


def test_headers_dripped_a_byte_at_a_time_hit_the_request_deadline(tmp_path):
    def handler(conn: Conn) -> None:
        while conn.read_request() is not None:
            conn.drip(b"HTTP/1.1 200 OK\r\n" + b"X-Slow: " + b"s" * 500 + b"\r\n\r\n", 0.2)

    with HostileServer(handler) as server:
        api = hostile_api(server, tmp_path, request_deadline_s=1.0, retry_budget_s=1.5)
        with pytest.raises(FieldSalesAPIError, match="request_deadline_s=1"):
            api.fetch_page(EVENTS, 0)


def test_silent_server_fails_within_the_retry_budget_naming_host_and_endpoint(tmp_path):
    def handler(conn: Conn) -> None:
        while conn.read_request() is not None:
            conn.server.stopping.wait()

    with HostileServer(handler) as server:
        api = hostile_api(
            server,
            tmp_path,
            read_timeout_s=120.0,
            request_deadline_s=0.5,
            retry_budget_s=2.0,
            max_retries=100,
        )
        with pytest.raises(FieldSalesAPIError) as raised:
            api.fetch_page(EVENTS, 0)
        attempts = len(server.requests)
    message = str(raised.value)
    assert f"127.0.0.1:{server.port}" in message and EV in message
    assert "retry_budget_s=2" in message
    assert 1 < attempts < 100


# --- 7. proxies and redirects ------------------------------------------------------------------


def test_loopback_requests_never_go_through_the_proxy_environment(demo_server, api, monkeypatch):
    with HostileServer(lambda conn: None) as proxy:
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
            monkeypatch.setenv(name, proxy.base_url)
            monkeypatch.setenv(name.lower(), proxy.base_url)
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        api.check_token()
        assert proxy.connections == 0


def redirecting_handler(location_for):
    def handler(conn: Conn) -> None:
        while (request := conn.read_request()) is not None:
            location = location_for(request)
            if location is None:
                conn.respond(200, b"[]")
            else:
                conn.respond(302, headers=(("Location", location),))

    return handler


def test_redirect_to_another_origin_is_refused_and_never_followed(demo_server, tmp_path):
    elsewhere = demo_server.base_url + EV
    with HostileServer(redirecting_handler(lambda request: elsewhere)) as server:
        api = hostile_api(server, tmp_path)
        with pytest.raises(RedirectRefusedError) as raised:
            api.fetch_page(EVENTS, 0)
    assert demo_server.base_url in str(raised.value) and EV in str(raised.value)
    assert demo_server.requests == []


def test_redirect_loop_is_reported_as_one(tmp_path):
    def location_for(request):
        return "/loop-b" if request.path != "/loop-b" else EV

    with HostileServer(redirecting_handler(location_for)) as server:
        api = hostile_api(server, tmp_path)
        with pytest.raises(RedirectRefusedError, match="redirects in a loop"):
            api.fetch_page(EVENTS, 0)


def test_redirect_within_the_origin_is_followed(tmp_path):
    def location_for(request):
        return f"/v2{request.path}?skip=0" if not request.path.startswith("/v2") else None

    with HostileServer(redirecting_handler(location_for)) as server:
        api = hostile_api(server, tmp_path)
        page = api.fetch_page(EVENTS, 0)
        assert server.paths() == [EV, "/v2" + EV]
        assert server.requests[1].headers["authorization"] == f"Bearer {TOKEN}"
    assert page.n == 0


# --- 8. Retry-After: 0 ------------------------------------------------------------------------


def test_retry_after_zero_keeps_a_minimum_backoff(tmp_path):
    def handler(conn: Conn) -> None:
        while conn.read_request() is not None:
            if len(conn.server.requests) <= 3:
                conn.respond(429, headers=(("Retry-After", "0"),))
            else:
                conn.respond(200, b"{}")

    with HostileServer(handler) as server:
        api = hostile_api(server, tmp_path, backoff_initial_s=0.1, backoff_max_s=1.0)
        api.check_token()
        times = [request.at for request in server.requests]
    assert len(times) == 4
    assert times[-1] - times[0] >= 3 * 0.1


# --- 9. an unreachable instance (issue 12) ----------------------------------------------------


def test_unreachable_instance_fails_naming_host_and_logs_each_retry(tmp_path, warehouse):
    port = closed_port()
    api = make_api(
        types.SimpleNamespace(base_url=f"http://127.0.0.1:{port}", token=TOKEN), tmp_path
    )
    instance = dg.DagsterInstance.ephemeral()
    result = materialize_events(api, warehouse, instance)
    assert not result.success
    message = failure_message(result)
    assert f"127.0.0.1:{port}" in message and UnreachableError.__name__ in message
    warnings = [
        entry.user_message
        for entry in instance.all_logs(result.run_id)
        if entry.level >= 30 and " failed, next in " in entry.user_message
    ]
    assert len(warnings) == api.max_retries
    assert all(f"127.0.0.1:{port}" in warning for warning in warnings)


@pytest.mark.parametrize(
    "overrides",
    [
        {"max_retries": 3},  # every retry used
        # The budget cuts the series short of max_retries (was: "retry 3 of 6", then "gave up
        # after 4 attempts").
        {
            "max_retries": 6,
            "unreachable_budget_s": 0.5,
            "backoff_initial_s": 0.1,
            "backoff_max_s": 0.2,
        },
    ],
)
def test_retry_warnings_and_the_final_error_count_attempts_alike(tmp_path, warehouse, overrides):
    port = closed_port()
    api = make_api(
        types.SimpleNamespace(base_url=f"http://127.0.0.1:{port}", token=TOKEN),
        tmp_path,
        **overrides,
    )
    instance = dg.DagsterInstance.ephemeral()
    result = materialize_events(api, warehouse, instance)
    assert not result.success
    most = overrides["max_retries"] + 1
    warned = [
        re.search(r"attempt (\d+) of at most (\d+) failed, next in", entry.user_message)
        for entry in instance.all_logs(result.run_id)
        if entry.level >= 30 and f"127.0.0.1:{port}" in entry.user_message
    ]
    assert warned and all(warned), "every warning counts attempts"
    counted = [int(match.group(1)) for match in warned]
    assert counted == list(range(1, len(counted) + 1))
    assert {int(match.group(2)) for match in warned} == {most}
    final = re.search(r"gave up after attempt (\d+) of at most (\d+)", failure_message(result))
    assert final, failure_message(result)
    assert (int(final.group(1)), int(final.group(2))) == (counted[-1] + 1, most)
    assert "retry" not in failure_message(result).split("gave up")[1].split(".")[0]
