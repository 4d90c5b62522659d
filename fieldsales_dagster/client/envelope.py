"""A list page's body -> its items (raw JSON) and total, whatever envelope holds them (the event
list's is not documented): a bare list, or an object holding one list and maybe a total."""

from __future__ import annotations

import functools
import re
import secrets
import threading
from array import array
from dataclasses import dataclass, field

import msgspec
import xxhash

from fieldsales_dagster.client.endpoints import TOTAL_KEYS, ListEndpoint
from fieldsales_dagster.client.errors import PageFormatError


@dataclass
class Page:
    """One answer of a list endpoint: its items as raw JSON, and the total it reported."""

    skip: int
    items: list[msgspec.Raw]
    total: int | None
    nbytes: int
    #: Each item's ``_id`` and extra-column keys (``loading.lists.item_keys``), where decoded.
    keys: list[tuple[str | int | float | None, ...]] | None = None
    digest: int | None = None
    #: The items a page holds, where they were not split out (a body in ``fetch_page``'s ``known``).
    count: int | None = None
    #: Each kept item's digest (``loading.lists.item_digests``), where the loader admitted it.
    digests: array[int] | None = None

    @property
    def n(self) -> int:
        return len(self.items) if self.count is None else self.count


@dataclass
class ListStats:
    """What one pass over a list cost; counts go to the ``parent`` too (the load's sum)."""

    requests: int = 0
    retries: int = 0
    pages: int = 0
    items: int = 0
    bytes: int = 0
    token_rereads: int = 0
    #: Lone UTF-16 surrogate escapes replaced by U+FFFD (strings a server cut mid-emoji).
    surrogates_replaced: int = 0
    totals_seen: list[int] = field(default_factory=list)
    #: A request sent after another had answered reported a smaller total: items were deleted.
    total_decreased: bool = False
    #: Every answered page as ``(skip, items, total)``: where the list moved under the pass.
    answers: list[tuple[int, int, int | None]] = field(default_factory=list)
    parent: ListStats | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                setattr(self, name, getattr(self, name) + delta)
        if self.parent is not None:
            self.parent.count(**deltas)


#: The key of ``digest`` by default, drawn per process: such digests are compared within a run,
#: never stored (a stored item's are keyed by what its row is made of: raw_load.digest_key).
PROCESS_KEY = secrets.randbits(64)


def digest(data: msgspec.Raw | bytes, key: int = PROCESS_KEY) -> int:
    """XXH3 of bytes as received, keyed: ten times as fast as ``hash(bytes(item))``."""
    return xxhash.xxh3_64_intdigest(data, key)


_ENVELOPE = msgspec.json.Decoder(list[msgspec.Raw] | dict[str, msgspec.Raw])
_LIST = msgspec.json.Decoder(list[msgspec.Raw])
_ANY = msgspec.json.Decoder()


#: An escaped backslash (consumed whole: keeps the scan aligned), a surrogate pair, or a lone one.
_SURROGATE_ESCAPE = re.compile(
    rb"\\\\"
    rb"|\\u[dD][89abAB][0-9a-fA-F]{2}(?:\\u[dD][c-fC-F][0-9a-fA-F]{2})?"
    rb"|\\u[dD][c-fC-F][0-9a-fA-F]{2}"
)


def replace_lone_surrogates(body: bytes) -> tuple[bytes, int]:
    """``body`` with every lone UTF-16 surrogate escape replaced by ``\\ufffd``, and how many:
    Node writes them for a string cut mid-emoji, and strict decoders (msgspec, DuckDB) refuse them.
    """
    replaced = 0

    def fix(match: re.Match[bytes]) -> bytes:
        nonlocal replaced
        text = match.group()
        if text == b"\\\\" or len(text) == 12:  # an escaped backslash, or a pair
            return text
        replaced += 1
        return b"\\ufffd"

    return _SURROGATE_ESCAPE.sub(fix, body), replaced


@functools.cache
def _documented_envelope(endpoint: ListEndpoint) -> msgspec.json.Decoder | None:
    """A decoder of the envelope the API document shows for ``endpoint``, if it shows one."""
    if not endpoint.items_key or not endpoint.total_key:
        return None
    fields = [
        ("items", list[msgspec.Raw] | None, msgspec.field(default=None, name=endpoint.items_key)),
        ("total", int | None, msgspec.field(default=None, name=endpoint.total_key)),
    ]
    return msgspec.json.Decoder(msgspec.defstruct(f"{endpoint.name.title()}Page", fields))


def split_envelope(
    body: bytes, endpoint: ListEndpoint, where: str
) -> tuple[list[msgspec.Raw], int | None]:
    """Items and total of one page body: ``msgspec.DecodeError`` for incomplete JSON (retried),
    ``PageFormatError`` for complete JSON that holds no list of items."""
    if (documented := _documented_envelope(endpoint)) is not None:
        # One pass for the documented shape; anything else takes the general path below.
        try:
            page = documented.decode(body)
            if page.items is not None and page.total is not None and page.total >= 0:
                return page.items, page.total
        except msgspec.ValidationError:
            pass
    try:
        doc = _ENVELOPE.decode(body)
    except msgspec.ValidationError as exc:
        raise PageFormatError(
            f"{where} answered JSON that is neither a list of items nor an object ({exc})."
        ) from None
    if isinstance(doc, list):
        return doc, None

    list_keys = [key for key, value in doc.items() if bytes(value).lstrip()[:1] == b"["]
    if endpoint.items_key in list_keys:
        list_keys = [endpoint.items_key]
    if len(list_keys) != 1:
        found = ", ".join(sorted(doc)) or "none"
        why = "no list" if not list_keys else f"several lists ({', '.join(sorted(list_keys))})"
        raise PageFormatError(
            f"{where} answered an object with {why} of items (keys: {found}); expected a list "
            f"of items{f' under {endpoint.items_key!r}' if endpoint.items_key else ''}."
        )
    items = _LIST.decode(doc[list_keys[0]])

    for key in (endpoint.total_key, *TOTAL_KEYS):
        value = _ANY.decode(doc[key]) if key and key in doc else None
        if isinstance(value, str) and value.isdigit():
            value = int(value)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return items, value
    return items, None
