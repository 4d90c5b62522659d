"""The base URL: validated once, with the parser that makes the connection (urllib3's).

Another parser would let ``http://evil.example:80\\@127.0.0.1`` pass as loopback while urllib3
connects to ``evil.example``: what two parsers could read differently is refused, and the URL is
rebuilt from urllib3's parts. It imports nothing of the project.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from urllib3.exceptions import LocationParseError
from urllib3.util import parse_url

_EXAMPLE = "an https:// URL such as https://example.com"


class InsecureURLError(ValueError):
    """``http://`` to a host other than loopback."""


@dataclass(frozen=True)
class Origin:
    """Scheme, host and port: where a request goes, and what a redirect may not leave."""

    scheme: str
    host: str
    port: int

    def __str__(self) -> str:
        default = {"http": 80, "https": 443}[self.scheme]
        return f"{self.scheme}://{self.host}" + (f":{self.port}" if self.port != default else "")


def is_loopback_host(host: str) -> bool:
    if host.lower() in {"localhost", "localhost.localdomain"}:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def refuse_plain_http(scheme: str, host: str, carried: str) -> None:
    """The one rule for every URL the project connects to (the API's base URL, the object
    store's endpoint): plain ``http://`` only to a loopback host, since ``carried`` would travel
    in clear text."""
    if scheme == "http" and not is_loopback_host(host):
        raise InsecureURLError(
            f"plain http:// to {host} would carry {carried} in clear text: use https:// "
            "(plain http:// is for loopback hosts only)"
        )


def _bad(name: str, base_url: str, why: str) -> ValueError:
    return ValueError(
        f"{name} must be {_EXAMPLE} (plain http:// only for loopback); {base_url!r} {why}."
    )


@functools.lru_cache(maxsize=256)  # asked for on every request: parsing it cost ~0.1 ms each time
def origin_of(url: str) -> Origin | None:
    """The origin urllib3 would connect to for ``url``, or ``None`` if it cannot parse it."""
    try:
        parts = parse_url(url)
    except LocationParseError:
        return None
    if parts.scheme not in {"http", "https"} or not parts.host:
        return None
    return Origin(parts.scheme, parts.host, parts.port or {"http": 80, "https": 443}[parts.scheme])


@functools.lru_cache(maxsize=256)  # pure; a refused URL raises every time (nothing is cached)
def validate_base_url(base_url: str, name: str = "FIELDSALES_BASE_URL") -> str:
    """The base URL, rebuilt from urllib3's parts without a trailing slash; ``name``: what its
    errors call it."""
    url = base_url.strip()
    if "@" in url:  # never echoing the URL: what precedes the @ may be a password
        raise ValueError(f"{name} must be {_EXAMPLE}, without user@: remove the part before the @.")
    # A backslash (parsers read it differently), whitespace, a control or non-ASCII character
    # (a domain goes in its xn-- form), a query or a fragment.
    if odd := re.search(r"[\x00-\x20\x7f\\?#]|[^\x00-\x7f]", url):
        raise _bad(name, url, f"holds {odd.group()!r}: give the instance's address only, in ASCII")
    # Belt and braces: the standard library's parser must see the same origin as urllib3.
    try:
        parts, other = parse_url(url), urlsplit(url)
        other_port = other.port
    except (LocationParseError, ValueError):
        raise _bad(name, url, "cannot be parsed") from None
    if not parts.host or not url.lower().startswith(("http://", "https://")):
        raise _bad(name, url, "does not start with http:// or https:// and a host")
    if (other.hostname or "").lower() != parts.host.strip("[]").lower() or other_port != parts.port:
        raise _bad(name, url, "is read differently by different URL parsers")
    refuse_plain_http(str(parts.scheme), parts.host, "the API token")
    port = f":{parts.port}" if parts.port is not None else ""
    return f"{parts.scheme}://{parts.host}{port}{(parts.path or '').rstrip('/')}"


def endpoint_origin(endpoint: str, variable: str = "") -> str:
    """An object store's ``endpoint`` (``host:port``, reached over https, or an http(s) URL) as
    the origin DuckDB connects to; ``variable``: where it was read, named in the error."""
    where = f" ({variable})" if variable else ""
    origin = origin_of(endpoint if "://" in endpoint else f"https://{endpoint}")
    if origin is None:
        raise ValueError(f"the object store's endpoint{where} is neither host:port nor a URL")
    refuse_plain_http(origin.scheme, origin.host, f"the lake's files{where}")
    return str(origin)
