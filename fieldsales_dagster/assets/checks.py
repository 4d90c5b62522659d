"""Asset checks on the core tables: each one queries DuckDB and says what it found.

Blocking checks guard what must hold for a table to be used at all (unique ids). Data-quality
findings that come from the API's data rather than from our decoding (values outside a slider's
range, transactions whose event was not paged yet) are warnings with the offending rows named.
Drift in the API's partly undocumented kinds (a new custom-report field type, a new event state)
is a warning too: the data still loads, typed as well as it can be. The known kinds are listed
once, in ``sql/field_type_kinds.sql`` and ``sql/known_event_states.sql``. The marts are checked
against the core tables they summarise.

A table's YAML lists its checks (``checks:``). A check that only its table has is written out
there: a query whose one row says whether it passed and what it found (``written_check``). A check
that any table may take is a function of this module, listed in ``CHECKS`` with its
description, and named in the YAML (``ids_unique``, ``values_typed``, ``values_finite``). An
unknown name fails the definitions' load, naming the file.

A check whose tables are all its asset or the asset's own upstream tables runs in its asset's step,
on the connection that built the table (a check spec of the asset: one step per table, not one per
check, and the asset's blocking checks fail that step, so nothing downstream builds on a table that
failed them). It can still be run alone: the asset subsets to the checks selected. A check that
reads a table its asset does not depend on (``event_ids_known`` reads ``core.events``) runs in one
step with the other such checks, once every table they read is built.
"""

import functools
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import dagster as dg
import duckdb

from fieldsales_dagster.assets.columns import TableFileError
from fieldsales_dagster.assets.decode import create_macros
from fieldsales_dagster.assets.tables import CheckEntry, CoreTable, derived_tables
from fieldsales_dagster.names import InstanceNames
from fieldsales_dagster.warehouse.quoting import qualified, quote_ident
from fieldsales_dagster.warehouse.rows import one_row

#: How many offending rows a check names in its metadata.
SAMPLE_SIZE = 5
#: Rows per bucket of the ids_unique screen (see there): ~1M hash groups fit the memory limit.
SCREEN_BUCKET_ROWS = 1_000_000

#: ``evaluate(connection, table) -> result``: the body of one check of ``table``.
Evaluate = Callable[[duckdb.DuckDBPyConnection, CoreTable], dg.AssetCheckResult]


def _fetch_one(conn: duckdb.DuckDBPyConnection, sql: str) -> tuple:
    create_macros(conn, sql)
    return one_row(conn, sql)


@dataclass(frozen=True)
class CheckKind:
    """A check implementation: one of this module's (``CHECKS``) or written out in a table's YAML
    (``written_check``)."""

    evaluate: Evaluate
    #: What the check promises: ``{table}`` is the checked table's name; or ``f(table)``.
    description: str | Callable[[CoreTable], str]
    blocking: bool = False
    #: The tables (``schema.name``) it reads besides the one it checks.
    also_reads: tuple[str, ...] = ()

    def describe(self, table: CoreTable) -> str:
        if callable(self.description):
            return self.description(table)
        return self.description.replace("{table}", table.table)


@dataclass(frozen=True)
class CoreCheck:
    """One check of a core or mart table: its name, what it promises, and how it is evaluated."""

    table: CoreTable
    name: str
    kind: CheckKind

    @property
    def also_reads(self) -> tuple[str, ...]:
        """The assets of the tables it reads besides its own."""
        return tuple(table.replace(".", "_") for table in self.kind.also_reads)

    @property
    def runs_in_asset_step(self) -> bool:
        """True when every table it reads is its asset's or one the asset depends on: the
        asset's step can evaluate it right after building the table."""
        return all(asset in self.table.deps for asset in self.also_reads)

    def spec(self, names: InstanceNames) -> dg.AssetCheckSpec:
        return dg.AssetCheckSpec(
            name=self.name,
            asset=names.asset_key(self.table.asset_name),
            description=self.kind.describe(self.table),
            blocking=self.kind.blocking,
            additional_deps=[names.asset_key(asset) for asset in self.also_reads],
        )

    def result(self, conn: duckdb.DuckDBPyConnection, names: InstanceNames) -> dg.AssetCheckResult:
        """The evaluation, addressed to this check (an asset step may evaluate several)."""
        evaluation = self.kind.evaluate(conn, self.table)
        return evaluation._replace(
            asset_key=names.asset_key(self.table.asset_name), check_name=self.name
        )


