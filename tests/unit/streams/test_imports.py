"""The imports of streams/ go one way: no module imports itself back through others (a
function-local import counts: it only hides a circle), no sub-package but testing imports
streams.testing, and nothing below streams/ imports streams.app (the top of the runtime).
Imports under ``if TYPE_CHECKING:`` are for the type checker only and do not count."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

STREAMS = Path(__file__).resolve().parents[3] / "streams"


def module_names() -> dict[str, Path]:
    """Every module of streams/, by its dotted name (a package by its own)."""
    names = {}
    for path in STREAMS.rglob("*.py"):
        parts = list(path.relative_to(STREAMS.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imported(tree: ast.AST) -> list[str]:
    """The dotted names ``tree`` imports from streams, wherever it imports them."""
    found: list[str] = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _type_checking(node):
            for branch in node.orelse:
                found += imported(branch)
            continue
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [f"{node.module}.{alias.name}" for alias in node.names]
        found += imported(node)
    return [name for name in found if name.split(".")[0] == "streams"]


@functools.cache
def import_graph() -> dict[str, set[str]]:
    """Each module of streams/ and the modules of streams/ it imports."""
    modules = module_names()

    def module_of(name: str) -> str:
        while name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = {module_of(n) for n in imported(ast.parse(path.read_text()))}
        graph[name] = targets - {name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph``: one path around each, found depth first."""
    found: list[list[str]] = []
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> None:
        if node in path:
            found.append([*path[path.index(node):], node])
            return
        if node in done:
            return
        for target in sorted(graph[node]):
            visit(target, [*path, node])
        done.add(node)

    for node in sorted(graph):
        visit(node, [])
    return found


def test_the_walk_sees_the_runtime_s_imports() -> None:
    graph = import_graph()
    assert "streams.runtime.thread" in graph and "streams.app" in graph
    assert "streams.config" in graph["streams.app"]
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]


def test_streams_has_no_import_circle() -> None:
    assert circles(import_graph()) == []


def test_no_sub_package_but_testing_imports_streams_testing() -> None:
    wrong = sorted((module, target) for module, targets in import_graph().items()
                   for target in targets
                   if target.startswith("streams.testing")
                   and module.count(".") >= 1 and not module.startswith("streams.testing")
                   and module.split(".")[1] in _sub_packages())
    assert wrong == []


def test_nothing_below_streams_imports_the_app() -> None:
    wrong = sorted(module for module, targets in import_graph().items()
                   if "streams.app" in targets and module.split(".")[1] in _sub_packages())
    assert wrong == []


def _sub_packages() -> set[str]:
    return {path.parent.name for path in STREAMS.glob("*/__init__.py")}
