"""No import circles among the package's modules, counting every import: module level, inside
functions, and under ``TYPE_CHECKING`` (import-linter's layers leave the last two out).

The graph is built from the source with `ast`: an edge ``a -> b`` for each import in ``a`` that
names module ``b`` of the package (``from p import m`` names ``p.m`` when that is a module,
else ``p``). Importing ``p.m`` also runs package ``p``'s ``__init__``, but that edge is left out:
every package whose face re-exports its parts would be a circle with each of them.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "agentrl_sdk"

def module_names() -> dict[str, Path]:
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def imports_of(path: Path, name: str, modules: set[str]) -> set[str]:
    """The package modules ``name`` (at ``path``) imports anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                child = f"{base}.{alias.name}"
                found.add(child if child in modules else base)
    return {m for m in found if m in modules and m != name}


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_package_has_no_import_circles():
    modules = module_names()
    graph = {name: imports_of(path, name, set(modules)) for name, path in modules.items()}
    found = [sorted(m.removeprefix("agentrl_sdk.") for m in c) for c in circles(graph)]
    assert found == [], f"import circles: {found}"


def test_the_graph_sees_type_checking_and_function_local_imports(tmp_path):
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from agentrl_sdk.b import B\n"
        "def f():\n"
        "    from agentrl_sdk import c\n"
    )
    path = tmp_path / "a.py"
    path.write_text(source)
    modules = {"agentrl_sdk.a", "agentrl_sdk.b", "agentrl_sdk.c"}
    assert imports_of(path, "agentrl_sdk.a", modules) == {"agentrl_sdk.b", "agentrl_sdk.c"}
    assert circles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [{"a", "b"}]
