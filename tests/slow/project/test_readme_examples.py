"""The README's ```python examples that use Ray Tune run as written, on the test session's local Ray.

The slow tier (the tests/slow/ folder: every test here is marked slow by tests/conftest.py); how the
examples are found and run, and the examples without Ray: tests/project/test_readme_examples.py."""

from __future__ import annotations

import pytest

from tests.project.test_readme_examples import BLOCKS, run_example, uses_ray
from tests.project.test_readme_examples import workdir  # noqa: F401 - a fixture, used by name


@pytest.mark.ray
@pytest.mark.parametrize("block", [pytest.param(b, id=b.where) for b in BLOCKS if uses_ray(b)])
def test_the_example_runs_as_written(block, workdir, monkeypatch, request):
    run_example(block, workdir, monkeypatch, request)
