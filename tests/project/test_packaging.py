"""Packaging: ``python -m fedtune``, ``fedtune --version``, ``py.typed``, and pyproject.toml
declaring every third-party package that fedtune/ imports (test-only ones in the ``test`` extra)."""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions, version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _nodes(tree: ast.AST, module_level: bool) -> list[ast.AST]:
    """Every node of ``tree``; with ``module_level``, none inside a function (what runs on import)."""
    out, stack = [], [tree]
    while stack:
        node = stack.pop()
        if module_level and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        out.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return out


def _top_level_imports(folder: Path, module_level: bool = False) -> dict[str, set[str]]:
    """Top-level module name -> files of ``folder`` importing it (absolute imports only; with
    ``module_level``, only the imports that run when the file is imported)."""
    out: dict[str, set[str]] = {}
    for path in folder.rglob("*.py"):
        for node in _nodes(ast.parse(path.read_text(), str(path)), module_level):
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


@functools.cache
def _packages_distributions() -> dict[str, list[str]]:
    return packages_distributions()  # a scan of every installed distribution: once per session


def _undeclared(folder: Path, declared: set[str], module_level: bool = False) -> dict[str, list[str]]:
    dists = _packages_distributions()
    missing: dict[str, list[str]] = {}
    for module, files in _top_level_imports(folder, module_level).items():
        if module in sys.stdlib_module_names or module in ("fedtune", "__future__"):
            continue
        if module == folder.name or (folder / f"{module}.py").is_file() or (folder / module).is_dir():
            continue  # the folder's own package (``from tests.data import wilds_copies``) or helpers
        names = _names(dists.get(module, [module]))
        if not names & declared:
            missing[module] = sorted(files)
    return missing


def test_every_third_party_import_of_the_package_is_a_declared_dependency():
    extras = PYPROJECT["project"]["optional-dependencies"]
    core = _names(PYPROJECT["project"]["dependencies"])
    optional = _names([r for name, reqs in extras.items() if name != "test" for r in reqs])
    assert _undeclared(ROOT / "fedtune", core | optional) == {}
    assert "pandas" in core  # the report's tables (it once was imported but undeclared)
    # A package of an extra only (wandb) is imported inside the function that needs it, never on import.
    assert _undeclared(ROOT / "fedtune", core, module_level=True) == {}


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


# The oldest release of each dependency that fedtune runs on, why, and where fedtune needs it (a
# substring of that file, so a reason that no longer holds is noticed). benchmarks/check_floors.sh
# installs exactly pyproject's floors (Python 3.10) and runs fedtune there; these are what it showed.
REQUIRED_FLOORS: dict[str, tuple[str, str, tuple[str, str] | None]] = {
    "ray": ("2.60", "tune.RunConfig and the callback API of the Ray CI tests", None),
    "torch": ("2.7", "torch.optim.adam.adam(decoupled_weight_decay=...); 2.6's adam() has no such argument",
              ("fedtune/algorithms/client/optim.py", "decoupled_weight_decay=self.decoupled_weight_decay")),
    "torchvision": ("0.22", "the torchvision built for torch 2.7 (each release pins its torch)", None),
    "optuna": ("4.0", "optuna.storages.journal.JournalFileBackend is new in Optuna 4.0",
               ("fedtune/tune/tuner/optuna_search.py", "from optuna.storages.journal import JournalFileBackend")),
    "numpy": ("2.0", "a np.uint64 shifted by a Python int needs NEP 50 (NumPy 1.x raises TypeError)",
              ("fedtune/runtime/common.py", ".generate_state(2, np.uint64)[0] >> 1")),
    "pyarrow": ("17", "ray[tune] 2.60 requires pyarrow>=17", None),
    "sqlalchemy": ("2.0", "Dialect.import_dbapi() is new in SQLAlchemy 2.0",
                   ("fedtune/results/optuna_url.py", "dialect.import_dbapi()")),
    "pandas": ("2.2.2", "the first pandas built for NumPy 2", None),
    "scipy": ("1.13", "the first SciPy built for NumPy 2", None),
    "matplotlib": ("3.8.4", "the first Matplotlib built for NumPy 2", None),
    "scikit-learn": ("1.4.2", "the first scikit-learn built for NumPy 2", None),
    "pyyaml": ("6.0.1", "6.0 has no wheel for Python 3.12+ and its sdist fails to build with Cython 3", None),
    "mlflow-skinny": ("2.12", "2.11 caps packaging<24; Ray 2.60 needs packaging>=24.2", None),
    "wandb": ("0.19", "with 0.18.7 a resumed driver's offline run file stayed empty (tests/slow/tune/test_loggers.py)",
              None),
}


def _floors() -> dict[str, str]:
    """Normalised distribution name -> its ``>=`` floor, over the dependencies and every extra."""
    project = PYPROJECT["project"]
    reqs = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    out: dict[str, str] = {}
    for r in reqs:
        (name,) = _names([r])
        m = re.search(r">=\s*([0-9][0-9.]*)", r)
        assert m, f"{r!r} has no floor (>=): every dependency says the oldest release fedtune runs on"
        assert out.setdefault(name, m.group(1)) == m.group(1), f"{name} has two floors in pyproject.toml"
    return out


def _v(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("."))


def test_no_floor_is_below_what_fedtune_needs():
    floors = _floors()
    low = {name: f"{floors[name]} < {need}: {why}" for name, (need, why, _) in REQUIRED_FLOORS.items()
           if name in floors and _v(floors[name]) < _v(need)}
    assert low == {}
    assert set(REQUIRED_FLOORS) <= set(floors)  # every row is a declared dependency
    assert _v(floors["optuna"]) >= (4, 0)  # fedtune.tune.tuner.optuna_search imports JournalFileBackend (Optuna 4.0)


def test_each_code_reason_for_a_floor_is_still_in_the_code():
    for name, (_, why, where) in REQUIRED_FLOORS.items():
        if where:
            path, text = where
            assert text in (ROOT / path).read_text(), f"{name}: {path} no longer has {text!r} ({why}); is the floor " \
                                                      "still needed?"


def test_every_logger_extra_the_errors_name_exists():
    from fedtune.tune.study.options import LOGGERS

    extras = PYPROJECT["project"]["optional-dependencies"]
    test_extra = _names(extras["test"])
    for name, needs in LOGGERS.items():
        if needs is None:
            continue
        module, extra = needs  # "pip install 'fedtune[<extra>]'" must install <module>
        assert extra in extras, f"--logger {name}: no [{extra}] extra in pyproject.toml"
        dists = _names(_packages_distributions().get(module, [module]))
        assert dists & _names(extras[extra]), f"[{extra}] does not install the '{module}' module"
        assert dists & test_extra, (f"--logger {name}: tests/slow/tune/test_loggers.py needs '{module}' "
                                    "in the test extra")


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
