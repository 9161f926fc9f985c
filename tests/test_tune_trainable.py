"""The Ray Tune trial layer: FedtuneTrainable (placement, checkpoints, actor reuse), ArrowCallback
(the single writer of the store) and the Tuner example that puts them together."""

from __future__ import annotations

import importlib.util
import math
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from fedtune.algorithms.server.aggregate import weighted_sum
from fedtune.algorithms.base import ClientMethodSpec, ServerRuleSpec
from fedtune.algorithms.client.method import SGD
from fedtune.algorithms.server.rule import AggregateResult, ServerRule
from fedtune.algorithms.client.optim import LocalSGD
from fedtune.config import FederatedRunConfig
from fedtune.results.store import load
from fedtune.runtime.driver import FederatedRun, run
from fedtune.errors import ResourceError
from fedtune.runtime.checkpoint import read_checkpoint, write_checkpoint
from fedtune.spaces.model import strip_switches
from fedtune.tune.trial.callback import ArrowCallback
from fedtune.tune.trial.trainable import (
    FedtuneTrainable,
    fedtune_trainable,
    plan_from_bundles,
    resources_for,
    trial_run_config,
)

METRICS = ("round", "train_loss", "val_acc", "target_acc", "num_participants")
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "tuner_api.py"


def key(row) -> tuple:
    """The metrics of a round (NaN and missing alike as None, so diverged rounds compare too)."""
    values = (row.get(m) for m in METRICS)
    return tuple(None if v is None or (isinstance(v, float) and math.isnan(v)) else v for v in values)


# ------------------------------------------------------------------------------------------------
# Resources: an empty head bundle for the trainable, then exactly the run's bundles.
def test_resources_for_three_clients_at_half_a_cpu(ray_session):
    # rect4 leave-one-domain-out has 3 source clients; 2 CPUs hold 4 actors at 0.5 CPU.
    pgf = resources_for({"dataset": "rect4", "client_cpus": 0.5})
    assert pgf.head_bundle_is_empty
    assert pgf.bundles == [{"CPU": 0.5}] * 3
    assert pgf.required_resources == {"CPU": 1.5}
    assert fedtune_trainable().default_resource_request({"dataset": "rect4", "client_cpus": 0.5}) == pgf

    # A coordinator that reserves a share gets bundle 0; the clients follow.
    cfg = {"dataset": "rect4", "client_cpus": 0.5, "coordinator_cpus": 0.5}
    pgf = resources_for(cfg)
    assert pgf.bundles == [{"CPU": 0.5}] * 4
    plan = plan_from_bundles(trial_run_config(cfg), pgf.bundles)
    assert (plan.num_workers, plan.coordinator_bundle, plan.worker_bundles) == (3, 0, [1, 2, 3])
    plan = plan_from_bundles(trial_run_config({"dataset": "rect4", "client_cpus": 0.5}), [{"CPU": 0.5}] * 3)
    assert (plan.num_workers, plan.coordinator_bundle, plan.worker_bundles) == (3, 0, [0, 1, 2])

    # Client actors: min(clients, max_client_actors or what fits); GPUs shares in each bundle.
    assert resources_for({"dataset": "rect4", "client_cpus": 1}).bundles == [{"CPU": 1.0}] * 2
    assert resources_for({"dataset": "rect4", "client_cpus": 1, "max_client_actors": 1}).bundles == [{"CPU": 1.0}]
    assert resources_for({"dataset": "rect4", "client_cpus": 0.5, "client_gpus": 0.25}).bundles == [
        {"CPU": 0.5, "GPU": 0.25}] * 3
    with pytest.raises(ResourceError, match="client_cpus=3"):
        resources_for({"dataset": "rect4", "client_cpus": 3})
    # A search space's switches are not run fields: the trainable leaves them out.
    assert trial_run_config({"dataset": "rect4", "switch.mode": "auto"}).dataset == "rect4"


