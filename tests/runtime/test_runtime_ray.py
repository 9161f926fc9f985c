"""Integration tests on a real local Ray (2 CPUs, one fake GPU): actors, placement, packing,
determinism against the in-process backend, fail-fast resources, client failures."""

from __future__ import annotations


import pytest

from fedtune.config import FederatedRunConfig
from fedtune.results.store import load
from fedtune.runtime.driver import FederatedRun, run
from fedtune.errors import ResourceError

pytestmark = pytest.mark.ray

METRICS = ("train_loss", "val_acc", "val_loss", "target_acc", "target_loss")


def cfg_of(tmp_path, **kw) -> FederatedRunConfig:
    base = {"dataset": "rect4", "rounds": 2, "local_steps": 3, "batch_size": 16, "output": str(tmp_path),
            "backend": "ray", "client_cpus": 0.5}
    base.update(kw)
    return FederatedRunConfig.from_dict(base)


def metrics_of(rows) -> list[tuple]:
    return [tuple(r[m] for m in METRICS) + tuple(sorted((k, v) for k, v in r.items() if k.startswith(
        ("val_acc.", "target_acc.")))) for r in rows]


def test_two_rounds_of_three_clients_match_the_in_process_backend(ray_session, tmp_path):
    # rect4 leave-one-domain-out: 3 source clients, one actor each.
    ray_res = run(cfg_of(tmp_path, max_client_actors=3), progress=False)
    local_res = run(cfg_of(tmp_path, backend="local", name="local"), progress=False)
    assert ray_res.status == local_res.status == "completed"
    assert ray_res.info["num_workers"] == 3
    assert [r["num_participants"] for r in ray_res.rows] == [3, 3]
    assert metrics_of(ray_res.rows) == metrics_of(local_res.rows)
    table = load(ray_res.study_dir)
    assert table.num_rows == 2 and table.column("round").to_pylist() == [1, 2]
    assert set(table.column("status").to_pylist()) == {"ok"}
    assert ray_res.rows[-1]["bytes_moved"] > 0
    # Nothing of the run is left behind: its placement group is removed.
    assert all(pg["state"] == "REMOVED" for pg in ray_session.util.placement_group_table().values())


def test_five_clients_at_a_quarter_gpu_are_refused_before_launch(ray_session, tmp_path):
    cfg = cfg_of(tmp_path, setting="fl", num_clients=5, client_gpus=0.25, client_cpus=0.25,
                 max_client_actors=5)
    before = len(ray_session.util.placement_group_table())
    with pytest.raises(ResourceError) as err:  # how fast: benchmarks/refusal_latency.py
        FederatedRun(cfg).start()
    msg = str(err.value)
    assert "max_client_actors=5" in msg and "0.25 GPU" in msg and "1 GPU" in msg and "room for 4" in msg
    assert len(ray_session.util.placement_group_table()) == before  # nothing was reserved


def test_a_busy_cluster_times_out_with_a_clear_error_instead_of_hanging(ray_session, tmp_path):
    from ray.util.placement_group import placement_group, remove_placement_group

    hog = placement_group([{"CPU": 2.0}])
    assert hog.wait(10)
    try:
        with pytest.raises(ResourceError, match="placement_timeout_s=1"):  # timing: benchmarks/refusal_latency.py
            FederatedRun(cfg_of(tmp_path, placement_timeout_s=1.0)).start()
    finally:
        remove_placement_group(hog)
