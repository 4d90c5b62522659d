"""The derived tables (``core.*``, ``mart.*``): each a query and its YAML (docs/tables.md), no
Python list. Their deps and column lineage are read from the query's FROM and JOIN clauses."""

import functools
import graphlib
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import dagster as dg
import msgspec

from fieldsales_dagster.assets.columns import (
    PACKAGE_SQL,
    ColumnEntries,
    TableDoc,
    TableFileError,
    columns_of,
    read_table_file,
)
from fieldsales_dagster.assets.decode import (
    DECODED_BY_TABLE,
    Decoded,
    macro_file,
    macro_files_called,
    shared_macros_sql,
)
from fieldsales_dagster.assets.follow import Follows
from fieldsales_dagster.assets.lineage import QueryReadError, Reads, column_sources, reads_of
from fieldsales_dagster.assets.raw import raw_asset_name, raw_columns
from fieldsales_dagster.client.endpoints import LIST_ENDPOINTS
from fieldsales_dagster.names import InstanceNames

RAW_ASSETS = {endpoint.raw_table: raw_asset_name(endpoint) for endpoint in LIST_ENDPOINTS}


class CheckEntry(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """A check written out in a table's YAML: one row, ``passed`` and metadata columns."""

    name: str
    description: str
    sql: str
    severity: Literal["warn", "error"] = "warn"
    also_reads: tuple[str, ...] = ()


class TableFile(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """``sql/<schema>_<name>.yaml``: a check is one of ``checks.py``'s, or written out."""

    description: str
    key: list[str]
    columns: ColumnEntries
    checks: list[str | CheckEntry]
    nullable_key: list[str] = msgspec.field(default_factory=list)
    follows: Follows | None = None


@dataclass(frozen=True)
class CoreTable:
    table: str
    key: tuple[str, ...]
    description: str
    doc: TableDoc
    folder: Path = PACKAGE_SQL
    #: Key columns that may be NULL (a mart's group-by key); the others must not be.
    nullable_key: tuple[str, ...] = ()
    follows: Follows | None = field(default=None, hash=False)
    checks: tuple[str, ...] = ()
    written_checks: tuple[CheckEntry, ...] = ()

    @property
    def asset_name(self) -> str:
        return self.table.replace(".", "_")

    @property
    def query_file(self) -> str:
        return f"{self.asset_name}.sql"

    @property
    def yaml_file(self) -> Path:
        return self.folder / f"{self.asset_name}.yaml"

    @property
    def schema(self) -> str:
        return self.table.partition(".")[0]

    @functools.cached_property
    def upstream(self) -> tuple[tuple[str, ...], tuple[Decoded, ...]]:
        return upstream_of(self)

    @property
    def deps(self) -> tuple[str, ...]:
        return self.upstream[0]

    @property
    def decoded(self) -> tuple[Decoded, ...]:
        """The decoded tables the query reads: brought up to date with their raw tables first."""
        return self.upstream[1]


def read_table(folder: Path, asset_name: str) -> CoreTable:
    where = folder / f"{asset_name}.yaml"
    found = read_table_file(where, TableFile)
    for source in found.follows.sources if found.follows else []:
        if source.decoded and source.decoded not in DECODED_BY_TABLE:
            raise TableFileError(
                f"{where}: follows.decoded is {source.decoded!r}, which is no decoded table "
                f"(they are {', '.join(DECODED_BY_TABLE)}). Fix the file."
            )
    for entry, listed in (("key", found.key), ("nullable_key", found.nullable_key)):
        if unknown := [name for name in listed if name not in found.columns]:
            raise TableFileError(
                f"{where}: {entry} names {', '.join(unknown)}, which columns does not declare. "
                "Fix the file."
            )
    schema, _, name = asset_name.partition("_")
    return CoreTable(
        f"{schema}.{name}",
        tuple(found.key),
        found.description,
        TableDoc(columns_of(found.columns)),
        folder,
        tuple(found.nullable_key),
        found.follows,
        tuple(c if isinstance(c, str) else c.name for c in found.checks),
        tuple(c for c in found.checks if isinstance(c, CheckEntry)),
    )


@functools.cache  # read once per process and folder
def derived_tables(folder: Path = PACKAGE_SQL) -> tuple[CoreTable, ...]:
    """Every core and mart table of ``folder``, each after the tables its query reads."""
    files = {path.name for path in folder.iterdir() if path.name.startswith(("core_", "mart_"))}
    stems = {name.rpartition(".")[0] for name in files if name.endswith((".sql", ".yaml"))}
    for stem in sorted(stems):
        for missing, beside in ((f"{stem}.yaml", f"{stem}.sql"), (f"{stem}.sql", f"{stem}.yaml")):
            if missing not in files:
                raise TableFileError(
                    f"{folder / beside} has no {missing} beside it: a table is its query and its "
                    "YAML. Add the file."
                )
    tables = {stem: read_table(folder, stem) for stem in sorted(stems)}
    order = {stem: [dep for dep in t.deps if dep in stems] for stem, t in tables.items()}
    try:
        return tuple(tables[stem] for stem in graphlib.TopologicalSorter(order).static_order())
    except graphlib.CycleError as exc:
        cycle = ", ".join(f"sql/{stem}.sql" for stem in sorted(set(exc.args[1])))
        raise QueryReadError(
            f"The queries {cycle} read each other in a cycle. Fix a query's FROM or JOIN."
        ) from None


def core_query(table: CoreTable) -> str:
    return (table.folder / table.query_file).read_text("utf-8")


BUILT_SCHEMAS = ("raw", "meta", "core", "mart")


def query_reads(query: str, where: str) -> Reads:
    """The tables ``query`` reads, and those its shared macros read."""
    reads = reads_of(query, where)
    for name in macro_files_called(query):
        reads |= reads_of(macro_file(name)[0], f"sql/{name}.sql")
    return reads


def follows_rows(table: CoreTable) -> list[Follows]:
    """Each decoded table ``table`` follows, read by its query as ``<rows>()``."""
    return table.follows.sources if table.follows else []


def upstream_of(table: CoreTable) -> tuple[tuple[str, ...], tuple[Decoded, ...]]:
    """The assets and decoded tables ``table``'s query reads; another schema than the project's is
    refused: the project's tables are built before the user's assets, never from them."""
    where = f"sql/{table.query_file}"
    reads = query_reads(core_query(table), where)
    read_decoded = {name for name in reads.tables if name in DECODED_BY_TABLE}
    if "decoded_rows" in reads.table_functions and not any(s.decoded for s in follows_rows(table)):
        raise QueryReadError(
            f"{where} calls decoded_rows(), which only a table that follows a decoded table "
            "defines: read that table by name, or add follows: to the YAML."
        )
    read_decoded |= {s.decoded for s in follows_rows(table) if s.rows in reads.table_functions}
    deps: set[str] = set()
    for name in reads.tables - read_decoded:
        schema = name.partition(".")[0]
        if schema not in BUILT_SCHEMAS:
            raise QueryReadError(
                f"{where} reads {name}, in schema {schema}, which this project does not build (it "
                f"builds {', '.join(BUILT_SCHEMAS)}). Read the project's tables only."
            )
        if schema == "raw":
            if name not in RAW_ASSETS:
                raise QueryReadError(
                    f"{where} reads {name}, which no raw asset loads (they load "
                    f"{', '.join(sorted(RAW_ASSETS))}). Fix the table name."
                )
            deps.add(RAW_ASSETS[name])
        elif schema in ("core", "mart"):
            asset = name.replace(".", "_")
            if not (table.folder / f"{asset}.sql").is_file():
                raise QueryReadError(
                    f"{where} reads {name}, which no query of this project builds (there is no "
                    f"sql/{asset}.sql). Fix the table name."
                )
            deps.add(asset)
    decoded = tuple(d for d in DECODED_BY_TABLE.values() if d.table in read_decoded)
    deps.update(RAW_ASSETS[d.source] for d in decoded)
    return tuple(sorted(deps)), decoded


def query_code_version(table: CoreTable) -> str:
    """A hash of the query and its shared macros: the UI marks SQL changes (as dagster-dbt)."""
    query = core_query(table)
    return hashlib.sha256(f"{query}\n{shared_macros_sql(query)}".encode()).hexdigest()[:16]


def column_lineage(names: InstanceNames, table: CoreTable) -> dg.TableColumnLineage:
    """Each column's source columns, as assets: a decoded table's come from its raw ``payload``."""
    decoded_by_table = dict(DECODED_BY_TABLE)
    decoded_by_table |= {
        s.rows: DECODED_BY_TABLE[s.decoded] for s in follows_rows(table) if s.decoded
    }
    known_columns = {raw_asset_name(e): raw_columns(e) for e in LIST_ENDPOINTS} | {
        t.asset_name: tuple(c.name for c in t.doc.columns) for t in derived_tables(table.folder)
    }
    known = tuple((dep.replace("_", ".", 1), known_columns[dep]) for dep in table.deps)
    columns = tuple(column.name for column in table.doc.columns)
    deps: dict[str, list[dg.TableColumnDep]] = {}
    query = core_query(table)
    for column, pairs in column_sources(query, columns, known, shared_macros_sql(query)).items():
        found: set[tuple[str, str]] = set()
        for source, source_column in pairs:
            if source in decoded_by_table:
                asset = RAW_ASSETS[decoded_by_table[source].source]
                kept = source_column in ("id", "loaded_at")
                found.add((asset, source_column if kept else "payload"))
            elif source in RAW_ASSETS:
                found.add((RAW_ASSETS[source], source_column))
            elif source.partition(".")[0] in ("core", "mart"):
                found.add((source.replace(".", "_"), source_column))
        if found:
            deps[column] = [
                dg.TableColumnDep(asset_key=names.asset_key(asset), column_name=name)
                for asset, name in sorted(found)
            ]
    return dg.TableColumnLineage(deps_by_column=deps)


def lineage_markdown(lineage: dg.TableColumnLineage) -> str:
    rows = [
        f"| {name} | {', '.join(f'{d.asset_key.to_user_string()}.{d.column_name}' for d in deps)} |"
        for name, deps in lineage.deps_by_column.items()
    ]
    return "\n".join(["| column | comes from |", "|---|---|", *rows])
