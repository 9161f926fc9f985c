"""FedGaLA (fedtune/algorithms/server/gala.py): global alignment weights, the gala server rule, the
locally gated client step (GatedSGD / client method "gala"), and the fedgala preset end to end."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedtune.algorithms.declarations import GALA_GATE, GALA_ITERS, GALA_MIX, GALA_TAU, GALA_WEIGHTS
from fedtune.runtime.examples import TensorExamples
from fedtune.algorithms import CLIENT_METHODS, SERVER_RULES, SERVER_SIDES
from fedtune.algorithms.presets import PRESETS
from fedtune.algorithms.server.aggregate import fedavg_step
from fedtune.algorithms.client.method import SGD, ClientContext
from fedtune.algorithms.server.rule import RoundInfo
from fedtune.algorithms.server.gala import Gala, gala_global_weights, gala_step
from fedtune.algorithms.server.gala_move import GlobalMove, SimclrGlobalMove
from fedtune.algorithms.client.gala import GalaClient, GatedSGD, reference_tensors
from fedtune.errors import ConfigError
from fedtune.config import FederatedRunConfig
from fedtune.models import build_model


def _cfg(**kw) -> FederatedRunConfig:
    base = {"algorithm": "fedgala", "dataset": "rect4", "backend": "local", "mlp_hidden": [],
            "local_momentum": 0.0}
    base.update(kw)
    return FederatedRunConfig.from_dict(base)


# ================================================================================ global alignment
def _layout(*sizes):
    from fedtune.layout import FlatLayout, TensorSlot

    slots, off = [], 0
    for k, n in enumerate(sizes):
        slots.append(TensorSlot(f"t{k}", (n,), off, n, True))
        off += n
    return FlatLayout(tuple(slots), off, off)


def test_two_clients_by_hand_whole_vector():
    # p = (1/4, 3/4), Δ1 = (1, 0), Δ2 = (1, 1)  =>  a0 = Σ p Δ = (1, 3/4), |a0| = 5/4
    # cos(Δ1, a0) = 1 / (5/4) = 4/5 ;  cos(Δ2, a0) = (7/4) / (√2 · 5/4) = 0.7·√2
    updates = np.array([[1.0, 0.0], [1.0, 1.0]], np.float32)
    p = np.array([0.25, 0.75])
    c1, c2 = 0.8, 0.7 * math.sqrt(2.0)
    raw = p * np.array([(c1 + 1) / 2, (c2 + 1) / 2])
    w_expected = raw / raw.sum()
    w, a = gala_global_weights(updates, p, iters=1)
    np.testing.assert_allclose(w, w_expected, rtol=1e-12)
    a_expected = w_expected[0] * np.array([1.0, 0.0]) + w_expected[1] * np.array([1.0, 1.0])
    np.testing.assert_allclose(a, a_expected, rtol=1e-12)
    # FedAvg scale: a is a convex combination of the updates (not 1/U of one)
    assert np.linalg.norm(a) == pytest.approx(np.linalg.norm(updates.T @ p), rel=0.05)

    # a second iteration reweights against that a (cosines written out again by hand)
    n1 = math.hypot(*a_expected)
    d1, d2 = a_expected[0] / n1, (a_expected[0] + a_expected[1]) / (math.sqrt(2.0) * n1)
    raw2 = p * np.array([(d1 + 1) / 2, (d2 + 1) / 2])
    w2_expected = raw2 / raw2.sum()
    w2, a2 = gala_global_weights(updates, p, iters=2)
    np.testing.assert_allclose(w2, w2_expected, rtol=1e-12)
    np.testing.assert_allclose(a2, w2_expected @ updates.astype(np.float64), rtol=1e-12)
    assert not np.allclose(w2, w)  # the iteration does change the weights here


def test_per_tensor_weights_by_hand_and_differ_from_whole_vector():
    # tensor A = entries 0:2 as in the whole-vector case; tensor B = entries 2:4 where client 1
    # points exactly against the FedAvg direction: a_B = (0, 0.5 − 0.75) => cos = (−1, +1) => w_B = (0, 1)
    updates = np.array([[1.0, 0.0, 0.0, 2.0], [1.0, 1.0, 0.0, -1.0]], np.float32)
    p = np.array([0.25, 0.75])
    c1, c2 = 0.8, 0.7 * math.sqrt(2.0)
    raw = p * np.array([(c1 + 1) / 2, (c2 + 1) / 2])
    wA = raw / raw.sum()
    lay = _layout(2, 2)
    w, a = gala_global_weights(updates, p, iters=1, slices=lay.param_slices())
    np.testing.assert_allclose(w, [wA, [0.0, 1.0]], rtol=1e-12, atol=0)
    np.testing.assert_allclose(a, [1.0, wA[1], 0.0, -1.0], rtol=1e-12)
    whole_w, whole_a = gala_global_weights(updates, p, iters=1)
    assert not np.allclose(whole_a, a, atol=1e-3)
    # the rule's step and its diagnostic (parameter-count-weighted mean of the per-tensor weights)
    info = RoundInfo((3, 8), ("source",) * 2, (1,) * 2, (1, 3))
    theta = np.zeros(4, np.float32)
    res = _rule(lay, gala_iters=1).aggregate(theta, updates, p, extras=[{}] * 2, round=1, info=info)
    np.testing.assert_allclose(res.params, a, rtol=1e-6)
    assert res.diagnostics == pytest.approx({"gala_w.3": (wA[0] + 0.0) / 2, "gala_w.8": (wA[1] + 1.0) / 2})
    res_whole = _rule(lay, gala_iters=1, gala_weights="whole").aggregate(theta, updates, p, extras=[{}] * 2,
                                                                        round=1, info=info)
    np.testing.assert_allclose(res_whole.params, whole_a, rtol=1e-6)
    assert res_whole.diagnostics == pytest.approx({"gala_w.3": whole_w[0], "gala_w.8": whole_w[1]})


@pytest.mark.parametrize("weights_mode", ["per-tensor", "whole"])
@pytest.mark.parametrize("mix", [1.0, 0.3])
def test_equal_alignments_are_fedavg_bit_for_bit(weights_mode, mix):
    rng = np.random.default_rng(1)
    lay = _layout(37, 5, 200)
    theta = rng.normal(size=242).astype(np.float32)
    delta = rng.normal(size=242).astype(np.float32)
    p = np.array([0.1, 0.2, 0.3, 0.4])
    info = RoundInfo.sources(4)
    rule = _rule(lay, gala_mix=mix, global_lr=0.7, gala_weights=weights_mode)
    # identical updates: every cosine is 1
    same = np.stack([delta] * 4)
    res = rule.aggregate(theta, same, p, extras=[{}] * 4, round=1, info=info)
    assert res.params.dtype == np.float32
    assert np.array_equal(res.params, fedavg_step(theta, same, p, 0.7))
    assert [res.diagnostics[f"gala_w.{u}"] for u in range(4)] == pytest.approx(p.tolist(), rel=1e-12)
    # two different updates, mirror images about their mean (u, ±v): equal cosines in every tensor
    sym = np.stack([delta, delta])
    sym[1, 121:] *= -1
    half = np.array([0.5, 0.5])
    sym_res = _rule(lay, gala_mix=mix, gala_weights=weights_mode).aggregate(
        theta, sym, half, extras=[{}] * 2, round=1, info=RoundInfo.sources(2))
    assert np.array_equal(sym_res.params, fedavg_step(theta, sym, half, 1.0))


def test_better_aligned_client_gets_more_weight_and_more_iterations_sharpen():
    rng = np.random.default_rng(0)
    common = rng.normal(size=50)
    updates = np.stack([common + 0.1 * rng.normal(size=50), common + 0.2 * rng.normal(size=50),
                        -common + rng.normal(size=50)]).astype(np.float32)
    p = np.full(3, 1 / 3)
    w1, _ = gala_global_weights(updates, p, iters=1)
    w5, _ = gala_global_weights(updates, p, iters=5)
    assert w1[2] < 1 / 3 < w1[0]
    assert w5[2] <= w1[2]


def test_zero_updates_are_handled_without_nan():
    updates = np.zeros((2, 5), np.float32)
    w, a = gala_global_weights(updates, np.array([0.5, 0.5]))
    np.testing.assert_array_equal(w, [0.5, 0.5])
    np.testing.assert_array_equal(a, np.zeros(5))


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="iters"):
        gala_global_weights(np.ones((2, 3), np.float32), np.array([0.5, 0.5]), iters=0)
    with pytest.raises(ValueError, match="client count"):
        gala_global_weights(np.ones((2, 3), np.float32), np.array([1.0]))
    with pytest.raises(ValueError, match="cover"):
        gala_global_weights(np.ones((2, 3), np.float32), np.array([0.5, 0.5]), slices=[slice(0, 2)])


def _rule(layout=None, **params) -> Gala:
    return Gala(_cfg(**params), layout if layout is not None else _layout(300))


def test_gala_mix_zero_is_fedavg_bit_for_bit_and_mix_one_is_theta_plus_a():
    rng = np.random.default_rng(2)
    theta = rng.normal(size=300).astype(np.float32)
    updates = rng.normal(size=(3, 300)).astype(np.float32)
    p = np.array([0.2, 0.3, 0.5])
    lay = _layout(100, 200)
    info = RoundInfo((4, 7, 9), ("source",) * 3, (1,) * 3, (2, 3, 5))
    res0 = _rule(lay, gala_mix=0.0, global_lr=0.5).aggregate(theta, updates, p, extras=[{}] * 3, round=1, info=info)
    np.testing.assert_array_equal(res0.params, fedavg_step(theta, updates, p, 0.5))
    res1 = _rule(lay, global_lr=0.5).aggregate(theta, updates, p, extras=[{}] * 3, round=1, info=info)
    _, a = gala_global_weights(updates, p, iters=3, slices=lay.param_slices())
    np.testing.assert_allclose(res1.params, theta + 0.5 * a, rtol=0, atol=1e-6)
    assert not np.allclose(res1.params, res0.params, atol=1e-4)
    # mix in between: the straight line between the two (global_lr scales both parts)
    half = _rule(lay, gala_mix=0.5, global_lr=0.5).aggregate(theta, updates, p, extras=[{}] * 3, round=1, info=info)
    np.testing.assert_allclose(half.params, 0.5 * (res0.params + res1.params), rtol=0, atol=1e-6)
    # diagnostics: one normalised weight per client id
    assert sorted(res1.diagnostics) == ["gala_w.4", "gala_w.7", "gala_w.9"]
    assert sum(res1.diagnostics.values()) == pytest.approx(1.0)
    assert res1.params.dtype == np.float32
    # per-tensor needs a layout with parameter tensors
    with pytest.raises(ValueError, match="gala_weights"):
        Gala(_cfg(), _layout()).aggregate(theta, updates, p, extras=[{}] * 3, round=1, info=info)


def test_gala_iters_reaches_the_rule():
    rng = np.random.default_rng(3)
    updates = rng.normal(size=(3, 40)).astype(np.float32)
    p = np.full(3, 1 / 3)
    info = RoundInfo.sources(3)
    d1 = _rule(_layout(40), gala_iters=1).aggregate(np.zeros(40, np.float32), updates, p, extras=[{}] * 3,
                                                    round=1, info=info)
    w1, _ = gala_global_weights(updates, p, iters=1)
    assert [d1.diagnostics[f"gala_w.{u}"] for u in range(3)] == pytest.approx(w1.tolist(), rel=1e-12)
    _, w3, _ = gala_step(np.zeros(40, np.float32), updates, p, iters=3)
    assert not np.allclose(w1, w3, rtol=1e-9)


@pytest.mark.parametrize("key,value", [("gala_tau", 2.0), ("gala_tau", -1.5), ("gala_iters", 0), ("gala_mix", 1.5),
                                       ("gala_gate", "ascent"), ("gala_weights", "layer")])
def test_bad_hyperparameters_are_config_errors_naming_the_field(key, value):
    with pytest.raises(ConfigError, match=key):
        _cfg(**{key: value})


def test_registration():
    assert CLIENT_METHODS["gala"] is GalaClient and SERVER_RULES["gala"] is Gala
    preset = PRESETS["fedgala"]
    assert (preset.client_method, preset.server_rule, preset.unsupervised_client_method) == ("gala", "gala", "gala-simclr")
    assert SERVER_SIDES["gala"] is GlobalMove and SERVER_SIDES["gala-simclr"] is SimclrGlobalMove
    assert CLIENT_METHODS.spec("gala").supervised
    cfg = _cfg()
    assert (GALA_TAU.of(cfg), GALA_ITERS.of(cfg), GALA_MIX.of(cfg)) == (0.0, 3, 1.0)
    assert (GALA_GATE.of(cfg), GALA_WEIGHTS.of(cfg)) == ("descent", "per-tensor")


# ================================================================================ local gate
def test_sign_convention_gated_sgd_with_known_gradients():
    # loss = <c1, w1> + <c2, w2>: the gradient of tensor l is exactly c_l
    w1 = torch.zeros(3, requires_grad=True)
    w2 = torch.zeros(2, 2, requires_grad=True)
    c1 = torch.tensor([1.0, -2.0, 0.5])
    c2 = torch.tensor([[0.5, 1.0], [-1.0, 2.0]])
    # r1 = −∇ (the descent direction): step taken;  r2 = +∇: skipped (τ = 0)
    opt = GatedSGD([w1, w2], lr=0.1, reference=[-c1, c2.clone()], tau=0.0)
    ((w1 * c1).sum() + (w2 * c2).sum()).backward()
    opt.step()
    torch.testing.assert_close(w1.detach(), -0.1 * c1, rtol=0, atol=0)
    assert torch.equal(w2.detach(), torch.zeros(2, 2))
    assert (opt.tensor_steps, opt.skipped, opt.metrics()) == (2, 1, {"gala_skipped": 0.5})

    # and the other way round
    v1 = torch.zeros(3, requires_grad=True)
    v2 = torch.zeros(2, 2, requires_grad=True)
    opt = GatedSGD([v1, v2], lr=0.1, reference=[c1.clone(), -c2], tau=0.0)
    ((v1 * c1).sum() + (v2 * c2).sum()).backward()
    opt.step()
    assert torch.equal(v1.detach(), torch.zeros(3))
    torch.testing.assert_close(v2.detach(), -0.1 * c2, rtol=0, atol=0)


def test_threshold_is_strict_and_zero_reference_is_not_gated():
    # cos(−∇, r) = 0 exactly (orthogonal): taken at τ = −0.1, skipped at τ = 0
    c = torch.tensor([1.0, 0.0])
    r = torch.tensor([0.0, 1.0])
    for tau, moved in ((-0.1, True), (0.0, False)):
        w = torch.zeros(2, requires_grad=True)
        z = torch.zeros(2, requires_grad=True)  # reference exactly zero: never gated
        opt = GatedSGD([w, z], lr=1.0, reference=[r, torch.zeros(2)], tau=tau)
        ((w * c).sum() + (z * c).sum()).backward()
        opt.step()
        assert (not torch.equal(w.detach(), torch.zeros(2))) == moved
        assert torch.equal(z.detach(), -c)


def test_descent_and_literal_gates_disagree_by_hand():
    # tensor 1: r = +∇ (cos(−∇, r) = −1, cos(+∇, r) = +1); tensor 2: r ⟂ ∇ (both cosines 0, at τ = 0:
    # descent's strict > skips, literal's >= steps); tensor 3: r = −∇ (descent steps, literal skips)
    c = [torch.tensor([1.0, -2.0]), torch.tensor([1.0, 0.0]), torch.tensor([0.5, 0.5])]
    refs = [c[0].clone(), torch.tensor([0.0, 3.0]), -c[2]]
    moved = {}
    for gate in ("descent", "literal"):
        ws = [torch.zeros(2, requires_grad=True) for _ in range(3)]
        opt = GatedSGD(ws, lr=0.1, reference=refs, tau=0.0, gate=gate)
        sum((w * ci).sum() for w, ci in zip(ws, c)).backward()
        opt.step()
        moved[gate] = [not torch.equal(w.detach(), torch.zeros(2)) for w in ws]
        for w, ci, m in zip(ws, c, moved[gate]):
            if m:
                torch.testing.assert_close(w.detach(), -0.1 * ci, rtol=0, atol=0)
        assert opt.metrics() == {"gala_skipped": pytest.approx(sum(not m for m in moved[gate]) / 3)}
    assert moved == {"descent": [False, False, True], "literal": [True, True, False]}
    with pytest.raises(ValueError, match="gate"):
        GatedSGD([torch.zeros(2, requires_grad=True)], lr=0.1, gate="ascent")


def test_gala_gate_reaches_the_client_and_skips_are_recorded_for_both():
    # One full-batch local step: both gates judge the same gradient at the same model, so their
    # decisions are complementary by construction (not by a trajectory that depends on rounding).
    x, y = _data()
    move = None
    res = {}
    for gate in ("descent", "literal"):
        cfg = _cfg(gala_gate=gate, local_steps=1, batch_size=len(y))
        a, _ = _twin_models()
        if move is None:
            move = torch.randn(_num_params(a), generator=torch.Generator().manual_seed(11)).numpy()
        out = GalaClient(cfg).train(_ctx(a, x, y, cfg, {"global_move": move}))
        res[gate] = out.metrics["gala_skipped"]
    # independent reference: the full-batch gradient at the initial model, one cosine per tensor
    ref, _ = _twin_models()
    torch.nn.functional.cross_entropy(ref(x), y).backward()
    grads = [p.grad.detach().double().flatten() for p in ref.parameters()]
    moves = torch.split(torch.from_numpy(move).double(), [g.numel() for g in grads])
    cosines = [float(torch.dot(-g, r) / (g.norm() * r.norm())) for g, r in zip(grads, moves)]
    assert all(abs(c) > 1e-6 for c in cosines)  # no tie: exactly one gate passes each tensor at tau = 0
    expected_descent_skips = sum(c <= 0.0 for c in cosines) / len(cosines)
    assert 0.0 < expected_descent_skips < 1.0  # the case separates the two gates
    assert res["descent"] == pytest.approx(expected_descent_skips, abs=0)
    assert res["literal"] == pytest.approx(1.0 - expected_descent_skips, abs=0)


def test_skipped_tensor_keeps_its_momentum_buffer_and_gets_no_weight_decay():
    w = torch.ones(2, requires_grad=True)
    r = torch.tensor([-1.0, -1.0])  # descent must have a positive component along r: gradient ~ (+, +)
    opt = GatedSGD([w], lr=0.1, momentum=0.9, weight_decay=0.5, reference=[r], tau=0.0)

    def step(grad):
        opt.zero_grad()
        (w * torch.tensor(grad)).sum().backward()
        opt.step()

    step([1.0, 1.0])  # aligned: d = g + 0.5 w = (1.5, 1.5); buf = d; w = 1 - 0.15
    torch.testing.assert_close(w.detach(), torch.tensor([0.85, 0.85]))
    buf = opt.buffers[0].clone()
    torch.testing.assert_close(buf, torch.tensor([1.5, 1.5]))
    step([-1.0, -1.0])  # misaligned: skipped -> w, buffer untouched (no decay, no weight decay)
    torch.testing.assert_close(w.detach(), torch.tensor([0.85, 0.85]), rtol=0, atol=0)
    assert torch.equal(opt.buffers[0], buf)
    step([2.0, 2.0])  # aligned again: buf = 0.9 * 1.5 + (2 + 0.5 * 0.85) = 3.775; w = 0.85 - 0.3775
    torch.testing.assert_close(opt.buffers[0], torch.tensor([3.775, 3.775]))
    torch.testing.assert_close(w.detach(), torch.tensor([0.4725, 0.4725]))
    assert opt.metrics() == {"gala_skipped": pytest.approx(1 / 3)}


def _ctx(model, x, y, cfg, payload=None, seed=0, round=2):
    return ClientContext(model=model, data=TensorExamples(x, y), cfg=cfg, round=round, client_id=0, role="source",
                         generator=torch.Generator().manual_seed(seed), device=torch.device("cpu"),
                         payload=payload or {})


def _twin_models(d=6, k=3, hidden=(8,)):
    torch.manual_seed(0)
    a = build_model("mlp", input_shape=(d,), num_classes=k, mlp_hidden=list(hidden))
    b = build_model("mlp", input_shape=(d,), num_classes=k, mlp_hidden=list(hidden))
    b.load_state_dict(a.state_dict())
    return a, b


def _data(n=40, d=6, k=3):
    g = torch.Generator().manual_seed(5)
    return torch.randn(n, d, generator=g), torch.randint(0, k, (n,), generator=g)


def _num_params(model):
    return sum(p.numel() for p in model.parameters())


def test_tau_minus_one_is_bit_identical_to_sgd_with_a_global_move():
    x, y = _data()
    a, b = _twin_models()
    cfg = _cfg(local_steps=6, batch_size=8, local_momentum=0.9, weight_decay=1e-3, gala_tau=-1.0)
    move = np.random.default_rng(0).normal(size=_num_params(a)).astype(np.float32)
    move.setflags(write=False)  # payloads from the object store are read-only
    out_sgd = SGD(cfg).train(_ctx(a, x, y, cfg, {"global_move": move}))
    out_gala = GalaClient(cfg).train(_ctx(b, x, y, cfg, {"global_move": move}))
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert out_gala.loss == out_sgd.loss and out_gala.steps == out_sgd.steps == 6
    assert out_gala.metrics == {"gala_skipped": 0.0}

    # the same run at τ = 0 does gate (so the identity above is not vacuous)
    _, c = _twin_models()
    out0 = GalaClient(cfg.replace(params={"gala_tau": 0.0})).train(_ctx(c, x, y, cfg.replace(params={"gala_tau": 0.0}),
                                                                        {"global_move": move}))
    assert 0.0 < out0.metrics["gala_skipped"] < 1.0
    assert any(not torch.equal(p, q) for p, q in zip(a.parameters(), c.parameters()))


def test_tau_one_moves_nothing():
    x, y = _data()
    a, _ = _twin_models()
    before = [p.detach().clone() for p in a.parameters()]
    cfg = _cfg(local_steps=4, batch_size=8, local_momentum=0.9, weight_decay=1e-3, gala_tau=1.0)
    move = np.random.default_rng(1).normal(size=_num_params(a)).astype(np.float32)
    out = GalaClient(cfg).train(_ctx(a, x, y, cfg, {"global_move": move}))
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), before))
    assert out.metrics == {"gala_skipped": 1.0} and out.steps == 4


def test_round_one_without_a_global_move_is_not_gated():
    x, y = _data()
    a, b = _twin_models()
    cfg = _cfg(local_steps=3, batch_size=8, gala_tau=1.0)  # τ = 1 would freeze everything if gated
    SGD(cfg).train(_ctx(a, x, y, cfg, round=1))
    out = GalaClient(cfg).train(_ctx(b, x, y, cfg, round=1))
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert out.metrics == {"gala_skipped": 0.0}


def test_global_move_is_sliced_per_tensor_in_parameters_order():
    # A linear model (weight, bias), one full-batch step: the gradient is known before training.
    x, y = _data(n=16, d=4, k=3)
    a, _ = _twin_models(d=4, k=3, hidden=())
    lin = a[-1]
    loss = torch.nn.functional.cross_entropy(a(x), y)
    gW, gb = torch.autograd.grad(loss, [lin.weight, lin.bias])
    W0, b0 = lin.weight.detach().clone(), lin.bias.detach().clone()
    cfg = _cfg(local_steps=1, batch_size=16, local_lr=0.5)
    for r_w, r_b, w_moves in ((-gW, gb, True), (gW, -gb, False)):
        lin.weight.data.copy_(W0)
        lin.bias.data.copy_(b0)
        move = torch.cat([r_w.flatten(), r_b.flatten()]).numpy()
        out = GalaClient(cfg).train(_ctx(a, x, y, cfg, {"global_move": move}))
        assert (not torch.equal(lin.weight.detach(), W0)) == w_moves
        assert torch.equal(lin.bias.detach(), b0) == w_moves
        assert out.metrics == {"gala_skipped": 0.5}
    with pytest.raises(ValueError, match="parameters"):
        reference_tensors(a, np.zeros(_num_params(a) + 1, np.float32))


def test_gated_client_mixin_wraps_any_loss():
    # A made-up client method (squared norm of the output) that builds its optimiser through
    # make_optimizer, like SGD and SimCLR: the mixin gates it without touching its loop.
    from fedtune.algorithms.client.method import ClientMethod, ClientOutcome
    from fedtune.algorithms.client.gala import GatedClientMixin

    class OutputNorm(ClientMethod):
        name = "output-norm"

        def make_optimizer(self, model):
            from fedtune.algorithms.client.optim import LocalSGD

            return LocalSGD(model.parameters(), lr=self.cfg.local_lr)

        def train(self, ctx):
            opt = self.make_optimizer(ctx.model)
            for _ in range(3):
                opt.zero_grad()
                ctx.model(ctx.data.x).pow(2).sum().backward()
                ctx.record_step(opt.params, [p.grad for p in opt.params])
                opt.step()
            return ClientOutcome(loss=0.0, steps=3)

    class GatedOutputNorm(GatedClientMixin, OutputNorm):
        name = "gala-output-norm"

    x, y = _data()
    cfg = _cfg(gala_tau=1.0)
    a, b = _twin_models()
    move = np.ones(_num_params(a), np.float32)
    out = GatedOutputNorm(cfg).train(_ctx(a, x, y, cfg, {"global_move": move}))
    assert out.metrics == {"gala_skipped": 1.0}
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))  # τ = 1: frozen
    OutputNorm(cfg).train(_ctx(b, x, y, cfg, {"global_move": move}))
    assert any(not torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))  # ungated: moves


# ================================================================================ end to end
def test_fedgala_end_to_end_local_backend(tmp_path):
    from fedtune.results.store import load
    from fedtune.runtime.driver import run

    cfg = FederatedRunConfig.from_dict({"algorithm": "fedgala", "dataset": "rotated-digits", "setting": "fdg",
                               "model": "mlp", "mlp_hidden": [16], "rounds": 3, "local_steps": 3, "batch_size": 16,
                               "backend": "local", "output": str(tmp_path)})
    result = run(cfg, progress=False)
    assert result.status == "completed"
    rows = result.rows
    assert [r["round"] for r in rows] == [1, 2, 3]
    assert [r["server_rule"] for r in rows] == ["gala"] * 3 and rows[0]["client_method"] == "gala"
    assert rows[0]["diag.gala_skipped"] == 0.0  # no global move yet: nothing gated
    assert all(0.0 < r["diag.gala_skipped"] < 1.0 for r in rows[1:])  # gating active from round 2
    for r in rows:
        w = {k: v for k, v in r.items() if k.startswith("diag.gala_w.")}
        assert len(w) == r["num_participants"] == 5
        assert sum(w.values()) == pytest.approx(1.0)
    assert rows[0]["hp.gala_tau"] == 0.0 and rows[0]["hp.gala_iters"] == 3
    table = load(tmp_path / "default")
    names = table.column_names
    assert "diag.gala_skipped" in names and sum(c.startswith("diag.gala_w.") for c in names) == 5
    assert table.column("diag.gala_skipped").to_pylist()[0] == 0.0


def test_the_global_move_reaching_clients_is_new_minus_old_weights():
    """The reference FedGaLA's clients receive is θ^t − θ^(t−1) (not its negative), driven through
    the coordinator with the local pool for three rounds."""
    from fedtune.runtime.coordinator import Coordinator
    from fedtune.runtime.driver import build_plan

    cfg = FederatedRunConfig.from_dict({"algorithm": "fedgala", "dataset": "rotated-digits", "setting": "fdg",
                               "model": "mlp", "mlp_hidden": [8], "rounds": 3, "local_steps": 2, "batch_size": 16,
                               "backend": "local"})
    coord = Coordinator(cfg.to_dict(), build_plan(cfg), {"kind": "local"})
    seen = []
    fit_stream = coord.pool.fit_stream

    def spy(weights, payload, round, client_ids, skipped):
        seen.append(None if "global_move" not in payload else np.array(payload["global_move"]))
        return fit_stream(weights, payload, round, client_ids, skipped)

    coord.pool.fit_stream = spy
    P = coord.layout.num_params
    history = [coord.weights.copy()]
    try:
        for r in (1, 2, 3):
            assert coord.run_round(r, evaluate=False).status == "ok"
            history.append(coord.weights.copy())
    finally:
        coord.shutdown()
    assert seen[0] is None  # no move before the first aggregation
    for r in (2, 3):
        expected = history[r - 1][:P] - history[r - 2][:P]
        assert np.abs(expected).max() > 0
        np.testing.assert_array_equal(seen[r - 1], expected)
