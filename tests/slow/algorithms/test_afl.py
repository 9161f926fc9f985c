"""AFL (client method ``afl`` with its server side, docs/methods-benchmark.md §22): the simplex projection
against a float64 bisection, the server's ascent step from the clients' extras, the clients' domain
losses and their λ-weighted steps against float64 references, λ in the checkpoint, a run, and bad
input in one line.

The slow tier (the tests/slow/ folder: every test here is marked slow by tests/conftest.py);
the quick tests of the same subject are in tests/algorithms/test_afl.py."""

from __future__ import annotations

import pytest

from tests.algorithms.test_afl import _metrics, _run_cfg


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.ray
def test_the_aggregated_order_gives_the_same_rounds_on_ray_with_any_actor_count(ray_session, tmp_path):
    from fedtune.runtime.driver import FederatedRun

    with FederatedRun(_run_cfg(tmp_path / "local", rounds=3)) as fr:
        expected = [fr.step().metrics for _ in range(3)]
    for actors in (1, 2):
        cfg = _run_cfg(tmp_path / f"ray{actors}", rounds=3, backend="ray", client_cpus=0.5,
                       max_client_actors=actors)
        with FederatedRun(cfg) as fr:
            assert len(fr.client_handles()) == actors
            assert _metrics([fr.step().metrics for _ in range(3)]) == _metrics(expected), actors
