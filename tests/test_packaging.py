"""Packaging: ``python -m fedtune``, ``fedtune --version``, ``py.typed``, and pyproject.toml
declaring every third-party package that fedtune/ imports (test-only ones in the ``test`` extra)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions, version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _top_level_imports(folder: Path) -> dict[str, set[str]]:
    """Top-level module name -> files of ``folder`` importing it (absolute imports only)."""
    out: dict[str, set[str]] = {}
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                out.setdefault(name.split(".")[0], set()).add(str(path.relative_to(ROOT)))
    return out


def _names(requirements: list[str]) -> set[str]:
    """Normalised distribution names of PEP 508 requirement strings."""
    return {re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9_.-]+", r).group(0)).lower() for r in requirements}


def _undeclared(folder: Path, declared: set[str]) -> dict[str, list[str]]:
    dists = packages_distributions()
    missing: dict[str, list[str]] = {}
    for module, files in _top_level_imports(folder).items():
        if module in sys.stdlib_module_names or module in ("fedtune", "__future__"):
            continue
        if (folder / f"{module}.py").is_file() or (folder / module).is_dir():  # the folder's own helpers
            continue
        names = _names(dists.get(module, [module]))
        if not names & declared:
            missing[module] = sorted(files)
    return missing


def test_every_third_party_import_of_the_package_is_a_declared_dependency():
    declared = _names(PYPROJECT["project"]["dependencies"])
    assert _undeclared(ROOT / "fedtune", declared) == {}
    assert "pandas" in declared  # the report's tables (it once was imported but undeclared)


def test_every_third_party_import_of_the_tests_is_declared_or_in_the_test_extra():
    declared = _names(PYPROJECT["project"]["dependencies"] + PYPROJECT["project"]["optional-dependencies"]["test"])
    assert _undeclared(ROOT / "tests", declared) == {}


def test_ray_floor_is_the_version_ci_tests():
    (ray,) = [r for r in PYPROJECT["project"]["dependencies"] if r.startswith("ray[")]
    floor = re.search(r">=\s*([0-9.]+)", ray).group(1)
    installed = tuple(int(x) for x in version("ray").split(".")[:2])
    floor_v = tuple(int(x) for x in floor.split(".")[:2])
    assert floor_v <= installed  # the floor is not above what CI runs
    assert floor_v > (2, 40)  # Ray 2.40 has no tune.RunConfig (tried: AttributeError), which the sweep uses


def test_python_m_fedtune_and_version_print_the_installed_version(tmp_path):
    res = subprocess.run([sys.executable, "-m", "fedtune", "--version"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == f"fedtune {version('fedtune')}"
    res = subprocess.run([sys.executable, "-m", "fedtune", "fields"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60, check=False)
    assert res.returncode == 0 and "local_steps" in res.stdout  # the whole CLI, not only --version


def test_py_typed_ships_as_package_data():
    assert (ROOT / "fedtune" / "py.typed").is_file()
    assert "py.typed" in PYPROJECT["tool"]["setuptools"]["package-data"]["fedtune"]