# ------------------------------------------------------------------------------------------------
# Checkpoints hold the server rule's and the clients' state: shown with a stateful pair.
class _MomentumRule(ServerRule):
    """Server momentum: v <- 0.9 v + sum p_u Δ_u; θ <- θ + v (state: v and a call count)."""

    name = "test_momentum"
    spec = ServerRuleSpec("test_momentum", f"{__name__}:_MomentumRule", "server momentum (a test's)")

    def __init__(self, cfg, layout):
        super().__init__(cfg, layout)
        self.velocity, self.calls = None, 0

    def aggregate(self, params, updates, weights, *, extras, round, info):
        g = weighted_sum(updates, weights)
        self.velocity = g if self.velocity is None else 0.9 * self.velocity + g
        self.calls += 1
        return AggregateResult((params + self.velocity).astype(np.float32), {"calls": float(self.calls)})

    def state_dict(self):
        return {"velocity": None if self.velocity is None else self.velocity.copy(), "calls": self.calls}

    def load_state_dict(self, state):
        self.velocity, self.calls = state["velocity"], int(state["calls"])


class _CountingSGD(SGD):
    """SGD whose step size decays with the rounds the client has trained (kept in ctx.state as a tensor)."""

    name = "test_counting"
    spec = ClientMethodSpec("test_counting", f"{__name__}:_CountingSGD", "decaying SGD (a test's)")

    def make_optimizer(self, model):
        return LocalSGD(model.parameters(), lr=self.cfg.local_lr / self.seen, momentum=self.cfg.local_momentum)

    def train(self, ctx):
        import torch

        ctx.state["seen"] = ctx.state.get("seen", torch.zeros(1)) + 1
        ctx.state["rounds"] = ctx.state.get("rounds", ()) + (ctx.round,)
        self.seen = float(ctx.state["seen"][0])
        return super().train(ctx)


@pytest.fixture
def stateful_components(monkeypatch):
    from fedtune import algorithms

    monkeypatch.setitem(algorithms.SERVER_RULES, _MomentumRule.name, _MomentumRule)
    monkeypatch.setitem(algorithms.CLIENT_METHODS, _CountingSGD.name, _CountingSGD)


def test_checkpoint_restores_rule_and_client_state_exactly(stateful_components, tmp_path):
    cfg = FederatedRunConfig.from_dict({"dataset": "rect4", "setting": "fl", "num_clients": 4, "participation": 0.5,
                               "rounds": 4, "local_steps": 3, "batch_size": 16, "backend": "local",
                               "client_method": "test_counting", "server_rule": "test_momentum",
                               "output": str(tmp_path)})

    def rounds(fr, n):
        return [fr.step().metrics for _ in range(n)]

    with FederatedRun(cfg) as fr:
        straight = rounds(fr, 4)
    with FederatedRun(cfg) as fr:
        first = rounds(fr, 2)
        write_checkpoint(tmp_path / "ckpt", fr.get_state())
    state = read_checkpoint(tmp_path / "ckpt")
    assert state["round"] == 2 and state["weights"].dtype == np.float32
    assert state["rule"]["calls"] == 2 and state["rule"]["velocity"].dtype == np.float64
    assert sorted(state["clients"]) == [0, 1, 2, 3]
    # Participation 0.5 samples 2 of 4 clients per round from (seed, round): whoever trained
    # has its own count and the rounds it took part in.
    trained = {c: s["rounds"] for c, s in state["clients"].items() if s}
    assert sum(len(r) for r in trained.values()) == 4
    assert all(float(s["seen"]["__tensor__"][0]) == len(s["rounds"]) for s in state["clients"].values() if s)

    with FederatedRun(cfg) as fr:
        fr.set_state(state)
        resumed = rounds(fr, 2)
    assert [m["diag.calls"] for m in resumed] == [3.0, 4.0]
    cols = ("train_loss", "val_acc", "target_acc", "num_participants")
    assert [tuple(m[c] for c in cols) for m in first + resumed] == [tuple(m[c] for c in cols) for m in straight]

    # The rule's and clients' state matter: the weights alone do not continue the run.
    with FederatedRun(cfg) as fr:
        fr.set_state({**state, "rule": {"velocity": None, "calls": 0}, "clients": {}})
        weights_only = rounds(fr, 2)
    assert [m["train_loss"] for m in weights_only] != [m["train_loss"] for m in straight[2:]]


# ------------------------------------------------------------------------------------------------
# The trainable on Ray: trial actors in the trial's placement group, reuse and restore.
BASE = {"dataset": "rect4", "setting": "fl", "num_clients": 4, "participation": 0.5, "rounds": 4,
        "local_steps": 3, "batch_size": 16, "client_cpus": 1, "max_client_actors": 1, "checkpoint_every": 2}