def written_check(entry: CheckEntry) -> CheckKind:
    """A check its table's YAML writes out: its query's one row is the result (``CheckEntry``)."""

    def evaluate(conn: duckdb.DuckDBPyConnection, table: CoreTable) -> dg.AssetCheckResult:
        row = _fetch_one(conn, entry.sql)
        found = dict(zip([column[0] for column in conn.description or ()], row, strict=True))
        if "passed" not in found:
            raise TableFileError(
                f"{table.yaml_file}: the query of check {entry.name!r} returns "
                "no column named passed. Add one."
            )
        return dg.AssetCheckResult(
            passed=bool(found.pop("passed")),
            severity=dg.AssetCheckSeverity[entry.severity.upper()],
            metadata={name: _metadata_value(value) for name, value in found.items()},
        )

    return CheckKind(evaluate, entry.description, also_reads=entry.also_reads)


def _metadata_value(value: object) -> Any:
    """A column of a written check as metadata: a list as its items, comma-separated; a decimal
    as a float."""
    if isinstance(value, list):
        return ", ".join(str(item) for item in value if item is not None)
    return float(value) if isinstance(value, Decimal) else value


def checks_of(table: CoreTable) -> list[CoreCheck]:
    """The checks ``table``'s YAML names or writes out; an unknown name fails, naming the file."""
    kinds = CHECKS | {entry.name: written_check(entry) for entry in table.written_checks}
    for name in table.checks:
        if name not in kinds:
            raise TableFileError(
                f"{table.yaml_file}: checks names {name!r}, which is no check of this project "
                f"(they are {', '.join(sorted(CHECKS))}). Fix the name, or write the check out."
            )
    return [CoreCheck(table, name, kinds[name]) for name in table.checks]


def _cross_table_checks(names: InstanceNames, checks: list[CoreCheck]) -> dg.AssetChecksDefinition:
    """``checks`` (each reading a table its asset does not depend on) in one step of their own,
    once every table they read is built; each can still be run alone (the step subsets)."""
    by_key = {
        dg.AssetCheckKey(names.asset_key(check.table.asset_name), check.name): check
        for check in checks
    }

    @dg.multi_asset_check(
        specs=[check.spec(names) for check in checks],
        name=names.asset_key("core_cross_table_checks").to_python_identifier(),
        can_subset=True,
        required_resource_keys={names.warehouse.key},
    )
    def _checks(context: dg.AssetCheckExecutionContext) -> Iterator[dg.AssetCheckResult]:
        warehouse = names.warehouse.of(context)
        with warehouse.get_connection() as conn:
            for key in sorted(context.selected_asset_check_keys, key=str):
                yield by_key[key].result(conn, names)

    return _checks


#: The check every table has: its columns are those of its previous materialization.
SCHEMA_CHECK = "column_schema_change"


def build_schema_change_checks(
    names: InstanceNames, assets: Sequence[dg.AssetsDefinition]
) -> dg.AssetChecksDefinition:
    """``column_schema_change`` on every asset of ``assets``, as Dagster's
    ``build_column_schema_change_checks`` compares (the ``dagster/column_schema`` of the last two
    materializations), in one step named for what it checks: Dagster's step would be named
    ``asset_check_<hash>``, and the function is in beta."""
    description = "The columns (names and types) are those of the previous materialization."
    specs = [
        dg.AssetCheckSpec(SCHEMA_CHECK, asset=key, description=description)
        for asset in assets
        for key in asset.keys
    ]

    @dg.multi_asset_check(
        specs=specs,
        name=names.asset_key("column_schema_change_checks").to_python_identifier(),
        can_subset=True,
    )
    def _checks(context: dg.AssetCheckExecutionContext) -> Iterator[dg.AssetCheckResult]:
        for key in sorted(context.selected_asset_check_keys, key=str):
            records = context.instance.fetch_materializations(key.asset_key, limit=2).records
            passed, description = _schema_change(
                [r.asset_materialization.metadata.get("dagster/column_schema") for r in records]
            )
            yield dg.AssetCheckResult(
                asset_key=key.asset_key,
                check_name=key.name,
                passed=passed,
                severity=dg.AssetCheckSeverity.WARN,
                description=description,
            )

    return _checks


