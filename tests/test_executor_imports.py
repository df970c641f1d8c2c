"""The executor's modules import each other one way only: no import cycle among them.

Reads the source with ``ast`` (imports nothing of the executor, so it needs no torch) and counts
every import: at module level and inside functions, relative (``from .timing import timeit``,
``from . import measure``) and absolute (``from simpar.executor.probe import speed_probe``,
``import simpar.executor.worker``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "executor"  # installed as simpar.executor


def executor_modules() -> dict[str, Path]:
    """Dotted name (``executor.microbench``; the package itself ``executor``) -> source file."""
    mods = {}
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


def imported(module: str, path: Path, node: ast.AST) -> list[str]:
    """The dotted names an import statement may refer to (a module, or a module's attribute)."""
    if isinstance(node, ast.Import):
        return [a.name.removeprefix("simpar.") for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        base = (module if path.name == "__init__.py" else module.rpartition(".")[0]).split(".")
        base = base[: len(base) - (node.level - 1)]
        name = ".".join(base + ([node.module] if node.module else []))
    else:
        name = (node.module or "").removeprefix("simpar.")
    return [name] + [f"{name}.{a.name}" for a in node.names]


def import_graph() -> nx.DiGraph:
    mods = executor_modules()
    g = nx.DiGraph()
    g.add_nodes_from(mods)
    for module, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            for name in imported(module, path, node):
                if name in mods and name != module:
                    g.add_edge(module, name)
    return g


def test_graph_sees_executor_imports():
    """The graph is not empty by mistake: known imports (module level, inside a function) are in it."""
    g = import_graph()
    assert g.has_edge("executor.entry", "executor.launch")  # module level, relative
    assert g.has_edge("executor.launch", "executor.worker")  # inside a function


def test_no_import_cycle_in_executor():
    g = import_graph()
    cycles = [sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1]
    assert not cycles, f"import cycles among executor modules: {cycles}"
    assert nx.is_directed_acyclic_graph(g)
