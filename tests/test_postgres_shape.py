"""PostgreSQL backend: the shape of its code stays readable.

Its modules form no import cycle (counting imports inside functions and
under ``TYPE_CHECKING``, and ``from . import x`` as an import of the
package), no submodule imports the package, and no class runs over
``MAX_CLASS_LINES`` lines. Read from the source with ``ast``: no import.
"""

from __future__ import annotations

import ast
from pathlib import Path

import asynclock

PACKAGE = Path(asynclock.__file__).parent / "backends" / "postgres"
DOTTED = "asynclock.backends.postgres"
MAX_CLASS_LINES = 300


def _modules() -> dict[str, ast.Module]:
    return {path.stem: ast.parse(path.read_text(), str(path)) for path in sorted(PACKAGE.glob("*.py"))}


def _edges(modules: dict[str, ast.Module]) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (``__init__``: the package itself)."""
    edges: dict[str, set[str]] = {name: set() for name in modules}
    for name, tree in modules.items():
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom):
                if node.level == 1:
                    targets = [node.module.split(".")[0]] if node.module else ["__init__"]
                elif node.level == 0 and node.module and node.module.startswith(DOTTED):
                    rest = node.module[len(DOTTED) :].lstrip(".")
                    targets = [rest.split(".")[0] or "__init__"]
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith(DOTTED):
                        rest = alias.name[len(DOTTED) :].lstrip(".")
                        targets.append(rest.split(".")[0] or "__init__")
            edges[name].update(target for target in targets if target in modules)
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (or a module importing itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in edges[v]:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_postgres_modules_form_no_import_cycle() -> None:
    edges = _edges(_modules())
    assert _cycles(edges) == []
    assert [name for name in edges if name != "__init__" and "__init__" in edges[name]] == []


def test_no_postgres_class_is_longer_than_the_limit() -> None:
    long = [
        f"{name}.{node.name}: {node.end_lineno - node.lineno + 1} lines"
        for name, tree in _modules().items()
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef) and node.end_lineno is not None
        if node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES
    ]
    assert long == []


def test_the_shape_check_sees_a_cycle() -> None:
    # (the check itself: a cycle through a TYPE_CHECKING import and one through the package)
    modules = {
        "__init__": ast.parse("from ._a import A"),
        "_a": ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ._b import B"),
        "_b": ast.parse("def f():\n    from . import _a"),
    }
    edges = _edges(modules)
    assert edges["_b"] == {"__init__"}
    assert _cycles(edges) == [["__init__", "_a", "_b"]]
