"""Which tables a query reads, and where each of its columns comes from, parsed by sqlglot.

Parsing takes a few hundred ms per process, so results are cached in ``~/.cache`` (or
``XDG_CACHE_HOME``) by a hash of the query, sqlglot's version and this module's text (a cache
that fails is parsed around); sqlglot (50 ms to import) is imported only to parse."""

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
    rules = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]  # what is parsed, how
    return Path(cache) / "fieldsales_dagster" / f"query_lineage-sqlglot-{version}-{rules}.json"


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
    sql: str, columns: tuple[str, ...], known: KnownColumns = (), macros: str = ""
) -> dict[str, frozenset[tuple[str, str]]]:
    """``(table or table function, column)`` sources of each of ``columns`` of the last statement
    of ``sql``; ``known`` columns place an unqualified one (in a ``FILTER``, say). A table macro
    of ``macros`` (their SQL) that ``sql`` calls is followed through its body."""
    found = _parsed_once(
        "column_sources",
        json.dumps([sql, columns, known, macros]),
        lambda: _column_sources(sql, columns, known, macros),
    )
    return {column: frozenset(map(tuple, pairs)) for column, pairs in found.items()}


def _column_sources(
    sql: str, columns: tuple[str, ...], known: KnownColumns, macros: str
) -> dict[str, list[tuple[str, str]]]:
    import sqlglot
    from sqlglot import exp
    from sqlglot.lineage import lineage

    query = _expand_table_macros([s for s in sqlglot.parse(sql, read="duckdb") if s][-1], macros)
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


def _expand_table_macros(query: Any, macros: str) -> Any:
    """``query`` with each call of a table macro of ``macros`` replaced by its body (nested calls
    too), its parameters by the call's arguments, simplified (a ``CASE`` on a parameter keeps
    its branch): lineage follows a subquery, not a table function."""
    import sqlglot
    from sqlglot import exp
    from sqlglot.optimizer.simplify import simplify

    bodies = {
        s.this.this.name.lower(): ([p.name for p in s.this.expressions], s.expression)
        for s in sqlglot.parse(macros, read="duckdb")
        if isinstance(s, exp.Create) and isinstance(s.expression, exp.Query)
    }

    def expand(node: Any) -> Any:
        call = node.this if isinstance(node, exp.Table) else None
        if not isinstance(call, exp.Anonymous) or call.name.lower() not in bodies:
            return node
        params, body = bodies[call.name.lower()]
        values = dict(zip(params, call.expressions, strict=False))

        def bind(n: Any) -> Any:
            bound = isinstance(n, exp.Column) and not n.table and n.name in values
            return values[n.name].copy() if bound else n

        alias = node.args.get("alias") or exp.TableAlias(this=exp.to_identifier(call.name))
        return exp.Subquery(
            this=simplify(body.copy().transform(bind).transform(expand)), alias=alias
        )

    return query.transform(expand)


def over_rows(sql: str, table: str, rows: str) -> str | None:
    """``sql`` reading the table ``rows`` in place of ``table``, where that gives the same result
    whenever no other row of ``table`` offends: its one statement reads ``table`` once, and its
    ``passed`` is ``count(*) = 0`` over the rows a WHERE keeps of that reading (in its own FROM,
    or in a CTE that only filters it), which its every other column reads too; else ``None``."""
    narrowed = _parsed_once(
        "over_rows", f"{table}\0{rows}\0{sql}", lambda: _over_rows(sql, table, rows)
    )
    return str(narrowed) if narrowed is not None else None


def _over_rows(sql: str, table: str, rows: str) -> str | None:
    import sqlglot
    from sqlglot import exp

    def plain(select: Any) -> bool:  # no step that reads several rows of its FROM
        modifiers = ("group", "having", "qualify", "joins", "distinct", "limit", "offset")
        return isinstance(select, exp.Select) and not any(select.args.get(m) for m in modifiers)

    statements: list[Any] = [s for s in sqlglot.parse(sql, read="duckdb") if s is not None]
    if len(statements) != 1 or not plain(query := statements[0]):
        return None
    reads = [t for t in query.find_all(exp.Table) if t.db]
    passed = [c.unalias() for c in query.expressions if c.alias_or_name.lower() == "passed"]
    zero = exp.EQ(this=exp.Count(this=exp.Star(), big_int=True), expression=exp.Literal.number(0))
    if len(reads) != 1 or f"{reads[0].db}.{reads[0].name}".lower() != table or passed != [zero]:
        return None
    (read,), source = reads, query.args["from_"].this
    if source is not read:  # through a CTE: the rows it keeps, whatever the query does with them
        name = source.name.lower() if isinstance(source, exp.Table) and not source.db else None
        ctes = [c for c in query.ctes if c.alias_or_name.lower() == name]
        if len(ctes) != 1 or query.args["with_"].args.get("recursive") or query.args.get("where"):
            return None
        query = ctes[0].this
        if not plain(query) or query.args["from_"].this is not read:
            return None
        if any(query.find_all(exp.AggFunc, exp.Window)):
            return None
    if not query.args.get("where"):
        return None
    # In the text as written: sqlglot's own rendering may rename a column named by its expression.
    start, end = (read.args.get("catalog") or read.args["db"]).meta["start"], read.this.meta["end"]
    named = "" if read.alias else f" AS {exp.to_identifier(read.name).sql('duckdb')}"
    return f"{sql[:start]}{rows}{named}{sql[end + 1 :]}"
