"""Which tables a query reads, and where each of its columns comes from, parsed by sqlglot.

Parsing takes a few hundred ms per process, so results are cached in ``~/.cache`` (or
``XDG_CACHE_HOME``) by a hash of the query and sqlglot's version (a cache that fails is parsed
around); sqlglot (50 ms to import) is imported only to parse."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class QueryReadError(ValueError):
    """A query reads something its dependencies cannot be told from."""


@dataclass(frozen=True)
class Reads:
    tables: frozenset[str]
    table_functions: frozenset[str]

    def __or__(self, other: Reads) -> Reads:
        return Reads(self.tables | other.tables, self.table_functions | other.table_functions)


def _cache_file() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    version = importlib.metadata.version("sqlglot")  # without importing it
    return Path(cache) / "fieldsales_dagster" / f"query_lineage-sqlglot-{version}.json"


@functools.cache
def _stored() -> dict[str, Any]:
    try:
        return json.loads(_cache_file().read_text("utf-8"))
    except (OSError, ValueError):
        return {}


def _parsed_once(kind: str, key: str, parse: Callable[[], Any]) -> Any:
    key = hashlib.sha256(f"{kind}\0{key}".encode()).hexdigest()
    stored = _stored()
    if key in stored:
        return stored[key]
    stored[key] = value = parse()
    path = _cache_file()
    with contextlib.suppress(OSError):  # a cache that cannot be written is parsed around
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
            json.dump(stored, f)
        os.replace(f.name, path)  # whole or not at all; a concurrent writer's entries may go
    return value


@functools.cache
def reads_of(sql: str, where: str) -> Reads:
    """What ``sql``'s statements read (a macro: its body). A table without a schema must be a
    CTE; built-in table functions (``range``, ...) are left out."""
    tables, functions = _parsed_once("reads", sql, lambda: _parse_reads(sql, where))
    return Reads(frozenset(tables), frozenset(functions))


def _parse_reads(sql: str, where: str) -> tuple[list[str], list[str]]:
    import sqlglot
    from sqlglot import exp

    try:
        statements = [s for s in sqlglot.parse(sql, read="duckdb") if s is not None]
    except sqlglot.errors.ParseError as exc:
        raise QueryReadError(
            f"{where}: sqlglot cannot parse the query, so its asset's deps are unknown: {exc}. "
            "Fix the SQL."
        ) from exc
    tables, functions = set[str](), set[str]()
    for statement in statements:
        body = statement.expression if isinstance(statement, exp.Create) else statement
        if body is None:
            continue
        ctes = {cte.alias_or_name.lower() for cte in body.find_all(exp.CTE)}
        for table in body.find_all(exp.Table):
            if isinstance(table.this, exp.Anonymous):
                functions.add(table.this.name.lower())
            elif not isinstance(table.this, exp.Identifier):
                continue  # a built-in table function, parsed as its own expression
            elif table.db:
                tables.add(f"{table.db}.{table.name}".lower())
            elif table.name.lower() not in ctes:
                raise QueryReadError(
                    f"{where} reads {table.name}, which is neither one of its CTEs nor a table "
                    "named with its schema: name it (core.events, raw.transactions, ...)."
                )
    return sorted(tables), sorted(functions)


#: ``((schema.table, (column, ...)), ...)``: the columns of tables a query reads, where known.
KnownColumns = tuple[tuple[str, tuple[str, ...]], ...]


@functools.cache
def column_sources(
    sql: str, columns: tuple[str, ...], known: KnownColumns = ()
) -> dict[str, frozenset[tuple[str, str]]]:
    """``(table or table function, column)`` sources of each of ``columns`` of the last statement
    of ``sql``; ``known`` columns place an unqualified one (in a ``FILTER``, say)."""
    found = _parsed_once(
        "column_sources",
        json.dumps([sql, columns, known]),
        lambda: _column_sources(sql, columns, known),
    )
    return {column: frozenset(map(tuple, pairs)) for column, pairs in found.items()}


def _column_sources(
    sql: str, columns: tuple[str, ...], known: KnownColumns
) -> dict[str, list[tuple[str, str]]]:
    import sqlglot
    from sqlglot import exp
    from sqlglot.lineage import lineage

    query = [s for s in sqlglot.parse(sql, read="duckdb") if s is not None][-1]
    schema: dict[str, dict[str, dict[str, str]]] = {}
    for qualified_name, names in known:
        db, _, name = qualified_name.partition(".")
        schema.setdefault(db, {})[name] = dict.fromkeys(names, "VARCHAR")
    found: dict[str, list[tuple[str, str]]] = {}
    for column in columns:
        try:
            steps = list(lineage(column, query, schema, dialect="duckdb").walk())
        except (sqlglot.errors.SqlglotError, ValueError, KeyError):
            steps = []  # a form sqlglot cannot follow: no lineage, not wrong
        sources = set()
        for step in steps:
            table, source = step.expression, step.name.rpartition(".")[2]
            if not isinstance(table, exp.Table) or source == "*":
                continue
            if isinstance(table.this, exp.Anonymous):
                sources.add((table.this.name.lower(), source))
            elif table.db:
                sources.add((f"{table.db}.{table.name}".lower(), source))
        found[column] = sorted(sources)
    return found
