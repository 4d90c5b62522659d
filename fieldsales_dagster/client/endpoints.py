"""The Field-Sales API as data: every endpoint path and raw table, written once."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class ListEndpoint:
    """One paged list of the API and the raw table it lands in."""

    name: str
    path: str
    #: Keys of the items and of the total in an object envelope, as documented (else ``None``).
    items_key: str | None
    total_key: str | None
    raw_table: str
    #: Extra VARCHAR columns of the raw table: column name -> key of the item.
    extra_columns: tuple[tuple[str, str], ...] = ()
    #: Query parameters sent with every page (filters such as ``eventId``), besides skip/limit.
    params: tuple[tuple[str, str | int], ...] = ()

    def with_params(self, **params: str | int) -> ListEndpoint:
        """The same list, filtered: ``TRANSACTIONS.with_params(eventId=...)``."""
        return replace(self, params=(*self.params, *params.items()))

    @property
    def schema(self) -> str:
        return self.raw_table.split(".", 1)[0]

    @property
    def table(self) -> str:
        return self.raw_table.split(".", 1)[1]


TRANSACTIONS = ListEndpoint(
    name="transactions",
    path="/public/v1/api/transaction/all",
    items_key="transactions",
    total_key="count",
    raw_table="raw.transactions",
    extra_columns=(("event_id", "eventId"),),
)
EVENTS = ListEndpoint(
    name="events",
    path="/public/v1/api/event/all",
    items_key=None,
    total_key=None,
    raw_table="raw.events",
)
EVENT_GROUPS = ListEndpoint(
    name="event_groups",
    path="/public/v1/api/eventgroup/all",
    items_key="data",
    total_key="total",
    raw_table="raw.event_groups",
)

LIST_ENDPOINTS: tuple[ListEndpoint, ...] = (EVENTS, TRANSACTIONS, EVENT_GROUPS)

#: Keys a server may use for the total number of items (section 4 of the API document).
TOTAL_KEYS: tuple[str, ...] = ("count", "total")

GENERATE_TOKEN_PATH = "/api/bearer/generatetoken"
CHECK_TOKEN_PATH = "/api/sellout/all"
