"""Integration tests on a real local Ray (2 CPUs, one fake GPU): actors, placement, packing,
determinism against the in-process backend, fail-fast resources, client failures."""

from __future__ import annotations

import time

import numpy as np
import pytest

from fedtune.config import FederatedRunConfig
from fedtune.results.store import load
from fedtune.runtime.pools import ClientFailure
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


def stepped(cfg: FederatedRunConfig, rounds: int, between=None) -> tuple[list[dict], FederatedRun]:
    fr = FederatedRun(cfg)
    fr.start()
    out = []
    try:
        for r in range(rounds):
            if between is not None and r > 0:
                between(fr, r)
            out.append(fr.step().metrics)
    finally:
        fr.close()
    return out, fr


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


@pytest.mark.slow
@pytest.mark.parametrize("algorithm,extra", [("fedomg", {}), ("fedgp", {"setting": "fda", "gp_beta": "auto"})])
def test_server_rules_on_their_own_coordinator_cpu_match_the_in_process_backend(ray_session, tmp_path, algorithm,
                                                                                 extra):
    # The coordinator actor in its own 1-CPU bundle (one server thread) against the in-process
    # coordinator with 3 server threads: the Gram / auto-β passes give the same bits.
    cfg = dict(algorithm=algorithm, max_client_actors=2, **extra)
    on_ray = run(cfg_of(tmp_path, coordinator_cpus=1, name="ray", **cfg), progress=False)
    local = run(cfg_of(tmp_path, backend="local", coordinator_cpus=3, name="local", **cfg), progress=False)
    assert on_ray.status == local.status == "completed"
    assert metrics_of(on_ray.rows) == metrics_of(local.rows)
    diag = "diag.omg_lambda" if algorithm == "fedomg" else "diag.gp_sigma2"
    assert [r[diag] for r in on_ray.rows] == [r[diag] for r in local.rows]


@pytest.mark.slow
@pytest.mark.parametrize("actors", [1, 2, 4])
def test_metrics_do_not_depend_on_the_number_of_actors(ray_session, tmp_path, actors):
    cfg = dict(dataset="rotated-digits", setting="fl", num_clients=5, rounds=2, local_steps=2, participation=0.8,
               batch_size=16)
    local = run(cfg_of(tmp_path, backend="local", name="ref", **cfg), progress=False)
    on_ray = run(cfg_of(tmp_path, max_client_actors=actors, name=f"a{actors}", **cfg), progress=False)
    assert on_ray.info["num_workers"] == actors
    assert [r["num_participants"] for r in on_ray.rows] == [4, 4]
    assert metrics_of(on_ray.rows) == metrics_of(local.rows)


@pytest.mark.slow
def test_every_actor_lives_in_the_runs_placement_group_with_its_cpu_share(ray_session, tmp_path):
    fr = FederatedRun(cfg_of(tmp_path, client_cpus=1.0))
    fr.start()
    try:
        import ray

        desc = fr.describe()
        infos = ray.get([h.info.remote() for h in fr.client_handles()])
        pg_id = fr._pg.id.hex()
        assert desc["placement_group_id"] == pg_id
        assert [i["placement_group_id"] for i in infos] == [pg_id] * len(infos)
        assert len(infos) == 2  # 2 CPUs / client_cpus=1 -> 2 client actors for 3 clients
        assert sorted(c for i in infos for c in i["clients"]) == [0, 1, 2]
        assert {i["torch_threads"] for i in infos} == {1}
        assert len({i["pid"] for i in infos} | {desc["pid"]}) == 3
    finally:
        fr.close()


