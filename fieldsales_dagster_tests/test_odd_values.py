"""Odd but valid values from the API: ids of any content, NaN and infinity, values that cannot be
typed. Raw tables keep what was sent; core and mart tables hold typed values or NULL, and checks
count what was NULLed."""

from __future__ import annotations

import duckdb

from fieldsales_dagster.client.endpoints import EVENTS, TRANSACTIONS
from fieldsales_dagster.warehouse.raw_load import load_list
from fieldsales_dagster.warehouse.resource import FieldSalesWarehouse
from fieldsales_dagster_tests import core_payloads as p
from fieldsales_dagster_tests.hostile_lists import HostileServer
from fieldsales_dagster_tests.test_hostile_paging import hostile_api

#: Ids with every kind of character a JSON string can carry.
ODD_EVENT_IDS = ["ev-cr\rhere", "ev-line\nbreak", 'ev-"quoted"', "ev-tab\tand\\backslash"]
ODD_TRANSACTION_IDS = [
    "tx-line\nbreak",
    "tx-crlf\r\n",
    "tx-ctl\x00\x01\x02\x1f",
    '\x02"escaped-looking"',
    "tx-'single' \"double\"",
    "tx-unicode é✓😀\u2028",
    "tx-plain",
]


def _served(documents: dict[str, list[dict]]):
    """A server answering the event and transaction lists with ``documents``' items."""

    def answer(path: str, skip: int, limit: int) -> object:
        if path.endswith("/transaction/all"):
            items = documents["transactions"]
            return {"transactions": items[skip : skip + limit], "count": len(items)}
        if path.endswith("/event/all"):
            return documents["events"][skip : skip + limit]
        return {"data": [], "total": 0}

    return HostileServer(answer)


def test_ids_of_any_content_are_stored_verbatim_in_raw_and_core(tmp_path):
    events = [p.event(event_id) for event_id in ODD_EVENT_IDS]
    transactions = [
        p.transaction(tx_id, event_id=ODD_EVENT_IDS[i % len(ODD_EVENT_IDS)])
        for i, tx_id in enumerate(ODD_TRANSACTION_IDS)
    ]
    documents = {"events": events, "transactions": transactions}
    database = tmp_path / "odd_ids.duckdb"
    warehouse = FieldSalesWarehouse(database=str(database))
    with _served(documents) as server:
        api = hostile_api(server, page_size=1000)
        with warehouse.get_connection() as conn:
            load_list(api, conn, EVENTS)
            load_list(api, conn, TRANSACTIONS)
    p.materialize_core_only(database)

    expected_pairs = sorted((t["_id"], t["eventId"]) for t in transactions)
    assert p.query(database, "SELECT id FROM raw.events ORDER BY id") == [
        (i,) for i in sorted(ODD_EVENT_IDS)
    ]
    assert p.query(database, "SELECT id, event_id FROM raw.transactions ORDER BY id") == (
        expected_pairs
    )
    assert p.query(database, "SELECT event_id FROM core.events ORDER BY event_id") == [
        (i,) for i in sorted(ODD_EVENT_IDS)
    ]
    assert (
        p.query(
            database,
            "SELECT transaction_id, event_id FROM core.transactions ORDER BY transaction_id",
        )
        == expected_pairs
    )
    # Every transaction finds its event.
    assert p.query(
        database,
        "SELECT count(*) FROM core.transactions JOIN core.events USING (event_id)",
    ) == [(len(transactions),)]
    with duckdb.connect(str(database), read_only=True) as conn:
        assert conn.execute(
            "SELECT count(*) FROM raw.transactions WHERE id = md5(payload::VARCHAR)"
        ).fetchone() == (0,)
