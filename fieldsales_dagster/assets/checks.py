"""Asset checks on the core and mart tables, named in or written out in their YAML (docs/tables.md).
One reading only its asset's upstream runs in the asset's step (so its blocking checks stop what
builds downstream); one reading another table (``event_ids_known``) runs in one shared step.
A check none of whose tables changed since its last evaluation reports that result again
(``check_results``)."""

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import dagster as dg
import duckdb

from fieldsales_dagster.assets.build import build_fingerprint
from fieldsales_dagster.assets.columns import TableFileError
from fieldsales_dagster.assets.decode import create_macros, macro_file, macro_files_called
from fieldsales_dagster.assets.follow import FOLLOW_KEYS, FOLLOW_ROWS
from fieldsales_dagster.assets.lineage import over_rows, reads_of
from fieldsales_dagster.assets.tables import CheckEntry, CoreTable, derived_tables, query_reads
from fieldsales_dagster.names import InstanceNames
from fieldsales_dagster.warehouse.lake import (
    BUILDS_TABLE,
    changed_since,
    record_evaluation,
    run_transaction,
    still_valid,
    table_exists,
)
from fieldsales_dagster.warehouse.quoting import qualified, quote_ident
from fieldsales_dagster.warehouse.rows import one_row
from fieldsales_dagster.warehouse.warehouse import FieldSalesWarehouse

SAMPLE_SIZE = 5
#: Rows per bucket of the ids_unique screen (see there): ~1M hash groups fit the memory limit.
SCREEN_BUCKET_ROWS = 1_000_000


#: The results of a kind's checks (by name) from one reading of every row of a table, or (given
#: ``True``) of the rows a follow inserted in it (``FOLLOW_ROWS``).
Evaluate = Callable[[duckdb.DuckDBPyConnection, CoreTable, bool], dict[str, dg.AssetCheckResult]]


@dataclass(frozen=True)
class CheckKind:
    """A check implementation: one of ``CHECKS``, or written out in a table's YAML."""

    evaluate: Evaluate
    #: What the check promises: ``{table}`` is the checked table's name; or ``f(table)``.
    description: str | Callable[[CoreTable], str]
    #: Over the inserted rows, it gives its result over every row where the others passed.
    narrows: bool
    blocking: bool = False
    #: The tables (``schema.name``) it reads besides the one it checks.
    also_reads: tuple[str, ...] = ()

    def describe(self, table: CoreTable) -> str:
        text = self.description
        return text(table) if callable(text) else text.replace("{table}", table.table)


@dataclass(frozen=True)
class CoreCheck:
    table: CoreTable
    name: str
    kind: CheckKind

    @property
    def also_reads(self) -> tuple[str, ...]:
        return tuple(table.replace(".", "_") for table in self.kind.also_reads)

    @property
    def reads(self) -> list[str]:
        """Every table its result depends on: its own and those it ``also_reads``."""
        return [self.table.table, *self.kind.also_reads]

    @property
    def runs_in_asset_step(self) -> bool:
        return all(asset in self.table.deps for asset in self.also_reads)

    def spec(self, names: InstanceNames) -> dg.AssetCheckSpec:
        return dg.AssetCheckSpec(
            name=self.name,
            asset=names.asset_key(self.table.asset_name),
            description=self.kind.describe(self.table),
            blocking=self.kind.blocking,
            additional_deps=[names.asset_key(asset) for asset in self.also_reads],
        )

    def result(self, found: dg.AssetCheckResult, names: InstanceNames) -> dg.AssetCheckResult:
        """``found`` (evaluated, or carried) as this check's of ``names``'s asset."""
        return found._replace(
            asset_key=names.asset_key(self.table.asset_name), check_name=self.name
        )


