"""What the Field-Sales API can do to a load, as exceptions whose messages never carry the token."""

from __future__ import annotations

#: What to do about a refused token; ``{}``: the token's variable (this tenant's).
RENEW_TOKEN_INSTRUCTION = (
    "Regenerate it in your Field-Sales user profile (API tab, refresh button) and set {} to the "
    "new token."
)


class FieldSalesAPIError(RuntimeError):
    """Anything the API did that stops a load. Messages name the endpoint, never the token."""


class AuthenticationError(FieldSalesAPIError):
    """The server refused the token (401) or its rights (403)."""


class PageFormatError(FieldSalesAPIError):
    """A page answered 200 but holds no list of items."""


class NotJSONError(PageFormatError):
    """A complete 200 body that is not JSON (a login page, a proxy's error page): not retried."""


class ResponseTooLargeError(FieldSalesAPIError):
    """A body (once decompressed) larger than ``max_page_bytes``: not retried."""


class RedirectRefusedError(FieldSalesAPIError):
    """A redirect to another origin, a redirect loop, or too many redirects."""


class UnreachableError(FieldSalesAPIError):
    """The host refused connections, could not be resolved, or never accepted one in time."""


class TransientHTTPError(Exception):
    """A failure worth another attempt; ``retry_after``: the server's wish, in seconds;
    ``unreachable``: no connection at all, retried within ``unreachable_budget_s`` only."""

    def __init__(self, message: str, retry_after: float | None = None, unreachable: bool = False):
        super().__init__(message)
        self.retry_after = retry_after
        self.unreachable = unreachable


def token_refused(status: int, where: str, token_variable: str) -> AuthenticationError:
    """The error of a request the server answered with 401 (the token) or 403 (its rights)."""
    why = (
        "refused the API token (HTTP 401): it is invalid, expired or was replaced by a renewal"
        if status == 401
        else "denies the token's user access (HTTP 403): it needs admin rights for the public API"
    )
    instruction = RENEW_TOKEN_INSTRUCTION.format(token_variable)
    return AuthenticationError(f"{where}: the Field-Sales API {why}. {instruction}")