def _schema_change(values: list[Any]) -> tuple[bool, str]:
    """Whether the latest of the ``dagster/column_schema`` ``values`` (newest first) has the
    columns of the one before."""
    if len(values) < 2:
        return True, "The asset has been materialized fewer than 2 times."
    schemas = [v.value for v in values if isinstance(v, dg.TableSchemaMetadataValue)]
    if len(schemas) < 2:
        return False, "A materialization of the last two has no column schema metadata."
    latest, previous = ({c.name: c.type for c in schema.columns} for schema in schemas)
    changes = [f"added: {name}" for name in latest.keys() - previous.keys()]
    changes += [f"removed: {name}" for name in previous.keys() - latest.keys()]
    changes += [
        f"{name}: {previous[name]} -> {latest[name]}"
        for name in latest.keys() & previous.keys()
        if latest[name] != previous[name]
    ]
    if not changes:
        return True, "The columns are those of the previous materialization."
    return False, "Column schema changed since the previous materialization: " + "; ".join(
        sorted(changes)
    )


def ids_unique_description(table: CoreTable) -> str:
    key, nullable = ", ".join(table.key), ", ".join(table.nullable_key)
    null = f" ({nullable} may be NULL; NULLs compare equal)" if nullable else ""
    return f"Every row of {table.table} has a distinct, non-NULL ({key}){null}."


def _key_text(table: CoreTable) -> str:
    """SQL: a row's key as text, its columns joined by `` / ``."""
    return " || ' / ' || ".join(f"coalesce({quote_ident(c)}::VARCHAR, 'NULL')" for c in table.key)


def _any_null(table: CoreTable) -> str:
    """SQL: whether a key column that must not be NULL is."""
    required = [c for c in table.key if c not in table.nullable_key]
    return " OR ".join(f"{quote_ident(c)} IS NULL" for c in required) or "false"


# Both queries of ids_unique read one bucket of key hashes at a time: equal keys have equal
# hashes, so a duplicate never spans two buckets, and a query's hash table holds at most about
# SCREEN_BUCKET_ROWS groups whatever the table's size. All 5.5M keys of
# core.custom_report_results (1M transactions) grouped at once needed more than 32MB; after a
# nightly update of that table, more than the 192MB memory_limit had left.
#
# A screen first, per bucket: rows grouped by a 64-bit hash of the key (cheap to group, unlike
# the key's text; 5.5M custom report results: 2.2 -> 0.7 CPU-s). No hash shared by two rows and
# no NULL key means no duplicate in the bucket; otherwise (a duplicate, a NULL, or a rare hash
# collision) the exact query counts and names the bucket's offending keys.
def _flagged_sql(table: CoreTable, in_bucket: str) -> str:
    """The bucket's key hashes that two rows share or a NULL-keyed row has."""
    columns = ", ".join(quote_ident(c) for c in table.key)
    return (
        f"SELECT hash({columns}) AS key_hash FROM {qualified(table.table)} WHERE {in_bucket} "
        f"GROUP BY key_hash HAVING count(*) > 1 OR bool_or({_any_null(table)})"
    )


def _exact_sql(table: CoreTable, in_bucket: str) -> str:
    """The bucket's duplicated and NULL-keyed rows, and a sample of their keys: grouped by the
    key itself, so only the rows of flagged hashes."""
    columns, any_null = ", ".join(quote_ident(c) for c in table.key), _any_null(table)
    return f"""
        WITH keys AS (
            SELECT {_key_text(table)} AS key_text, bool_or({any_null}) AS has_null, count(*) AS n
            FROM {qualified(table.table)}
            WHERE {in_bucket} AND hash({columns}) IN ({_flagged_sql(table, in_bucket)})
            GROUP BY {columns}
        )
        SELECT coalesce(sum(n) FILTER (WHERE n > 1), 0),
            coalesce(sum(n) FILTER (WHERE has_null), 0),
            coalesce(list((n, key_text) ORDER BY n DESC, key_text)
                FILTER (WHERE n > 1 OR has_null), [])[1:{SAMPLE_SIZE}]
        FROM keys
    """


