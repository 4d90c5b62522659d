"""The token store on its own: seeding, atomic owner-only writes, rotation, errors."""

from __future__ import annotations

import json
import os
import socket
import stat
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from fieldsales_dagster.token.store import (
    FileTokenStore,
    TokenStore,
    TokenStoreError,
    fingerprint,
)

ENV_TOKEN = "env-token-0123456789abcdef"
RENEW_AFTER = timedelta(days=45)


@pytest.fixture
def store(tmp_path: Path) -> TokenStore:
    return FileTokenStore(tmp_path / "state" / "fieldsales_token.json")


def backdate(store: TokenStore, days: float) -> None:
    """Pretend the stored token was issued ``days`` ago (rewrites the file in place)."""
    doc = json.loads(store.path.read_text())
    doc["issued_at"] = (datetime.now(UTC) - timedelta(days=days)).isoformat()
    store.path.write_text(json.dumps(doc))


def renewer(*tokens: str):
    """A renewal callback handing out ``tokens`` in order and recording the old tokens it got."""
    calls: list[str] = []
    supply = iter(tokens)

    def renew(old_token: str) -> str:
        calls.append(old_token)
        return next(supply)

    renew.calls = calls  # type: ignore[attr-defined]
    return renew


def test_first_use_seeds_the_store_from_the_env_token(store: TokenStore):
    assert store.current(ENV_TOKEN).token == ENV_TOKEN
    doc = json.loads(store.path.read_text())
    assert doc["token"] == ENV_TOKEN
    assert doc["env_token_sha256"] == fingerprint(ENV_TOKEN)
    issued = datetime.fromisoformat(doc["issued_at"])
    assert issued.tzinfo is not None
    assert abs(datetime.now(UTC) - issued) < timedelta(minutes=1)


def test_store_wins_over_the_env_token_after_renewal(store: TokenStore):
    store.current(ENV_TOKEN)
    backdate(store, 46)
    store.rotate(ENV_TOKEN, renewer("renewed-token-1"), renew_after=RENEW_AFTER)
    assert store.current(ENV_TOKEN).token == "renewed-token-1"


def test_renewed_store_keeps_only_a_fingerprint_of_the_env_token(store: TokenStore):
    store.current(ENV_TOKEN)
    backdate(store, 46)
    store.rotate(ENV_TOKEN, renewer("renewed-token-1"), renew_after=RENEW_AFTER)
    text = store.path.read_text()
    assert ENV_TOKEN not in text
    assert fingerprint(ENV_TOKEN) in text


def test_store_file_is_owner_only_whatever_the_umask(store: TokenStore):
    old_umask = os.umask(0)
    try:
        store.current(ENV_TOKEN)
        backdate(store, 46)
        store.rotate(ENV_TOKEN, renewer("renewed-token-1"), renew_after=RENEW_AFTER)
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600


