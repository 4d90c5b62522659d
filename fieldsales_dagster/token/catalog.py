"""The token store as a row per lake of the PostgreSQL catalog (docs/token-lifecycle.md), owned
by the catalog's role with PUBLIC's rights revoked (one another role owns or may use is refused).
The lock is the row's (``SELECT ... FOR UPDATE`` around read, ``generatetoken``, write, commit):
a host that dies holding it loses its connection, and the lock with it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from fieldsales_dagster.catalogs import POSTGRES_PREFIX
from fieldsales_dagster.token.store import (
    LOCK_TIMEOUT_S,
    Commit,
    FileTokenStore,
    StoredToken,
    TokenStore,
    TokenStoreError,
)

try:  # the production extra's (deploy/README.md): a file store needs none of it
    import psycopg2  # type: ignore[import-untyped]
    import psycopg2.errors  # type: ignore[import-untyped]
    import psycopg2.extensions  # type: ignore[import-untyped]
except ImportError:  # pragma: no cover - the test extra installs it
    psycopg2 = None

#: What ``token_store_path`` (``FIELDSALES_TOKEN_STORE``) holds to keep the token in the catalog.
CATALOG_STORE = "catalog"
TABLE = "fieldsales_token.token_store"
_SETUP = f"""CREATE SCHEMA IF NOT EXISTS fieldsales_token;
REVOKE ALL ON SCHEMA fieldsales_token FROM PUBLIC;
CREATE TABLE IF NOT EXISTS {TABLE} (lake text PRIMARY KEY, record text,
    updated_at timestamptz NOT NULL DEFAULT now());
REVOKE ALL ON TABLE {TABLE} FROM PUBLIC;"""
#: The table's owner, the role connected, and every other role the table grants a right to.
_PRIVILEGES = f"""SELECT pg_get_userbyid(c.relowner), current_user, ARRAY(
    SELECT DISTINCT CASE a.grantee WHEN 0 THEN 'PUBLIC' ELSE pg_get_userbyid(a.grantee) END
    FROM aclexplode(c.relacl) AS a WHERE a.grantee <> c.relowner ORDER BY 1)
