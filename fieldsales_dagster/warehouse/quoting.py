"""The one place a name or a string becomes SQL text: where DuckDB takes no parameters."""

from __future__ import annotations


def quote_ident(name: str) -> str:
    """``name`` as a SQL identifier: in double quotes, a double quote doubled."""
    return '"' + name.replace('"', '""') + '"'


def qualified(table: str) -> str:
    """``schema.table`` -> ``"schema"."table"`` (the first dot splits; the rest is the name)."""
    schema, _, name = table.partition(".")
    return f"{quote_ident(schema)}.{quote_ident(name)}"


def sql_literal(text: str) -> str:
    """``text`` as a SQL string literal: in single quotes, a single quote doubled."""
    return "'" + text.replace("'", "''") + "'"