def test_write_leaves_no_temporary_file_behind(store: TokenStore):
    store.current(ENV_TOKEN)
    backdate(store, 46)
    store.rotate(ENV_TOKEN, renewer("renewed-token-1"), renew_after=RENEW_AFTER)
    leftovers = [p.name for p in store.path.parent.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []


def test_rotation_not_yet_due_does_not_call_the_renewal(store: TokenStore):
    store.current(ENV_TOKEN)
    renew = renewer("renewed-token-1")
    rotation = store.rotate(ENV_TOKEN, renew, renew_after=RENEW_AFTER)
    assert not rotation.renewed
    assert renew.calls == []
    assert store.current(ENV_TOKEN).token == ENV_TOKEN


def test_rotation_when_due_renews_with_the_stored_token_and_resets_the_age(store: TokenStore):
    store.current(ENV_TOKEN)
    backdate(store, 46)
    renew = renewer("renewed-token-1")
    rotation = store.rotate(ENV_TOKEN, renew, renew_after=RENEW_AFTER)
    assert rotation.renewed
    assert renew.calls == [ENV_TOKEN]
    stored = store.read()
    assert stored is not None and stored.token == "renewed-token-1"
    assert stored.source == "renewal"
    assert stored.age() < timedelta(minutes=1)


def test_failed_renewal_leaves_the_store_unchanged(store: TokenStore):
    store.current(ENV_TOKEN)
    backdate(store, 46)
    before = store.path.read_bytes()

    def refused(old_token: str) -> str:
        raise RuntimeError("server said no")

    with pytest.raises(RuntimeError, match="server said no"):
        store.rotate(ENV_TOKEN, refused, renew_after=RENEW_AFTER)
    assert store.path.read_bytes() == before


def test_new_token_is_on_disk_even_if_the_caller_fails_right_after_rotation(store: TokenStore):
    store.current(ENV_TOKEN)
    backdate(store, 46)
    with pytest.raises(RuntimeError, match="crash"):
        store.rotate(ENV_TOKEN, renewer("renewed-token-1"), renew_after=RENEW_AFTER)
        raise RuntimeError("crash right after the store write")
    assert FileTokenStore(store.path).current(ENV_TOKEN).token == "renewed-token-1"


def test_concurrent_rotations_in_threads_renew_exactly_once(store: TokenStore):
    store.current(ENV_TOKEN)
    backdate(store, 46)
    calls: list[str] = []
    start = threading.Barrier(8)

    def slow_renew(old_token: str) -> str:
        calls.append(old_token)
        time.sleep(0.2)  # a slow server: every other thread is waiting on the lock meanwhile
        return f"renewed-{len(calls)}"

    def rotate() -> None:
        start.wait()
        FileTokenStore(store.path).rotate(ENV_TOKEN, slow_renew, renew_after=RENEW_AFTER)

    threads = [threading.Thread(target=rotate) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert calls == [ENV_TOKEN]
    assert store.current(ENV_TOKEN).token == "renewed-1"


def test_changed_env_token_reseeds_the_store(store: TokenStore):
    store.current(ENV_TOKEN)
    backdate(store, 46)
    store.rotate(ENV_TOKEN, renewer("renewed-token-1"), renew_after=RENEW_AFTER)

    regenerated = "token-regenerated-in-the-ui"
    assert store.current(regenerated).token == regenerated
    stored = store.read()
    assert stored is not None
    assert stored.env_fingerprint == fingerprint(regenerated)
    assert stored.age() < timedelta(minutes=1)


def test_process_with_a_replaced_env_token_does_not_overwrite_the_new_one(store: TokenStore):
    store.current(ENV_TOKEN)
    regenerated = "token-regenerated-in-the-ui"
    store.current(regenerated)
    # A run started before the environment changed still carries the old token.
    assert store.current(ENV_TOKEN).token == regenerated


def test_env_set_to_the_stored_token_keeps_its_age(store: TokenStore):
    store.current(ENV_TOKEN)
    backdate(store, 46)
    store.rotate(ENV_TOKEN, renewer("renewed-token-1"), renew_after=RENEW_AFTER)
    backdate(store, 10)
    assert store.current("renewed-token-1").token == "renewed-token-1"
    stored = store.read()
    assert stored is not None and stored.age() > timedelta(days=9)


def test_corrupt_store_gives_an_error_naming_the_file_not_the_token(store: TokenStore):
    store.current(ENV_TOKEN)
    store.path.write_text('{"token": "' + ENV_TOKEN + '", "issued_at": ')  # cut off
    with pytest.raises(TokenStoreError) as excinfo:
        store.current(ENV_TOKEN)
    message = str(excinfo.value)
    assert str(store.path) in message
    assert "corrupt" in message
    assert ENV_TOKEN not in message
    assert excinfo.value.__cause__ is None and excinfo.value.__context__ is None


def test_store_readable_by_others_is_refused(store: TokenStore):
    store.current(ENV_TOKEN)
    store.path.chmod(0o644)
    with pytest.raises(TokenStoreError) as excinfo:
        store.current(ENV_TOKEN)
    message = str(excinfo.value)
    assert str(store.path) in message and "chmod 600" in message
    assert ENV_TOKEN not in message


def test_unreadable_store_gives_an_error_naming_the_file(store: TokenStore):
    store.path.parent.mkdir(parents=True)
    store.path.mkdir()  # a directory where the file should be
    with pytest.raises(TokenStoreError, match=str(store.path)):
        store.current(ENV_TOKEN)


def test_repr_never_shows_the_token(store: TokenStore):
    store.current(ENV_TOKEN)
    stored = store.read()
    rotation = store.rotate(ENV_TOKEN, renewer(), renew_after=RENEW_AFTER)
    for text in (repr(stored), str(stored), repr(rotation), repr(store)):
        assert ENV_TOKEN not in text


def store_path_from_settings() -> Path:
    from fieldsales_dagster_tests.project import load_project_defs

    api = load_project_defs().resources["fieldsales_api"]
    return Path(api.token_store_path)


def test_default_path_prefers_env_var_then_dagster_home_then_data(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("FIELDSALES_BASE_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("FIELDSALES_API_TOKEN", ENV_TOKEN)
    monkeypatch.delenv("FIELDSALES_TOKEN_STORE", raising=False)
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    # data/ need not exist in a fresh clone: the folder check passes only when it may be created.
    monkeypatch.setenv("FIELDSALES_CREATE_DIRS", "true")
    assert store_path_from_settings() == Path("data") / "fieldsales_token.json"
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    assert store_path_from_settings() == tmp_path / "home" / "fieldsales_token.json"
    monkeypatch.setenv("FIELDSALES_TOKEN_STORE", str(tmp_path / "explicit.json"))
    assert store_path_from_settings() == tmp_path / "explicit.json"


def test_new_env_token_the_server_refuses_does_not_replace_the_stored_one(store: TokenStore):
    store.current(ENV_TOKEN)
    store.rotate(ENV_TOKEN, renewer("renewed-token"), renew_after=timedelta(0))
    asked = []

    def server_refuses(token: str) -> bool:
        asked.append(token)
        return False

    assert store.current("mistyped-new-token", accept=server_refuses).token == "renewed-token"
    assert asked == ["mistyped-new-token"]
    assert store.read().token == "renewed-token"
    # Once the server accepts a new token, the store takes it over.
    assert store.current("good-new-token", accept=lambda token: True).token == "good-new-token"


def test_store_whose_directory_cannot_take_a_file_is_reported_as_unwritable(
    tmp_path: Path, monkeypatch
):
    import errno
    import tempfile

    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    with pytest.raises(TokenStoreError, match="Not a directory") as raised:
        FileTokenStore(blocker / "fieldsales_token.json").current(ENV_TOKEN)
    assert str(blocker) in str(raised.value) and ENV_TOKEN not in str(raised.value)

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    store = FileTokenStore(tmp_path / "state" / "fieldsales_token.json")
    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    with pytest.raises(TokenStoreError, match="cannot be written") as raised:
        store.current(ENV_TOKEN)
    assert str(store.path) in str(raised.value) and ENV_TOKEN not in str(raised.value)
    assert not store.path.exists()


# --- the server a store serves -----------------------------------------------------------------


@pytest.fixture
def two_servers():
    from fieldsales_dagster.demo_api import DemoConfig, DemoServer

    with (
        DemoServer(DemoConfig(transactions=20, seed=1), port=0) as first,
        DemoServer(DemoConfig(transactions=20, seed=2), port=0) as second,
    ):
        yield first, second


def client_of(server, store_path: Path):
    from fieldsales_dagster.client.api import FieldSalesAPI

    return FieldSalesAPI(
        base_url=server.base_url, api_token=server.token, token_store_path=str(store_path)
    )


def test_store_of_one_server_is_refused_by_a_client_of_another_and_no_token_is_sent(
    two_servers, tmp_path: Path
):
    first, second = two_servers
    shared = tmp_path / "shared_token.json"
    client_of(first, shared).check_token()
    second.clear_requests()
    with pytest.raises(TokenStoreError) as excinfo:
        client_of(second, shared).check_token()
    message = str(excinfo.value)
    assert str(shared) in message
    assert first.base_url in message and second.base_url in message
    assert first.token not in message and second.token not in message
    assert second.requests == []  # neither token went to the second server
    assert json.loads(shared.read_text())["token"] == first.token
    client_of(first, shared).check_token()  # the first tenant still works


def test_store_naming_no_server_is_refused_and_no_token_is_sent(two_servers, tmp_path: Path):
    """A store without an origin (written by hand) is no server's: its token is sent only once
    the environment gives that very token, which binds the store to this server."""
    first, _ = two_servers
    path, env_token = tmp_path / "fieldsales_token.json", first.token
    client_at(first.base_url, env_token, path).check_token()
    FileTokenStore(path, origin=first.base_url).rotate(
        env_token, lambda old: first.renew_token(), renew_after=timedelta(0)
    )
    doc = json.loads(path.read_text())
    del doc["origin"]
    path.write_text(json.dumps(doc))
    first.clear_requests()
    with pytest.raises(TokenStoreError, match="holds the token of an unnamed server"):
        client_at(first.base_url, env_token, path).check_token()
    assert first.requests == []
    client_at(first.base_url, first.token, path).check_token()  # the renewed token, given
    assert json.loads(path.read_text())["origin"] == first.base_url


def test_symlinked_store_is_held_to_the_origin_of_its_target(two_servers, tmp_path: Path):
    first, second = two_servers
    real = tmp_path / "first_token.json"
    link = tmp_path / "second_token.json"
    client_of(first, real).check_token()
    link.symlink_to(real)
    second.clear_requests()
    with pytest.raises(TokenStoreError) as excinfo:
        client_of(second, link).check_token()
    message = str(excinfo.value)
    assert str(real) in message and str(link) in message
    assert second.requests == []
    assert link.is_symlink()


def test_symlinked_store_is_written_through_its_target_and_the_link_kept(tmp_path: Path):
    real = tmp_path / "volume" / "fieldsales_token.json"
    real.parent.mkdir()
    link = tmp_path / "fieldsales_token.json"
    link.symlink_to(real)
    store = FileTokenStore(link)
    store.current(ENV_TOKEN)
    store.rotate(ENV_TOKEN, renewer("renewed-token-1"), renew_after=timedelta(0))
    assert link.is_symlink()
    assert json.loads(real.read_text())["token"] == "renewed-token-1"


def test_store_owned_by_another_user_is_refused(store: TokenStore):
    """Root (as on CI and here) can give a file away; the running user then does not own it."""
    store.current(ENV_TOKEN)
    os.chown(store.path, 65534, 65534)
    with pytest.raises(TokenStoreError) as excinfo:
        store.current(ENV_TOKEN)
    message = str(excinfo.value)
    assert str(store.path) in message and "owned by" in message
    assert ENV_TOKEN not in message


# --- the store records only what a server accepted (docs/token-lifecycle.md) -------------------


def closed_port_url() -> str:
    """A loopback URL nothing listens on: connections are refused at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def client_at(base_url: str, token: str, store_path: Path):
    from fieldsales_dagster.client.api import FieldSalesAPI

    return FieldSalesAPI(
        base_url=base_url,
        api_token=token,
        token_store_path=str(store_path),
        max_retries=0,
        unreachable_budget_s=0.2,
    )


def test_wrong_url_then_right_url_never_touches_the_store(two_servers, tmp_path: Path):
    from fieldsales_dagster.client.errors import AuthenticationError, UnreachableError

    first, second = two_servers
    path = tmp_path / "fieldsales_token.json"
    # A first run on a mistyped port: refused connection, and no store is written.
    with pytest.raises(UnreachableError):
        client_at(closed_port_url(), first.token, path).check_token()
    assert not path.exists()
    client_at(first.base_url, first.token, path).check_token()  # the right URL: seeded now
    seeded = path.read_bytes()
    assert json.loads(seeded)["origin"] == first.base_url
    # Later runs on a wrong URL (nothing listens; another server refuses the token with 401)
    # fail with their own error and leave the store byte for byte as it was.
    with pytest.raises(UnreachableError):
        client_at(closed_port_url(), first.token, path).check_token()
    with pytest.raises(AuthenticationError):
        client_at(second.base_url, first.token, path).check_token()
    assert path.read_bytes() == seeded
    client_at(first.base_url, first.token, path).check_token()  # the right URL still works
    assert path.read_bytes() == seeded


def test_restarted_demo_api_on_a_new_port_with_the_same_token_works(tmp_path: Path):
    from fieldsales_dagster.demo_api import DemoConfig, DemoServer

    path = tmp_path / "fieldsales_token.json"
    config = DemoConfig(transactions=20, seed=1)
    with DemoServer(config, port=0, token="demo-token") as before:
        client_at(before.base_url, "demo-token", path).check_token()
        old_origin = before.base_url
    with DemoServer(config, port=0, token="demo-token") as after:
        assert after.base_url != old_origin
        client_at(after.base_url, "demo-token", path).check_token()
        doc = json.loads(path.read_text())
        assert doc["origin"] == after.base_url and doc["token"] == "demo-token"


def test_renewed_token_of_a_moved_instance_is_not_sent_to_the_new_address(
    two_servers, tmp_path: Path
):
    """A moved instance whose store holds a renewed token: one step, a fresh token and the store
    deleted (docs/token-lifecycle.md); until then the renewed token stays home."""
    first, second = two_servers
    path = tmp_path / "fieldsales_token.json"
    env_token = first.token
    client_at(first.base_url, env_token, path).check_token()
    FileTokenStore(path, origin=first.base_url).rotate(
        env_token, lambda old: first.renew_token(), renew_after=timedelta(0)
    )
    second.clear_requests()
    with pytest.raises(TokenStoreError, match="delete the store"):
        client_at(second.base_url, env_token, path).check_token()
    assert second.requests == []
    path.unlink()  # the documented step, with FIELDSALES_API_TOKEN set to the new address's token
    client_at(second.base_url, second.token, path).check_token()
    assert json.loads(path.read_text())["origin"] == second.base_url


def test_lost_or_corrupt_store_is_seeded_again_once_the_server_accepts(two_servers, tmp_path: Path):
    first, _ = two_servers
    path = tmp_path / "fieldsales_token.json"
    client_at(first.base_url, first.token, path).check_token()
    path.write_text('{"token": ')  # corrupt
    with pytest.raises(TokenStoreError, match="Delete it"):
        client_at(first.base_url, first.token, path).check_token()
    path.unlink()  # the documented step (a lost store needs none)
    client_at(first.base_url, first.token, path).check_token()
    assert json.loads(path.read_text())["token"] == first.token


def test_env_token_is_reseeded_only_after_the_server_accepts_it(two_servers, tmp_path: Path):
    first, _ = two_servers
    path = tmp_path / "fieldsales_token.json"
    client_at(first.base_url, first.token, path).check_token()
    regenerated = first.expire_token()  # regenerated in the UI: the stored token is refused now
    seeded = path.read_bytes()
    from fieldsales_dagster.client.errors import AuthenticationError

    with pytest.raises(AuthenticationError):
        client_at(first.base_url, "a-mistyped-token-123", path).check_token()
    assert path.read_bytes() == seeded
    client_at(first.base_url, regenerated, path).check_token()  # the documented re-seed
    assert json.loads(path.read_text())["token"] == regenerated


def test_a_client_store_writes_a_first_seed_only_when_settled_with_that_token(tmp_path: Path):
    store = FileTokenStore(tmp_path / "fieldsales_token.json", origin="http://127.0.0.1:8765")
    asked: list[str] = []

    def accept(token: str) -> bool:
        asked.append(token)
        return True

    assert store.current(ENV_TOKEN, accept=accept).token == ENV_TOKEN
    assert asked == [] and not store.path.exists()  # no probe, no file
    store.settle(ENV_TOKEN, "some-other-token")  # a 200 for another token settles nothing
    assert not store.path.exists()
    store.settle(ENV_TOKEN, ENV_TOKEN)
    stored = store.read()
    assert stored is not None and stored.token == ENV_TOKEN
    assert stored.origin == "http://127.0.0.1:8765"
