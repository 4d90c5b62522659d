"""Durable store of the current API token (docs/token-lifecycle.md): the protocol and the file.

The record binds the token to its server's origin (another's is refused before it is sent).
Nothing is written before the server accepted the token. Once seeded the store wins over the
environment; a new environment token re-seeds it once accepted, one it replaced never does.
"""

from __future__ import annotations

import abc
import contextlib
import hashlib
import os
import stat
import tempfile
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, NamedTuple, cast

import msgspec
from filelock import FileLock, Timeout
from msgspec.structs import replace

from fieldsales_dagster.clock import from_the_future
from fieldsales_dagster.pause import pause_at
from fieldsales_dagster.token.secret import TokenFormatError, clean_token

#: How long a process waits for another one's seeding or renewal before giving up.
LOCK_TIMEOUT_S = 300.0
#: How long a request refused with HTTP 401 waits for a renewal in progress (one takes <= 15 s).
RENEWAL_WAIT_S = 20.0
Commit = Callable[["StoredToken"], None]


class TokenStoreError(RuntimeError):
    """The store cannot be read or written. Messages name the store, never the token."""


def fingerprint(token: str) -> str:
    """SHA-256 hex digest of a token: lets the store recognise a token without keeping it."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


Fingerprint = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]


class StoredToken(msgspec.Struct, frozen=True, kw_only=True):
    """What the store holds (format version 1). ``repr`` hides the token."""

    version: int = 1
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
        return (now or datetime.now(UTC)) - self.issued_at

    def encode(self) -> bytes:
        # A frozen clock's datetime subclass is not encodable as is: written as ISO text.
        raw = msgspec.json.encode(self, enc_hook=datetime.isoformat)
        return msgspec.json.format(raw, indent=2) + b"\n"

    @classmethod
    def decode(cls, raw: bytes | str, where: object, token_variable: str) -> StoredToken:
        try:
            stored, why = msgspec.json.decode(raw, type=cls), ""
        except msgspec.DecodeError as exc:  # a ValidationError too
            stored, why = None, str(exc)  # msgspec names the field and the rule, never the value
        if stored is None:  # raised outside the except block: no decoder error is attached
            raise TokenStoreError(
                f"Token store {where} is corrupt ({why}). Delete it and restart: the store is "
                f"seeded again from {token_variable} (regenerated in the API tab if renewed)."
            )
        try:  # a store edited by hand may hold a line break
            return replace(stored, token=clean_token(stored.token, f"token store {where}"))
        except TokenFormatError as exc:
            raise TokenStoreError(
                f"{exc} Or delete {where}: it is seeded again from {token_variable}."
            ) from None


class Rotation(NamedTuple):
    """Outcome of ``TokenStore.rotate``: the token now stored, and whether this call renewed it."""

    renewed: bool
    stored: StoredToken


class TokenStore(abc.ABC):
    """The protocol; a backend supplies ``where``, ``_read_any`` (unchecked), ``_locked``
    (``wait=True``: only wait until it is free) and ``_open_write`` (what can fail of a write, done;
    yields ``commit(record)``). ``origin`` ``None`` (the store alone) checks nothing."""

    where: str

    def __init__(self, origin: str | None, variables: Mapping[str, str]):
        self.origin = origin
        names = ("FIELDSALES_API_TOKEN", "FIELDSALES_TOKEN_STORE", "FIELDSALES_DUCKLAKE_CATALOG")
        self.token_variable, self.variable, self.catalog_variable = (
            variables.get(name, name) for name in names
        )

    @abc.abstractmethod
    def _read_any(self) -> StoredToken | None: ...

    @abc.abstractmethod
    def _locked(
        self, timeout_s: float = LOCK_TIMEOUT_S, wait: bool = False
    ) -> contextlib.AbstractContextManager[None]: ...

    @abc.abstractmethod
    def _open_write(self) -> contextlib.AbstractContextManager[Commit]: ...

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.where!r})"

    def _failed(self, doing: str, exc: Exception) -> TokenStoreError:
        """``exc`` in one line (a driver's text may go on, never with the token)."""
        first = str(exc).strip().partition("\n")[0]
        why = getattr(exc, "strerror", None) or first or type(exc).__name__
        return TokenStoreError(f"Cannot {doing} the token store, {self.where}: {why.rstrip('.')}.")

    def _lock_timed_out(self, timeout_s: float) -> TokenStoreError:
        return TokenStoreError(
            f"Waited {timeout_s:.0f} s for the lock of the token store, {self.where}: another "
            "process is renewing the token, or died holding the lock. Try again later."
        )

    def read(self) -> StoredToken | None:
        """The stored token, or ``None`` when there is none yet; refuses another server's."""
        if (stored := self._read_any()) is not None and self._foreign(stored):
            self._refuse(stored)
        return stored

    def _refuse(self, stored: StoredToken) -> None:
        raise TokenStoreError(
            f"Token store {self.where} holds the token of {stored.origin or 'an unnamed server'}, "
            f"not of {self.origin}: give each instance its own {self.variable}; if it moved, set "
            f"{self.token_variable} to its token and delete the store (docs/token-lifecycle.md)."
        )

    def _foreign(self, stored: StoredToken) -> bool:
        return self.origin is not None and stored.origin != self.origin

    def current(self, env_token: str, accept: Callable[[str], bool] | None = None) -> StoredToken:
        """The token to use. With ``accept`` (a client), a new environment token replaces the
        stored one only if ``accept(env_token)``; a first seed or a new address is returned unsaved,
        for ``settle``. Without it (the store alone) every record is written at once."""
        stored, pending = self._pending(env_token)
        if pending is None:
            return cast(StoredToken, stored)  # _pending returns None for a usable stored token
        if accept is not None:
            if stored is None or self._foreign(stored) or not self._must_reseed(stored, env_token):
                return pending  # written by settle() after the server's first 200
            if not accept(pending.token):
                return stored
        return self._write_pending(env_token) or pending

    def settle(self, env_token: str, token: str) -> None:
        """The server just accepted ``token``: write the record ``current`` left unsaved for it."""
        if (pending := self._pending(env_token)[1]) is not None and pending.token == token:
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
        """What ``current`` would use, writing and asking nothing; a token not yet stored: age 0."""
        stored, pending = self._pending(env_token)
        return pending or cast(StoredToken, stored)

    def _pending(self, env_token: str) -> tuple[StoredToken | None, StoredToken | None]:
        """The store as read, and the record to write before it can be used (``None``: none)."""
        if (stored := self._read_any()) and self._foreign(stored) and stored.token != env_token:
            self._refuse(stored)  # another server's token is never sent here
        if stored is not None and not self._must_reseed(stored, env_token):
            return stored, replace(stored, origin=self.origin) if self._foreign(stored) else None
        if not env_token:
            raise TokenStoreError(
                f"Token store {self.where} is empty and {self.token_variable} is not set: set it "
                "to a token from your Field-Sales profile (API tab)."
            )
        new = StoredToken(
            token=env_token,
            issued_at=datetime.now(UTC),
            env_fingerprint=fingerprint(env_token),
            origin=self.origin or (stored.origin if stored else None),
        )
        if stored is None or self._foreign(stored):
            return stored, new
        if stored.token == env_token:  # the environment set to the stored token: same age
            return stored, replace(stored, env_fingerprint=new.env_fingerprint, origin=new.origin)
        retired = (*stored.retired_env_fingerprints, stored.env_fingerprint)
        # The environment tokens the store has moved past: the last 20, a bounded history.
        return stored, replace(new, retired_env_fingerprints=retired[-20:])

    @staticmethod
    def _must_reseed(stored: StoredToken, env_token: str) -> bool:
        """A new environment token, one this store never saw, means a person regenerated it."""
        seen = (stored.env_fingerprint, *stored.retired_env_fingerprints)
        return bool(env_token) and fingerprint(env_token) not in seen

    def wait_for_renewal(self, timeout_s: float) -> None:
        """After a 401: let a renewal in progress finish (best effort, up to ``timeout_s``)."""
        with contextlib.suppress(TokenStoreError), self._locked(timeout_s, wait=True):
            pass

    def rotate(
        self,
        env_token: str,
        renew: Callable[[str], str],
        *,
        renew_after: timedelta,
        lock_timeout_s: float = LOCK_TIMEOUT_S,
    ) -> Rotation:
        """Renew the token if older than ``renew_after``, once across processes: ``renew(old)``
        invalidates the old token, so the store is re-read under the lock and the write prepared
        before it is called."""
        with self._locked(lock_timeout_s):
            stored = self.peek(env_token)
            now = datetime.now(UTC)
            if stored.age(now) < renew_after and not from_the_future(
                stored.issued_at, now, "issued_at"
            ):
                return Rotation(renewed=False, stored=stored)
            renewed = replace(stored, issued_at=now, source="renewal")
            with self._prepared_write(renewed) as commit:  # what fails here, fails unrenewed
                renewed = replace(renewed, token=renew(stored.token))
                try:
                    self._write_atomically(renewed, commit)
                except TokenStoreError as exc:
                    raise TokenStoreError(
                        f"{exc} The stored token was renewed, so invalid: fix the store and set "
                        f"{self.token_variable} to a token regenerated in the API tab."
                    ) from None
            return Rotation(renewed=True, stored=renewed)

    def _write_atomically(self, stored: StoredToken, commit: Commit | None = None) -> None:
        """Write ``stored`` through ``commit`` (prepared earlier), or a write prepared now."""
        with contextlib.nullcontext(commit) if commit else self._prepared_write(stored) as write:
            write(stored)

    @contextlib.contextmanager
    def _prepared_write(self, shape: StoredToken) -> Iterator[Commit]:
        """Everything a write needs that can fail, done before the caller's irreversible step."""
        try:
            replace(shape, token="prepared").encode()
        except (TypeError, ValueError, msgspec.EncodeError) as exc:
            raise TokenStoreError(
                f"Token store {self.where}: the record cannot be encoded ({exc}); this is a bug, "
                "please report it."
            ) from None
        with self._open_write() as commit:
            yield commit


class FileTokenStore(TokenStore):
    """The token file at ``path`` (symlinks resolved) and its lock ``<path>.lock``."""

    def __init__(
        self, path: Path | str, origin: str | None = None, variables: Mapping[str, str] = {}
    ):
        super().__init__(origin, variables)
        self.given_path = Path(path)
        try:
            self.path = self.given_path.resolve()
        except (OSError, RuntimeError) as exc:  # a symlink loop (RuntimeError before 3.13)
            raise TokenStoreError(
                f"Token store {self.given_path} cannot be resolved ({exc}); point "
                f"{self.variable} (token_store_path) at a file or a link to one."
            ) from None
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        self.where = str(self.path)
        if self.given_path.absolute() != self.path:
            self.where += f" (reached through {self.given_path})"

    def _read_any(self) -> StoredToken | None:
        """The file (no lock: it is only replaced whole), if its owner alone may read it."""
        try:  # the path is resolved already: a link put in its place since is not followed
            fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            with os.fdopen(fd, "rb") as file:
                st = os.fstat(fd)
                raw = file.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise self._failed("read", exc) from None
        if os.name == "posix" and st.st_uid != os.geteuid():
            raise TokenStoreError(
                f"Token store {self.where} is owned by another user (uid {st.st_uid}): `chown` it "
                f"to uid {os.geteuid()}, or delete it (seeded again from {self.token_variable})."
            )
        if os.name == "posix" and (mode := stat.S_IMODE(st.st_mode)) & 0o077:
            raise TokenStoreError(
                f"Token store {self.where} is open to other users (mode {mode:04o}) and holds the "
                f"API token: run `chmod 600 {self.path}`; regenerate the token if in doubt."
            )
        return StoredToken.decode(raw, self.path, self.token_variable)

    @contextlib.contextmanager
    def _locked(self, timeout_s: float = LOCK_TIMEOUT_S, wait: bool = False) -> Iterator[None]:
        if wait and not self.lock_path.exists():  # never renewed here: nothing to wait for
            yield
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            held = FileLock(self.lock_path, timeout=timeout_s, mode=0o600).acquire()
        except Timeout:
            raise self._lock_timed_out(timeout_s) from None
        except OSError as exc:
            raise self._failed("lock", exc) from None
        with held:  # released on the way out
            self._finish_dead_writes()
            yield

    def _finish_dead_writes(self) -> None:
        """Dead writers' temporary files: one newer than the store is a killed renewal's (the
        server already rotated the token) and is committed; any other is removed."""
        for leftover in self.path.parent.glob(f".{self.path.name}.*.tmp"):
            try:
                candidate = StoredToken.decode(leftover.read_bytes(), leftover, "")
                stored = self.read()
                newer = not self._foreign(candidate) and (
                    stored is None or candidate.issued_at > stored.issued_at
                )
            except (OSError, TokenStoreError):
                newer = False
            if newer:
                os.replace(leftover, self.path)
                _fsync_directory(self.path.parent)
            else:
                leftover.unlink(missing_ok=True)

    @contextlib.contextmanager
    def _open_write(self) -> Iterator[Commit]:
        """A 0600 temporary file beside the store; ``commit(record)`` writes, fsyncs, renames."""
        try:  # mkstemp opens with O_EXCL and mode 0600 whatever the umask
            fd, tmp_name = tempfile.mkstemp(
                dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp"
            )
        except OSError as exc:
            raise TokenStoreError(
                f"Token store {self.where} cannot be written ({exc.strerror}): fix its "
                f"directory's permissions or space, or set {self.variable} to a writable path."
            ) from None
        file = os.fdopen(fd, "wb")

        def commit(record: StoredToken) -> None:
            try:
                with file:
                    file.write(record.encode())
                    file.flush()
                    os.fsync(fd)
                pause_at("token_store")
                os.replace(tmp_name, self.path)
            except OSError as exc:
                raise self._failed("write", exc) from None
            _fsync_directory(self.path.parent)

        try:
            yield commit
        finally:
            file.close()
            with contextlib.suppress(OSError):  # not committed (else gone: writes hold the lock)
                os.unlink(tmp_name)


def _fsync_directory(directory: Path) -> None:
    """Make a rename durable; best effort (some filesystems and Windows refuse it)."""
    with contextlib.suppress(OSError):
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
