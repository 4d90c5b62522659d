"""What every column means (``sql/<schema>_<table>.yaml``: a description, ``pii: true``), for
analysts as DuckDB comments and ``dagster/column_schema``; and how a query stores empty strings
and personal columns."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TypeVar

import dagster as dg
import duckdb
import msgspec
import msgspec.yaml

from fieldsales_dagster.warehouse.lake import run_transaction
from fieldsales_dagster.warehouse.pii import hmac_pads, hmac_sql, redact_pii_keys
from fieldsales_dagster.warehouse.quoting import qualified, quote_ident, sql_literal
from fieldsales_dagster.warehouse.warehouse import FieldSalesWarehouse

#: Schemas whose text columns store an empty string as NULL (raw.* keeps payloads as received).
EMPTY_IS_NULL_SCHEMAS = ("core", "mart")
EMPTY_IS_NULL_NOTE = "An empty string from the API is stored as NULL."
PII_NOTES = {
    "keep": "Personal data (FIELDSALES_PII=keep: stored as received).",
    "hash": "Personal data (FIELDSALES_PII=hash: HMAC-SHA256 under FIELDSALES_PII_HASH_KEY).",
    "drop": "Personal data (FIELDSALES_PII=drop: always NULL).",
}


#: The queries and their YAML files (an installed package is never zipped).
PACKAGE_SQL = Path(__file__).resolve().parents[1] / "sql"


class TableFileError(ValueError):
    """A table's YAML file is missing, unreadable, or wrong."""


class ColumnEntry(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    description: str
    pii: bool = False


#: ``columns:`` of a table's YAML, in table order: name -> description, or -> a ``ColumnEntry``.
ColumnEntries = dict[str, str | ColumnEntry]


class RawTableFile(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """``sql/raw_<name>.yaml``."""

    columns: ColumnEntries
    description: str | None = None


Model = TypeVar("Model", bound=msgspec.Struct)


def read_table_file(path: Path, model: type[Model]) -> Model:
    """msgspec reads YAML with libyaml's parser (PyYAML's own took 25 ms of the load, libyaml 2)."""
    try:
        return msgspec.yaml.decode(path.read_bytes(), type=model)
    except (OSError, msgspec.DecodeError) as exc:  # a ValidationError is a DecodeError
        fields = ", ".join(model.__struct_fields__)
        raise TableFileError(f"{path}: {exc}. Fix the file (its fields: {fields}).") from exc


@dataclass(frozen=True)
class Column:
    name: str
    description: str
    pii: bool = False


@dataclass(frozen=True)
class TableDoc:
    columns: tuple[Column, ...]
    description: str | None = None

    @property
    def pii_columns(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns if c.pii)


def columns_of(entries: ColumnEntries) -> tuple[Column, ...]:
    return tuple(
        Column(name, entry.strip())
        if isinstance(entry, str)
        else Column(name, entry.description.strip(), entry.pii)
        for name, entry in entries.items()
    )


@cache
def table_doc(asset_name: str) -> TableDoc:
    found = read_table_file(PACKAGE_SQL / f"{asset_name}.yaml", RawTableFile)
    return TableDoc(columns_of(found.columns), found.description)


def publishing_query(
    conn: duckdb.DuckDBPyConnection,
    table: str,
    query: str,
    doc: TableDoc,
    warehouse: FieldSalesWarehouse,
) -> tuple[str, dict[str, object]]:
    """``query`` as stored: empty strings NULL, personal columns per policy in ``core.*`` (mart.*
    inherits it), and its parameters (the hash key's pads, never in the SQL). The query's macros
    must exist on ``conn``: DESCRIBE binds it."""
    policy = warehouse.pii if table.startswith("core.") else "keep"
    hashed = policy == "hash" and doc.pii_columns
    params: dict[str, object] = {**hmac_pads(warehouse.pii_hash_key or "")} if hashed else {}
    projections = []
    for name, data_type, *_ in conn.execute(f"DESCRIBE {query}").fetchall():
        column, pii = quote_ident(name), name in doc.pii_columns
        if pii and data_type != "VARCHAR":
            raise ValueError(
                f"{table}.{name} is declared personal data but is {data_type}; only VARCHAR "
                "columns can be hashed or dropped. Fix sql/<table>.yaml or the query."
            )
        expression = {
            "VARCHAR": f"nullif({column}, '')",
            "VARCHAR[]": f"list_transform({column}, lambda v: nullif(v, ''))",
        }.get(data_type, column)
        if pii and policy != "keep":
            expression = "NULL::VARCHAR" if policy == "drop" else hmac_sql(expression)
        projections.append(expression if expression == column else f"{expression} AS {column}")
    return f"SELECT {', '.join(projections)}\nFROM (\n{query}\n) AS built", params


def described_columns(
    conn: duckdb.DuckDBPyConnection, table: str, doc: TableDoc, pii_policy: str
) -> list[tuple[str, str, str, bool]]:
    """``(name, type, description, pii)`` of ``table``'s columns as stored, notes appended."""
    derived = table.partition(".")[0] in EMPTY_IS_NULL_SCHEMAS
    declared = {c.name: c for c in doc.columns}
    out = []
    stored = conn.execute(f"SELECT * FROM {qualified(table)} LIMIT 0").description
    for name, type_code, *_ in stored:
        data_type = str(type_code)  # the type's name, as information_schema.columns gives it
        column = declared.get(name, Column(name, "(not described)"))
        text = [column.description]
        if derived and data_type in ("VARCHAR", "VARCHAR[]"):
            text.append(EMPTY_IS_NULL_NOTE)
        if derived and column.pii:
            text.append(PII_NOTES[pii_policy])
        out.append((name, data_type, " ".join(text), column.pii))
    return out


def comment_table(
    conn: duckdb.DuckDBPyConnection, table: str, description: str, doc: TableDoc, pii_policy: str
) -> None:
    """The descriptions as DuckDB comments, in one transaction: on a lake, one snapshot."""

    def comment() -> None:
        conn.execute(f"COMMENT ON TABLE {qualified(table)} IS {sql_literal(description)}")
        for name, _, text, _ in described_columns(conn, table, doc, pii_policy):
            conn.execute(
                f"COMMENT ON COLUMN {qualified(table)}.{quote_ident(name)} IS {sql_literal(text)}"
            )

    run_transaction(conn, table, comment)


def column_schema(
    conn: duckdb.DuckDBPyConnection, table: str, doc: TableDoc, pii_policy: str
) -> dg.TableSchema:
    return dg.TableSchema(
        [
            dg.TableColumn(name, data_type, text, tags={"pii": ""} if pii else None)
            for name, data_type, text, pii in described_columns(conn, table, doc, pii_policy)
        ]
    )


def prepare_raw_table(
    conn: duckdb.DuckDBPyConnection, staged: str, asset_name: str, warehouse: FieldSalesWarehouse
) -> int:
    """Before a raw table is swapped in: redact personal keys if asked (return how many rows),
    write its comments."""
    redacted = redact_pii_keys(conn, staged) if warehouse.redact_pii_in_raw else 0
    doc = table_doc(asset_name)
    comment_table(conn, staged, doc.description or asset_name, doc, warehouse.pii)
    return redacted
