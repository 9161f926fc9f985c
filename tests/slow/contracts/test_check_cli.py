"""``fedtune check MODULE[:NAME]`` and its Python face (issue 45): the contract checks every built-in
passes (:mod:`fedtune.contracts`; tests/contracts/test_contracts.py runs them on every built-in) run on a
plugin's components. Both plugin examples pass (exit 0); seven components broken on purpose
(tests/contracts/broken_plugins/) each fail the check that names their fault (exit 1) and pass the others; a
module that does not import, a name it does not register and a bare ``fedtune`` are one line (exit 2);
``fedtune:NAME`` checks a built-in; ``fedtune.assert_component_ok`` raises one line per failure.

The slow tier (the tests/slow/ folder: every test here is marked slow by tests/conftest.py);
the quick tests of the same subject are in tests/contracts/test_check_cli.py."""

from __future__ import annotations

import pytest

from tests.contracts.test_check_cli import cli


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.ray
def test_fedtune_check_ray_starts_its_own_ray_and_passes_an_example():
    res = cli("examples/plugins/fednova.py", "--ray", timeout=400)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "ray = local" in res.stdout and " 0 failed" in res.stdout.strip().splitlines()[-1]
