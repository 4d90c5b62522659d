"""Tenants never share a file, a token or a pool: a claim (lake, data folder, export, token
store, key prefix, pool) two components of a code location share fails the load, naming both.
Claims compare what they resolve to: a file by device and inode, a data folder also by the
folders holding it (one tenant's upkeep would delete the other's files), a PostgreSQL catalog by
its server's system identifier. Across code locations, ``lake.check_tenant`` refuses a second.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, cast

import dagster as dg
from dagster.components.core.component_tree import TestComponentTree
from dagster.components.core.defs_module import ComponentPath


@dataclass(frozen=True)
class Claim:
    """One thing a tenant must have to itself: ``thing`` ``value`` from its ``setting``."""

    thing: str  # "DuckLake", "lake data folder", "DuckDB export", "token store", "key prefix", ...
    value: str  # as this tenant's settings spell it
    setting: str  # where it comes from, e.g. "ducklake_catalog"
    #: Claims of one kind may be one thing (a SQLite file is never a PostgreSQL schema).
    kind: Hashable = None
    #: What it resolves to, then what holds it (asked only of claims of one kind, spelled apart).
    resolve: Callable[[], tuple[Hashable, ...]] | None = field(default=None, compare=False)
    same: str = "one"

    def collides(self, other: Claim) -> bool:
        if (self.thing, self.kind) != (other.thing, other.kind):
            return False
        if self.value == other.value or self.resolve is None or other.resolve is None:
            return self.value == other.value
        mine, theirs = self.resolve(), other.resolve()
        return mine[0] in theirs or theirs[0] in mine

    def shared_with(self, other: Claim) -> str:
        if self.value == other.value:
            return f"the {self.thing} {self.value} ({self.setting} of both)"
        return (
            f"the {self.thing} {self.value} and {other.value} ({self.setting} of each: {self.same})"
        )


class Tenant(Protocol):
    key_prefix: str | None

    def tenant_claims(self) -> list[Claim]: ...


class TenantConflictError(ValueError):
    """Two components of one code location share a file, a token store, a key prefix or a pool."""


def refuse_shared_claims(context: dg.ComponentLoadContext, of_type: type[Tenant]) -> None:
    """Raise ``TenantConflictError`` if this component shares a claim with another ``of_type``."""
    tree, this = context.component_tree, context.component_loc
    tenants = {
        loc: cast(Tenant, tree.load_component(loc)) for loc in declared_tenants(context, of_type)
    }
    if this not in tenants:  # built outside a defs folder: nothing to compare with
        return
    root = tree.defs_module_path.parent
    mine = tenants.pop(this)
    claims = mine.tenant_claims()
    for loc, other in tenants.items():
        theirs = other.tenant_claims()
        shared = [c.shared_with(t) for c in claims for t in theirs if c.collides(t)]
        if shared:
            raise TenantConflictError(
                f"Field-Sales components {_describe(this, mine, root)} and "
                f"{_describe(loc, other, root)} share {'; '.join(shared)}. Give each "
                "defs/<tenant>/defs.yaml its own lake (ducklake_catalog or ducklake_schema), "
                "ducklake_data_path, duckdb_path, token_store_path and key_prefix."
            )


def declared_tenants(context: dg.ComponentLoadContext, of_type: type) -> list[ComponentPath]:
    """Where the code location declares components of ``of_type``, without loading them."""
    tree = context.component_tree
    if isinstance(tree, TestComponentTree):
        return []
    return [
        loc
        for loc, decl in tree.find_root_decl().iterate_loc_component_decl_pairs()
        if isinstance(loc, ComponentPath)
        and isinstance(decl.component_type, type)
        and issubclass(decl.component_type, of_type)
    ]


def _describe(loc: ComponentPath, tenant: Tenant, root: Path) -> str:
    """``defs/acme/defs.yaml (key_prefix acme)``, with ``[n]`` for a file's n-th component."""
    where = loc.file_path.relative_to(root).as_posix()
    where += "" if loc.instance_key in (None, 0) else f"[{loc.instance_key}]"
    prefix = f"key_prefix {tenant.key_prefix}" if tenant.key_prefix else "no key_prefix"
    return f"{where} ({prefix})"
