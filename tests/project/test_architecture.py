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

PACKAGE = Path(__file__).resolve().parents[2] / "fedtune"
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
    assert "fedtune.errors" in graph["fedtune.data.registry"]  # module level
    assert "fedtune.algorithms" in graph["fedtune.config"]  # inside a method
    assert "fedtune.data.base" in graph["fedtune.data.registry"]  # relative (from .base import ...)
    assert "fedtune.algorithms.client.method" in graph["fedtune.algorithms.client.sam"]
    assert graph["fedtune.errors"] == set()  # the floor


def test_the_package_has_no_import_cycle():
    graph = import_graph()
    found = cycles(graph)
    assert not found, "import circles:\n" + "\n".join(describe(c, graph) for c in found)


def test_algorithms_never_import_the_config():
    graph = import_graph()
    offenders = sorted(m for m, deps in graph.items() if m.startswith("fedtune.algorithms") and "fedtune.config" in deps)
    assert not offenders, f"algorithms must import fedtune.errors, not fedtune.config: {offenders}"


def third_party_imports(path: Path) -> set[str]:
    """Top-level names of every non-fedtune module ``path`` imports, anywhere in its body."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.split(".")[0])
    return out - {"fedtune"}


def reachable(start: str, graph: dict[str, set[str]]) -> set[str]:
    seen, todo = {start}, [start]
    while todo:
        for dep in graph[todo.pop()] - seen:
            seen.add(dep)
            todo.append(dep)
    return seen


def test_algorithms_rooms_show_the_split():
    """algorithms/server/ (what the coordinator runs) reaches no torch, through any fedtune module
    it imports; the declarations, the presets and the registries at algorithms/ reach neither torch
    nor NumPy; every module of algorithms/ lives in one of the two rooms or is one of those seven."""
    graph, mods = import_graph(), modules()
    top = {"fedtune.algorithms", "fedtune.algorithms.base", "fedtune.algorithms.declarations",
           "fedtune.algorithms.fedadg_declarations", "fedtune.algorithms.optimizer_declarations",
           "fedtune.algorithms.presets", "fedtune.algorithms.tuner_declarations"}
    rooms = {m for m in mods if m.startswith("fedtune.algorithms.")} - top
    assert rooms and all(m.split(".")[2] in ("client", "server") for m in rooms), sorted(rooms)
    assert {m for m in mods if m.startswith("fedtune.algorithms.server.")}, "the server room is empty"
    assert {m for m in mods if m.startswith("fedtune.algorithms.client.")}, "the client room is empty"
    for name in sorted(mods):
        if name.startswith("fedtune.algorithms.server") or name in top:
            lazy_registry = name == "fedtune.algorithms"  # imports a class's module only when asked
            reach = {name} if lazy_registry else reachable(name, graph)
            banned = {"torch", "torchvision"} | ({"numpy"} if name in top else set())
            found = {m: sorted(third_party_imports(mods[m]) & banned) for m in reach}
            assert not any(found.values()), f"{name} reaches {({m: b for m, b in found.items() if b})}"


def test_no_module_is_oversized():
    sizes = {name: len(path.read_text(encoding="utf-8").splitlines()) for name, path in modules().items()}
    big = {name: n for name, n in sizes.items() if n > MAX_LINES}
    assert not big, f"modules over {MAX_LINES} lines: {big}"


# ------------------------------------------------------------------------------------ one home per name
ROOT = PACKAGE.parent
IMPORTERS = ("fedtune", "tests", "benchmarks", "examples")


def defined_names(path: Path) -> set[str]:
    """Names a module defines at its top level (def, class, assignment; inside a top-level ``if``
    or ``try`` too). Names it only imports are not its own."""
    out: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    out.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
            elif isinstance(node, ast.If):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)
                visit(node.finalbody)

    visit(ast.parse(path.read_text(encoding="utf-8"), str(path)).body)
    return out


def public_api() -> set[str]:
    """The top-level ``fedtune`` namespace: the one deliberate facade (``fedtune.run``, ...),
    for users; code inside the package imports each name from its home."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    return set()


