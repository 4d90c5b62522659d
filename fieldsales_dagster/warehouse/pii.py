"""Personal data in the warehouse: what counts as such, how it is kept, hashed, dropped or redacted.

Personal data here means people's names, email addresses and client IP addresses. In ``core.*``
the columns holding them are tagged ``pii`` in their table's column declaration
(``sql/<table>.yaml``) and governed by ``FieldSalesWarehouse.pii``:

- ``keep``: stored as received;
- ``hash``: replaced by HMAC-SHA256(``pii_hash_key``, value) as 64 hex digits. The same value gives
  the same hash under the same key, so joins and distinct counts still work, while the value
  cannot be read back or guessed by hashing candidates without the key;
- ``drop``: stored as NULL (the column stays, so queries keep working).

``mart.*`` tables read ``core.*`` only, so they inherit the policy without applying it twice.
In ``raw.*`` the payloads keep the values unless ``redact_pii_in_raw`` is set: then the keys in
``PII_PAYLOAD_KEYS`` are set to JSON ``null`` wherever they occur, before the new table is
swapped in.
"""

from __future__ import annotations

import hashlib

import duckdb

from fieldsales_dagster.settings import named
from fieldsales_dagster.warehouse.quoting import qualified
from fieldsales_dagster.warehouse.rows import one_row

#: Keys of API items whose string values are personal data (eventUser[].firstName/lastName/email,
#: point_of_sale.address.email, eventStateHistory[].ip), redacted anywhere in a raw payload.
PII_PAYLOAD_KEYS = ("firstName", "lastName", "email", "ip")

#: Shortest hash key accepted: a short key could be guessed, and then every hash with it.
MIN_HASH_KEY_CHARS = 16

_BLOCK = 64  # SHA-256 block size, in bytes


class PiiSettingError(ValueError):
    """The privacy settings cannot be applied as given."""


def check_hash_key(key: str | None, variable: str = "FIELDSALES_PII_HASH_KEY") -> str:
    """``key`` if ``pii: hash`` can use it (at least ``MIN_HASH_KEY_CHARS`` characters), else a
    ``PiiSettingError`` naming ``variable``, the variable it is read from."""
    key = (key or "").strip()
    if len(key) < MIN_HASH_KEY_CHARS:
        raise PiiSettingError(
            f"pii: hash needs a secret key in {variable} (pii_hash_key: at least "
            f"{MIN_HASH_KEY_CHARS} characters; it has {len(key)}). Set it to a long random secret "
            f"and keep it (a new key changes every hash), or set {named('FIELDSALES_PII')} to keep "
            "or drop."
        )
    return key


def hmac_pads(key: str) -> dict[str, bytes]:
    """The HMAC inner and outer padded keys, as query parameters for ``hmac_sql``."""
    check_hash_key(key)
    raw = key.encode()
    raw = (hashlib.sha256(raw).digest() if len(raw) > _BLOCK else raw).ljust(_BLOCK, b"\0")
    return {"pii_ipad": bytes(b ^ 0x36 for b in raw), "pii_opad": bytes(b ^ 0x5C for b in raw)}


def hmac_sql(expression: str) -> str:
    """SQL for HMAC-SHA256 of ``expression`` (VARCHAR) as hex; binds ``hmac_pads``' parameters.

    DuckDB has SHA-256 but no HMAC; this is RFC 2104 spelled out: H(opad || H(ipad || message)),
    the same hex digest as Python's ``hmac.new(key, value, hashlib.sha256).hexdigest()``.
    """
    return f"sha256($pii_opad || unhex(sha256($pii_ipad || encode({expression}))))"


def redact_pii_keys(conn: duckdb.DuckDBPyConnection, table: str) -> int:
    """Set every ``PII_PAYLOAD_KEYS`` string value in ``table.payload`` to null; rows changed.

    Matches the keys at any depth, so personal data in shapes the API document does not show is
    redacted too. Only rows that mention a key are rewritten.
    """
    mentions = " OR ".join(f"contains(payload::VARCHAR, '\"{key}\"')" for key in PII_PAYLOAD_KEYS)
    # A key followed by a JSON string value (escapes included); other value types are left alone.
    pattern = rf'"({"|".join(PII_PAYLOAD_KEYS)})"(\s*):(\s*)"(?:[^"\\]|\\.)*"'
    (changed,) = one_row(
        conn,
        f"UPDATE {qualified(table)} "
        r"""SET payload = regexp_replace(payload::VARCHAR, $pattern, '"\1"\2:\3null', 'g')::JSON """
        f"WHERE ({mentions}) AND regexp_matches(payload::VARCHAR, $pattern)",
        {"pattern": pattern},
    )
    return int(changed)
