"""SimCLR client method, encoder features, and the ufdg linear-probe evaluation.

The slow tier (the tests/slow/ folder: every test here is marked slow by tests/conftest.py);
the quick tests of the same subject are in tests/algorithms/test_simclr_ufdg.py."""

from __future__ import annotations

import pytest

from fedtune.runtime.driver import run

from tests.algorithms.test_simclr_ufdg import METRICS, ufdg_cfg


def metrics_of(rows) -> list[tuple]:
    return [tuple(r[m] for m in METRICS) + tuple(sorted((k, v) for k, v in r.items() if k.startswith(
        ("val_acc.", "target_acc.")))) for r in rows]


@pytest.mark.ray
def test_ufdg_metrics_do_not_depend_on_actors_or_backend(ray_session, tmp_path):
    kw = {"rounds": 2, "local_steps": 1, "client_cpus": 0.5}
    local = run(ufdg_cfg(tmp_path, name="local", **kw), progress=False)
    rows = {}
    for actors in (1, 2):
        res = run(ufdg_cfg(tmp_path, backend="ray", max_client_actors=actors, name=f"a{actors}", **kw), progress=False)
        assert res.status == "completed" and res.info["num_workers"] == actors
        rows[actors] = res.rows
    assert metrics_of(rows[1]) == metrics_of(rows[2]) == metrics_of(local.rows)
    assert all(0.0 <= r["target_acc"] <= 1.0 for r in local.rows)