def check_results(
    conn: duckdb.DuckDBPyConnection,
    warehouse: FieldSalesWarehouse,
    names: InstanceNames,
    checks: Sequence[CoreCheck],
    built_from: Sequence[str] | None = None,
) -> list[dg.AssetCheckResult]:
    """Each check's result: where its last evaluation is ``still_valid`` (its code, none of the
    tables it ``reads`` changed since the snapshot it read), that result, saying so; else
    evaluated now, and recorded with the builds (one commit for all of them). In the commit of
    their table's build, each is evaluated, and recorded as reading what the build read
    (``built_from``): its result holds while the build does."""
    results, evaluated, snapshot = [], [], None
    readings: dict[tuple[Evaluate, str, bool], dict[str, dg.AssetCheckResult]] = {}

    def evaluate(check: CoreCheck, inserted: bool) -> dg.AssetCheckResult:
        if (key := (check.kind.evaluate, check.table.table, inserted)) not in readings:
            readings[key] = check.kind.evaluate(conn, check.table, inserted)
        return readings[key][check.name]

    for check in checks:
        table, fingerprint = check.table.table, build_fingerprint(check.table, warehouse)
        found = still_valid(conn, warehouse.lake, table, fingerprint, check.name)
        if found and built_from is None:
            carried = dg.deserialize_value(str(found.result), dict)
            why = f"{', '.join(found.reads)} unchanged since snapshot {found.read}, evaluated there"
            carried["metadata"] |= {"fieldsales/check": f"carried: {why}"}
            results.append(check.result(dg.AssetCheckResult(**carried), names))
            continue
        if snapshot is None:  # read before evaluating
            (snapshot,) = one_row(conn, "SELECT id FROM current_snapshot()")
        narrowed = built_from is not None and _over_inserted(conn, warehouse, check, fingerprint)
        now = evaluate(check, bool(narrowed))
        if narrowed:
            now = now._replace(metadata={**now.metadata, "fieldsales/check": narrowed})
        results.append(result := check.result(now, names))
        reads = check.reads if built_from is None else built_from
        evaluated.append(
            (table, reads, fingerprint, check.name, dg.serialize_value(result._asdict()))
        )

    def record() -> None:  # in one commit, at the snapshot read before evaluating
        for table, reads, fingerprint, name, found in evaluated:
            record_evaluation(conn, table, reads, fingerprint, name, found, snapshot)

    if evaluated:
        run_transaction(conn, BUILDS_TABLE, record)
    return results


def _over_inserted(
    conn: duckdb.DuckDBPyConnection,
    warehouse: FieldSalesWarehouse,
    check: CoreCheck,
    fingerprint: str | None,
) -> dg.MetadataValue | None:
    """Why ``check`` may be evaluated over the rows a follow inserted in this commit
    (``FOLLOW_ROWS``, there), where it holds of every other row: it passed, running
    ``fingerprint``, in the commit of a build of the table (its last evaluation read what the
    build read, not the table), and no commit wrote the table since (the build's own is the
    snapshot after the one it read); else ``None`` (and always after a failure: its counts must
    be those of every row)."""
    lake, table, kind = warehouse.lake, check.table.table, check.kind
    if not kind.narrows or not table_exists(conn, f"temp.{FOLLOW_ROWS}"):
        return None
    last = still_valid(conn, lake, table, fingerprint, check.name, judged=False)
    if last is None or table in last.reads or changed_since(conn, lake, last.read + 1, [table]):
        return None
    if not dg.deserialize_value(str(last.result), dict)["passed"]:
        return None
    how = "over the keys of the rows the follow inserted: it passed at the build that read "
    return dg.MetadataValue.text(f"{how}snapshot {last.read}, the table unchanged since")


def written_check(entry: CheckEntry, table: CoreTable) -> CheckKind:
    """It must name in ``also_reads`` every other table it reads (else it could carry a stale
    result). Evaluated over the rows a follow inserted too where that is sound (``over_rows``): it
    reads no table but its own, and no shared macro it calls reads one."""
    where = f"{table.yaml_file}: check {entry.name!r}"
    reads = query_reads(entry.sql, where).tables
    if undeclared := sorted(reads - {table.table, *entry.also_reads}):
        raise TableFileError(
            f"{where} reads {', '.join(undeclared)}, which its also_reads does not name: add "
            f"also_reads: [{', '.join(undeclared)}] to it, so that it runs after them and is "
            "evaluated again when they change."
        )
    macros_read = any(reads_of(macro_file(m)[0], m).tables for m in macro_files_called(entry.sql))
    alone = reads == {table.table} and not macros_read
    narrowed = over_rows(entry.sql, table.table, FOLLOW_ROWS) if alone else None

    def evaluate(
        conn: duckdb.DuckDBPyConnection, table: CoreTable, inserted: bool
    ) -> dict[str, dg.AssetCheckResult]:
        sql = (narrowed if inserted else None) or entry.sql
        create_macros(conn, sql)
        row = one_row(conn, sql)
        found = dict(zip([column[0] for column in conn.description or ()], row, strict=True))
        if "passed" not in found:
            raise TableFileError(
                f"{table.yaml_file}: the query of check {entry.name!r} returns "
                "no column named passed. Add one."
            )
        return {
            entry.name: dg.AssetCheckResult(
                passed=bool(found.pop("passed")),
                severity=dg.AssetCheckSeverity[entry.severity.upper()],
                metadata={name: _metadata_value(value) for name, value in found.items()},
            )
        }

    return CheckKind(evaluate, entry.description, narrowed is not None, also_reads=entry.also_reads)


def _metadata_value(value: object) -> Any:
    if isinstance(value, list):
        return ", ".join(str(item) for item in value if item is not None)
    return float(value) if isinstance(value, Decimal) else value


