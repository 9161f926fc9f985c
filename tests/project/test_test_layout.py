"""The tests' own layout: tests/<area>/ mirrors the package (fedtune/<area>/ or fedtune/<area>.py),
the slow tier is the folder tests/slow/<area>/, and tests/conftest.py keeps the ``slow`` mark and
that folder the same thing (every test under tests/slow/ is marked slow; a test marked slow
anywhere else fails the collection of its module), so ``-m "not slow"`` is ``--ignore=tests/slow``."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
PACKAGE = TESTS.parent / "fedtune"
# Folders that mirror no single fedtune/<area>: what each holds.
OTHER_AREAS = {
    "benchmarks": "the scripts of benchmarks/",
    "cluster": "cluster.yaml and examples/cluster-*.yaml: fedtune/runtime/cluster.py and the sweep on Ray clusters",
    "project": "the repository as a whole: import layers, packaging, the public face, doctests, README examples",
}


def areas(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir() if p.is_dir() and p.name not in ("__pycache__", "slow")
            and any(p.rglob("test_*.py"))}


def test_each_test_folder_mirrors_a_part_of_the_package_and_no_test_lies_loose():
    package = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    modules = {p.stem.partition("_")[0] for p in PACKAGE.glob("*.py")}  # cli_sweep.py -> cli, config_values -> config
    unmirrored = areas(TESTS) - package - modules - set(OTHER_AREAS)
    assert not unmirrored, f"tests/{sorted(unmirrored)} mirror no fedtune/<area>: rename, or say why in OTHER_AREAS"
    assert not list(TESTS.glob("test_*.py")), "a test module directly in tests/: put it in tests/<area>/"
    assert areas(TESTS / "slow") <= areas(TESTS), "tests/slow/<area>/ uses the quick tier's area names"
    for folder in [TESTS, *(TESTS / a for a in areas(TESTS)), TESTS / "slow", *(TESTS / "slow" / a for a in
                                                                                   areas(TESTS / "slow"))]:
        assert (folder / "__init__.py").is_file(), f"{folder}: a package, so that equal module names may repeat"


def _collect(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "-p", "no:xdist", "--rootdir", str(root), "-c", str(root / "pytest.ini"), *args,
                           str(root / "tests")], cwd=root, capture_output=True, text=True, timeout=300)


def test_the_slow_folder_is_the_slow_mark_and_a_slow_mark_elsewhere_fails_collection(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: slow\n")
    tests = tmp_path / "tests"
    (tests / "slow" / "area").mkdir(parents=True)
    (tests / "area").mkdir()
    shutil.copy(TESTS / "conftest.py", tests / "conftest.py")
    for folder in (tests, tests / "slow", tests / "slow" / "area", tests / "area"):
        (folder / "__init__.py").write_text("")
    (tests / "slow" / "area" / "test_x.py").write_text("def test_whole_study():\n    pass\n")
    (tests / "area" / "test_x.py").write_text("def test_quick():\n    pass\n")

    quick = _collect(tmp_path, "-m", "not slow")
    assert quick.returncode == 0, quick.stdout + quick.stderr
    assert "tests/area/test_x.py::test_quick" in quick.stdout and "test_whole_study" not in quick.stdout
    slow = _collect(tmp_path, "-m", "slow")
    assert "tests/slow/area/test_x.py::test_whole_study" in slow.stdout and "test_quick" not in slow.stdout

    (tests / "area" / "test_marked.py").write_text(textwrap.dedent("""
        import pytest

        @pytest.mark.slow
        def test_marked_slow_in_the_quick_tier():
            pass
    """))
    bad = _collect(tmp_path)
    assert bad.returncode != 0
    assert "ERROR collecting tests/area/test_marked.py" in bad.stdout, bad.stdout + bad.stderr
    assert "tests marked slow outside tests/slow/: test_marked_slow_in_the_quick_tier" in bad.stdout


def test_a_test_that_leaves_a_component_registered_fails_and_registries_isolated_undoes_it(tmp_path):
    """tests/conftest.py fails (at teardown, naming them) a test that leaves a component registered,
    which the later tests of its worker would see; ``registries_isolated`` undoes a test's."""
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: slow\n")
    tests = tmp_path / "tests"
    (tests / "area").mkdir(parents=True)
    shutil.copy(TESTS / "conftest.py", tests / "conftest.py")
    for folder in (tests, tests / "area"):
        (folder / "__init__.py").write_text("")
    (tests / "area" / "test_x.py").write_text(textwrap.dedent("""
        import fedtune

        def twice():
            return fedtune.Preset("sgd-twice", "sgd", "fedavg", ("fl",), "a test's")

        def test_isolated(registries_isolated):
            fedtune.register(twice())
            assert "sgd-twice" in fedtune.PRESETS

        def test_after_isolated():
            assert "sgd-twice" not in fedtune.PRESETS

        def test_leaks():
            fedtune.register(twice())
    """))
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                          "-p", "no:randomly", "--rootdir", str(tmp_path), "-c", str(tmp_path / "pytest.ini"),
                          str(tests)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode != 0, run.stdout + run.stderr
    assert "ERROR at teardown of test_leaks" in run.stdout, run.stdout + run.stderr
    assert "the test left registered: algorithm sgd-twice (use the registries_isolated fixture" in run.stdout
    assert "3 passed, 1 error" in run.stdout, run.stdout


def test_a_slow_half_uses_its_quick_halfs_autouse_fixtures():
    """A slow module split from a quick one keeps the quick module's autouse fixtures (imported by
    name): without them, e.g., a plugin a slow test registers stays registered for the tests that
    run after it in the same worker."""
    import ast

    missing = []
    for slow in (TESTS / "slow").rglob("test_*.py"):
        quick = TESTS / slow.relative_to(TESTS / "slow")
        if not quick.is_file():
            continue
        autouse = [node.name for node in ast.walk(ast.parse(quick.read_text(encoding="utf-8")))
                   if isinstance(node, ast.FunctionDef) and any("autouse=True" in ast.unparse(d)
                                                                for d in node.decorator_list)]
        text = slow.read_text(encoding="utf-8")
        missing += [f"{slow.relative_to(TESTS)}: {name}" for name in autouse if f"import {name}" not in text]
    assert not missing, "slow halves without their quick half's autouse fixtures:\n" + "\n".join(missing)