def ids_unique(conn: duckdb.DuckDBPyConnection, table: CoreTable) -> dg.AssetCheckResult:
    columns = ", ".join(quote_ident(c) for c in table.key)
    (rows,) = _fetch_one(conn, f"SELECT count(*) FROM {qualified(table.table)}")
    buckets = 1 + rows // SCREEN_BUCKET_ROWS
    found = []  # (duplicated rows, rows with a NULL key, sample) of each flagged bucket
    for bucket in range(buckets):
        # Literals, not $parameters: with parameters each bucket's scan ran 15x slower. One
        # bucket (under SCREEN_BUCKET_ROWS rows, most tables) needs no filter at all.
        in_bucket = f"hash({columns}) % {buckets} = {bucket}" if buckets > 1 else "true"
        if _fetch_one(conn, f"SELECT count(*) FROM ({_flagged_sql(table, in_bucket)})") != (0,):
            found.append(_fetch_one(conn, _exact_sql(table, in_bucket)))
    duplicated, with_null = sum(f[0] for f in found), sum(f[1] for f in found)
    samples = sorted((sample for f in found for sample in f[2]), key=lambda s: (-s[0], s[1]))
    offending = [key for _, key in samples]
    return dg.AssetCheckResult(
        passed=duplicated == 0 and with_null == 0,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata={
            "key": ", ".join(table.key),
            "duplicated_rows": int(duplicated),
            "rows_with_null_key": int(with_null),
            "offending_keys": ", ".join(offending[:SAMPLE_SIZE]),
        },
    )


NOT_FINITE = "not finite"


def _untyped_values_sql(table: CoreTable, not_finite: bool) -> str:
    """The rows of ``table`` with a present value that could not be typed (``untyped_values``, see
    ``sql/typed_values.sql``): NaN and infinity when ``not_finite``, every other kind otherwise."""
    kind = "=" if not_finite else "<>"
    return f"""
        WITH entries AS (
            SELECT {_key_text(table)} AS row_key, unnest(untyped_values) AS entry
            FROM {qualified(table.table)} WHERE untyped_values IS NOT NULL
        ), counted AS (
            SELECT row_key, entry.field, entry.value, entry.problem
            FROM entries WHERE entry.problem {kind} '{NOT_FINITE}'
        )
        SELECT
            count(DISTINCT row_key),
            (SELECT coalesce(string_agg(field || ': ' || n, ', ' ORDER BY n DESC, field), '')
             FROM (SELECT field, count(*) AS n FROM counted GROUP BY field)),
            (SELECT coalesce(list([row_key, field, value, problem]), [])
             FROM (SELECT * FROM counted ORDER BY row_key, field LIMIT {SAMPLE_SIZE}))
        FROM counted
    """


def untyped_values_found(
    conn: duckdb.DuckDBPyConnection, table: CoreTable, not_finite: bool
) -> dg.AssetCheckResult:
    """Rows of ``table`` with a present value that could not be typed, with a count per field and
    a sample."""
    rows, by_field, sample = _fetch_one(conn, _untyped_values_sql(table, not_finite))
    label = "rows_with_nan_or_infinity" if not_finite else "rows_with_untyped_values"
    return dg.AssetCheckResult(
        passed=rows == 0,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={
            label: int(rows),
            "values_by_field": by_field,
            # Ids and values may hold any character: shown as JSON strings.
            "sample": "\n".join(
                f"{json.dumps(key)}: {field} = {json.dumps(value)} ({problem})"
                for key, field, value, problem in sample
            ),
        },
    )


#: Every check implementation, by the name a table's YAML gives it.
CHECKS = {
    "ids_unique": CheckKind(ids_unique, ids_unique_description, blocking=True),
    "values_typed": CheckKind(
        functools.partial(untyped_values_found, not_finite=False),
        "Every present value of {table} was typed: counts the rows where one could not be (its "
        "column is NULL; untyped_values and raw.* keep it as received), with a sample.",
    ),
    "values_finite": CheckKind(
        functools.partial(untyped_values_found, not_finite=True),
        "No NaN or infinity was sent for a value of {table}: counts the rows where one was "
        "(stored as NULL, so sums stay numbers), with a sample of ids.",
    ),
}


def core_checks(tables: Sequence[CoreTable] | None = None) -> list[CoreCheck]:
    """Every check of ``tables`` (every core and mart table unless given), as their YAML names
    them."""
    return [
        c for table in (derived_tables() if tables is None else tables) for c in checks_of(table)
    ]


def checks_in_asset_step(table: CoreTable) -> list[CoreCheck]:
    """The checks of ``table`` its asset's step evaluates (see the module's docstring)."""
    return [c for c in checks_of(table) if c.runs_in_asset_step]


def build_core_checks(
    names: InstanceNames, tables: Sequence[CoreTable] | None = None
) -> list[dg.AssetChecksDefinition]:
    """The checks of ``tables`` that run in a step of their own (one for all of them): those that
    read a table their asset does not depend on. The others are check specs of their assets
    (``checks_in_asset_step``)."""
    return [
        _cross_table_checks(names, [c for c in core_checks(tables) if not c.runs_in_asset_step])
    ]
