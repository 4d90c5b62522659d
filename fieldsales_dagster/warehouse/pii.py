"""Personal data (names, emails, client IPs): ``core.*`` columns tagged ``pii`` are kept, hashed
(HMAC-SHA256 with ``pii_hash_key``: joins still work, values cannot be guessed without the key)
or dropped (NULL); ``mart.*`` inherits; ``redact_pii_in_raw`` nulls ``PII_PAYLOAD_KEYS`` in raw.
"""

from __future__ import annotations

import hashlib

import duckdb

from fieldsales_dagster.settings import named
from fieldsales_dagster.warehouse.quoting import qualified
from fieldsales_dagster.warehouse.rows import one_row

#: Redacted anywhere in a raw payload (eventUser[], point_of_sale.address, eventStateHistory[]).
PII_PAYLOAD_KEYS = ("firstName", "lastName", "email", "ip")
#: Such a key followed by a JSON string value (escapes included); other value types are left alone.
PII_VALUE = rf'"({"|".join(PII_PAYLOAD_KEYS)})"(\s*):(\s*)"(?:[^"\\]|\\.)*"'

#: A short key could be guessed, and then every hash with it.
MIN_HASH_KEY_CHARS = 16

_BLOCK = 64  # SHA-256 block size, in bytes


class PiiSettingError(ValueError):
    """The privacy settings cannot be applied as given."""


def check_hash_key(key: str | None, variable: str = "FIELDSALES_PII_HASH_KEY") -> None:
    """A ``PiiSettingError`` naming ``variable`` unless ``key`` is long enough."""
    key = (key or "").strip()
    if len(key) < MIN_HASH_KEY_CHARS:
        raise PiiSettingError(
            f"pii: hash needs a secret key in {variable} (pii_hash_key) of {MIN_HASH_KEY_CHARS} "
            f"characters or more, not {len(key)}: set a long random one and keep it (a new key "
            f"changes every hash), or set {named('FIELDSALES_PII')} to keep or drop."
        )


def hmac_pads(key: str) -> dict[str, bytes]:
    """The HMAC padded keys, as ``hmac_sql``'s parameters."""
    check_hash_key(key)
    raw = key.encode()
    raw = (hashlib.sha256(raw).digest() if len(raw) > _BLOCK else raw).ljust(_BLOCK, b"\0")
    return {"pii_ipad": bytes(b ^ 0x36 for b in raw), "pii_opad": bytes(b ^ 0x5C for b in raw)}


def hmac_sql(expression: str) -> str:
    """HMAC-SHA256 of ``expression`` as hex: DuckDB has no HMAC, so RFC 2104 spelled out."""
    return f"sha256($pii_opad || unhex(sha256($pii_ipad || encode({expression}))))"


def redact_pii_keys(conn: duckdb.DuckDBPyConnection, table: str) -> int:
    """Null ``PII_PAYLOAD_KEYS``' string values at any depth of ``payload``; rows changed."""
    mentions = " OR ".join(f"contains(payload::VARCHAR, '\"{key}\"')" for key in PII_PAYLOAD_KEYS)
    return one_row(
        conn,
        f"UPDATE {qualified(table)} "
        r"""SET payload = regexp_replace(payload::VARCHAR, $pattern, '"\1"\2:\3null', 'g')::JSON """
        f"WHERE ({mentions}) AND regexp_matches(payload::VARCHAR, $pattern)",
        {"pattern": PII_VALUE},
    )[0]
