"""Every module of the fedtune package runs its doctests (the examples in the docs are code)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import fedtune

def _modules() -> list[str]:
    names = ["fedtune"]
    for info in pkgutil.walk_packages(fedtune.__path__, prefix="fedtune."):
        if not info.name.startswith("fedtune.search_spaces"):
            names.append(info.name)
    return sorted(names)


MODULES = _modules()


def test_every_module_is_collected():
    # walk_packages found the subpackages' modules too, not only the top level
    for name in ("fedtune.config", "fedtune.results.store", "fedtune.tune.study.sweep", "fedtune.runtime.coordinator",
                 "fedtune.algorithms.server.fedomg", "fedtune.data.partition", "fedtune.reports.report",
                 "fedtune.reports.stats", "fedtune.spaces.lookup", "fedtune.spaces.yaml_files"):
        assert name in MODULES, name


@pytest.mark.parametrize("name", MODULES)
def test_module_doctests(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # examples that write files write them here
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} doctest examples failed"
