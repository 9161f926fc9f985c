"""Three rules of the house that drifted before (issue 46, item 6), read from the source with ``ast``:

- no ``cfg: Any``: a run's configuration is typed, as :class:`~fedtune.config.FederatedRunConfig`
  where the module may import it, else as a protocol of what the code reads
  (:class:`fedtune.algorithms.base.RunConfig` and its kin);
- the study's vocabulary below the code that uses it: ``tune/trial`` and ``tune/tuner`` (the rooms
  inside Ray Tune) never import ``tune/study`` (which drives a study), and ``tune/common`` (the
  vocabulary they share) imports none of the three;
- an import inside a function only where it keeps a heavy or optional dependency (torch, Ray,
  Optuna, pyarrow, ...) out of a light path, and then it says so: ``# lazy: <why>`` at the end of
  the import (or on the line just above a run of such imports).
"""

from __future__ import annotations

import ast
from tests.project.test_architecture import import_graph, modules

LAZY = "# lazy:"


# ------------------------------------------------------------------------------------------- no cfg: Any
def any_typed_cfgs(source: str, where: str = "") -> list[str]:
    """``where:line: name`` for every function parameter called ``cfg`` annotated ``Any`` (the name,
    ``typing.Any`` or the string ``"Any"``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        args = node.args
        for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
            note = arg.annotation
            if arg.arg != "cfg" or note is None:
                continue
            if ((isinstance(note, ast.Name) and note.id == "Any")
                    or (isinstance(note, ast.Attribute) and note.attr == "Any")
                    or (isinstance(note, ast.Constant) and str(note.value).strip() == "Any")):
                found.append(f"{where}:{arg.lineno}: {getattr(node, 'name', 'lambda')}")
    return found


def test_no_run_config_is_typed_any():
    found = [hit for name, path in modules().items()
             for hit in any_typed_cfgs(path.read_text(encoding="utf-8"), name)]
    assert not found, ("`cfg: Any` (type it FederatedRunConfig, or a protocol of what the code reads where the "
                       "layer may not import the config):\n" + "\n".join(found))


def test_the_cfg_any_check_can_fail():
    source = ("from typing import Any\nimport typing\n"
              "def a(cfg: Any): pass\ndef b(x, *, cfg: 'Any'): pass\ndef c(cfg: typing.Any = None): pass\n"
              "def d(cfg: 'FederatedRunConfig', other: Any): pass\ndef e(cfg): pass\n")
    assert any_typed_cfgs(source) == [":3: a", ":4: b", ":5: c"]


# --------------------------------------------------------------------- the study's vocabulary below its users
INSIDE_TUNE = ("fedtune.tune.trial", "fedtune.tune.tuner")
COMMON = "fedtune.tune.common"
STUDY = "fedtune.tune.study"


def _under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def tune_arrows_up(graph: dict[str, set[str]]) -> list[str]:
    """``a -> b`` for every import (anywhere in a module) from ``tune/trial`` or ``tune/tuner`` into
    ``tune/study``, and from ``tune/common`` into any of the three."""
    wrong = []
    for a, deps in sorted(graph.items()):
        for b in sorted(deps):
            if any(_under(a, p) for p in INSIDE_TUNE) and _under(b, STUDY):
                wrong.append(f"{a} -> {b}")
            elif _under(a, COMMON) and any(_under(b, p) for p in (*INSIDE_TUNE, STUDY)):
                wrong.append(f"{a} -> {b}")
    return wrong


def test_the_rooms_inside_tune_never_import_the_study():
    graph = import_graph()
    assert any(_under(m, COMMON) for m in graph), "tune/common is gone: update this test"
    wrong = tune_arrows_up(graph)
    assert not wrong, ("imports from the rooms inside Ray Tune into tune/study (move what they need to tune/common):\n"
                       + "\n".join(wrong))


def test_the_tune_layer_check_can_fail():
    graph = {"fedtune.tune.trial.progress": {"fedtune.tune.study.plan", "fedtune.tune.common.searches"},
             "fedtune.tune.tuner.samplers": {"fedtune.tune.study"},
             "fedtune.tune.common.active": {"fedtune.tune.trial.callback"},
             "fedtune.tune.study.sweep": {"fedtune.tune.trial.progress", "fedtune.tune.common.active"}}
    assert tune_arrows_up(graph) == ["fedtune.tune.common.active -> fedtune.tune.trial.callback",
                                     "fedtune.tune.trial.progress -> fedtune.tune.study.plan",
                                     "fedtune.tune.tuner.samplers -> fedtune.tune.study"]


# ------------------------------------------------------------------------------ imports inside functions
def unexplained_lazy_imports(source: str, where: str = "") -> list[str]:
    """``where:line: import`` for every import inside a function (at any depth) that does not say why
    it is there: ``# lazy: <why>`` on one of its lines, or on the line just above the run of
    consecutive imports it belongs to."""
    lines = source.splitlines()
    found = []

    def said(node: ast.stmt) -> bool:
        return any(LAZY in lines[i - 1] and lines[i - 1].split(LAZY, 1)[1].strip()
                   for i in range(node.lineno, node.end_lineno + 1))

    def above(line: int) -> bool:
        text = lines[line - 2].strip() if line >= 2 else ""
        return text.startswith(LAZY) and bool(text[len(LAZY):].strip())

    def check_body(body: list[ast.stmt]) -> None:
        run_said = False
        for i, stmt in enumerate(body):
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                if above(stmt.lineno):
                    run_said = True
                elif i == 0 or not isinstance(body[i - 1], (ast.Import, ast.ImportFrom)):
                    run_said = False
                if not (run_said or said(stmt)):
                    found.append(f"{where}:{stmt.lineno}: {ast.get_source_segment(source, stmt)}")

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if inside:
                for field in ("body", "orelse", "finalbody"):
                    body = getattr(child, field, None)
                    if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
                        check_body(body)
                for handler in getattr(child, "handlers", []) or []:
                    check_body(handler.body)
                for case in getattr(child, "cases", []) or []:
                    check_body(case.body)
            visit(child, inside)

    visit(ast.parse(source), False)
    return found


def test_imports_inside_functions_say_why():
    found = [hit for name, path in modules().items()
             for hit in unexplained_lazy_imports(path.read_text(encoding="utf-8"), name)]
    assert not found, (f"{len(found)} imports inside functions without a reason: move them to the top of the module, "
                       f"or, where one keeps a heavy or optional dependency (torch, Ray, Optuna, pyarrow, ...) out of "
                       f"a light path, say so at its end: `{LAZY} keeps torch out of ...`:\n" + "\n".join(found))


def test_the_lazy_import_check_can_fail():
    source = (
        "import json\n"
        "def f():\n"
        "    import torch  # lazy: keeps torch out of the CLI\n"
        "    import ray\n"
        "    # lazy: Optuna and pyarrow load only when a study runs\n"
        "    import optuna\n"
        "    from pyarrow import (\n"
        "        parquet)\n"
        "    x = 1\n"
        "    import os\n"
        "    if x:\n"
        "        from fedtune import errors  # lazy:\n"
        "    def g():\n"
        "        import math  # lazy: a reason\n"
        "        import csv\n"
        "class C:\n"
        "    import re\n"
    )
    assert unexplained_lazy_imports(source) == [":4: import ray", ":10: import os",
                                                ":12: from fedtune import errors", ":15: import csv"]
