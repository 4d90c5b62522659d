"""The one SQL-quoting module against a real DuckDB: hostile names and strings round-trip, and no
quoted text ever ends the statement it sits in."""

from __future__ import annotations

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fieldsales_dagster.warehouse.quoting import qualified, quote_ident, sql_literal

HOSTILE = [
    "plain",
    'a"b',
    '""',
    "x'; DROP TABLE victim; --",
    'name"; DROP TABLE victim; --',
    "with space",
    "dot.in.name",
    "ünïcödé ✓",
    "back\\slash",
    "new\nline",
    "$1 ? %s",
]
# DuckDB refuses a NUL in text; an empty identifier is not a name.
TEXT = st.text(st.characters(exclude_characters="\x00", exclude_categories=("Cs",)))


@pytest.fixture
def conn() -> duckdb.DuckDBPyConnection:
    conn = duckdb.connect()
    conn.execute("CREATE TABLE victim AS SELECT 1 AS x")
    return conn


def test_known_spellings() -> None:
    assert quote_ident('a"b') == '"a""b"'
    assert sql_literal("it's") == "'it''s'"
    assert qualified("raw.events") == '"raw"."events"'
    # Only the first dot splits: the rest belongs to the table's name.
    assert qualified('core.a.b"c') == '"core"."a.b""c"'


@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_string_is_one_literal(conn: duckdb.DuckDBPyConnection, text: str) -> None:
    assert conn.execute(f"SELECT {sql_literal(text)}").fetchone() == (text,)
    assert conn.execute("SELECT count(*) FROM victim").fetchone() == (1,)


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_name_is_one_identifier(conn: duckdb.DuckDBPyConnection, name: str) -> None:
    conn.execute(f"CREATE SCHEMA {quote_ident(name)}")
    conn.execute(f"CREATE TABLE {quote_ident(name)}.{quote_ident(name)} AS SELECT 1 AS v")
    found = conn.execute(
        "SELECT schema_name, table_name FROM duckdb_tables() WHERE table_name = ?", [name]
    ).fetchall()
    assert found == [(name, name)]
    assert conn.execute("SELECT count(*) FROM victim").fetchone() == (1,)


def test_qualified_names_the_table(conn: duckdb.DuckDBPyConnection) -> None:
    conn.execute('CREATE SCHEMA "s""x"')
    conn.execute('CREATE TABLE "s""x"."t.1" AS SELECT 42 AS v')
    table = qualified('s"x.t.1')
    assert conn.execute(f"SELECT v FROM {table}").fetchone() == (42,)


@settings(max_examples=200, deadline=None)
@given(TEXT)
def test_any_string_round_trips(text: str) -> None:
    with duckdb.connect() as conn:
        assert conn.execute(f"SELECT {sql_literal(text)}").fetchone() == (text,)


@settings(max_examples=100, deadline=None)
@given(TEXT.filter(bool))
def test_any_name_round_trips(name: str) -> None:
    with duckdb.connect() as conn:
        conn.execute(f"CREATE TABLE {quote_ident(name)} AS SELECT 1 AS {quote_ident(name)}")
        assert conn.execute(f"SELECT {quote_ident(name)} FROM {quote_ident(name)}").fetchone() == (
            1,
        )
