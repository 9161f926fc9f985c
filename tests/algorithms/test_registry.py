"""The lazy algorithm registry (fedtune/algorithms/__init__.py) and the torch-free server side.

Client-method modules import torch at their top; the registry names each component's class as
``"module:Class"`` and imports it on first lookup, so ``import fedtune.algorithms`` and the
coordinator (which looks up only its server rule) never load torch. Checked in fresh processes.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from fedtune.algorithms import CLIENT_METHODS, SERVER_RULES, SERVER_SIDES, Registry, resolve
from fedtune.algorithms.declarations import CLIENT_METHOD_SPECS, SERVER_RULE_SPECS
from fedtune.algorithms.presets import PRESETS
from fedtune.algorithms.base import ClientMethodSpec
from fedtune.config import FederatedRunConfig


def _run(code: str, *args: str) -> str:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True).stdout


# ------------------------------------------------------------------------------------------ registry
def test_every_registered_class_is_where_the_registry_says_and_carries_its_name():
    for registry in (CLIENT_METHODS, SERVER_RULES, SERVER_SIDES):
        for name in registry:
            cls = registry[name]
            module, _, attr = registry.where(name).partition(":")
            assert (cls.__module__, cls.__name__, cls.name) == (module, attr, name)
    # the registries keep the declarations' order (listings, `fedtune algorithms`, config choices)
    assert list(CLIENT_METHODS)[:len(CLIENT_METHOD_SPECS)] == [s.name for s in CLIENT_METHOD_SPECS]
    assert list(SERVER_RULES.keys())[:len(SERVER_RULE_SPECS)] == [s.name for s in SERVER_RULE_SPECS]
    assert set(SERVER_SIDES) <= set(CLIENT_METHODS)  # a server side belongs to a client method
    for p in PRESETS.values():
        assert p.client_method in CLIENT_METHODS and p.server_rule in SERVER_RULES
        assert p.unsupervised_client_method is None or p.unsupervised_client_method in CLIENT_METHODS


def test_a_registry_is_a_mapping_that_names_a_wrong_entry():
    sgd_spec = CLIENT_METHODS.spec("sgd")
    oops = ClientMethodSpec("oops", "fedtune.algorithms.client.method:SGD", "a wrong place")
    reg = Registry("client method", (sgd_spec, oops))
    assert "sgd" in reg and "nope" not in reg and len(reg) == 2 and reg.get("nope") is None
    assert reg["sgd"] is CLIENT_METHODS["sgd"] and reg.spec("oops") is oops
    with pytest.raises(RuntimeError, match="client method 'oops' is registered as fedtune.algorithms.client.method:SGD"):
        reg["oops"]
    with pytest.raises(KeyError):
        reg["nope"]
    sgd = reg["sgd"]
    del reg["oops"]
    reg["sgd2"] = dataclasses.replace(sgd_spec, name="sgd2")  # registered by declaration: checked when looked up
    with pytest.raises(RuntimeError, match="'sgd2'"):
        reg["sgd2"]
    with pytest.raises(RuntimeError, match="'sgd2'"):
        reg["sgd2"] = sgd  # registered by class: it carries no declaration named sgd2
    with pytest.raises(RuntimeError, match="'sgd3': its declaration is named 'sgd'"):
        reg["sgd3"] = sgd_spec
    assert list(reg) == ["sgd", "sgd2"] and reg.where("sgd") == "fedtune.algorithms.client.method:SGD"


def test_importing_the_package_and_its_registry_loads_no_torch():
    out = _run("import sys\nimport fedtune, fedtune.algorithms\n"
               "from fedtune.algorithms import CLIENT_METHODS, SERVER_RULES, resolve_names\n"
               "names = list(CLIENT_METHODS), 'sam' in CLIENT_METHODS, resolve_names('fedgala', setting='ufdg')\n"
               "print('torch' in sys.modules, any(m.startswith('fedtune.algorithms.') and m not in "
               "('fedtune.algorithms.base', 'fedtune.algorithms.declarations', 'fedtune.algorithms.optimizer_declarations', "
               "'fedtune.algorithms.fedadg_declarations', 'fedtune.algorithms.tuner_declarations', "
               "'fedtune.algorithms.presets') "
               "for m in sys.modules))")
    assert out.split() == ["False", "False"]


def test_resolved_looks_up_each_class_on_first_use():
    r = resolve(FederatedRunConfig.from_dict({"algorithm": "fedgala"}))
    assert (r.client_method_name, r.server_rule_name) == ("gala", "gala")
    assert r.client_method is CLIENT_METHODS["gala"] and r.server_rule is SERVER_RULES["gala"]
    assert r.settings == ("fdg", "fl") and set(r.hyperparameters(FederatedRunConfig.from_dict(
        {"algorithm": "fedgala", "gala_tau": 0.25}))) == {"gala_tau", "gala_gate", "gala_iters", "gala_mix",
                                                         "gala_weights"}


# ------------------------------------------------------------------------ the coordinator without torch
# Configs are validated here (validation looks at the client method, so this process may import
# torch); the child process rebuilds each one as the coordinator does (from_validated) and runs
# three rounds of fedtune.runtime.coordinator.Coordinator on a fake pool of random float32 states.
def rule_config(rule: str) -> dict:
    """A run of server rule ``rule``: a preset pairing it with plain SGD where one exists (else any
    preset that uses it), in the fda setting for a rule that needs the target client."""
    uses = [p for p in PRESETS.values() if p.server_rule == rule]
    preset = next((p for p in uses if p.client_method == "sgd"), uses[0] if uses else None)
    values = {"algorithm": preset.name} if preset else {"algorithm": "fedavg", "server_rule": rule}
    return {**values, "setting": "fda" if SERVER_RULES.spec(rule).needs_target_client else "fdg"}


# Every registered rule (from the registry: a new rule needs no line here), then the rules' less
# plain paths (options, not methods).
VARIANTS = [
    {"algorithm": "fedomg", "omg_kappa": 0.3},
    {"algorithm": "fedomg", "omg_solver": "sgd", "omg_rescale": True},
    {"algorithm": "fedgp", "setting": "fda", "gp_beta": "auto", "local_steps": 3},
    {"algorithm": "fedgala", "gala_weights": "whole", "gala_mix": 0.5},
    {"algorithm": "fedomg", "server_optimizer": "adam", "global_lr": 0.01},
    {"algorithm": "fedgma", "gma_mask": "bai"},
]
CONFIGS = [rule_config(rule) for rule in SERVER_RULES] + VARIANTS

CHILD = r'''
import json, sys
import numpy as np
import fedtune.runtime.coordinator as coordinator
from fedtune.config import FederatedRunConfig
from fedtune.data.base import ClientSpec, FederatedPlan
from fedtune.layout import FlatLayout, TensorSlot
from fedtune.runtime.messages import FitReply
from fedtune.runtime.pools import PoolBase

SLOTS = (TensorSlot("w", (3, 4), 0, 12, True), TensorSlot("b", (4,), 12, 4, True),
         TensorSlot("bn.running_mean", (4,), 16, 4, False))
LAYOUT = FlatLayout(SLOTS, 16, 20)


class FakePool(PoolBase):
    """What the coordinator asks of a pool, with random float32 client states instead of training."""
    num_workers, restarts = 1, 0

    def __init__(self, plan, steps):
        self.plan, self.steps, self.rng = plan, steps, np.random.default_rng(0)

    def initial_state(self):
        return self.rng.standard_normal(LAYOUT.size).astype(np.float32), LAYOUT, LAYOUT.num_params

    def publish(self, value):
        return value

    def fit(self, weights, payload, round, client_ids):
        states = (weights + 0.1 * self.rng.standard_normal((len(client_ids), LAYOUT.size))).astype(np.float32)
        extras = []
        for c in client_ids:
            target = self.plan.clients[c].role == "target"
            steps = self.rng.standard_normal((self.steps, LAYOUT.num_params)).astype(np.float32)
            extras.append({"step_updates": steps} if target else {"mean_step_update": steps.mean(0)})
            extras[-1].update({k: self.rng.uniform(0, 1, 1) for k in ("ga_loss_global", "ga_loss_local",
                                                                        "ga_acc_global", "ga_acc_local")})
        return [FitReply(list(client_ids), states, [10 + c for c in client_ids], [0.5] * len(client_ids),
                         [self.steps] * len(client_ids), [0.0] * len(client_ids), 0.0, extras,
                         [{} for _ in client_ids])], []

    def shutdown(self):
        pass


for line in sys.stdin:
    job = json.loads(line)
    cfg_dict = job["cfg"]
    fda = cfg_dict["setting"] == "fda"
    clients = tuple(ClientSpec(c, f"c{c}", "target" if fda and c == 3 else "source", "d", {"d": np.arange(10 + c)})
                    for c in range(4))
    plan = FederatedPlan(cfg_dict["setting"], clients, ("d",), ("t",), {})

    class Coordinator(coordinator.Coordinator):
        def _make_pool(self, spec):
            return FakePool(self.plan, 3)

    coord = Coordinator(cfg_dict, plan, {"kind": "fake"})
    for r in (1, 2, 3):
        result = coord.run_round(r, evaluate=False)
        assert result.status == "ok", result
    assert np.isfinite(coord.weights).all() and coord.weights.dtype == np.float32
    assert (coord.side is not None) == job["has_side"]
    print(type(coord.rule).__name__, "torch" in sys.modules,
          any(m in sys.modules for m in ("fedtune.algorithms.client.method", "fedtune.algorithms.client.gala",
                                         "fedtune.models")))
'''


def test_the_coordinator_runs_every_server_rule_without_torch():
    jobs = []
    for values in CONFIGS:
        cfg = FederatedRunConfig.from_dict({**values, "backend": "local", "coordinator_cpus": 2})
        jobs.append(json.dumps({"cfg": cfg.to_dict(), "has_side": cfg.resolved.client_method_name in SERVER_SIDES}))
    assert {json.loads(j)["cfg"]["server_rule"] or PRESETS[json.loads(j)["cfg"]["algorithm"]].server_rule
            for j in jobs} == set(SERVER_RULES)
    out = subprocess.run([sys.executable, "-c", CHILD], input="\n".join(jobs) + "\n", capture_output=True,
                         text=True, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.split("\n")[:-1]
    classes = [SERVER_RULES.spec(FederatedRunConfig.from_dict(v).resolved.server_rule_name).where.split(":")[1]
               for v in CONFIGS]
    assert [line.split()[0] for line in lines] == classes
    assert all(line.split()[1:] == ["False", "False"] for line in lines), lines


# ------------------------------------------------------- client methods' server sides without torch
# The fake pool of CHILD (its definitions, not its loop), whose clients also send the extras a
# server side reads (random positive values of the shapes their clients send; None: float32
# [num_params]); three rounds, then the coordinator's state (the side's included) is restored into
# a fresh coordinator that runs the same fourth round. Each job's expected line: the side's class,
# the rule's class and the payload keys the clients received.
SCAFFOLD_EXTRAS = {"scaffold_delta_c": None}
FEDIIR_EXTRAS = {"fediir_grad_sum": [5], "fediir_batches": []}
SIDE_JOBS = [
    ({"algorithm": "scaffold", "num_clients": 4}, SCAFFOLD_EXTRAS, "ScaffoldServer FedAvg scaffold_c"),
    # Scaffold's clients under FedOMG's rule
    ({"algorithm": "fedomg", "client_method": "scaffold"}, SCAFFOLD_EXTRAS, "ScaffoldServer FedOMG scaffold_c"),
    ({"algorithm": "feddyn", "feddyn_alpha": 0.1}, {}, "FedDynServer FedAvg -"),
    ({"algorithm": "feddyn", "feddyn_mean": "uniform"}, {}, "FedDynServer FedAvg -"),
    ({"algorithm": "fedomg", "client_method": "feddyn"}, {}, "FedDynServer FedOMG -"),
    ({"algorithm": "fediir"}, FEDIIR_EXTRAS, "FedIIRServer FedAvg fediir_grad_mean"),
    ({"algorithm": "fediir-omg"}, FEDIIR_EXTRAS, "FedIIRServer FedOMG fediir_grad_mean"),
    ({"algorithm": "fishr"}, {"fishr_variance": [5]}, "FishrServer FedAvg fishr_mean_variance"),
    # the plan below: domains ("d", "t"), the clients train on "d" (id 0)
    ({"algorithm": "afl", "afl_lambda_lr": 0.1}, {"afl.loss_sum": [2], "afl.count": [2]}, "AFLServer FedAvg afl.lambda"),
    ({"algorithm": "fedadg"}, {"fedadg.generator": [6]}, "FedADGServer FedAvg fedadg.generator"),
]

SIDE_CHILD = CHILD.split("\nfor line in sys.stdin:")[0] + r'''


class SidePool(FakePool):
    def __init__(self, plan, steps, shapes):
        super().__init__(plan, steps)
        self.shapes, self.payload_keys = shapes, set()

    def fit(self, weights, payload, round, client_ids):
        self.payload_keys |= set(payload)
        replies, skipped = super().fit(weights, payload, round, client_ids)
        for extra in replies[0].extras:
            extra.update({k: (np.abs(self.rng.standard_normal(LAYOUT.num_params if s is None else s)) + 1).astype(
                np.float32) for k, s in self.shapes.items()})
        return replies, skipped


for line in sys.stdin:
    job = json.loads(line)
    clients = tuple(ClientSpec(c, f"c{c}", "source", "d", {"d": np.arange(10 + c)}) for c in range(4))
    plan = FederatedPlan(job["cfg"]["setting"], clients, ("d",), ("t",), {}, domains=("d", "t"))

    class Coordinator(coordinator.Coordinator):
        def _make_pool(self, spec):
            return SidePool(self.plan, 3, job["shapes"])

    coord = Coordinator(job["cfg"], plan, {"kind": "fake"})
    for r in (1, 2, 3):
        assert coord.run_round(r, evaluate=False).status == "ok"
    again = Coordinator(job["cfg"], plan, {"kind": "fake"})
    again.set_state(coord.get_state())
    again.pool.rng, coord.pool.rng = np.random.default_rng(7), np.random.default_rng(7)
    coord.run_round(4, evaluate=False)
    again.run_round(4, evaluate=False)
    assert np.isfinite(coord.weights).all() and np.array_equal(coord.weights, again.weights)
    side, side_again = coord.side.state_dict(), again.side.state_dict()
    assert all(np.isfinite(v).all() and np.abs(v).max() > 0 for v in side.values()), side
    assert side.keys() == side_again.keys() and all(np.array_equal(side[k], side_again[k]) for k in side)
    print(type(coord.side).__name__, type(coord.rule).__name__, ",".join(sorted(coord.pool.payload_keys)) or "-",
          "torch" in sys.modules, any(m in sys.modules for m in ("fedtune.algorithms.client.method", "fedtune.models")))
'''


def test_the_coordinator_runs_the_client_methods_server_sides_without_torch():
    jobs = [json.dumps({"cfg": FederatedRunConfig.from_dict({**values, "backend": "local", "coordinator_cpus": 2})
                        .to_dict(), "shapes": shapes}) for values, shapes, _ in SIDE_JOBS]
    covered = {FederatedRunConfig.from_dict(values).resolved.client_method_name for values, _, _ in SIDE_JOBS}
    assert covered | {"gala", "gala-simclr"} == set(SERVER_SIDES)  # FedGaLA's: test_the_coordinator_runs_every_server_rule
    out = subprocess.run([sys.executable, "-c", SIDE_CHILD], input="\n".join(jobs) + "\n", capture_output=True,
                         text=True, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split("\n")[:-1] == [f"{expected} False False" for _, _, expected in SIDE_JOBS]