FROM pg_class AS c WHERE c.oid = to_regclass('{TABLE}')"""
_WRITE = f"UPDATE {TABLE} SET record = %s, updated_at = now() WHERE lake = %s"
_INSERT = f"INSERT INTO {TABLE} (lake) VALUES (%s) ON CONFLICT DO NOTHING"
#: Per process and thread, the connections that read the row (a request reads it each time).
_readers = threading.local()


class CatalogTokenStore(TokenStore):
    """The row ``ducklake_schema`` in the database ``ducklake_catalog``
    (``postgres:<libpq keywords>``) opens."""

    def __init__(
        self,
        ducklake_catalog: str | None = None,
        ducklake_password_env_var: str = "FIELDSALES_DUCKLAKE_PASSWORD",
        ducklake_schema: str | None = None,
        origin: str | None = None,
        variables: Mapping[str, str] = {},
    ):
        super().__init__(origin, variables)
        self.lake = ducklake_schema or "public"
        self.password_env_var = ducklake_password_env_var
        if psycopg2 is None:
            raise TokenStoreError(
                f"{self.variable}={CATALOG_STORE} needs psycopg2: install the production extra "
                "(pip install 'fieldsales_dagster[production]')."
            )
        if not (catalog := ducklake_catalog or "").startswith(POSTGRES_PREFIX):
            raise TokenStoreError(
                f"{self.variable}={CATALOG_STORE} needs {self.catalog_variable}=postgres:dbname="
                f"... host=... user=...; with one host, set {self.variable} to a file path."
            )
        dsn = catalog.removeprefix(POSTGRES_PREFIX)
        try:
            self.keywords: dict[str, str] = psycopg2.extensions.parse_dsn(dsn)
        except psycopg2.ProgrammingError:
            raise TokenStoreError(
                f"{self.catalog_variable} is not postgres: with a libpq connection string "
                "(dbname=... host=... user=...)."
            ) from None
        if "password" in self.keywords:  # shown as the catalog spells it, unless with a password
            dsn = " ".join(f"{k}={v}" for k, v in self.keywords.items() if k != "password")
        self.where = f"row {self.lake!r} of {TABLE} in the catalog database ({dsn.strip()})"
        self._held: tuple[Any, str | None] | None = None

    def _connect(self) -> Any:
        password = os.environ.get(self.password_env_var)
        keywords = {**self.keywords, **({"password": password} if password else {})}
        try:
            return psycopg2.connect(connect_timeout=10, **keywords)
        except psycopg2.Error as exc:
            raise TokenStoreError(
                f"{self._failed('connect to', exc)} Check {self.catalog_variable} and the password "
                f"in {self.password_env_var}."
            ) from None

    def _check_privileges(self, cur: Any) -> bool:
        """Whether the table exists; refuses one another role owns or may use."""
        cur.execute(_PRIVILEGES)
        if (row := cur.fetchone()) is None:
            return False
        owner, user, others = row
        if owner != user:
            raise TokenStoreError(
                f"The token store, {self.where}, is owned by role {owner}, not {user}: run `ALTER "
                f"TABLE {TABLE} OWNER TO {user}`, or drop it (seeded from {self.token_variable})."
            )
        if others:
            raise TokenStoreError(
                f"The token store, {self.where}, grants rights to {', '.join(others)}: run `REVOKE "
                f"ALL ON {TABLE} FROM {', '.join(others)}`; regenerate the token if in doubt."
            )
        return True

    def _reader(self, fresh: bool = False) -> Any:
        key = (os.getpid(), tuple(self.keywords.items()), os.environ.get(self.password_env_var))
        readers = _readers.__dict__.setdefault("connections", {})
        conn = readers.get(key)
        if fresh or conn is None or conn.closed:
            with contextlib.suppress(Exception):
                conn.close()
            conn = readers[key] = self._connect()
            conn.autocommit = True
        return conn

    def _read_any(self) -> StoredToken | None:
        try:
            if self._held is not None:
                raw = self._select(self._held[0])
            else:
                try:
                    raw = self._select(self._reader())
                except (psycopg2.OperationalError, psycopg2.InterfaceError):
                    raw = self._select(self._reader(fresh=True))  # the server closed the cached
        except psycopg2.Error as exc:
            raise self._failed("read", exc) from None
        return None if raw is None else StoredToken.decode(raw, self.where, self.token_variable)

    def _select(self, conn: Any, lock: str = "") -> str | None:
        with conn.cursor() as cur:
            if not self._check_privileges(cur):
                return None
            cur.execute(f"SELECT record FROM {TABLE} WHERE lake = %s {lock}", (self.lake,))
            row = cur.fetchone()
        return None if row is None else row[0]

    @contextlib.contextmanager
    def _locked(self, timeout_s: float = LOCK_TIMEOUT_S, wait: bool = False) -> Iterator[None]:
        """The row's lock, in a transaction committed by a write (else rolled back); ``wait``: a
        share lock, granted once a renewal in progress has committed."""
        with contextlib.closing(self._connect()) as conn:  # closing rolls back the uncommitted
            try:
                with conn.cursor() as cur:
                    cur.execute("SET idle_in_transaction_session_timeout = 0")
                    cur.execute("SET lock_timeout = %s", (f"{int(timeout_s * 1000)}ms",))
                    if not wait:
                        if not self._check_privileges(cur):
                            cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (TABLE,))
                            cur.execute(_SETUP)
                            conn.commit()
                            self._check_privileges(cur)
                        # A first seed has no row to lock yet: an empty one, gone unless written.
                        cur.execute(_INSERT, (self.lake,))
                held = self._select(conn, "FOR SHARE" if wait else "FOR UPDATE")
            except psycopg2.errors.LockNotAvailable:
                raise self._lock_timed_out(timeout_s) from None
            except psycopg2.Error as exc:
                raise self._failed("lock", exc) from None
            self._held = (conn, held)
            try:
                yield
            finally:
                self._held = None

    @contextlib.contextmanager
    def _open_write(self) -> Iterator[Commit]:
        """``commit(record)`` updates the row and commits; a broken connection is retried once
        on a new one, if the row is as it was read (or as this commit wrote it)."""
        assert self._held is not None, "the row is written under its lock only"
        conn, read = self._held

        def commit(record: StoredToken) -> None:
            data = record.encode().decode()
            try:
                with conn.cursor() as cur:
                    cur.execute(_WRITE, (data, self.lake))
                conn.commit()
                return
            except psycopg2.Error as exc:
                first = exc
            with (
                contextlib.suppress(psycopg2.Error, TokenStoreError),
                contextlib.closing(self._connect()) as again,
                again.cursor() as cur,
            ):
                # As read (a lost connection), or as written (a lost answer to the COMMIT).
                where = " AND (record IS NOT DISTINCT FROM %s OR record = %s)"
                cur.execute(_WRITE + where, (data, self.lake, read, data))
                again.commit()
                if cur.rowcount == 1:
                    return
            raise self._failed("write", first)

        yield commit

    def import_file(self, path: str) -> StoredToken:
        """Move the file store at ``path`` into the row, unless the row holds another token."""
        if (stored := FileTokenStore(path).read()) is None:
            raise TokenStoreError(f"There is no token store at {path}: nothing to import.")
        with self._locked():
            if (held := self._read_any()) is not None and held.token != stored.token:
                raise TokenStoreError(
                    f"The token store, {self.where}, holds another token already (issued "
                    f"{held.issued_at:%Y-%m-%d %H:%M} UTC), so {path} was not imported."
                )
            self._write_atomically(stored)
        return stored


def open_token_store(
    path: str, origin: str | None = None, variables: Mapping[str, str] = {}, **row: Any
) -> TokenStore:
    """The store ``token_store_path`` names: ``catalog``, the lake's row (``row``: the
    ``ducklake_*`` keywords of ``CatalogTokenStore``); else the file."""
    if path.strip() != CATALOG_STORE:
        return FileTokenStore(path, origin, variables)
    return CatalogTokenStore(origin=origin, variables=variables, **row)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m fieldsales_dagster.token.catalog")
    commands = parser.add_subparsers(dest="command", required=True)
    command = commands.add_parser("import", help="move a token store file into the catalog")
    command.add_argument("file", help="the file store (FIELDSALES_TOKEN_STORE until now)")
    command.add_argument("--schema", help="the lake's ducklake_schema, if it has one")
    args = parser.parse_args(argv)
    catalog = os.environ.get("FIELDSALES_DUCKLAKE_CATALOG", "")
    try:
        store = CatalogTokenStore(catalog, ducklake_schema=args.schema)
        stored = store.import_file(args.file)
    except TokenStoreError as exc:
        raise SystemExit(str(exc)) from None
    print(
        f"Imported the token of {stored.origin or 'its server'} (issued "
        f"{stored.issued_at:%Y-%m-%d %H:%M} UTC) into the token store, {store.where}. Set "
        f"FIELDSALES_TOKEN_STORE={CATALOG_STORE} on every host, then delete {args.file}."
    )


if __name__ == "__main__":
    main()