@pytest.mark.slow
def test_four_clients_at_a_quarter_gpu_share_gpu_zero(ray_session, tmp_path):
    cfg = cfg_of(tmp_path, setting="fl", num_clients=4, client_gpus=0.25, client_cpus=0.25, rounds=1)
    fr = FederatedRun(cfg)
    fr.start()
    try:
        import ray

        infos = ray.get([h.info.remote() for h in fr.client_handles()])
        assert len(infos) == 4
        assert [i["gpu_ids"] for i in infos] == [["0"]] * 4
        assert {i["cuda_visible_devices"] for i in infos} == {"0"}
        # No CUDA on this machine: an assigned (fake) GPU falls back to the CPU.
        import torch

        expected = "cuda" if torch.cuda.is_available() else "cpu"
        assert {i["device"] for i in infos} == {expected}
        assert fr.step().status == "ok"
    finally:
        fr.close()


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


def _kill_worker_zero(fr: FederatedRun, _round: int) -> None:
    import ray

    ray.kill(fr.client_handles()[0], no_restart=True)
    time.sleep(0.5)


@pytest.mark.slow
def test_retry_restarts_a_dead_actor_and_reproduces_the_metrics(ray_session, tmp_path):
    cfg = cfg_of(tmp_path, rounds=3, max_client_actors=2, on_client_failure="retry")
    clean, _ = stepped(cfg, 3)
    failed, _ = stepped(cfg, 3, between=lambda fr, r: _kill_worker_zero(fr, r) if r == 1 else None)
    assert [m["actor_restarts"] for m in failed] == [0, 1, 1]
    assert [m["skipped_clients"] for m in failed] == [0, 0, 0]
    assert [tuple(m[k] for k in METRICS) for m in failed] == [tuple(m[k] for k in METRICS) for m in clean]


@pytest.mark.slow
def test_skip_goes_on_without_the_dead_actors_clients_and_records_it(ray_session, tmp_path):
    cfg = cfg_of(tmp_path, rounds=3, max_client_actors=2, on_client_failure="skip")
    rows, _ = stepped(cfg, 3, between=lambda fr, r: _kill_worker_zero(fr, r) if r == 1 else None)
    # Worker 0 holds clients 0 and 2 of the 3: round 2 trains client 1 only.
    assert [m["num_participants"] for m in rows] == [3, 1, 3]
    assert [m["skipped_clients"] for m in rows] == [0, 2, 0]
    assert all(np.isfinite(m["val_acc"]) for m in rows)


@pytest.mark.slow
def test_fail_policy_stops_the_run_naming_the_actor(ray_session, tmp_path):
    cfg = cfg_of(tmp_path, rounds=2, max_client_actors=2, on_client_failure="fail")
    with pytest.raises(ClientFailure, match=r"client actor 0 \(clients \[0, 2\]\) died during fit; .*on_client_failure=fail"):
        stepped(cfg, 2, between=_kill_worker_zero)


@pytest.mark.slow
def test_a_roaming_actors_failure_names_the_clients_dealt_to_it_that_round(ray_session, tmp_path):
    """With roaming clients an actor trains the clients dealt to it, not the ones it owns: the
    failure names those (the round's participants dealt by cost)."""
    from fedtune.data.partition import sample_participants
    from fedtune.runtime.placement import client_cost, deal_clients
    from fedtune.runtime.pools import assign_clients

    cfg = cfg_of(tmp_path, rounds=4, max_client_actors=2, on_client_failure="fail", participation=0.67,
                 client_placement="roaming")
    plan = FederatedRun(cfg).plan
    costs = [client_cost(spec.num_train, cfg) for spec in plan.clients]
    owned = assign_clients(plan.num_clients, 2)[0]
    dealt = {r: deal_clients(sample_participants(plan.num_clients, cfg.participation, cfg.seed, r).tolist(), costs, 2)
             for r in range(2, 5)}
    # the first round whose clients for actor 0 are not the ones it owns (so the message tells them apart)
    r = next(r for r in range(2, 5) if dealt[r].get(0) and dealt[r][0] != owned)
    with pytest.raises(ClientFailure, match=rf"client actor 0 \(clients \{dealt[r][0]}\) died during fit"):
        stepped(cfg, r, between=lambda fr, k: _kill_worker_zero(fr, k) if k == r - 1 else None)
