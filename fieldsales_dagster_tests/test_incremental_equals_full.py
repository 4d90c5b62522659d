"""Issue 48, point 1: whatever changed on the server, every core and mart table a normal run leaves
equals a full rebuild of it from the same raw tables, exactly."""

from __future__ import annotations

from fieldsales_dagster.assets.decode import TRANSACTIONS_DECODED, DecodeRefresh, refresh_decoded
from fieldsales_dagster_tests import core_payloads as p
from fieldsales_dagster_tests.conftest import lake_at


def test_an_even_number_of_rows_loaded_again_at_one_time_is_decoded_again(tmp_path):
    """The first counterexample the property found: a raw table's fingerprint XORed the hashes of
    (id, loaded_at), which DuckDB combines by XOR, so rows stamped alike in an even number left it
    as it was, and the decoded table (so core.transactions) kept their old content."""
    database = tmp_path / "t.duckdb"
    for qty in (1, 2):  # each write stamps the four rows with one loaded_at
        p.write_raw_tables(
            database, transactions=[p.transaction(f"t-{i}", qty=qty) for i in range(4)]
        )
        with lake_at(database).get_connection() as conn:
            refreshed = refresh_decoded(conn, TRANSACTIONS_DECODED)

    assert refreshed == DecodeRefresh("full", 4)
