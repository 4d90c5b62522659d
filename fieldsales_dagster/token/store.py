"""Durable store of the current API token: one JSON file, owner-only, replaced atomically.

Renewing a token (``GET /api/bearer/generatetoken``) invalidates the old one at once, so the new
token must reach the disk before anything else happens, and every process must find it there:

* the file holds the token, when it was issued (or first seen) and a SHA-256 fingerprint of the
  ``FIELDSALES_API_TOKEN`` it was seeded from, never that environment token in clear;
* writes go to a temporary file in the same directory (created 0600), are flushed and fsynced,
  then ``os.replace``-d over the store and the directory is fsynced: a reader sees the old token
  or the new one, never half a file, and a crash never loses a renewal that was written;
* seeding and renewing hold ``<path>.lock`` (a ``filelock.FileLock``), so across threads and
  processes one renewal happens at a time, and the one that waited re-reads the store and finds
  the renewal already done (double-checked locking, see ``TokenStore.rotate``);
* once seeded, the store wins over the environment, whose token a renewal has made stale; a new
  environment token (a person regenerated it in the UI) re-seeds the store once the server has
  accepted it, while a token the store already replaced does not: a process started with an old
  environment never writes its invalid token back over the current one, and a mistyped new one
  never throws away the valid renewed token.

Interface the API client relies on: ``TokenStore(path).current_token(env_token, accept)``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated

import msgspec
from filelock import FileLock, Timeout

from fieldsales_dagster.paths import resolved
from fieldsales_dagster.pause import pause_at
from fieldsales_dagster.token.secret import TokenFormatError, clean_token

FORMAT_VERSION = 1
#: How long a process waits for another one's seeding or renewal before giving up.
LOCK_TIMEOUT_S = 300.0
#: Fingerprints of environment tokens the store has moved past (bounded history).
MAX_RETIRED_FINGERPRINTS = 20


class TokenStoreError(RuntimeError):
    """The store cannot be read or written. Messages name the file, never the token."""


def fingerprint(token: str) -> str:
    """SHA-256 hex digest of a token: lets the store recognise a token without keeping it."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def _utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class StoredToken:
    """What the store file holds. ``repr`` hides the token."""

    token: str = field(repr=False)
    #: When the token was issued by a renewal, or first seen in the environment (UTC).
    issued_at: datetime
    #: SHA-256 of the environment token this chain of renewals was seeded from.
    env_fingerprint: str
    #: ``"environment"`` (seeded) or ``"renewal"``.
    source: str = "environment"
    retired_env_fingerprints: tuple[str, ...] = ()

    def age(self, now: datetime | None = None) -> timedelta:
        return (now or _utcnow()) - self.issued_at

    def encode(self) -> bytes:
        file = _StoreFile(
            token=self.token,
            issued_at=self.issued_at.astimezone(UTC),
            env_token_sha256=self.env_fingerprint,
            source=self.source,
            retired_env_token_sha256=list(self.retired_env_fingerprints),
        )
        return msgspec.json.format(msgspec.json.encode(file), indent=2) + b"\n"

    @classmethod
    def decode(cls, raw: bytes, path: Path) -> StoredToken:
        try:
            file, why = _STORE_FILE.decode(raw), ""
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            file, why = None, str(exc)  # msgspec names the field and the rule, never the value
        if file is None:
            # Raised outside the except block: no decoder error is even attached as context.
            raise TokenStoreError(
                f"Token store {path} is corrupt ({why}). Delete it and restart: the store is "
                "seeded again from FIELDSALES_API_TOKEN (regenerate that token in your "
                "Field-Sales user profile, API tab, if it was renewed since)."
            )
        try:
            # A store edited by hand (or written before tokens were cleaned) may hold a line break.
            token = clean_token(file.token, f"token store {path}")
        except TokenFormatError as exc:
            raise TokenStoreError(
                f"{exc} Or delete {path}: it is seeded again from FIELDSALES_API_TOKEN."
            ) from None
        issued = file.issued_at
        return cls(
            token=token,
            issued_at=issued if issued.tzinfo else issued.replace(tzinfo=UTC),
            env_fingerprint=file.env_token_sha256,
            source=file.source,
            retired_env_fingerprints=tuple(file.retired_env_token_sha256),
        )