@pytest.mark.slow
def test_trainable_reuse_and_restore_match_an_uninterrupted_trial(ray_session, tmp_path, monkeypatch):
    import ray.tune.trainable.trainable as tune_trainable

    # Outside Tune a Trainable makes its log folders under ~/ray_results: keep them in tmp_path.
    monkeypatch.setattr(tune_trainable, "DEFAULT_STORAGE_PATH", str(tmp_path / "logs"))
    a = FedtuneTrainable(dict(BASE))
    try:
        # Outside Tune there is no trial placement group: the run reserves its own.
        assert a.startup["actors_reused"] is False and a.startup["actors_in_trial_pg"] is False
        assert a.run._own_pg and a.run.describe()["placement_group_id"] == a.run._pg.id.hex()
        straight = [a.train() for _ in range(4)]
        assert [r["training_iteration"] for r in straight] == [1, 2, 3, 4]
        assert [r["done"] for r in straight] == [False, False, False, True]
        assert [r.get("should_checkpoint", False) for r in straight] == [False, True, False, False]
        assert {r["fedtune_trial_id"] for r in straight} == {trial_run_config(BASE).trial_id()}
        assert straight[0]["fedtune_row"]["hp.local_lr"] == 0.05 and straight[0]["algorithm"] == "fedavg"
        pids = sorted(i["pid"] for i in ray_session.get([h.info.remote() for h in a.run.client_handles()]))

        # Another trial on the same actors, then the first config again: a fresh trial's numbers.
        assert a.reset(dict(BASE, local_lr=0.2, seed=3)) is True
        other = a.train()
        assert a.reset(dict(BASE)) is True
        assert a.startup["actors_reused"] is True
        assert sorted(i["pid"] for i in ray_session.get([h.info.remote() for h in a.run.client_handles()])) == pids
        again = [a.train() for _ in range(2)]
        assert [key(r) for r in again] == [key(r) for r in straight[:2]]
        assert key(other) != key(straight[0])
        a.save(str(tmp_path / "ckpt"))

        # Another resource shape cannot keep the actors: they start again, with the same numbers.
        assert a.reset(dict(BASE, client_cpus=0.5)) is True
        assert a.startup["actors_reused"] is False
        assert ray_session.get(a.run.client_handles()[0].info.remote())["pid"] not in pids
        assert key(a.train()) == key(straight[0])
    finally:
        a.stop()
    assert np.load(tmp_path / "ckpt" / "weights.npy").dtype == np.float32

    # Restore into a fresh trainable: rounds 3-4 as in the uninterrupted trial.
    b = FedtuneTrainable(dict(BASE))
    try:
        b.restore(str(tmp_path / "ckpt"))
        resumed = [b.train() for _ in range(2)]
    finally:
        b.stop()
    assert [r["training_iteration"] for r in resumed] == [3, 4] and resumed[-1]["done"]
    assert [key(r) for r in resumed] == [key(r) for r in straight[2:]]


# ------------------------------------------------------------------------------------------------
# ArrowCallback on its own: each (trial, round) once, resume, statuses.
def _trial(tid: str, config: dict, error: str | None = None):
    return SimpleNamespace(trial_id=tid, config=config, error_file=None, get_error=lambda: error)


def _row(cfg: FederatedRunConfig, rnd: int, status: str = "ok", val: float = 0.5) -> dict:
    return {"study": "elsewhere", "trial_id": cfg.trial_id(), "algorithm": cfg.algorithm, "round": rnd,
            "status": status, "train_loss": 1.0 / rnd, "val_acc": val + rnd / 100, "target_acc": 0.3, "hp.local_lr": 0.05}


