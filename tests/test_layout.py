"""The package's shape, checked: no import cycle, no class too big to read, one registry of schemes.

These hold the code to what the architecture page says of it, so that a
change that breaks the shape fails here, not in a later review.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import asynclock
from asynclock.backends._registry import SCHEMES

PACKAGE = Path(asynclock.__file__).parent
#: The longest a class may be, in lines (its docstring and methods included).
CLASS_LINES = 300


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ["asynclock", *path.relative_to(PACKAGE).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> Iterator[str]:
    """Every module of the package that ``name`` imports: at its top, inside functions, under TYPE_CHECKING."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            if target in modules:
                yield target
            for alias in node.names:
                if f"{target}.{alias.name}" in modules:
                    yield f"{target}.{alias.name}"
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names if alias.name in modules)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_counting_imports_inside_functions_and_for_type_checking() -> None:
    modules = _modules()
    graph = {name: set(_imports(name, path, modules)) - {name} for name, path in modules.items()}
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_class_is_over_300_lines() -> None:
    long = [
        f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name} ({lines} lines)"
        for path in PACKAGE.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
        and (lines := (node.end_lineno or node.lineno) - node.lineno + 1) > CLASS_LINES
    ]
    assert long == []


def test_connect_documents_every_scheme_of_the_registry() -> None:
    doc = asynclock.connect.__doc__ or ""
    assert [scheme for scheme in SCHEMES if f"``{scheme}://" not in doc] == []
