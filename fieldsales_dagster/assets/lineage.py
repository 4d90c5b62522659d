"""Which tables a query reads, and which columns each column comes from, from its SQL.

A query is parsed with sqlglot's DuckDB dialect, so a CTE named like a table, a table in a
comment or a string, and a column named ``from`` are told apart from the tables a ``FROM`` or
``JOIN`` reads. The macros of ``sql/<name>.sql`` that a query calls are read the same way: a
table their bodies read is read by the query.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import sqlglot
from sqlglot import exp
from sqlglot.lineage import lineage


class QueryReadError(ValueError):
    """A query reads something its dependencies cannot be told from."""


@dataclass(frozen=True)
class Reads:
    """What a query reads: schema-qualified tables and the table functions it calls by name."""

    tables: frozenset[str]
    table_functions: frozenset[str]

    def __or__(self, other: Reads) -> Reads:
        return Reads(self.tables | other.tables, self.table_functions | other.table_functions)


@functools.cache
def reads_of(sql: str, where: str) -> Reads:
    """The tables and table functions ``sql`` (one or more statements) reads.

    A ``CREATE MACRO`` statement reads what its body reads, not the macro it creates. A table
    without a schema must be one of the query's CTEs; ``where`` names the query in the error.
    Built-in table functions (``range``, ``read_parquet``, ...) read no table and are left out.
    """
    try:
        statements = [s for s in sqlglot.parse(sql, read="duckdb") if s is not None]
    except sqlglot.errors.ParseError as exc:
        raise QueryReadError(
            f"{where}: sqlglot cannot parse the query (DuckDB dialect), so the tables it reads "
            f"(its asset's deps) cannot be known. Fix the SQL, or report the parser's gap. {exc}"
        ) from exc
    tables: set[str] = set()
    functions: set[str] = set()
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
                    "named with its schema (core.events, raw.transactions, ...): name the "
                    "schema, so that the table's asset can be found and made a dependency."
                )
    return Reads(frozenset(tables), frozenset(functions))


#: ``((schema.table, (column, ...)), ...)``: the columns of tables a query reads, where known.
KnownColumns = tuple[tuple[str, tuple[str, ...]], ...]


@functools.cache
def column_sources(
    sql: str, columns: tuple[str, ...], known: KnownColumns = ()
) -> dict[str, frozenset[tuple[str, str]]]:
    """Where each of ``columns`` of the query's result comes from: ``(table, column)`` pairs.

    ``known`` columns of the tables read let sqlglot place an unqualified column (inside an
    aggregate's ``FILTER``, say) in its table.

    ``table`` is schema-qualified (``core.events``) or, for a table function, its name
    (``decoded_rows``). sqlglot's lineage follows CTEs, subqueries and expressions down to the
    tables read; a column computed from none (a literal) has no source. The query is the last
    statement of ``sql`` (the others define macros).
    """
    statements = [s for s in sqlglot.parse(sql, read="duckdb") if s is not None]
    query = statements[-1]
    schema: dict[str, dict[str, dict[str, str]]] = {}
    for qualified_name, names in known:
        db, _, name = qualified_name.partition(".")
        schema.setdefault(db, {})[name] = dict.fromkeys(names, "VARCHAR")
    found: dict[str, frozenset[tuple[str, str]]] = {}
    for column in columns:
        try:
            node = lineage(column, query, schema, dialect="duckdb")
        except (sqlglot.errors.SqlglotError, ValueError, KeyError):
            found[column] = frozenset()  # a form sqlglot cannot follow: no lineage, not wrong
            continue
        sources: set[tuple[str, str]] = set()
        for step in node.walk():
            table = step.expression
            if not isinstance(table, exp.Table):
                continue
            source = step.name.rpartition(".")[2]
            if source == "*":
                continue
            if isinstance(table.this, exp.Anonymous):
                sources.add((table.this.name.lower(), source))
            elif table.db:
                sources.add((f"{table.db}.{table.name}".lower(), source))
        found[column] = frozenset(sources)
    return found
