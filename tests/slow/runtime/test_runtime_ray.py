"""Integration tests on a real local Ray (2 CPUs, one fake GPU): actors, placement, packing,
determinism against the in-process backend, fail-fast resources, client failures.

The slow tier (the tests/slow/ folder: every test here is marked slow by tests/conftest.py);
the quick tests of the same subject are in tests/runtime/test_runtime_ray.py."""

from __future__ import annotations

import time

import numpy as np
import pytest

from fedtune.config import FederatedRunConfig
from fedtune.runtime.pools import ClientFailure
from fedtune.runtime.driver import FederatedRun, run

from tests.runtime.test_runtime_ray import METRICS, cfg_of, metrics_of


pytestmark = pytest.mark.ray


def stepped(cfg: FederatedRunConfig, rounds: int, between=None, run_ahead: bool = True) -> tuple[list[dict], FederatedRun]:
    """``rounds`` rounds of a fresh run, ``between(fr, r)`` before each round after the first;
    ``run_ahead=False``: the coordinator sends no round before its call (a test that kills a worker
    between rounds then knows which round meets the death)."""
    fr = FederatedRun(cfg)
    fr.start()
    if not run_ahead:
        _coordinator(fr, lambda coordinator: setattr(coordinator, "run_ahead", False))
    out = []
    try:
        for r in range(rounds):
            if between is not None and r > 0:
                between(fr, r)
            out.append(fr.step().metrics)
    finally:
        fr.close()
    return out, fr


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


@pytest.mark.parametrize("actors", [1, 2, 4])
def test_metrics_do_not_depend_on_the_number_of_actors(ray_session, tmp_path, actors):
    cfg = dict(dataset="rotated-digits", setting="fl", num_clients=5, rounds=2, local_steps=2, participation=0.8,
               batch_size=16)
    local = run(cfg_of(tmp_path, backend="local", name="ref", **cfg), progress=False)
    on_ray = run(cfg_of(tmp_path, max_client_actors=actors, name=f"a{actors}", **cfg), progress=False)
    assert on_ray.info["num_workers"] == actors
    assert [r["num_participants"] for r in on_ray.rows] == [4, 4]
    assert metrics_of(on_ray.rows) == metrics_of(local.rows)


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


def _kill_worker_zero(fr: FederatedRun, _round: int) -> None:
    import ray

    ray.kill(fr.client_handles()[0], no_restart=True)
    time.sleep(0.5)


def test_retry_restarts_a_dead_actor_and_reproduces_the_metrics(ray_session, tmp_path):
    cfg = cfg_of(tmp_path, rounds=3, max_client_actors=2, on_client_failure="retry")
    clean, _ = stepped(cfg, 3)
    failed, _ = stepped(cfg, 3, between=lambda fr, r: _kill_worker_zero(fr, r) if r == 1 else None, run_ahead=False)
    assert [m["actor_restarts"] for m in failed] == [0, 1, 1]
    assert [m["skipped_clients"] for m in failed] == [0, 0, 0]
    assert [tuple(m[k] for k in METRICS) for m in failed] == [tuple(m[k] for k in METRICS) for m in clean]


def test_skip_goes_on_without_the_dead_actors_clients_and_records_it(ray_session, tmp_path):
    cfg = cfg_of(tmp_path, rounds=3, max_client_actors=2, on_client_failure="skip")
    rows, _ = stepped(cfg, 3, between=lambda fr, r: _kill_worker_zero(fr, r) if r == 1 else None, run_ahead=False)
    # Worker 0 holds clients 0 and 1 of the 3: round 2 trains client 2 only.
    assert [m["num_participants"] for m in rows] == [3, 1, 3]
    assert [m["skipped_clients"] for m in rows] == [0, 2, 0]
    assert all(np.isfinite(m["val_acc"]) for m in rows)


def test_fail_policy_stops_the_run_naming_the_actor(ray_session, tmp_path):
    cfg = cfg_of(tmp_path, rounds=2, max_client_actors=2, on_client_failure="fail")
    with pytest.raises(ClientFailure, match=r"client actor 0 \(clients \[0, 1\]\) died during fit; .*on_client_failure=fail"):
        stepped(cfg, 2, between=_kill_worker_zero, run_ahead=False)


def test_a_roaming_actors_failure_names_the_clients_dealt_to_it_that_round(ray_session, tmp_path):
    """With roaming clients an actor trains the clients dealt to it, not the ones it owns: the
    failure names those (the round's participants dealt by cost into runs of consecutive clients:
    the round is folded)."""
    from fedtune.data.partition import sample_participants
    from fedtune.runtime.placement import client_cost, deal_contiguous
    from fedtune.runtime.pools import assign_clients

    cfg = cfg_of(tmp_path, rounds=4, max_client_actors=2, on_client_failure="fail", participation=0.67,
                 client_placement="roaming")
    plan = FederatedRun(cfg).plan
    costs = [client_cost(spec.num_train, cfg) for spec in plan.clients]
    owned = assign_clients(plan.num_clients, 2)[0]
    dealt = {r: deal_contiguous(sample_participants(plan.num_clients, cfg.participation, cfg.seed, r).tolist(),
                                costs, 2) for r in range(2, 5)}
    # the first round whose clients for actor 0 are not the ones it owns (so the message tells them apart)
    r = next(r for r in range(2, 5) if dealt[r].get(0) and dealt[r][0] != owned)
    with pytest.raises(ClientFailure, match=rf"client actor 0 \(clients \{dealt[r][0]}\) died during fit"):
        stepped(cfg, r, between=lambda fr, k: _kill_worker_zero(fr, k) if k == r - 1 else None, run_ahead=False)