def second_addresses() -> list[str]:
    """Every ``from fedtune.X import name`` (in the package, tests, benchmarks, examples) where
    ``name`` is neither a submodule of ``fedtune.X`` nor defined in it."""
    mods = modules()
    defined = {name: defined_names(path) for name, path in mods.items()}
    api = public_api()
    found = []
    for folder in IMPORTERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            inside = folder == "fedtune"
            here = module_name(path) if inside else ""
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
                if not isinstance(node, ast.ImportFrom):
                    continue
                source = node.module or ""
                if node.level:  # relative: from the module's package, one level up per extra dot
                    base = here.split(".") if path.name == "__init__.py" else here.split(".")[:-1]
                    source = ".".join(base[:len(base) - (node.level - 1)] + ([node.module] if node.module else []))
                if source not in mods:
                    continue
                for alias in node.names:
                    name = alias.name
                    if name == "*" or f"{source}.{name}" in mods or name in defined[source]:
                        continue
                    if source == "fedtune" and name in api and not inside:
                        continue
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: from {source} import {name}")
    return found


def test_every_name_is_imported_from_its_home():
    found = second_addresses()
    assert not found, (f"{len(found)} imports of a name from a module that only re-exports it (import it from "
                       "the module that defines it):\n" + "\n".join(found))


def only_raises_the_old_name_error(func: ast.FunctionDef) -> bool:
    """Whether a module ``__getattr__`` does nothing but ``raise old_name_error(__name__, name)``
    (:mod:`fedtune.old_names`: an old spelling's one line; it never returns a value)."""
    body = func.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    if len(body) != 1 or not isinstance(body[0], ast.Raise) or not isinstance(body[0].exc, ast.Call):
        return False
    call = body[0].exc
    params = [a.arg for a in func.args.args]
    return (isinstance(call.func, ast.Name) and call.func.id == "old_name_error" and not call.keywords
            and len(params) == 1
            and [a.id if isinstance(a, ast.Name) else None for a in call.args] == ["__name__", *params])


def test_no_module_re_exports_or_aliases_names():
    """The one deliberate exception: the public face, ``fedtune/__init__.py``, resolves its names
    (each from its one home) in a module ``__getattr__``. Elsewhere a module ``__getattr__`` may
    only raise an old spelling's one line, never hand out a name."""
    offenders = []
    for name, path in modules().items():
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text, str(path))
        if "noqa: F401" in text:
            offenders.append(f"{name}: an import kept only to re-export it (noqa: F401)")
        if "sys.modules[__name__]" in text:
            offenders.append(f"{name}: a sys.modules alias of another module")
        for node in tree.body:
            if (isinstance(node, ast.FunctionDef) and node.name == "__getattr__" and name != "fedtune"
                    and not only_raises_the_old_name_error(node)):
                offenders.append(f"{name}: a module __getattr__ that resolves names from elsewhere (only the "
                                 "public face, fedtune/__init__.py, may; others may only "
                                 "`raise old_name_error(__name__, name)`)")
    assert not offenders, "names with two addresses:\n" + "\n".join(offenders)


def test_the_old_name_hook_check_can_fail():
    def func(source: str) -> ast.FunctionDef:
        return ast.parse(source).body[0]

    hook = "def __getattr__(name):\n"
    assert only_raises_the_old_name_error(func(hook + '    """doc"""\n    raise old_name_error(__name__, name)'))
    assert not only_raises_the_old_name_error(func(hook + "    return 1"))
    assert not only_raises_the_old_name_error(func(hook + "    x = 1\n    raise old_name_error(__name__, name)"))
    assert not only_raises_the_old_name_error(func(hook + "    raise AttributeError(name)"))
    assert not only_raises_the_old_name_error(func(hook + "    raise old_name_error('fedtune', name)"))