def checks_of(table: CoreTable) -> list[CoreCheck]:
    kinds = CHECKS | {entry.name: written_check(entry, table) for entry in table.written_checks}
    for name in table.checks:
        if name not in kinds:
            raise TableFileError(
                f"{table.yaml_file}: checks names {name!r}, which is no check of this project "
                f"(they are {', '.join(sorted(CHECKS))}). Fix the name, or write the check out."
            )
    return [CoreCheck(table, name, kinds[name]) for name in table.checks]


def ids_unique_description(table: CoreTable) -> str:
    key, nullable = ", ".join(table.key), ", ".join(table.nullable_key)
    null = f" ({nullable} may be NULL; NULLs compare equal)" if nullable else ""
    return f"Every row of {table.table} has a distinct, non-NULL ({key}){null}."


def _key_text(table: CoreTable) -> str:
    return " || ' / ' || ".join(f"coalesce({quote_ident(c)}::VARCHAR, 'NULL')" for c in table.key)


def _any_null(table: CoreTable) -> str:
    required = [c for c in table.key if c not in table.nullable_key]
    return " OR ".join(f"{quote_ident(c)} IS NULL" for c in required) or "false"


# ids_unique reads one bucket of key hashes at a time: all 5.5M keys of core.custom_report_results
# at once overran the 192MB memory_limit. A 64-bit hash screens each bucket (2.2 -> 0.7 CPU-s
# against the key's text); only a shared hash or a NULL key runs the exact, naming query.
def _flagged_sql(table: CoreTable, in_bucket: str, rows: str) -> str:
    columns = ", ".join(quote_ident(c) for c in table.key)
    return (
        f"SELECT hash({columns}) AS key_hash FROM {rows} WHERE {in_bucket} "
        f"GROUP BY key_hash HAVING count(*) > 1 OR bool_or({_any_null(table)})"
    )


def _exact_sql(table: CoreTable, in_bucket: str, rows: str) -> str:
    columns, any_null = ", ".join(quote_ident(c) for c in table.key), _any_null(table)
    return f"""
        WITH keys AS (
            SELECT {_key_text(table)} AS key_text, bool_or({any_null}) AS has_null, count(*) AS n
            FROM {rows}
            WHERE {in_bucket} AND hash({columns}) IN ({_flagged_sql(table, in_bucket, rows)})
            GROUP BY {columns}
        )
        SELECT coalesce(sum(n) FILTER (WHERE n > 1), 0),
            coalesce(sum(n) FILTER (WHERE has_null), 0),
            coalesce(list((n, key_text) ORDER BY n DESC, key_text)
                FILTER (WHERE n > 1 OR has_null), [])[1:{SAMPLE_SIZE}]
        FROM keys
    """


def ids_unique(
    conn: duckdb.DuckDBPyConnection, table: CoreTable, inserted: bool
) -> dict[str, dg.AssetCheckResult]:
    """Over every row; or, where every row but the ``inserted`` ones passed, over the rows
    sharing with an inserted row the value, or NULL, of the key column telling them apart most: a
    duplicated or NULL key has one among them; over the inserted rows alone where no kept row can
    share their key (``_keys_replaced``)."""
    columns, rows = ", ".join(quote_ident(c) for c in table.key), qualified(table.table)
    if inserted and _keys_replaced(conn, table):
        parts, rows = ["true"], FOLLOW_ROWS
    elif inserted:  # by one key column's values: hashing every row's whole key cost more
        column = quote_ident(_telling_column(conn, table))
        parts = [f"({column} IS NULL OR {column} IN (SELECT {column} FROM {FOLLOW_ROWS}))"]
    else:
        (count,) = one_row(conn, f"SELECT count(*) FROM {rows}")
        buckets = 1 + count // SCREEN_BUCKET_ROWS
        # Literals: with $parameters each bucket's scan ran 15x slower.
        parts = [
            f"hash({columns}) % {buckets} = {b}" if buckets > 1 else "true" for b in range(buckets)
        ]
    found = []  # (duplicated rows, rows with a NULL key, sample) of each flagged part
    for part in parts:
        if one_row(conn, f"SELECT count(*) FROM ({_flagged_sql(table, part, rows)})") != (0,):
            found.append(one_row(conn, _exact_sql(table, part, rows)))
    duplicated, with_null = sum(f[0] for f in found), sum(f[1] for f in found)
    samples = sorted((sample for f in found for sample in f[2]), key=lambda s: (-s[0], s[1]))
    return {
        "ids_unique": dg.AssetCheckResult(
            passed=duplicated == 0 and with_null == 0,
            severity=dg.AssetCheckSeverity.ERROR,
            metadata={
                "key": ", ".join(table.key),
                "duplicated_rows": int(duplicated),
                "rows_with_null_key": int(with_null),
                "offending_keys": ", ".join(key for _, key in samples[:SAMPLE_SIZE]),
            },
        )
    }


