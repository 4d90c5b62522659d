"""Durable store of the current API token: one JSON file, owner-only, replaced atomically.

Renewing a token (``GET /api/bearer/generatetoken``) invalidates the old one at once, so the new
token must reach the disk before anything else happens, and every process must find it there:

* the file holds the token, when it was issued (or first seen), a SHA-256 fingerprint of the
  ``FIELDSALES_API_TOKEN`` it was seeded from (never that token in clear) and the origin
  (``scheme://host:port``) of its server: a store of another origin is refused before its token is
  sent anywhere, unless the environment gives this very token (the same token at a new address);
* nothing is written until the server accepted the token (``settle`` after its first 200, or
  ``accept`` in ``current``), so a mistyped base URL or token leaves the file as it was;
* a symlinked store is read and written through its target; a file another user owns, or others
  can read, is refused;
* writes go to a 0600 temporary file in the same directory, fsynced, ``os.replace``-d over the
  store, then the directory is fsynced: a reader sees the old token or the new one, and a crash
  never loses a renewal that was written;
* seeding and renewing hold ``<path>.lock``, so one renewal happens at a time across processes,
  and the one that waited re-reads the store and finds it done (``TokenStore.rotate``);
* a renewal prepares its write (lock, temporary file, encoding) before the server rotates the
  token: after that call only the write and the rename remain;
* once seeded, the store wins over the environment; a new environment token (regenerated in the
  UI) re-seeds it once the server accepted it, a token the store already replaced never does.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, cast

import msgspec
from filelock import FileLock, Timeout
from msgspec.structs import replace

from fieldsales_dagster.clock import from_the_future
from fieldsales_dagster.pause import pause_at
from fieldsales_dagster.token.secret import TokenFormatError, clean_token

FORMAT_VERSION = 1
#: How long a process waits for another one's seeding or renewal before giving up.
LOCK_TIMEOUT_S = 300.0
#: How long a request refused with HTTP 401 waits for a renewal in progress before re-reading the
#: store (a renewal's request takes at most 15 s: ``renewal.py``).
RENEWAL_WAIT_S = 20.0
#: Fingerprints of environment tokens the store has moved past (bounded history).
MAX_RETIRED_FINGERPRINTS = 20


class TokenStoreError(RuntimeError):
    """The store cannot be read or written. Messages name the file, never the token."""


def fingerprint(token: str) -> str:
    """SHA-256 hex digest of a token: lets the store recognise a token without keeping it."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def _utcnow() -> datetime:
    return datetime.now(UTC)


Fingerprint = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]


class StoredToken(msgspec.Struct, frozen=True, kw_only=True):
    """What the store file holds (format version 1). ``repr`` hides the token."""

    version: int = FORMAT_VERSION
    token: Annotated[str, msgspec.Meta(min_length=1)]
    #: When the token was issued by a renewal, or first seen in the environment (UTC).
    issued_at: datetime
    #: SHA-256 of the environment token this chain of renewals was seeded from.
    env_fingerprint: Fingerprint = msgspec.field(name="env_token_sha256")
    #: ``"environment"`` (seeded) or ``"renewal"``.
    source: str = "environment"
    retired_env_fingerprints: tuple[Fingerprint, ...] = msgspec.field(
        default=(), name="retired_env_token_sha256"
    )
    #: ``scheme://host:port`` of the server the token belongs to; ``None``: a store on its own.
    origin: str | None = None

    def __post_init__(self) -> None:
        if self.issued_at.tzinfo is None:  # a store written by hand without a zone: UTC
            msgspec.structs.force_setattr(self, "issued_at", self.issued_at.replace(tzinfo=UTC))

    def __repr__(self) -> str:
        return f"StoredToken(issued_at={self.issued_at!r}, source={self.source!r})"

    def age(self, now: datetime | None = None) -> timedelta:
        return (now or _utcnow()) - self.issued_at

    def encode(self) -> bytes:
        # A frozen clock's datetime subclass is not encodable as is: written as ISO text.
        raw = msgspec.json.encode(self, enc_hook=datetime.isoformat)
        return msgspec.json.format(raw, indent=2) + b"\n"

    @classmethod
    def decode(cls, raw: bytes, path: Path | str, token_variable: str) -> StoredToken:
        try:
            stored, why = _DECODER.decode(raw), ""
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            stored, why = None, str(exc)  # msgspec names the field and the rule, never the value
        if stored is None:
            # Raised outside the except block: no decoder error is even attached as context.
            raise TokenStoreError(
                f"Token store {path} is corrupt ({why}). Delete it and restart: the store is "
                f"seeded again from {token_variable} (regenerate that token in your "
                "Field-Sales user profile, API tab, if it was renewed since)."
            )
        try:
            # A store edited by hand (or written before tokens were cleaned) may hold a line break.
            token = clean_token(stored.token, f"token store {path}")
        except TokenFormatError as exc:
            raise TokenStoreError(
                f"{exc} Or delete {path}: it is seeded again from {token_variable}."
            ) from None
        return replace(stored, token=token)


