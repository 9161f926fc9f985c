"""The package's shape: no import circle between fedtune's modules, and no oversized module.

The import graph is read from the source (``ast``), not by importing: every ``import`` and
``from ... import`` anywhere in a module counts, at module level or inside a function (a lazy
import is still an arrow between two rooms). An import names one module: ``from fedtune.a import
b`` is an arrow to ``fedtune.a.b`` when that is a module, else to ``fedtune.a``; the parent
packages Python imports on the way are not arrows of their own (a package's ``__init__``
re-exporting its submodules is not a circle).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "fedtune"
MAX_LINES = 600


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported_modules(name: str, path: Path, known: set[str]) -> set[str]:
    """The fedtune modules ``name`` (its source at ``path``) imports, anywhere in its body."""
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the module's package, one level up per extra dot
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            targets = [f"{stem}.{alias.name}" if f"{stem}.{alias.name}" in known else stem for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # `import fedtune.a.b.Name`-like: the longest module prefix
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imported_modules(name, path, known) for name, path in mods.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
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
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def describe(component: list[str], graph: dict[str, set[str]]) -> str:
    inside = set(component)
    arrows = [f"{a} -> {b}" for a in component for b in sorted(graph[a] & inside)]
    return f"{', '.join(component)}: " + "; ".join(arrows)


def test_the_import_graph_reads_relative_and_lazy_imports():
    graph = import_graph()
    assert "fedtune.errors" in graph["fedtune.data.base"]  # module level
    assert "fedtune.algorithms" in graph["fedtune.config"]  # inside a method
    assert "fedtune.data.base" in graph["fedtune.data.registry"]  # relative (from .base import ...)
    assert "fedtune.algorithms.client" in graph["fedtune.algorithms.sam"]
    assert graph["fedtune.errors"] == set()  # the floor


def test_the_package_has_no_import_cycle():
    graph = import_graph()
    found = cycles(graph)
    assert not found, "import circles:\n" + "\n".join(describe(c, graph) for c in found)


def test_algorithms_never_import_the_config():
    graph = import_graph()
    offenders = sorted(m for m, deps in graph.items() if m.startswith("fedtune.algorithms") and "fedtune.config" in deps)
    assert not offenders, f"algorithms must import fedtune.errors, not fedtune.config: {offenders}"


def test_no_module_is_oversized():
    sizes = {name: len(path.read_text(encoding="utf-8").splitlines()) for name, path in modules().items()}
    big = {name: n for name, n in sizes.items() if n > MAX_LINES}
    assert not big, f"modules over {MAX_LINES} lines: {big}"