def test_arrow_callback_stores_each_round_once_and_ends_trials_with_their_status(tmp_path):
    cfg = {"dataset": "rect4", "rounds": 4}
    run_cfg = trial_run_config(cfg)
    tid = run_cfg.trial_id()
    cb = ArrowCallback(str(tmp_path), "s")
    t1 = _trial("tune_a", cfg)
    cb.on_trial_start(0, [], t1)
    for r in (1, 2, 3, 2, 3):  # a restore from the round-1 checkpoint reports rounds 2 and 3 again
        cb.on_trial_result(0, [], t1, {"fedtune_row": _row(run_cfg, r)})
    cb.on_trial_result(0, [], t1, {"done": True})  # a result without a row (not a fedtune trial) is ignored
    rounds = load(tmp_path / "s").to_pandas()
    assert rounds["round"].tolist() == [1, 2, 3] and set(rounds["study"]) == {"s"}
    cb.on_trial_complete(0, [], t1)  # stopped (by a scheduler) after round 3 of 4
    trials = load(tmp_path / "s", "trials").to_pylist()
    assert [(t["trial_id"], t["status"], t["rounds_done"], t["best_round"]) for t in trials] == [(tid, "pruned", 3, 3)]

    # The driver restarts (Tuner.restore): a new callback sees round 4 first and keeps rounds 1-3.
    cb2 = ArrowCallback(str(tmp_path), "s")
    cb2.on_trial_result(0, [], t1, {"fedtune_row": _row(run_cfg, 4)})
    cb2.on_trial_complete(0, [], t1)
    assert load(tmp_path / "s").column("round").to_pylist() == [1, 2, 3, 4]
    assert load(tmp_path / "s", "trials").column("status").to_pylist() == ["completed"]

    # Re-running the configuration in a new study run replaces its rows (round 1 first).
    cb3 = ArrowCallback(str(tmp_path), "s")
    cb3.on_trial_result(0, [], _trial("tune_b", cfg), {"fedtune_row": _row(run_cfg, 1, status="diverged")})
    cb3.on_trial_complete(0, [], _trial("tune_b", cfg))
    assert load(tmp_path / "s").column("round").to_pylist() == [1]
    assert load(tmp_path / "s", "trials").column("status").to_pylist() == ["diverged"]

    # A failed trial: status failed with the exception's line; other trials' rows stay.
    other = {"dataset": "rect4", "rounds": 4, "seed": 7}
    t3 = _trial("tune_c", other, error="Failure # 1 (occurred at now)\nTraceback (most recent call last):\n"
                                        '  File "x.py", line 1\nValueError: boom')
    cb3.on_trial_result(0, [], t3, {"fedtune_row": _row(trial_run_config(other), 1)})
    cb3.on_trial_error(0, [], t3)
    by_id = {t["trial_id"]: t for t in load(tmp_path / "s", "trials").to_pylist()}
    failed = by_id[trial_run_config(other).trial_id()]
    assert (failed["status"], failed["error"], failed["rounds_done"]) == ("failed", "ValueError: boom", 1)
    assert by_id[tid]["status"] == "diverged" and len(by_id) == 2


