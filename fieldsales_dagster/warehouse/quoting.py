"""SQL text the project writes itself: the one place a name or a string becomes SQL.

DuckDB takes parameters for values, but not for names (tables, schemas, a lake's alias) nor in
``ATTACH``, ``INSTALL``, ``LOAD``, ``SET`` and ``COMMENT ON``: there the text is quoted here.
"""

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
