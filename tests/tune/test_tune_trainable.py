"""The Ray Tune trial layer: FedtuneTrainable (placement, checkpoints, actor reuse), ArrowCallback
(the single writer of the store) and the Tuner example that puts them together."""

from __future__ import annotations

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
from fedtune.runtime.driver import FederatedRun
from fedtune.errors import ResourceError
from fedtune.runtime.checkpoint import read_checkpoint, write_checkpoint
from fedtune.tune.trial.callback import ArrowCallback
from fedtune.tune.trial.trainable import fedtune_trainable, plan_from_bundles, resources_for, trial_run_config

METRICS = ("round", "train_loss", "val_acc", "target_acc", "num_participants")
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tuner_api.py"


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