def _coordinator(fr: FederatedRun, fn):
    """``fn(coordinator)`` run in the coordinator actor."""
    import ray

    return ray.get(fr.coordinator.__ray_call__.remote(fn))


def _folded_rounds(fr: FederatedRun) -> int:
    return _coordinator(fr, lambda coordinator: coordinator.folded_rounds)


@pytest.mark.parametrize("kw", [{}, {"participation": 0.67, "client_placement": "roaming"},
                                {"algorithm": "feddyn", "feddyn_alpha": 0.1}],
                         ids=["owners", "roaming", "feddyn-side-sums"])
def test_folded_rounds_are_the_in_process_rows_bit_for_bit(ray_session, tmp_path, kw):
    """Every fit round folded on the workers (their sums carried from one to the next, one reply of
    sums each): the in-process backend's rows, FedDyn's server-side sums included."""
    cfg = cfg_of(tmp_path, rounds=3, max_client_actors=2, **kw)
    folded, fr = stepped(cfg, 3)
    local, _ = stepped(cfg_of(tmp_path, rounds=3, backend="local", name="local", **kw), 3)
    assert metrics_of(folded) == metrics_of(local)
    fr2 = FederatedRun(cfg)
    fr2.start()
    try:
        for _ in range(2):
            fr2.step()
        assert _folded_rounds(fr2) == 2
        # round 2 sent as round 1 ended; FedDyn's clients keep state on their workers: never run ahead
        ahead = 0 if kw.get("algorithm") == "feddyn" else 1
        assert _coordinator(fr2, lambda coordinator: coordinator.rounds_ahead) == ahead
    finally:
        fr2.close()


def test_a_round_run_ahead_is_abandoned_when_a_checkpoint_is_loaded(ray_session, tmp_path):
    """Round r+1 is sent before round r's result returns; loading round 1's checkpoint after
    round 2 abandons the round 3 sent ahead, and rounds 2 and 3 are a clean run's rows again."""
    cfg = cfg_of(tmp_path, rounds=3, max_client_actors=2)
    clean, _ = stepped(cfg, 3)
    fr = FederatedRun(cfg)
    fr.start()
    try:
        rows = [fr.step().metrics]
        state = fr.get_state()
        fr.step()
        fr.set_state(state)
        rows += [fr.step().metrics, fr.step().metrics]
        # taken as run ahead: round 2 after round 1 and round 3 after the second round 2 (the round 3
        # sent after the first round 2 was abandoned); all four fit rounds folded
        assert _coordinator(fr, lambda coordinator: (coordinator.rounds_ahead, coordinator.folded_rounds)) == (2, 4)
    finally:
        fr.close()
    assert metrics_of(rows) == metrics_of(clean)


def test_a_worker_killed_while_a_round_runs_ahead_gives_a_clean_runs_rows(ray_session, tmp_path):
    """retry: whether the dead worker had finished the round sent ahead or not (which round meets
    the death depends on timing), the rows are a clean run's and the actor was restarted once."""
    cfg = cfg_of(tmp_path, rounds=3, max_client_actors=2, on_client_failure="retry")
    clean, _ = stepped(cfg, 3, run_ahead=False)
    rows, _ = stepped(cfg, 3, between=lambda fr, r: _kill_worker_zero(fr, r) if r == 1 else None)
    assert rows[-1]["actor_restarts"] == 1
    assert metrics_of(rows) == metrics_of(clean)


def test_a_worker_that_dies_in_a_folded_round_meets_the_policy_and_the_round_is_streamed(ray_session, tmp_path):
    """retry: the dead worker restarted, the round trained again through the streamed path, the
    same rows as a clean run; the rounds after it fold again."""
    cfg = cfg_of(tmp_path, rounds=3, max_client_actors=2, on_client_failure="retry")
    clean, _ = stepped(cfg, 3)
    fr = FederatedRun(cfg)
    fr.start()
    _coordinator(fr, lambda coordinator: setattr(coordinator, "run_ahead", False))
    try:
        rows = [fr.step().metrics]
        _kill_worker_zero(fr, 1)
        rows += [fr.step().metrics, fr.step().metrics]
        assert _folded_rounds(fr) == 2  # rounds 1 and 3; round 2 streamed after the restart
    finally:
        fr.close()
    assert [m["actor_restarts"] for m in rows] == [0, 1, 1]
    assert metrics_of(rows) == metrics_of(clean)