_DECODER = msgspec.json.Decoder(StoredToken)


@dataclass(frozen=True)
class Rotation:
    """Outcome of ``TokenStore.rotate``: the token now stored, and whether this call renewed it."""

    renewed: bool
    stored: StoredToken


class TokenStore:
    """The token file at ``path`` (symlinks resolved) and its lock ``<path>.lock``.

    ``origin`` (``scheme://host:port``) is the server this client sends the token to: a store
    holding another server's token is refused. ``None`` (tests of the store alone) checks nothing.
    ``variables``: what its errors call the token's and the store's variables (a tenant's own:
    the client's ``variables``).
    """

    def __init__(
        self, path: Path | str, origin: str | None = None, variables: Mapping[str, str] = {}
    ):
        self.token_variable, self.variable = (
            variables.get(name, name) for name in ("FIELDSALES_API_TOKEN", "FIELDSALES_TOKEN_STORE")
        )
        #: The path as configured; ``path`` is where it leads (the same unless a symlink).
        self.given_path = Path(path)
        try:
            self.path = self.given_path.resolve()
        except (OSError, RuntimeError) as exc:  # a symlink loop (RuntimeError before 3.13)
            raise TokenStoreError(
                f"Token store {self.given_path} cannot be resolved ({exc}); point "
                f"{self.variable} (token_store_path) at a file or a link to one."
            ) from None
        self.origin = origin
        self.lock_path = self.path.with_name(self.path.name + ".lock")

    def __repr__(self) -> str:
        return f"TokenStore({str(self.path)!r})"

    @property
    def where(self) -> str:
        """The store's file for a message, with the link it was reached through, if any."""
        if self.given_path.absolute() == self.path:
            return str(self.path)
        return f"{self.path} (reached through {self.given_path})"

    # --- reading (no lock needed: the file is only ever replaced whole) --------------------

    def read(self) -> StoredToken | None:
        """The stored token, or ``None`` when the store does not exist yet.

        Refuses a file another user owns or could read, and one that holds another server's
        token (see ``origin``), before anything uses the token.
        """
        stored = self._read_any()
        if stored is not None:
            self._check_origin(stored)
        return stored

    def _read_any(self) -> StoredToken | None:
        """``read`` without the origin check: ``_pending`` decides about another server's store."""
        try:
            # The path is resolved already: a link put in its place since is not followed.
            fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            with os.fdopen(fd, "rb") as file:
                self._check_permissions(os.fstat(fd))
                raw = file.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise TokenStoreError(
                f"Cannot read token store {self.where}: {exc.strerror}."
            ) from None
        return StoredToken.decode(raw, self.path, self.token_variable)

    def _check_permissions(self, st: os.stat_result) -> None:
        if os.name != "posix":
            return
        if st.st_uid != os.geteuid():
            raise TokenStoreError(
                f"Token store {self.where} is owned by another user (uid {st.st_uid}; this process "
                f"runs as uid {os.geteuid()}): whoever owns it chooses the token sent to the "
                f"server. Delete it (it is seeded again from {self.token_variable}) or `chown` it "
                "to the user that runs Dagster."
            )
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o077:
            raise TokenStoreError(
                f"Token store {self.where} is readable or writable by other users (mode "
                f"{mode:04o}); it holds the API token. Run `chmod 600 {self.path}` and check who "
                "could read it; regenerate the token if in doubt."
            )

    def _check_origin(self, stored: StoredToken) -> None:
        if not self._foreign(stored):
            return
        raise TokenStoreError(
            f"Token store {self.where} holds the token of {stored.origin or 'an unnamed server'}, "
            f"but this instance serves {self.origin}: a token is only ever sent to the server it "
            "belongs to, so the store is not used and no token was sent. Give each Field-Sales "
            f"instance a token_store_path of its own ({self.variable}); if the instance really "
            f"moved to the new address, set {self.token_variable} to its current token "
            "(regenerate it in your Field-Sales user profile, API tab) and delete the store: it "
            "is seeded again once the new address accepts that token (docs/token-lifecycle.md)."
        )

    def _foreign(self, stored: StoredToken) -> bool:
        """The store holds the token of another server than this client's."""
        return self.origin is not None and stored.origin != self.origin

    # --- the token to use ------------------------------------------------------------------

    def current(self, env_token: str, accept: Callable[[str], bool] | None = None) -> StoredToken:
        """The token to use. With ``accept`` (a client) nothing is written the server has not
        accepted (see the module): a new environment token replaces this server's stored one only
        if ``accept(env_token)``; a first seed, an adoption or a new address is returned unsaved,
        for ``settle``. Without ``accept`` (the store on its own) every record is written at once.
        """
        stored, pending = self._pending(env_token)
        if pending is None:
            assert stored is not None  # _pending only returns None for a usable stored token
            return stored
        if accept is not None:
            if stored is None or self._foreign(stored) or not self._must_reseed(stored, env_token):
                return pending  # written by settle() after the server's first 200
            if not accept(pending.token):
                return stored
        return self._write_pending(env_token) or pending

    def settle(self, env_token: str, token: str) -> None:
        """The server just accepted ``token``: write the record ``current`` left unsaved for it."""
        _, pending = self._pending(env_token)
        if pending is not None and pending.token == token:
            self._write_pending(env_token, token)

    def _write_pending(self, env_token: str, token: str | None = None) -> StoredToken | None:
        """Under the lock: write what is still pending (for ``token``, if given); else the store."""
        with self._locked():
            stored, pending = self._pending(env_token)
            if pending is None or (token is not None and pending.token != token):
                return stored
            self._write_atomically(pending)
            return pending

    def peek(self, env_token: str) -> StoredToken:
        """What ``current`` would use, without writing anything or asking the server (a sensor's
        decision): a token not yet stored is new (age 0)."""
        stored, pending = self._pending(env_token)
        return pending or cast(StoredToken, stored)

    def _pending(self, env_token: str) -> tuple[StoredToken | None, StoredToken | None]:
        """The store as read, and the record to write before it can be used here (``None``: it
        can as is)."""
        stored = self._read_any()
        if stored is not None and self._foreign(stored) and stored.token != env_token:
            self._check_origin(stored)  # raises: another server's token is never sent here
        if stored is not None and not self._must_reseed(stored, env_token):
            if stored.origin == self.origin or self.origin is None:
                return stored, None
            # This very token at a new address.
            return stored, replace(stored, origin=self.origin)
        if not env_token:
            raise TokenStoreError(
                f"Token store {self.where} is empty and {self.token_variable} is not set: generate "
                f"a token in your Field-Sales user profile (API tab) and set {self.token_variable}."
            )
        env_fp = fingerprint(env_token)
        if stored is None or self._foreign(stored):
            new = StoredToken(
                token=env_token, issued_at=_utcnow(), env_fingerprint=env_fp, origin=self.origin
            )
            return stored, new
        if stored.token == env_token:
            # The environment was set to the token the store already holds: same age.
            return stored, replace(
                stored, env_fingerprint=env_fp, origin=self.origin or stored.origin
            )
        retired = (*stored.retired_env_fingerprints, stored.env_fingerprint)
        return stored, StoredToken(
            token=env_token,
            issued_at=_utcnow(),
            env_fingerprint=env_fp,
            retired_env_fingerprints=retired[-MAX_RETIRED_FINGERPRINTS:],
            origin=self.origin or stored.origin,
        )

    @staticmethod
    def _must_reseed(stored: StoredToken, env_token: str) -> bool:
        """A new environment token, one this store never saw, means a person regenerated it."""
        if not env_token:
            return False
        env_fp = fingerprint(env_token)
        return env_fp != stored.env_fingerprint and env_fp not in stored.retired_env_fingerprints

    def wait_for_renewal(self, timeout_s: float) -> None:
        """A request was just refused (HTTP 401): let a renewal in progress finish (its lock),
        so that the store read next holds its token. Best effort: gives up after ``timeout_s``."""
        if self.lock_path.exists():  # never renewed here: nothing to wait for, nothing to create
            with (
                contextlib.suppress(Timeout, OSError),
                FileLock(self.lock_path, timeout=timeout_s, mode=0o600),
            ):
                pass

    # --- renewal -----------------------------------------------------------------------------

    def rotate(
        self,
        env_token: str,
        renew: Callable[[str], str],
        *,
        renew_after: timedelta,
        lock_timeout_s: float = LOCK_TIMEOUT_S,
    ) -> Rotation:
        """Renew the token if it is older than ``renew_after``, once across all processes.

        ``renew(old_token) -> new_token`` is the HTTP renewal, which invalidates the old token.
        Under the lock the store is read again (another process may have renewed meanwhile);
        only if renewal is still due is the write prepared and ``renew`` called, and its token
        is stored before this method returns. A token not yet stored is not due (age 0).
        """
        with self._locked(lock_timeout_s):
            stored = self.peek(env_token)
            now = _utcnow()
            future = from_the_future(stored.issued_at, now, "issued_at")
            if stored.age(now) < renew_after and future is None:
                return Rotation(renewed=False, stored=stored)
            renewed = replace(stored, issued_at=_utcnow(), source="renewal")
            with self._prepared_write(renewed, renewing=True) as commit:
                renewed = replace(renewed, token=renew(stored.token))
                self._write_atomically(renewed, commit)
            return Rotation(renewed=True, stored=renewed)

    # --- plumbing ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self, timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[None]:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            raise TokenStoreError(
                f"Cannot create the directory of token store {self.where}: {exc.strerror}."
            ) from None
        lock = FileLock(self.lock_path, timeout=timeout_s, mode=0o600)
        try:
            lock.acquire()
        except Timeout:
            raise TokenStoreError(
                f"Waited {timeout_s:.0f} s for the token store lock {self.lock_path}: another "
                "process is renewing the token or died holding the lock. Try again later."
            ) from None
        except OSError as exc:
            raise TokenStoreError(
                f"Cannot lock the token store {self.lock_path}: {exc.strerror}."
            ) from None
        try:
            self._finish_dead_writes()
            yield
        finally:
            lock.release()

    def _finish_dead_writes(self) -> None:
        """Under the lock, the temporary files of dead writers: one newer than the store is a killed
        renewal's (the server already rotated the token) and is committed; any other is removed."""
        for leftover in self.path.parent.glob(f".{self.path.name}.*.tmp"):
            candidate: StoredToken | None
            try:
                candidate = StoredToken.decode(leftover.read_bytes(), leftover, self.token_variable)
                self._check_origin(candidate)
                stored = self.read()
            except (OSError, TokenStoreError):
                candidate = stored = None
            if candidate is not None and (stored is None or candidate.issued_at > stored.issued_at):
                os.replace(leftover, self.path)
                self._fsync_directory(self.path.parent)
            else:
                leftover.unlink(missing_ok=True)

    def _write_atomically(
        self, stored: StoredToken, commit: Callable[[StoredToken], None] | None = None
    ) -> None:
        """Write ``stored`` through ``commit`` (opened by ``_prepared_write`` before an
        irreversible call), or through a write prepared now."""
        if commit is not None:
            return commit(stored)
        with self._prepared_write(stored) as commit_now:
            commit_now(stored)

    @contextlib.contextmanager
    def _prepared_write(
        self, shape: StoredToken, *, renewing: bool = False
    ) -> Iterator[Callable[[StoredToken], None]]:
        """Everything a write needs that can fail (encoding ``shape``, the temporary file), done
        before the caller's irreversible step; ``commit(record)`` then writes, fsyncs and renames.
        """
        not_renewing = " not renewing the token, because it could not be kept;" if renewing else ""
        try:
            replace(shape, token="prepared").encode()
        except (TypeError, ValueError, msgspec.EncodeError) as exc:
            raise TokenStoreError(
                f"Token store {self.where}: the record cannot be encoded ({exc});"
                f"{not_renewing} this is a bug, please report it."
            ) from None
        try:
            # mkstemp opens with O_EXCL and mode 0600 whatever the umask (which only clears bits).
            fd, tmp_name = tempfile.mkstemp(
                dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp"
            )
        except OSError as exc:
            raise TokenStoreError(
                f"Token store {self.where} cannot be written ({exc.strerror});{not_renewing} fix "
                f"the permissions or the space of its directory (or set {self.variable} to "
                "a writable path)."
            ) from None
        file, committed = os.fdopen(fd, "wb"), False

        def commit(record: StoredToken) -> None:
            nonlocal committed
            data = record.encode()
            try:
                with file:
                    file.write(data)
                    file.flush()
                    os.fsync(fd)
                pause_at("token_store")
                os.replace(tmp_name, self.path)
            except OSError as exc:
                after = (
                    " The token was renewed, so the stored one is no longer valid: regenerate "
                    "the token in your Field-Sales user profile (API tab) and set "
                    f"{self.token_variable}, then fix the store's directory."
                    if renewing
                    else ""
                )
                raise TokenStoreError(
                    f"Cannot write token store {self.where}: {exc.strerror}.{after}"
                ) from None
            committed = True
            self._fsync_directory(self.path.parent)

        try:
            yield commit
        finally:
            file.close()
            if not committed:
                with contextlib.suppress(OSError):
                    os.unlink(tmp_name)

    @staticmethod
    def _fsync_directory(directory: Path) -> None:
        """Make the rename itself durable; best effort (some filesystems refuse a directory fsync,
        and the new file is in place either way, as on Windows, which cannot open a directory)."""
        with contextlib.suppress(OSError):
            dir_fd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