Fingerprint = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]


class _StoreFile(msgspec.Struct, kw_only=True):
    """The store file's schema (version 1)."""

    version: int = FORMAT_VERSION
    token: Annotated[str, msgspec.Meta(min_length=1)]
    issued_at: datetime
    source: str = "environment"
    env_token_sha256: Fingerprint
    retired_env_token_sha256: list[Fingerprint] = []


_STORE_FILE = msgspec.json.Decoder(_StoreFile)


@dataclass(frozen=True)
class Rotation:
    """Outcome of ``TokenStore.rotate``: the token now stored, and whether this call renewed it."""

    renewed: bool
    stored: StoredToken

    @property
    def token(self) -> str:
        return self.stored.token


class TokenStore:
    """The token file at ``path`` and its lock ``<path>.lock``."""

    def __init__(self, path: Path | str):
        # A symlinked store is written through: the rename replaces the target, the link stays.
        self.path = resolved(path)
        self.lock_path = self.path.with_name(self.path.name + ".lock")

    def __repr__(self) -> str:
        return f"TokenStore({str(self.path)!r})"

    # --- reading (no lock needed: the file is only ever replaced whole) --------------------

    def read(self) -> StoredToken | None:
        """The stored token, or ``None`` when the store does not exist yet."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise TokenStoreError(f"Cannot read token store {self.path}: {exc.strerror}.") from None
        try:
            self._check_permissions(os.fstat(fd))
            with os.fdopen(fd, "rb", closefd=False) as file:
                raw = file.read()
        except OSError as exc:
            raise TokenStoreError(f"Cannot read token store {self.path}: {exc.strerror}.") from None
        finally:
            os.close(fd)
        return StoredToken.decode(raw, self.path)

    def _check_permissions(self, st: os.stat_result) -> None:
        if os.name != "posix":
            return
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o077:
            raise TokenStoreError(
                f"Token store {self.path} is readable or writable by other users (mode "
                f"{mode:04o}); it holds the API token. Run `chmod 600 {self.path}` and check who "
                "could read it; regenerate the token if in doubt."
            )

    # --- the token to use ------------------------------------------------------------------

    def current(self, env_token: str, accept: Callable[[str], bool] | None = None) -> StoredToken:
        """The stored token, seeding (or re-seeding) the store from ``env_token`` if needed.

        A new environment token replaces a stored one only if ``accept(env_token)`` says the
        server takes it (when ``accept`` is given): a mistyped replacement must never throw away
        a valid renewed token. Refused, the stored token stays in use.
        """
        stored = self.read()
        if stored is not None and not self._must_reseed(stored, env_token):
            return stored
        if stored is not None and accept is not None and not accept(env_token):
            return stored
        with self._locked():
            return self._read_or_seed(env_token)

    def current_token(self, env_token: str, accept: Callable[[str], bool] | None = None) -> str:
        return self.current(env_token, accept).token

    def env_token_pending(self, env_token: str) -> bool:
        """True when ``env_token`` is one the store has never seen (a person set a new one)."""
        stored = self.read()
        return stored is not None and self._must_reseed(stored, env_token)

    @staticmethod
    def _must_reseed(stored: StoredToken, env_token: str) -> bool:
        """A new environment token, one this store never saw, means a person regenerated it."""
        if not env_token:
            return False
        env_fp = fingerprint(env_token)
        return env_fp != stored.env_fingerprint and env_fp not in stored.retired_env_fingerprints

    def _read_or_seed(self, env_token: str) -> StoredToken:
        """Under the lock: the stored token, after seeding it from ``env_token`` where due."""
        stored = self.read()
        if stored is not None and not self._must_reseed(stored, env_token):
            return stored
        if not env_token:
            raise TokenStoreError(
                f"Token store {self.path} is empty and FIELDSALES_API_TOKEN is not set: generate a "
                "token in your Field-Sales user profile (API tab) and set FIELDSALES_API_TOKEN."
            )
        env_fp = fingerprint(env_token)
        if stored is None:
            seeded = StoredToken(token=env_token, issued_at=_utcnow(), env_fingerprint=env_fp)
        elif stored.token == env_token:
            # The environment was set to the token the store already holds: same age.
            seeded = replace(stored, env_fingerprint=env_fp)
        else:
            retired = (*stored.retired_env_fingerprints, stored.env_fingerprint)
            seeded = StoredToken(
                token=env_token,
                issued_at=_utcnow(),
                env_fingerprint=env_fp,
                retired_env_fingerprints=retired[-MAX_RETIRED_FINGERPRINTS:],
            )
        self._write_atomically(seeded)
        return seeded

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

        ``renew(old_token) -> new_token`` performs the HTTP renewal. Under the lock the store is
        read again, because another process may have renewed while this one waited; only if
        renewal is still due is ``renew`` called, and its token is written durably before this
        method returns, before any log line or any other use of the answer.
        """
        with self._locked(lock_timeout_s):
            stored = self._read_or_seed(env_token)
            if stored.age() < renew_after:
                return Rotation(renewed=False, stored=stored)
            new_token = renew(stored.token)
            renewed = replace(stored, token=new_token, issued_at=_utcnow(), source="renewal")
            try:
                self._write_atomically(renewed)
            except TokenStoreError as exc:
                raise TokenStoreError(
                    f"{exc} The token was renewed, so the stored one is no longer valid: "
                    "regenerate the token in your Field-Sales user profile (API tab) and set "
                    "FIELDSALES_API_TOKEN, then fix the store's directory."
                ) from None
            return Rotation(renewed=True, stored=renewed)

    # --- plumbing ----------------------------------------------------------------------------

    def ensure_writable(self) -> None:
        """Raise ``TokenStoreError`` unless a new token could be written beside the store now.

        Called before a renewal: once the server has rotated the token, a failed write would lose
        the only valid one.
        """
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd, probe = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.probe.")
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            raise TokenStoreError(
                f"Token store {self.path} cannot be written ({exc.strerror}); not renewing the "
                "token, because the renewed token could not be kept. Fix the permissions or the "
                "space of its directory (or set FIELDSALES_TOKEN_STORE to a writable path)."
            ) from None

    @contextlib.contextmanager
    def _locked(self, timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[None]:
        self._ensure_directory()
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
        """Under the lock: the temporary files of writers that died (no live one holds the lock).

        A complete one newer than the store is the write a killed renewal was about to commit
        (the server had already rotated the token), so it is committed now; any other is removed.
        """
        for leftover in self.path.parent.glob(f".{self.path.name}.*.tmp"):
            try:
                candidate = StoredToken.decode(leftover.read_bytes(), leftover)
                stored = self.read()
            except (OSError, TokenStoreError):
                candidate = stored = None
            if candidate is not None and (stored is None or candidate.issued_at > stored.issued_at):
                os.replace(leftover, self.path)
                self._fsync_directory(self.path.parent)
            else:
                leftover.unlink(missing_ok=True)

    def _ensure_directory(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            raise TokenStoreError(
                f"Cannot create the directory of token store {self.path}: {exc.strerror}."
            ) from None

    def _write_atomically(self, stored: StoredToken) -> None:
        """Temp file (0600) beside the store, write, fsync, ``os.replace``, fsync the directory."""
        data = stored.encode()
        directory = self.path.parent
        try:
            # mkstemp opens with O_EXCL and mode 0600 whatever the umask; fchmod says so anyway.
            fd, tmp_name = tempfile.mkstemp(
                dir=directory, prefix=f".{self.path.name}.", suffix=".tmp"
            )
        except OSError as exc:
            raise TokenStoreError(
                f"Cannot write token store {self.path}: {exc.strerror}."
            ) from None
        try:
            try:
                if hasattr(os, "fchmod"):
                    os.fchmod(fd, 0o600)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            pause_at("token_store")
            os.replace(tmp_name, self.path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp_name)
            raise TokenStoreError(
                f"Cannot write token store {self.path}: {exc.strerror}."
            ) from None
        self._fsync_directory(directory)

    @staticmethod
    def _fsync_directory(directory: Path) -> None:
        """Make the rename itself durable; best effort (some filesystems refuse a directory fsync,
        and the new file is in place either way)."""
        if os.name != "posix":
            return
        with contextlib.suppress(OSError):
            dir_fd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
