"""The package's layers, as docs/development.md lists them after "Each layer imports only the ones
below it": no module imports one of a higher layer, and no modules import each other in a cycle.
Every import counts: at the top of a module, inside a function, under ``if TYPE_CHECKING:``."""

from __future__ import annotations

import ast
import re

from fieldsales_dagster_tests.test_static_checks import DEVELOPMENT, PACKAGE

Graph = dict[str, set[str]]


def stated_layers(doc: str) -> list[list[str]]:
    """The doc's layers, bottom first, each a list of its entries (``client/``, ``names.py``)."""
    layers: list[list[str]] = []
    for line in doc.split("Each layer imports only the ones below it", 1)[1].splitlines():
        if entries := re.match(r"^\d+\. ((?:`[^`]+`(?:, )?)+):", line):
            layers.append(re.findall(r"`([^`]+)`", entries.group(1)))
        elif layers and not line.strip():
            break
    return layers


def layer_of(module: str, layers: list[list[str]]) -> int:
    found = [
        index
        for index, entries in enumerate(layers)
        for entry in entries
        if module == entry or (entry.endswith("/") and module.startswith(entry))
    ]
    assert len(found) == 1, (
        f"{module} is in {len(found)} layers of docs/development.md's list (after \"Each layer "
        'imports only the ones below it"): put it in one.'
    )
    return found[0]


def module_file(dotted: str) -> str | None:
    """``fieldsales_dagster.client.api`` -> ``client/api.py`` (a package: its ``__init__.py``)."""
    parts = dotted.split(".")
    if parts[0] != PACKAGE.name:
        return None
    base = PACKAGE.joinpath(*parts[1:])
    for candidate in (base.parent / f"{base.name}.py", base / "__init__.py"):
        if candidate.is_file():
            return candidate.relative_to(PACKAGE).as_posix()
    return None


def imported_modules(source: str) -> set[str]:
    """The package's modules ``source`` imports, wherever the import statement is."""
    found: set[str | None] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {module_file(alias.name) for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0 and node.module, "the package imports by absolute names"
            module = node.module
            found |= {module_file(f"{module}.{a.name}") or module_file(module) for a in node.names}
    return {module for module in found if module}


def package_graph() -> Graph:
    """Each module of the package (``client/api.py``) -> the package's modules it imports."""
    graph = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        graph[name] = imported_modules(path.read_text("utf-8")) - {name}
    return graph


def upward_imports(graph: Graph, layers: list[list[str]]) -> list[str]:
    def named(index: int) -> str:
        return f"layer {index + 1}: {', '.join(layers[index])}"

    found = []
    for module, imported in sorted(graph.items()):
        for target in sorted(imported):
            low, high = layer_of(module, layers), layer_of(target, layers)
            if high > low:
                found.append(f"{module} ({named(low)}) imports {target} ({named(high)})")
    return found


def cycles(graph: Graph) -> list[str]:
    """Each set of modules that import each other in a circle, as the imports among them."""

    def reachable(start: str) -> set[str]:
        seen, todo = set[str](), [start]
        while todo:
            for module in graph[todo.pop()] - seen:
                seen.add(module)
                todo.append(module)
        return seen

    reach = {module: reachable(module) for module in graph}
    circles = {frozenset(m for m in reach[start] if start in reach[m]) for start in graph}
    return sorted(
        ", ".join(f"{a} imports {b}" for a in sorted(circle) for b in sorted(graph[a] & circle))
        for circle in circles
        if circle
    )


def test_every_module_is_in_one_layer_and_every_layer_names_modules():
    layers = stated_layers(DEVELOPMENT.read_text())
    graph = package_graph()
    assert len(layers) > 5
    placed = {layer_of(module, layers) for module in graph}
    assert placed == set(range(len(layers))), "a layer of docs/development.md names no module"


def test_no_module_imports_a_higher_layer():
    upward = upward_imports(package_graph(), stated_layers(DEVELOPMENT.read_text()))
    assert not upward, "imports of a higher layer (docs/development.md):\n" + "\n".join(upward)


def test_no_modules_import_each_other_in_a_cycle():
    found = cycles(package_graph())
    assert not found, "modules that import each other:\n" + "\n".join(found)


def test_imports_inside_functions_and_for_type_checking_count():
    source = """
from typing import TYPE_CHECKING
import fieldsales_dagster.settings
if TYPE_CHECKING:
    from fieldsales_dagster.client.api import FieldSalesAPI
def lazy():
    from fieldsales_dagster.warehouse import lake
    from fieldsales_dagster.demo_api import DemoServer
"""
    assert imported_modules(source) == {
        "settings.py",
        "client/api.py",
        "warehouse/lake.py",
        "demo_api/__init__.py",
    }


def test_the_checks_see_an_upward_import_and_a_cycle():
    layers = stated_layers(DEVELOPMENT.read_text())
    graph = package_graph()
    graph["settings.py"] |= {"warehouse/lake.py"}
    graph["warehouse/lake.py"] |= {"settings.py"}
    assert (
        "settings.py (layer 3: settings.py, paths.py) imports warehouse/lake.py (layer 4: "
        "warehouse/)" in upward_imports(graph, layers)
    )
    assert "settings.py imports warehouse/lake.py, warehouse/lake.py imports settings.py" in (
        cycles(graph)
    )
