"""FedGA — generalization adjustment of the aggregation weights (Zhang et al., CVPR 2023;
fedtune/algorithms/server/fedga.py): the equations against a float64 reference written here, the
zero-step invariant (FedAvg bit for bit), the decay schedule, checkpoints, the worker's two
evaluations, the torch-free coordinator and a short local run."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from fedtune.algorithms import SERVER_RULES, resolve
from fedtune.algorithms.server.aggregate import fedavg_buffers, fedavg_step
from fedtune.algorithms.server.fedga import (
    FedGA,
    aggregation_weights,
    decayed_step,
    ga_update,
    generalization_gaps,
    normalized_gaps,
)
from fedtune.algorithms.server.rule import RoundInfo
from fedtune.config import FederatedRunConfig
from fedtune.errors import ConfigError

M = 7  # parameters of the toy model of the pure-server tests


def _cfg(**values) -> FederatedRunConfig:
    return FederatedRunConfig.from_dict({"backend": "local", "dataset": "rect4", "model": "mlp",
                                         "algorithm": "fedga", **values})


def _extras(loss_global, loss_local, acc_global=None, acc_local=None):
    """One participant's extras as the worker sends them (float64 [1])."""
    acc_global = 0.5 if acc_global is None else acc_global
    acc_local = 0.5 if acc_local is None else acc_local
    return {"ga_loss_global": np.array([loss_global]), "ga_loss_local": np.array([loss_local]),
            "ga_acc_global": np.array([acc_global]), "ga_acc_local": np.array([acc_local])}


def _info(ids, sizes):
    return RoundInfo(tuple(ids), ("source",) * len(ids), (1,) * len(ids), tuple(sizes))


# ------------------------------------------------------------------------ an independent reference
def reference_weights(a, gaps, step, t, rounds, *, center=True, decay="linear"):
    """The paper's adjustment in plain Python floats, written without the module's functions:
    G → (G − mean) / max|G − mean| → a + d_t Ĝ with d_t = (step / K) · (1 − t/R) → clip → renormalise."""
    k = len(gaps)
    mean = sum(gaps) / k if center else 0.0
    centred = [g - mean for g in gaps]
    largest = max(abs(c) for c in centred)
    normal = [c / largest for c in centred] if largest > 0 else [0.0] * k
    comm = max(rounds - 1, 1)  # the authors' --comm for a run of ``rounds`` rounds (used by "authors" only)
    factor = {"linear": 1.0 - t / rounds, "authors": 1.0 - (t - 2) / comm, "none": 1.0}[decay]
    d = step / k * max(factor, 0.0)
    moved = [min(max(w + d * g, 0.0), 1.0) for w, g in zip(a, normal)]
    total = sum(moved)
    return [w / total * sum(a) for w in moved]


def test_the_equations_on_a_hand_checked_three_client_case():
    # gaps 0.1, 0.2, 0.6: μ = 0.3, centred (−0.2, −0.1, 0.3), ÷ 0.3 = (−2/3, −1/3, 1)
    gaps = generalization_gaps(np.array([1.1, 0.7, 1.6]), np.array([1.0, 0.5, 1.0]))
    np.testing.assert_allclose(gaps, [0.1, 0.2, 0.6], rtol=0, atol=1e-15)
    ghat = normalized_gaps(gaps)
    np.testing.assert_allclose(ghat, [-2 / 3, -1 / 3, 1.0], rtol=0, atol=1e-15)
    # step 0.3 over K = 3 clients, round 1 of R = 4: d = 0.1 · 0.75 = 0.075;
    # a = 1/3 + 0.075 Ĝ = (40 − 6, 40 − 3, 40 + 9) / 120
    d = decayed_step(0.3, 1, 4) / 3
    assert d == pytest.approx(0.075, abs=1e-16)
    a = ga_update(np.full(3, 1 / 3), ghat, d)
    np.testing.assert_allclose(a, [34 / 120, 37 / 120, 49 / 120], rtol=0, atol=1e-15)
    np.testing.assert_allclose(a, reference_weights([1 / 3] * 3, [0.1, 0.2, 0.6], 0.3, 1, 4), rtol=0, atol=1e-15)
    # the authors' code: raw gaps ÷ max |G| = (1/6, 1/3, 1)
    np.testing.assert_allclose(normalized_gaps(gaps, center=False), [1 / 6, 1 / 3, 1.0], rtol=0, atol=1e-15)
    # accuracy: the gap is local − global accuracy (the authors' signal −1)
    np.testing.assert_allclose(generalization_gaps(np.array([0.6, 0.8]), np.array([0.9, 0.8]), "acc"), [0.3, 0.0],
                               rtol=0, atol=1e-15)


