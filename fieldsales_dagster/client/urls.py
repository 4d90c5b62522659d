"""The base URL: validated once, ``http://`` only for loopback hosts."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from fieldsales_dagster.client.errors import FieldSalesAPIError, InsecureURLError


def _is_loopback(host: str) -> bool:
    if host.lower() in {"localhost", "localhost.localdomain"}:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def validate_base_url(base_url: str) -> str:
    """The base URL without a trailing slash; ``http://`` only for loopback hosts."""
    parts = urlsplit(base_url.strip())
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise FieldSalesAPIError(
            f"FIELDSALES_BASE_URL must be an https:// URL such as https://example.com, got "
            f"{base_url!r}."
        )
    if parts.scheme == "http" and not _is_loopback(parts.hostname):
        raise InsecureURLError(
            f"Refusing plain http:// to {parts.hostname}: the API token would travel in clear "
            "text. Use https:// (plain http is allowed for loopback hosts only)."
        )
    return base_url.strip().rstrip("/")
