"""Contract tests generated from the registry (issue 28): every preset, and every (client method x
server rule x server optimiser) combination the declarations allow, parametrised from
:mod:`fedtune.algorithms.declarations` alone. No list of methods is kept here: a component added
to the declarations is tested by every contract below without touching this file.

The slow tier (the tests/slow/ folder: every test here is marked slow by tests/conftest.py);
the quick tests of the same subject are in tests/contracts/test_contracts.py."""

from __future__ import annotations

import pytest

from fedtune.contracts.runs import check_ray
from fedtune.runtime.driver import FederatedRun

from tests.contracts.test_contracts import FORMS, FORM_IDS, ok


@pytest.fixture(scope="module")
def ray_runs(ray_session):
    """One Ray run per actor count, re-configured in place for each form (no actor restarts)."""
    runs: dict[int, FederatedRun] = {}
    yield runs
    for fr in runs.values():
        fr.close()


@pytest.mark.ray
@pytest.mark.parametrize("form", FORMS, ids=FORM_IDS)
def test_both_backends_and_any_actor_count_give_the_same_rounds(ray_runs, tmp_path, form):
    ok(check_ray(form, tmp_path, runs=ray_runs))