def test_the_re_export_checks_can_fail(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("from os import path  # noqa: F401\nimport sys\nX = 1\ndef f(): pass\nclass C: pass\n"
                      "if sys:\n    Y = 2\ntry:\n    Z = 3\nexcept ImportError:\n    W = 4\n")
    assert defined_names(module) == {"X", "f", "C", "Y", "Z", "W"}


# ------------------------------------------------------------------------------------------ the public face
def face_homes() -> dict[str, str]:
    """``fedtune/__init__.py``'s ``_HOMES``: each public name -> the module that defines it."""
    for node in ast.parse((PACKAGE / "__init__.py").read_text(encoding="utf-8")).body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == "_HOMES":
            return ast.literal_eval(node.value)
    raise AssertionError("fedtune/__init__.py has no _HOMES table")


def test_the_public_face_is_its_table_and_each_name_has_one_home():
    homes = face_homes()
    assert public_api() == set(homes) | {"__version__"}, "fedtune.__all__ lists exactly _HOMES' names and __version__"
    mods = modules()
    wrong = {name: home for name, home in homes.items() if home not in mods or name not in defined_names(mods[home])}
    assert not wrong, f"public names whose _HOMES entry is not the module that defines them: {wrong}"
    assert not set(homes) & defined_names(PACKAGE / "__init__.py"), "the face defines none of its names itself"


def through_the_face(source: str, api: set[str]) -> list[str]:
    """Where ``source`` reaches a public name through the face: ``from fedtune import <name>`` (or
    ``*``) and ``fedtune.<name>``, each as ``line: text``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module == "fedtune" and not node.level:
            found += [f"{node.lineno}: from fedtune import {a.name}" for a in node.names if a.name in api | {"*"}]
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "fedtune"
              and node.attr in api):
            found.append(f"{node.lineno}: fedtune.{node.attr}")
    return found


def test_code_inside_the_package_never_imports_through_the_face():
    """``from fedtune import run`` and ``fedtune.run`` are for users; inside fedtune every name
    is imported from its home (``_HOMES``), so the face can change without moving the package."""
    api = public_api() - {"__version__"}
    found = [f"{name}:{where}" for name, path in modules().items() if name != "fedtune"
             for where in through_the_face(path.read_text(encoding="utf-8"), api)]
    assert not found, "code inside fedtune reaching a name through the public face (import it from its home):\n" + \
        "\n".join(found)


def test_the_face_check_can_fail():
    source = ("import fedtune\nfrom fedtune import run, yaml_safe, __version__\nfrom fedtune import *\n"
              "fedtune.load('x')\nfedtune.config\nfrom fedtune.results.store import load\n")
    assert through_the_face(source, {"run", "load"}) == [
        "2: from fedtune import run", "3: from fedtune import *", "4: fedtune.load"]


# ------------------------------------------------------------------------------------------------ layers
# docs/architecture.md's layers, from the floor up: a module imports modules of its own layer or
# of a layer below it, never above (the first prefix that matches a module names its layer).
LAYERS: list[tuple[str, ...]] = [
    ("fedtune.errors", "fedtune.bounds", "fedtune.yaml_safe", "fedtune.old_names", "fedtune.results.atomic",
     "fedtune.results.study_dir", "fedtune.results.status", "fedtune.entry_points"),
    ("fedtune.data", "fedtune.layout"),
    ("fedtune.algorithms", "fedtune.models", "fedtune.flat_weights", "fedtune.model_heads", "fedtune.model_check", "fedtune.weight_files",
     "fedtune.plugins", "fedtune.model_factory"),
    ("fedtune.config", "fedtune.config_roles", "fedtune.config_values", "fedtune.trial_ids"),
    ("fedtune.results",),
    ("fedtune.runtime",),
    ("fedtune.spaces", "fedtune.reports", "fedtune.contracts"),
    ("fedtune.tune",),
    ("fedtune.cli_sweep", "fedtune.cli_check", "fedtune.cli", "fedtune.__main__", "fedtune"),
]


def layer_of(module: str) -> int:
    for i, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes if p != "fedtune"):
            return i
    if module == "fedtune":
        return len(LAYERS) - 1
    raise AssertionError(f"{module} is in no layer of LAYERS (add it, and to docs/architecture.md)")


def test_imports_point_down_the_layers_only():
    graph = import_graph()
    upward = sorted(f"{a} (layer {layer_of(a)}) -> {b} (layer {layer_of(b)})"
                    for a, deps in graph.items() for b in deps if layer_of(b) > layer_of(a))
    assert not upward, "imports pointing up a layer:\n" + "\n".join(upward)



def test_moved_module_paths_are_gone_and_their_new_homes_exist():
    from fedtune.old_names import MOVED_MODULES, MOVED_NAMES

    mods = modules()
    assert not set(MOVED_MODULES) & set(mods), "a MOVED_MODULES old path is a module again: drop it from MOVED_MODULES"
    assert set(MOVED_MODULES.values()) <= set(mods)
    assert not set(MOVED_NAMES) & set(mods), "a MOVED_NAMES old spelling is a module: drop it from MOVED_NAMES"


MAX_FUNCTION_LINES = 80  # a function's lines, its docstring left out


def test_no_function_is_oversized():
    big = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                first = node.body[0]
                if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                    lines -= first.end_lineno - first.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    big.append(f"{name}.{node.name}: {lines} lines")
    assert not big, f"functions over {MAX_FUNCTION_LINES} lines (split them where the parts have names):\n" + "\n".join(big)