def _telling_column(conn: duckdb.DuckDBPyConnection, table: CoreTable) -> str:
    """The key column with the most distinct values among the rows a follow inserted."""
    if len(table.key) == 1:
        return table.key[0]
    counts = ", ".join(f"count(DISTINCT {quote_ident(c)})" for c in table.key)
    found = one_row(conn, f"SELECT {counts} FROM {FOLLOW_ROWS}")
    return max(zip(found, table.key, strict=True))[1]


def _keys_replaced(conn: duckdb.DuckDBPyConnection, table: CoreTable) -> bool:
    """Whether no row a follow kept shares its key with a row it inserted: the key holds the
    follow's key column, the follow replaced every row of the keys it named (``FOLLOW_KEYS``),
    and each inserted row has one of them (else it might be a kept row's)."""
    key = table.follows.key if table.follows else ""
    if key not in table.key or not table_exists(conn, f"temp.{FOLLOW_KEYS}"):
        return False
    column = quote_ident(key)
    replaced = f"SELECT id FROM {FOLLOW_KEYS} WHERE id IS NOT NULL"  # NOT IN a NULL: unknown
    outside = f"{column} IS NULL OR {column} NOT IN ({replaced})"
    return one_row(conn, f"SELECT count(*) FROM {FOLLOW_ROWS} WHERE {outside}") == (0,)


def untyped_values(
    conn: duckdb.DuckDBPyConnection, table: CoreTable, inserted: bool
) -> dict[str, dg.AssetCheckResult]:
    """``values_typed`` and ``values_finite``: the rows whose ``untyped_values`` hold other
    problems, and NaN/infinity, from one scan of the table (or of the ``inserted`` rows)."""
    query = f"""
        WITH entries AS (
            SELECT row_key, entry.field, entry.value, entry.problem,
                entry.problem = 'not finite' AS not_finite
            FROM (
                SELECT {_key_text(table)} AS row_key, unnest(untyped_values) AS entry
                FROM {FOLLOW_ROWS if inserted else qualified(table.table)}
                WHERE untyped_values IS NOT NULL
            )
        ), fields AS (
            SELECT not_finite,
                string_agg(field || ': ' || n, ', ' ORDER BY n DESC, field) AS by_field
            FROM (SELECT not_finite, field, count(*) AS n FROM entries GROUP BY ALL)
            GROUP BY ALL
        )
        SELECT not_finite, count(DISTINCT row_key), any_value(by_field),
            min([row_key, field, value, problem], {SAMPLE_SIZE})
        FROM entries JOIN fields USING (not_finite) GROUP BY ALL
    """
    found = {not_finite: counts for not_finite, *counts in conn.execute(query).fetchall()}

    def result(not_finite: bool, label: str) -> dg.AssetCheckResult:
        rows, by_field, sample = found.get(not_finite, (0, "", []))
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

    return {
        "values_typed": result(False, "rows_with_untyped_values"),
        "values_finite": result(True, "rows_with_nan_or_infinity"),
    }


CHECKS = {
    "ids_unique": CheckKind(ids_unique, ids_unique_description, True, blocking=True),
    "values_typed": CheckKind(
        untyped_values,
        "Every present value of {table} was typed: counts the rows where one could not be (its "
        "column is NULL; untyped_values and raw.* keep it as received), with a sample.",
        True,
    ),
    "values_finite": CheckKind(
        untyped_values,
        "No NaN or infinity was sent for a value of {table}: counts the rows where one was "
        "(stored as NULL, so sums stay numbers), with a sample of ids.",
        True,
    ),
}


def core_checks(tables: Sequence[CoreTable] | None = None) -> list[CoreCheck]:
    return [
        c for table in (derived_tables() if tables is None else tables) for c in checks_of(table)
    ]


def checks_in_asset_step(table: CoreTable) -> list[CoreCheck]:
    return [c for c in checks_of(table) if c.runs_in_asset_step]


def build_core_checks(
    names: InstanceNames, tables: Sequence[CoreTable] | None = None
) -> list[dg.AssetChecksDefinition]:
    """The checks that read another table than theirs, in one shared step."""
    checks = [c for c in core_checks(tables) if not c.runs_in_asset_step]
    by_key = {check.spec(names).key: check for check in checks}

    @dg.multi_asset_check(
        specs=[check.spec(names) for check in checks],
        name=names.asset_key("core_cross_table_checks").to_python_identifier(),
        can_subset=True,
        required_resource_keys={names.warehouse.key},
    )
    def _checks(context: dg.AssetCheckExecutionContext) -> Iterator[dg.AssetCheckResult]:
        warehouse = names.warehouse.of(context)
        with warehouse.get_connection() as conn:
            selected = [by_key[key] for key in sorted(context.selected_asset_check_keys, key=str)]
            yield from check_results(conn, warehouse, names, selected)

    return [_checks]
