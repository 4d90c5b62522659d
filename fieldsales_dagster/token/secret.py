"""The API token as a secret: cleaned where it enters, masked wherever text might carry it."""

from __future__ import annotations

import itertools
import unicodedata
from collections.abc import Iterable

MASK = "***"
#: A run of this many characters of a token is masked anywhere: a cut must leave no usable part.
MIN_FRAGMENT = 8


class TokenFormatError(ValueError):
    """A token holds characters no HTTP header can carry. The message never holds the token."""


def _refused(char: str) -> str | None:
    """Why ``char`` cannot be part of a bearer token, or ``None`` if it can."""
    code = ord(char)
    if code > 0xFF:
        return f"a character outside latin-1 ({unicodedata.name(char, 'unnamed')})"
    if code < 0x20 or 0x7F <= code <= 0x9F:
        return "a control character"
    if char.isspace():
        return "a space"
    return None


def clean_token(raw: str | None, source: str) -> str:
    """``raw`` stripped (CRLF env files, mounted secrets); a character inside that a header
    cannot carry is a ``TokenFormatError`` naming ``source`` and its position, never the token.
    An empty token stays empty: the caller decides."""
    token = (raw or "").strip()
    for position, char in enumerate(token, start=1):
        if (why := _refused(char)) is not None:
            bearer = token[:7].lower() == "bearer " and why == "a space"
            hint = " (set the token alone, without 'Bearer ')" if bearer else ""
            raise TokenFormatError(
                f"The API token from {source} holds {why} at position {position} of {len(token)}"
                f"{hint}: copy it again from your Field-Sales profile's API tab, without quotes."
            )
    return token


def mask_secrets(text: str, secrets: Iterable[str | None], limit: int | None = None) -> str:
    """``text`` with every secret, and every ``MIN_FRAGMENT``-long fragment of one, masked; then
    cut to ``limit`` (cutting first could leave a part that no longer matches)."""
    usable = sorted({s for s in secrets if s}, key=len, reverse=True)
    for secret in usable:
        text = text.replace(secret, MASK)
    for secret in usable:  # one shorter than MIN_FRAGMENT has no fragments
        grams = {secret[i : i + MIN_FRAGMENT] for i in range(len(secret) - MIN_FRAGMENT + 1)}
        starts = [i for i in range(len(text)) if text[i : i + MIN_FRAGMENT] in grams]
        hidden = {j for i in starts for j in range(i, i + MIN_FRAGMENT)}
        runs = itertools.groupby(range(len(text)), hidden.__contains__)  # touching runs: one
        text = "".join(MASK if masked else "".join(text[i] for i in run) for masked, run in runs)
    if limit is not None and len(text) > limit:
        text = text[:limit] + "..."
    return text