# ------------------------------------------------------------------------------------------------
# The Tuner example end to end: a diverging trial, then one on its reused actors.
def _example():
    spec = importlib.util.spec_from_file_location("tuner_api_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_tuner_example_stores_every_round_once_with_trial_statuses(ray_session, tmp_path):
    from ray import tune

    example = _example()
    overrides = {"dataset": "rect4", "model": "mlp", "mlp_hidden": [32], "rounds": 3, "local_steps": 3,
                 "batch_size": 16, "local_lr": tune.grid_search([1e6, 0.05]), "checkpoint_every": 2,
                 # the space's other knobs fixed: Tune's random draws (unseeded) must not decide which trial diverges
                 "global_lr": 1.0, "server_optimizer": "sgd", "local_momentum": 0.9, "weight_decay": 0.0}
    grid = example.main(str(tmp_path / "out"), "study", "fedavg", num_samples=1, max_concurrent_trials=1,
                        overrides=overrides, storage_path=str(tmp_path / "tune"))
    assert len(grid) == 2 and not grid.errors
    last = {r.metrics["fedtune_trial_id"]: r.metrics for r in grid}
    assert all(m["actors_in_trial_pg"] for m in last.values())
    # The second trial ran on the first one's trainable, placement group and actors.
    assert sorted(m["actors_reused"] for m in last.values()) == [False, True]

    rounds = load(tmp_path / "out" / "study").to_pandas()
    assert not rounds.duplicated(["trial_id", "round"]).any()
    trials = load(tmp_path / "out" / "study", "trials").to_pandas().set_index("trial_id")
    assert sorted(trials.index) == sorted(last)
    lr = {t: float(r["hp.local_lr"]) for t, r in trials.iterrows()}
    assert {t: trials.loc[t, "status"] for t in trials.index} == {
        t: ("diverged" if lr[t] == 1e6 else "completed") for t in trials.index}
    for t, group in rounds.sort_values("round").groupby("trial_id"):
        status = group["status"].tolist()
        assert group["round"].tolist() == list(range(1, len(group) + 1))
        if lr[t] == 1e6:  # stops at the round that diverged (NaN loss); the study went on
            assert status[-1] == "diverged" and set(status[:-1]) <= {"ok"} and math.isnan(group["train_loss"].iloc[-1])
        else:
            assert status == ["ok"] * 3
        assert trials.loc[t, "rounds_done"] == len(group)

    # checkpoint_every=2 (and checkpoint_at_end=False): the completed trial's round-2 checkpoint only.
    done = [r for r in grid if r.metrics["status"] == "ok"]
    assert len(done) == 1 and done[0].checkpoint is not None
    assert [read_checkpoint(c.path)["round"] for c, _ in done[0].best_checkpoints] == [2]

    # Every trial, on reused actors or not, computed what a fresh in-process run computes.
    for result in grid:
        m = result.metrics
        config = strip_switches(result.config)  # Tune's config: switches, left-out parameters, the driver's key
        ref = run(FederatedRunConfig.from_dict({**config, "backend": "local", "output": str(tmp_path / "ref")}),
                  progress=False).rows
        stored = rounds[rounds["trial_id"] == m["fedtune_trial_id"]].sort_values("round").to_dict("records")
        assert [key(r) for r in stored] == [key(r) for r in ref]

    # Tune gave every trial's placement group back.
    deadline = time.time() + 20
    while time.time() < deadline and any(
            pg["state"] != "REMOVED" for pg in ray_session.util.placement_group_table().values()):
        time.sleep(0.05)
    assert all(pg["state"] == "REMOVED" for pg in ray_session.util.placement_group_table().values())


# ------------------------------------------------------------------ trial configs validated without torch
_DRIVER_CHILD = r'''
import json, sys
from fedtune.tune.trial.trainable import trial_run_config
from fedtune.runtime.driver import FederatedRun
config = json.loads(sys.stdin.read())
cfg = trial_run_config(config)
run = FederatedRun(cfg)  # what the trial actor builds before its actors start
print(json.dumps({"torch": "torch" in sys.modules, "params": cfg.params, "backend": cfg.backend,
                  "client_method": run.resolved.client_method_name}))
'''


def test_a_trial_config_is_validated_in_the_trial_actor_without_importing_torch():
    import json
    import subprocess
    import sys

    config = {"algorithm": "fedgala", "gala_tau": 0.1, "rounds": 3, "model": "mlp", "global_lr": 1,
              "fedtune.validated_config": "{}"}  # an older study's private key: ignored
    out = subprocess.run([sys.executable, "-c", _DRIVER_CHILD], input=json.dumps(config), capture_output=True,
                         text=True, check=True).stdout
    assert json.loads(out) == {"torch": False, "params": {"gala_tau": 0.1}, "backend": "ray", "client_method": "gala"}


_RAY_DRIVER_CHILD = r'''
import json, sys
import ray
from fedtune.tune.trial.trainable import trial_run_config
from fedtune.runtime.driver import FederatedRun
ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
try:
    run = FederatedRun(trial_run_config(json.loads(sys.stdin.read())))  # what FedtuneTrainable.setup does
    run.start()
    run.step()
    run.close()
finally:
    ray.shutdown()
print(json.dumps({"torch": "torch" in sys.modules, "round": run.round}))
'''


@pytest.mark.slow
def test_the_trial_actors_process_runs_rounds_on_ray_without_importing_torch():
    """The trainable (and ``fedtune run --backend ray``'s driver) only waits on the coordinator:
    starting the run's actors and running a round must not load torch into it (2.7 CPU-s in every
    trial actor, once per search of a sweep). A batch_size above every client's data takes the
    warning path, which once imported the client methods' module."""
    import json
    import subprocess
    import sys

    config = {"dataset": "rect4", "model": "mlp", "mlp_hidden": [8], "rounds": 1, "local_steps": 1,
              "batch_size": 100000, "client_cpus": 0.5}
    out = subprocess.run([sys.executable, "-c", _RAY_DRIVER_CHILD], input=json.dumps(config), capture_output=True,
                         text=True, check=True, timeout=240).stdout
    assert json.loads(out.strip().splitlines()[-1]) == {"torch": False, "round": 1}