def test_clipping_to_the_unit_interval_then_renormalising():
    # (0.1, 0.3, 0.6) + 0.2 · (−1, 0.5, 1) = (−0.1, 0.4, 0.8) → (0, 0.4, 0.8) → ÷ 1.2
    np.testing.assert_allclose(ga_update(np.array([0.1, 0.3, 0.6]), np.array([-1.0, 0.5, 1.0]), 0.2),
                               [0.0, 1 / 3, 2 / 3], rtol=0, atol=1e-15)
    # above 1: (1.2, −0.1, −0.1) → (1, 0, 0)
    np.testing.assert_allclose(ga_update(np.array([0.9, 0.05, 0.05]), np.array([1.0, -0.5, -0.5]), 0.3),
                               [1.0, 0.0, 0.0], rtol=0, atol=1e-15)
    # every weight at 0 (possible without centring): unchanged, not 0/0
    np.testing.assert_array_equal(ga_update(np.array([0.5, 0.5]), np.array([-1.0, -1.0]), 1.0), [0.5, 0.5])
    # equal gaps: nothing to adjust
    np.testing.assert_array_equal(normalized_gaps(np.array([0.4, 0.4, 0.4])), [0.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="finite"):
        normalized_gaps(np.array([0.1, np.nan]))


def test_the_decay_schedules():
    R = 5
    np.testing.assert_allclose([decayed_step(0.2, t, R) for t in range(1, 6)], [0.16, 0.12, 0.08, 0.04, 0.0],
                               rtol=0, atol=1e-15)
    # the authors' step_size − (i − 1) · step_size / comm with i = t − 1 over their comm + 1 = R rounds
    # (comm = 4): starts above 0.2
    np.testing.assert_allclose([decayed_step(0.2, t, R, "authors") for t in range(1, 6)],
                               [0.25, 0.2, 0.15, 0.1, 0.05], rtol=0, atol=1e-15)
    assert decayed_step(0.2, 1, 1, "authors") == 0.2  # one round (their comm = 0 divides by zero): undecayed
    assert [decayed_step(0.2, t, R, "none") for t in range(1, 6)] == [0.2] * 5
    assert decayed_step(0.2, 7, R) == 0.0  # never negative
    with pytest.raises(ValueError, match="decay"):
        decayed_step(0.2, 1, R, "cosine")


def authors_weights_per_round(gaps_per_round, step_size, comm):
    """The authors' ``train_pacs_GA.py`` loop re-implemented in plain floats: rounds ``i = 0..comm``
    aggregate with ``weight_dict`` (1/3 each at the start), then ``refine_weight_dict_by_GA`` with
    ``step_size − (i − 1) · step_size / comm`` (``weight_adjust.py``: × 1/3, raw gaps ÷ max |gap|,
    clip to [0, 1], renormalise). Returns the weights each round aggregated with."""
    weights, used = [1 / 3] * 3, []
    for i in range(comm + 1):
        used.append(list(weights))
        step = (step_size - (i - 1) * (step_size / comm)) * (1.0 / 3.0)
        largest = max(abs(g) for g in gaps_per_round[i])
        moved = [min(max(w + g / largest * step, 0.0), 1.0) for w, g in zip(weights, gaps_per_round[i])]
        weights = [w / sum(moved) for w in moved]
    return used


def test_authors_decay_matches_the_authors_loop_when_rounds_equals_the_rounds_they_train():
    rounds = 6  # the authors' --comm 5 trains rounds 0..5
    cfg = _cfg(rounds=rounds, fedga_step=0.6, fedga_decay="authors", fedga_center=False)
    history = _run_rounds(FedGA(cfg, None), rounds, seed=3)
    # the gap of round t: the aggregate's loss (received in round t + 1) minus round t's local loss
    gaps = [[history[t]["losses"][c][0] - history[t - 1]["losses"][c][1] for c in range(3)]
            for t in range(1, rounds)] + [[1.0, 2.0, 3.0]]  # the last round's gaps are never used
    expected = authors_weights_per_round(gaps, 0.6, rounds - 1)
    np.testing.assert_allclose([h["q"] for h in history], expected, rtol=0, atol=1e-13)
    assert not np.allclose(expected[-1], 1 / 3)  # the weights did move


# ------------------------------------------------------------------------ the rule
def _run_rounds(rule, rounds, *, sizes=(10, 20, 30), participants=None, seed=0, buffers=False):
    """Drive ``rule`` like the coordinator: rounds of random updates and random losses; returns the
    parameters, the losses sent and each round's aggregation weights."""
    rng = np.random.default_rng(seed)
    theta = rng.standard_normal(M).astype(np.float32)
    history = []
    for r in range(1, rounds + 1):
        ids = participants[r - 1] if participants else list(range(len(sizes)))
        n = [sizes[c] for c in ids]
        updates = rng.standard_normal((len(ids), M)).astype(np.float32)
        losses = rng.uniform(0.2, 2.0, (len(ids), 2))
        extras = [_extras(g, loc) for g, loc in losses]
        p = np.array(n, np.float64) / np.sum(n)
        out = rule.aggregate(theta, updates, p, extras=extras, round=r, info=_info(ids, n))
        q = np.array([out.diagnostics[f"fedga_weight.{c}"] for c in ids])
        history.append({"ids": ids, "losses": losses, "updates": updates, "theta": theta, "p": p, "q": q,
                        "diag": out.diagnostics, "new": out.params})
        if buffers:
            cb = rng.standard_normal((len(ids), 3)).astype(np.float32)
            history[-1]["buffers"] = (rule.aggregate_buffers(np.zeros(3, np.float32), cb, p, info=_info(ids, n)),
                                      fedavg_buffers(cb, p))
        theta = out.params
    return history


def test_the_rule_follows_the_reference_over_rounds_and_pairs_the_aggregate_with_last_rounds_local_loss():
    cfg = _cfg(rounds=5, fedga_step=0.6, global_lr=0.7)
    history = _run_rounds(FedGA(cfg, None), 5)
    a = [1 / 3] * 3  # uniform start (the authors' 1/3 each)
    for r, h in enumerate(history, start=1):
        if r >= 2:  # round r's received model (the aggregate of r − 1) vs round r − 1's local models
            gaps = [h["losses"][i][0] - history[r - 2]["losses"][i][1] for i in range(3)]
            a = reference_weights(a, gaps, 0.6, r - 1, 5)
            np.testing.assert_allclose([h["diag"][f"fedga_gap.{c}"] for c in range(3)], gaps, rtol=0, atol=1e-15)
            assert h["diag"]["fedga_step_size"] == pytest.approx(0.6 / 3 * (1 - (r - 1) / 5), abs=1e-15)
        else:
            assert h["diag"]["fedga_adjusted"] == 0.0
        np.testing.assert_allclose(h["q"], a, rtol=0, atol=1e-13)
        expected = h["theta"].astype(np.float64) + 0.7 * (np.array(a)[:, None] * h["updates"].astype(np.float64)).sum(0)
        np.testing.assert_allclose(h["new"], expected, rtol=1e-6, atol=1e-6)
    assert not np.allclose(history[-1]["q"], 1 / 3)  # the weights did move


def test_zero_step_is_fedavg_bit_for_bit_with_data_size_weights():
    for init, sizes in (("size", (10, 25, 65)), ("uniform", (30, 30, 30))):  # uniform = FedAvg only for equal sizes
        rule = FedGA(_cfg(rounds=4, fedga_step=0.0, fedga_init=init, global_lr=0.5), None)
        history = _run_rounds(rule, 4, sizes=sizes, buffers=True)
        for h in history:
            np.testing.assert_array_equal(h["q"], h["p"])
            np.testing.assert_array_equal(h["new"], fedavg_step(h["theta"], h["updates"], h["p"], 0.5))
            np.testing.assert_array_equal(*h["buffers"])
            assert h["diag"]["fedga_step_size"] == 0.0
        initial = {"size": [float(s) for s in sizes], "uniform": [1.0] * 3}[init]
        assert [rule.scores[c] for c in range(3)] == initial  # the weights never left their start
    # uniform weights with unequal sizes are not FedAvg's
    rule = FedGA(_cfg(rounds=2, fedga_step=0.0), None)
    h = _run_rounds(rule, 1, sizes=(10, 20, 30))[0]
    np.testing.assert_array_equal(h["q"], aggregation_weights(np.ones(3)))
    assert not np.array_equal(h["q"], h["p"])


def test_partial_participation_adjusts_only_the_clients_seen_in_both_rounds():
    rule = FedGA(_cfg(rounds=4, fedga_step=0.5), None)
    history = _run_rounds(rule, 2, sizes=(10, 10, 10, 10), participants=[[0, 1, 2], [1, 2, 3]])
    h1, h2 = history
    assert h2["diag"]["fedga_adjusted"] == 2.0 and "fedga_gap.3" not in h2["diag"]
    # clients 1 and 2 (rows 1, 2 of round 1; rows 0, 1 of round 2) form the federation of the adjustment
    gaps = [h2["losses"][0][0] - h1["losses"][1][1], h2["losses"][1][0] - h1["losses"][2][1]]
    shares = reference_weights([0.5, 0.5], gaps, 0.5, 1, 4)
    assert rule.scores[0] == 1.0 and rule.scores[3] == 1.0  # untouched
    np.testing.assert_allclose([rule.scores[1], rule.scores[2]], [2 * shares[0], 2 * shares[1]], rtol=0, atol=1e-14)
    np.testing.assert_allclose(h2["q"], np.array([2 * shares[0], 2 * shares[1], 1.0]) / 3, rtol=0, atol=1e-14)


def test_state_dict_round_trip_through_a_checkpoint_resumes_to_identical_weights(tmp_path):
    from fedtune.runtime.checkpoint import read_checkpoint, write_checkpoint

    cfg = _cfg(rounds=6, fedga_step=0.4, fedga_center=False, fedga_metric="acc")
    full = FedGA(cfg, None)
    rng = np.random.default_rng(3)
    theta = np.zeros(M, np.float32)
    rounds = [(rng.standard_normal((3, M)).astype(np.float32), rng.uniform(0, 1, (3, 4))) for _ in range(4)]

    def step(rule, r, theta):
        updates, vals = rounds[r - 1]
        extras = [_extras(*row) for row in vals]
        return rule.aggregate(theta, updates, np.full(3, 1 / 3), extras=extras, round=r, info=_info([0, 1, 2], [5] * 3))

    for r in (1, 2):
        theta = step(full, r, theta).params
    write_checkpoint(tmp_path, {"round": 2, "weights": theta, "rule": full.state_dict()})
    resumed = FedGA(cfg, None)
    resumed.load_state_dict(read_checkpoint(tmp_path)["rule"])
    assert resumed.scores == full.scores and resumed.last == full.last
    t_full = t_res = theta
    for r in (3, 4):
        a, b = step(full, r, t_full), step(resumed, r, t_res)
        np.testing.assert_array_equal(a.params, b.params)
        assert a.diagnostics == b.diagnostics
        t_full, t_res = a.params, b.params
    assert resumed.scores == full.scores and len(set(full.scores.values())) > 1
    # a fresh rule (no state) takes another path: the state matters
    assert step(FedGA(cfg, None), 3, theta).diagnostics["fedga_adjusted"] == 0.0


def test_missing_losses_and_bad_hyperparameters_are_refused():
    rule = FedGA(_cfg(), None)
    with pytest.raises(ValueError, match="client 4's update carries no ga_loss_global"):
        rule.aggregate(np.zeros(M, np.float32), np.zeros((1, M), np.float32), np.ones(1), extras=[{}], round=1,
                       info=_info([4], [3]))
    with pytest.raises(ConfigError, match="field 'fedga_step'.*allowed"):
        _cfg(fedga_step=1.5)
    with pytest.raises(ConfigError, match="field 'fedga_step'"):
        _cfg(fedga_step=-0.1)
    with pytest.raises(ConfigError, match="field 'fedga_decay'.*cosine"):
        _cfg(fedga_decay="cosine")
    with pytest.raises(ConfigError, match="field 'val_fraction'.*fedga"):
        _cfg(val_fraction=0.0)
    with pytest.raises(ConfigError, match="unsupervised"):
        _cfg(client_method="simclr", setting="ufdg", dataset="rotated-digits", model="cnn")
    assert SERVER_RULES["fedga"] is FedGA and resolve(_cfg()).settings == ("fdg", "fl")


# ------------------------------------------------------------------------ the worker
def test_the_worker_evaluates_received_and_trained_models_only_when_the_rule_asks(tmp_path):
    from fedtune.flat_weights import set_flat
    from fedtune.runtime.common import evaluate
    from fedtune.runtime.driver import FederatedRun

    replies, workers, runs = {}, {}, []
    for algorithm in ("fedga", "fedavg"):
        cfg = _cfg(algorithm=algorithm, local_steps=2, rounds=1, output=str(tmp_path / algorithm))
        fr = FederatedRun(cfg)
        fr.start()
        runs.append(fr)
        coord = fr.coordinator
        (reply,), _ = coord.pool.fit(coord.weights, {}, 1, [0, 1])
        replies[algorithm], workers[algorithm] = (reply, coord.weights.copy()), coord.pool.worker
        hooks = [type(h).__name__ for h in workers[algorithm].hooks]  # the rule's declared client hooks
        assert hooks == (["GeneralizationGap"] if algorithm == "fedga" else [])
    (ga, w0), (avg, _) = replies["fedga"], replies["fedavg"]
    assert all(set(e) == {"ga_loss_global", "ga_loss_local", "ga_acc_global", "ga_acc_local"} for e in ga.extras)
    assert all(e == {} for e in avg.extras)
    np.testing.assert_array_equal(ga.states, avg.states)  # evaluating does not change training
    worker = workers["fedga"]
    for row, cid in enumerate(ga.client_ids):
        val = worker.data[cid]["val"]
        for key, flat in (("global", w0), ("local", ga.states[row])):
            set_flat(worker.model, worker.layout, flat)
            counts = evaluate(worker.model, val, worker.cfg.eval_batch_size)
            assert ga.extras[row][f"ga_loss_{key}"].dtype == np.float64
            assert ga.extras[row][f"ga_loss_{key}"][0] == counts.loss
            assert ga.extras[row][f"ga_acc_{key}"][0] == counts.acc
        assert ga.extras[row]["ga_loss_global"][0] != ga.extras[row]["ga_loss_local"][0]
    for fr in runs:
        fr.close()


# ------------------------------------------------------------------------ the coordinator, torch-free
CHILD = r'''
import json, sys
import numpy as np
import fedtune.runtime.coordinator as coordinator
from fedtune.data.base import ClientSpec, FederatedPlan
from fedtune.layout import FlatLayout, TensorSlot
from fedtune.runtime.messages import FitReply
from fedtune.runtime.pools import PoolBase

LAYOUT = FlatLayout((TensorSlot("w", (3, 4), 0, 12, True), TensorSlot("bn.running_mean", (4,), 12, 4, False)), 12, 16)


class FakePool(PoolBase):
    num_workers, restarts = 1, 0

    def __init__(self):
        self.rng = np.random.default_rng(0)

    def initial_state(self):
        return self.rng.standard_normal(LAYOUT.size).astype(np.float32), LAYOUT, LAYOUT.num_params

    def publish(self, value):
        return value

    def fit(self, weights, payload, round, client_ids):
        states = (weights + 0.1 * self.rng.standard_normal((len(client_ids), LAYOUT.size))).astype(np.float32)
        extras = [{k: self.rng.uniform(0, 1, 1) for k in ("ga_loss_global", "ga_loss_local", "ga_acc_global",
                                                           "ga_acc_local")} for _ in client_ids]
        return [FitReply(list(client_ids), states, [10 + c for c in client_ids], [0.5] * len(client_ids),
                         [3] * len(client_ids), [0.0] * len(client_ids), 0.0, extras, [{} for _ in client_ids])], []

    def shutdown(self):
        pass


class Coordinator(coordinator.Coordinator):
    def _make_pool(self, spec):
        return FakePool()


cfg = json.loads(sys.stdin.read())
clients = tuple(ClientSpec(c, f"c{c}", "source", "d", {"d": np.arange(10 + c)}) for c in range(3))
coord = Coordinator(cfg, FederatedPlan("fdg", clients, ("d",), ("t",), {}), {"kind": "fake"})
rows = [coord.run_round(r, evaluate=False) for r in (1, 2, 3)]
assert all(r.status == "ok" for r in rows), rows
assert np.isfinite(coord.weights).all()
print(type(coord.rule).__name__, "torch" in sys.modules, "fedtune.models" in sys.modules,
      rows[-1].metrics["diag.fedga_adjusted"])
'''


def test_the_coordinator_runs_fedga_without_torch():
    cfg = _cfg(coordinator_cpus=2, rounds=3)
    out = subprocess.run([sys.executable, "-c", CHILD], input=json.dumps(cfg.to_dict()), capture_output=True,
                         text=True, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["FedGA", "False", "False", "3.0"]


# ------------------------------------------------------------------------ end to end
def test_a_short_local_run_is_finite_moves_the_weights_and_with_zero_step_is_fedavg(tmp_path):
    from fedtune.runtime.driver import run

    base = {"setting": "fdg", "rounds": 3, "local_steps": 2, "output": str(tmp_path)}
    ga = run(_cfg(**base, name="ga", fedga_step=1.0, fedga_decay="none"), progress=False).rows
    assert len(ga) == 3 and all(r["status"] == "ok" for r in ga)
    for r in ga:
        numbers = [v for k, v in r.items() if k.startswith(("diag.fedga", "train_loss", "val_acc", "target_acc"))]
        assert numbers and all(np.isfinite(v) for v in numbers)
    weights = lambda row: sorted((k, v) for k, v in row.items() if k.startswith("diag.fedga_weight."))  # noqa: E731
    assert len(weights(ga[2])) == 3 and weights(ga[2]) != weights(ga[0])  # adjusted from round 2 on
    assert ga[1]["diag.fedga_adjusted"] == 3.0
    fixed = run(_cfg(**base, name="fixed", fedga_step=0.0, fedga_init="size"), progress=False).rows
    avg = run(_cfg(**base, name="avg", algorithm="fedavg"), progress=False).rows
    assert [r["train_loss"] for r in fixed] == [r["train_loss"] for r in avg]
    assert [r["val_acc"] for r in fixed] == [r["val_acc"] for r in avg]
    assert [r["train_loss"] for r in ga][1:] != [r["train_loss"] for r in fixed][1:]
