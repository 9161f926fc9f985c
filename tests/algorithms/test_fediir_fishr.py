"""FedIIR and federated Fishr (docs/methods-baselines.md §8, §9): the client penalties against
float64 NumPy references of the equations (per-example classifier gradients in closed form,
(softmax − onehot) ⊗ [features, 1], gradients of the objective by central finite differences), the
server sides' statistics against hand computations, their state through a checkpoint, zero weights
bit-identical to sgd, and short end-to-end runs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from fedtune.algorithms import CLIENT_METHODS, SERVER_SIDES, own_knobs
from fedtune.algorithms.presets import PRESETS
from fedtune.algorithms.client.method import ClientContext, batches
from fedtune.algorithms.client.fediir import FedIIR, round_gradient_sum
from fedtune.algorithms.server.fediir import BATCHES_KEY, GRAD_SUM_KEY, FedIIRServer
from fedtune.algorithms.server.fediir import MEAN_KEY as FEDIIR_MEAN_KEY
from fedtune.algorithms.client.fishr import STATE_KEY, Fishr, gradient_variance, iterations_behind
from fedtune.algorithms.server.fishr import MEAN_KEY as FISHR_MEAN_KEY
from fedtune.algorithms.server.fishr import VARIANCE_KEY, FishrServer
from fedtune.algorithms.server.rule import RoundInfo
from fedtune.config import FederatedRunConfig
from fedtune.errors import ConfigError
from fedtune.runtime.checkpoint import read_checkpoint, write_checkpoint
from fedtune.runtime.driver import FederatedRun
from fedtune.runtime.examples import TensorExamples


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _cfg(**values) -> FederatedRunConfig:
    return FederatedRunConfig.from_dict({"backend": "local", "dataset": "rotated-digits", **values})


def _ctx(model, x, y, cfg, *, payload=None, state=None, round=1, seed=0) -> ClientContext:
    return ClientContext(model=model, data=TensorExamples(x, y), cfg=cfg, round=round, client_id=0, role="source",
                         generator=torch.Generator().manual_seed(seed), device=torch.device("cpu"),
                         payload={} if payload is None else payload, state={} if state is None else state)


X = torch.tensor([[1.0, 0.5, -1.0], [0.2, -0.3, 0.8], [-0.6, 1.2, 0.4], [0.9, 0.0, 0.3], [-1.1, -0.4, 0.6]],
                 dtype=torch.float64)
Y = torch.tensor([0, 2, 2, 1, 0])
K = 4 * 3 + 3  # the classifier's weight [3, 4] and bias [3]


def _model(seed=0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 3)).double()


def _flat(model) -> np.ndarray:
    return np.concatenate([p.detach().numpy().ravel() for p in model.parameters()])


# ------------------------------------------------------------------------- float64 NumPy references
def _unflat(theta):
    w1, b1, w2, b2 = np.split(theta, [12, 16, 28])
    return w1.reshape(4, 3), b1, w2.reshape(3, 4), b2


def _forward(theta, x):
    w1, b1, w2, b2 = _unflat(theta)
    h = np.tanh(x @ w1.T + b1)
    return h, h @ w2.T + b2


def _softmax(logits):
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    return p / p.sum(axis=1, keepdims=True)


def _ce(logits, y):
    return float(-np.log(_softmax(logits)[np.arange(len(y)), y]).mean())


def _per_example_grads(h, logits, y):
    """Row i: the gradient of example i's cross-entropy w.r.t. the last layer, (p_i − onehot_i) ⊗ [h_i, 1]."""
    e = _softmax(logits)
    e[np.arange(len(y)), y] -= 1.0
    return np.stack([np.concatenate([np.outer(e[i], h[i]).ravel(), e[i]]) for i in range(len(y))])


def _fediir_objective(theta, x, y, g_bar, weight):
    h, logits = _forward(theta, x)
    g = _per_example_grads(h, logits, y).mean(axis=0)  # the batch-mean gradient
    return _ce(logits, y) + weight * float(((g - g_bar) ** 2).sum())


def _variance(theta, x, y):
    h, logits = _forward(theta, x)
    g = _per_example_grads(h, logits, y)
    return ((g - g.mean(axis=0)) ** 2).mean(axis=0)


def _fishr_objective(theta, x, y, v_bar, previous, ema, weight, form):
    h, logits = _forward(theta, x)
    v = (ema * previous + (1 - ema) * _variance(theta, x, y)) / (1 - ema)
    sq = (v - v_bar) ** 2
    return _ce(logits, y) + weight * float(sq.mean() if form == "mean" else sq.sum())


def _numeric_gradient(f, theta, h=1e-6):
    out = np.empty_like(theta)
    for i in range(theta.size):
        up, down = theta.copy(), theta.copy()
        up[i] += h
        down[i] -= h
        out[i] = (f(up) - f(down)) / (2 * h)
    return out


def _one_step_gradient(method, model, cfg, **ctx_values):
    """Train one full-batch plain-SGD step (momentum 0, no weight decay); the gradient it stepped on."""
    before = _flat(model)
    out = method.train(_ctx(model, X, Y, cfg, **ctx_values))
    assert out.steps == 1
    return out, (before - _flat(model)) / cfg.local_lr


SGD_STEP = {"local_steps": 1, "batch_size": 64, "local_lr": 0.1, "local_momentum": 0.0, "weight_decay": 0.0}


# --------------------------------------------------------------------------------------------- FedIIR
def test_fediir_step_matches_a_float64_reference_of_the_penalty_and_its_gradient():
    g_bar = (np.random.default_rng(0).standard_normal(K) * 0.3).astype(np.float32)
    cfg = _cfg(algorithm="fediir", fediir_penalty=0.5, **SGD_STEP)
    model = _model()
    theta = _flat(model)
    out, stepped = _one_step_gradient(FedIIR(cfg), model, cfg, payload={FEDIIR_MEAN_KEY: g_bar})
    gb = g_bar.astype(np.float64)
    reference = _numeric_gradient(lambda t: _fediir_objective(t, X.numpy(), Y.numpy(), gb, 0.5), theta)
    ce_only = _numeric_gradient(lambda t: _fediir_objective(t, X.numpy(), Y.numpy(), gb, 0.0), theta)
    np.testing.assert_allclose(stepped, reference, rtol=1e-6, atol=1e-8)
    assert np.abs(reference - ce_only)[:16].max() > 0.05  # the penalty trains the featurizer too
    h, logits = _forward(theta, X.numpy())
    g = _per_example_grads(h, logits, Y.numpy()).mean(axis=0)
    assert out.metrics["fediir_penalty_term"] == pytest.approx(float(((g - gb) ** 2).sum()), rel=1e-9)
    assert out.loss == pytest.approx(_ce(logits, Y.numpy()), rel=1e-12)
    # the report: the classifier gradient at the received model, one batch
    np.testing.assert_allclose(out.extras[GRAD_SUM_KEY], g, rtol=1e-12, atol=1e-14)
    assert int(out.extras[BATCHES_KEY]) == 1


def test_fediir_first_round_uses_a_zero_mean_and_the_report_sums_an_epoch_of_batches():
    cfg = _cfg(algorithm="fediir", fediir_penalty=0.5, **{**SGD_STEP, "batch_size": 2, "local_steps": 3})
    model = _model()
    theta = _flat(model)
    ctx = _ctx(model, X, Y, cfg, round=0, seed=7)
    # the batches the round draws: 5 examples, batch 2 -> epochs of 2 batches (2 + 3 examples)
    rows = [r.numpy() for r in batches(5, 2, 2, torch.Generator().manual_seed(7))]
    out = FedIIR(cfg).train(ctx)
    assert out.steps == 3 and int(out.extras[BATCHES_KEY]) == 2  # one epoch, not the 3 local steps
    expected = np.zeros(K)
    for r in rows:
        h, logits = _forward(theta, X.numpy()[r])
        expected += _per_example_grads(h, logits, Y.numpy()[r]).mean(axis=0)
    np.testing.assert_allclose(out.extras[GRAD_SUM_KEY], expected, rtol=1e-12, atol=1e-14)
    # no mean received: the penalty of the first step is ||g||^2 (g_bar = 0, the authors' start)
    cfg1 = _cfg(algorithm="fediir", fediir_penalty=0.5, **SGD_STEP)
    m1 = _model()
    _, stepped = _one_step_gradient(FedIIR(cfg1), m1, cfg1, round=0)
    ref = _numeric_gradient(lambda t: _fediir_objective(t, X.numpy(), Y.numpy(), np.zeros(K), 0.5), theta)
    np.testing.assert_allclose(stepped, ref, rtol=1e-6, atol=1e-8)


def test_the_gradient_pass_leaves_the_model_and_every_random_stream_alone():
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(3, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Dropout(0.3), nn.Linear(6, 3)).double()
    cfg = _cfg(algorithm="fediir", local_steps=2, batch_size=64)
    ctx = _ctx(model, X, Y, cfg, seed=5)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng, gen = torch.get_rng_state(), ctx.generator.get_state()
    grad_sum, count = round_gradient_sum(ctx, model[4])
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert torch.equal(torch.get_rng_state(), rng) and torch.equal(ctx.generator.get_state(), gen)
    assert count == 1 and grad_sum.shape == (6 * 3 + 3,) and np.abs(grad_sum).max() > 0


# ---------------------------------------------------------------------------------------------- Fishr
@pytest.mark.parametrize("bias", [True, False])
def test_fishr_variance_is_that_of_explicit_per_example_gradients(bias):
    g = torch.Generator().manual_seed(1)
    z = torch.randn(7, 5, generator=g, dtype=torch.float64)
    logits = torch.randn(7, 4, generator=g, dtype=torch.float64)
    y = torch.tensor([0, 3, 1, 1, 2, 0, 3])
    e = (torch.softmax(logits, 1) - torch.eye(4, dtype=torch.float64)[y]).numpy()
    zs = z.numpy()
    per_example = np.stack([np.concatenate([np.outer(e[i], zs[i]).ravel()] + ([e[i]] if bias else []))
                            for i in range(7)])
    expected = ((per_example - per_example.mean(0)) ** 2).mean(0)
    got = gradient_variance(z, logits, y, bias).numpy()
    assert got.shape == (20 + 4 * bias,)
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-15)


@pytest.mark.parametrize("form", ["mean", "sum"])
def test_fishr_step_matches_a_float64_reference_of_the_penalty_and_its_gradient(form):
    rng = np.random.default_rng(2)
    v_bar = (rng.uniform(0.0, 0.1, K)).astype(np.float32)
    previous = rng.uniform(0.0, 0.05, K)
    weight = 30.0 if form == "mean" else 2.0
    cfg = _cfg(algorithm="fishr", fishr_penalty=weight, fishr_ema=0.8, fishr_anneal_iters=0, fishr_distance=form,
               **SGD_STEP)
    model = _model()
    theta = _flat(model)
    state = {STATE_KEY: previous.copy()}
    out, stepped = _one_step_gradient(Fishr(cfg), model, cfg, payload={FISHR_MEAN_KEY: v_bar}, state=state)
    vb = v_bar.astype(np.float64)
    f = lambda w: lambda t: _fishr_objective(t, X.numpy(), Y.numpy(), vb, previous, 0.8, w, form)  # noqa: E731
    reference, ce_only = _numeric_gradient(f(weight), theta), _numeric_gradient(f(0.0), theta)
    np.testing.assert_allclose(stepped, reference, rtol=1e-6, atol=1e-8)
    assert np.abs(reference - ce_only)[:16].max() > 0.01  # the penalty trains the featurizer too
    a = _variance(theta, X.numpy(), Y.numpy())
    s = 0.8 * previous + 0.2 * a
    np.testing.assert_allclose(state[STATE_KEY], s, rtol=1e-12)  # the moving average, kept on the client
    np.testing.assert_allclose(out.extras[VARIANCE_KEY], s / 0.2, rtol=1e-12)  # the corrected value reported
    sq = (s / 0.2 - vb) ** 2
    assert out.metrics["fishr_penalty_term"] == pytest.approx(float(sq.mean() if form == "mean" else sq.sum()),
                                                              rel=1e-9)


def test_fishr_warm_up_trains_like_sgd_and_resets_the_optimiser_when_the_penalty_starts():
    v_bar = np.full(K, 0.05, np.float32)
    base = {**SGD_STEP, "local_steps": 2, "local_momentum": 0.9}
    # Warm-up all round long (round 1: iterations 0, 1 < 10): the steps of sgd, bit for bit; the average still runs.
    cfg = _cfg(algorithm="fishr", fishr_penalty=50.0, fishr_anneal_iters=10, **base)
    sgd_cfg = _cfg(**base)
    m_fishr, m_sgd, state = _model(), _model(), {}
    out = Fishr(cfg).train(_ctx(m_fishr, X, Y, cfg, payload={FISHR_MEAN_KEY: v_bar}, state=state))
    CLIENT_METHODS["sgd"](sgd_cfg).train(_ctx(m_sgd, X, Y, sgd_cfg))
    assert all(torch.equal(a, b) for a, b in zip(m_fishr.parameters(), m_sgd.parameters()))
    assert out.metrics["fishr_penalty_term"] == 0.0 and STATE_KEY in state and VARIANCE_KEY in out.extras
    # The switch at iteration 3 (round 2, step 1 of 2) rebuilds the optimiser: no momentum carried over.
    cfg3 = _cfg(algorithm="fishr", fishr_penalty=50.0, fishr_anneal_iters=3, **base)
    m3 = _model()
    theta = _flat(m3)
    out3 = Fishr(cfg3).train(_ctx(m3, X, Y, cfg3, payload={FISHR_MEAN_KEY: v_bar}, state={}, round=2))
    first = _numeric_gradient(lambda t: _ce(_forward(t, X.numpy())[1], Y.numpy()), theta)
    mid = theta - 0.1 * first
    v1 = 0.05 * _variance(theta, X.numpy(), Y.numpy())  # the state after step 1 (ema 0.95, from 0)
    second = _numeric_gradient(lambda t: _fishr_objective(t, X.numpy(), Y.numpy(), v_bar.astype(np.float64), v1,
                                                          0.95, 50.0, "mean"), mid)
    np.testing.assert_allclose(_flat(m3), mid - 0.1 * second, rtol=1e-6, atol=1e-9)  # no 0.9 * first in it
    assert out3.metrics["fishr_penalty_term"] > 0


@pytest.mark.parametrize("anneal,first_penalised_round", [(6, 3), (4, 2)])
def test_fishr_penalty_starts_at_the_round_whose_received_model_has_anneal_iters_behind_it(anneal,
                                                                                          first_penalised_round):
    # Rounds start at 1 and take S = 3 steps: the model received in round r has (r - 1) * 3 iterations
    # behind it (§9.4), so step s of round r is iteration (r - 1) * 3 + s. anneal = 6: rounds 1 and 2
    # are plain CE, round 3 is penalised from its first step; anneal = 4: round 2 from its second step.
    assert [iterations_behind(r, 3) for r in (1, 2, 3)] == [0, 3, 6]
    v_bar = np.full(K, 0.05, np.float32)
    base = {**SGD_STEP, "local_steps": 3, "local_momentum": 0.0}
    cfg = _cfg(algorithm="fishr", fishr_penalty=50.0, fishr_anneal_iters=anneal, **base)
    sgd_cfg = _cfg(**base)
    for r in range(1, first_penalised_round + 1):
        m_fishr, m_sgd = _model(), _model()
        out = Fishr(cfg).train(_ctx(m_fishr, X, Y, cfg, payload={FISHR_MEAN_KEY: v_bar}, state={}, round=r))
        CLIENT_METHODS["sgd"](sgd_cfg).train(_ctx(m_sgd, X, Y, sgd_cfg, round=r))
        same = all(torch.equal(a, b) for a, b in zip(m_fishr.parameters(), m_sgd.parameters()))
        if r < first_penalised_round:  # (r − 1)·3 + 2 < anneal: the warm-up, the steps of sgd bit for bit
            assert same and out.metrics["fishr_penalty_term"] == 0.0, r
        else:
            assert not same and out.metrics["fishr_penalty_term"] > 0.0, r


# ---------------------------------------------------------------------------------------- server sides
def _info(ids):
    return RoundInfo(tuple(ids), ("source",) * len(ids), (2,) * len(ids), tuple(10 * (i + 1) for i in ids))


def _update(side, ids, extras, round):
    old = np.zeros(4, np.float32)
    new = np.ones(4, np.float32)
    params, diagnostics = side.update(old, new, np.zeros((len(ids), 4), np.float32), np.full(len(ids), 1 / len(ids)),
                                      extras=extras, round=round, info=_info(ids))
    assert params is new  # the statistic only: the server rule's parameters unchanged
    return diagnostics


def test_fediir_server_mean_gradient_is_the_authors_moving_average_over_participants_batches():
    side = FedIIRServer(_cfg(algorithm="fediir", fediir_ema=0.9), None, 3)
    assert side.payload(0) == {}  # no mean yet: the clients use 0
    s0, s2 = np.array([1.0, -2.0, 0.5]), np.array([3.0, 1.0, -1.5])
    # round 1: clients 0 and 2 of 3 take part (0: 2 batches, 2: 3 batches)
    d = _update(side, [0, 2], [{GRAD_SUM_KEY: s0, BATCHES_KEY: np.array(2)},
                               {GRAD_SUM_KEY: s2, BATCHES_KEY: np.array(3)}], 1)
    g1 = np.array([(1.0 + 3.0) / 5, (-2.0 + 1.0) / 5, (0.5 - 1.5) / 5])
    m1 = 0.1 * g1
    np.testing.assert_allclose(side.grad_mean, m1, rtol=1e-15)
    assert d["fediir_grad_mean_norm"] == pytest.approx(float(np.sqrt((m1 ** 2).sum())))
    assert side.payload(2)[FEDIIR_MEAN_KEY].dtype == np.float32
    np.testing.assert_array_equal(side.payload(2)[FEDIIR_MEAN_KEY], m1.astype(np.float32))
    # round 2: client 1 reports one batch; a participant with nothing to report is left out
    s1 = np.array([0.4, 0.4, -0.2])
    _update(side, [1, 2], [{GRAD_SUM_KEY: s1, BATCHES_KEY: np.array(1)}, {}], 2)
    np.testing.assert_allclose(side.grad_mean, 0.9 * m1 + 0.1 * s1, rtol=1e-15)
    # round 3: nobody reports (fediir_penalty = 0): unchanged
    assert _update(side, [0], [{}], 3) == {}
    np.testing.assert_allclose(side.grad_mean, 0.9 * m1 + 0.1 * s1, rtol=1e-15)


def test_fishr_server_mean_variance_is_the_unweighted_mean_of_the_rounds_participants():
    side = FishrServer(_cfg(algorithm="fishr"), None, 3)
    assert side.payload(0) == {}
    v0, v1, v2 = np.array([0.1, 0.4]), np.array([0.3, 0.0]), np.array([0.5, 0.2])
    d = _update(side, [0, 2], [{VARIANCE_KEY: v0}, {VARIANCE_KEY: v2}], 1)  # weights (sizes) do not count
    np.testing.assert_allclose(side.variance, [0.3, 0.3], rtol=1e-15)
    assert d["fishr_variance_spread"] == pytest.approx(((0.2 ** 2 + 0.1 ** 2) + (0.2 ** 2 + 0.1 ** 2)) / 4)
    np.testing.assert_array_equal(side.payload(2)[FISHR_MEAN_KEY], np.array([0.3, 0.3], np.float32))
    _update(side, [1], [{VARIANCE_KEY: v1}], 2)  # the next round's participants replace it (Eq. 4)
    np.testing.assert_allclose(side.variance, v1, rtol=1e-15)
    _update(side, [0, 2], [{}, {}], 3)
    np.testing.assert_allclose(side.variance, v1, rtol=1e-15)


@pytest.mark.parametrize("name", ["fediir", "fishr"])
def test_server_side_state_survives_a_checkpoint(tmp_path, name):
    assert name in SERVER_SIDES
    key = GRAD_SUM_KEY if name == "fediir" else VARIANCE_KEY
    extra = {key: np.array([0.25, -0.5, 2.0])} | ({BATCHES_KEY: np.array(2)} if name == "fediir" else {})
    side = SERVER_SIDES[name](_cfg(algorithm=name), None, 3)
    fresh = SERVER_SIDES[name](_cfg(algorithm=name), None, 3)
    for i, state in enumerate((side.state_dict(), None)):  # before any update: nothing to send after loading
        if state is None:
            _update(side, [1], [extra], 1)
            state = side.state_dict()
        write_checkpoint(tmp_path / str(i), {"round": 1, "weights": np.zeros(2), "side": state})
        fresh.load_state_dict(read_checkpoint(tmp_path / str(i))["side"])
        assert fresh.payload(2).keys() == side.payload(2).keys()
        for k in side.payload(2):
            np.testing.assert_array_equal(fresh.payload(2)[k], side.payload(2)[k])
    assert len(side.payload(2)) == 1


# ----------------------------------------------------------------------------------------- end to end
def _local_run(tmp_path, name, **values):
    base = {"dataset": "rect4", "model": "mlp", "mlp_hidden": [16], "rounds": 2, "local_steps": 2, "batch_size": 8,
            "setting": "fdg", "backend": "local", "output": str(tmp_path / name)}
    fr = FederatedRun(FederatedRunConfig.from_dict({**base, **values}))
    fr.start()
    try:
        rows = [fr.step().metrics for _ in range(2)]
        return rows, fr.coordinator.weights.copy()
    finally:
        fr.close()


@pytest.mark.parametrize("algorithm,zero,active,diag", [
    ("fediir", {"fediir_penalty": 0.0}, {"fediir_penalty": 0.05}, "fediir_penalty_term"),
    ("fishr", {"fishr_penalty": 0.0}, {"fishr_penalty": 1000.0, "fishr_anneal_iters": 0}, "fishr_penalty_term"),
])
def test_zero_weight_is_sgd_bit_for_bit_and_a_positive_weight_trains_differently(tmp_path, algorithm, zero, active,
                                                                                 diag):
    sgd_rows, sgd_weights = _local_run(tmp_path, "sgd", algorithm="fedavg")
    zero_rows, zero_weights = _local_run(tmp_path, "zero", algorithm=algorithm, **zero)
    rows, weights = _local_run(tmp_path, "on", algorithm=algorithm, **active)
    assert np.array_equal(zero_weights, sgd_weights)
    keys = ("train_loss", "val_loss", "target_loss")
    assert [[r[k] for k in keys] for r in zero_rows] == [[r[k] for k in keys] for r in sgd_rows]
    assert all(math.isfinite(r[k]) for r in rows for k in (*keys, f"diag.{diag}"))
    assert not np.array_equal(weights, sgd_weights) and rows[-1]["val_loss"] != sgd_rows[-1]["val_loss"]
    assert rows[-1][f"diag.{diag}"] > 0
    if algorithm == "fishr":  # round 1 has no mean variance yet: no penalty, the steps of sgd
        assert rows[0]["train_loss"] == sgd_rows[0]["train_loss"] and rows[0][f"diag.{diag}"] == 0.0
        assert math.isfinite(rows[-1]["diag.fishr_variance_spread"])
    else:
        assert math.isfinite(rows[-1]["diag.fediir_grad_mean_norm"]) and rows[-1]["diag.fediir_grad_mean_norm"] > 0


def test_fediir_omg_runs_fediirs_clients_under_fedomgs_rule(tmp_path):
    assert (PRESETS["fediir-omg"].client_method, PRESETS["fediir-omg"].server_rule) == ("fediir", "fedomg")
    assert own_knobs("fediir-omg") == ("fediir_penalty", "fediir_ema", "omg_kappa", "omg_solver", "omg_rescale",
                                       "global_lr")
    assert (PRESETS["fishr"].client_method, PRESETS["fishr"].server_rule) == ("fishr", "fedavg")
    rows, _ = _local_run(tmp_path, "omg", algorithm="fediir-omg", fediir_penalty=1e-2)
    assert all(math.isfinite(r[k]) for r in rows for k in ("train_loss", "val_loss", "diag.omg_objective",
                                                           "diag.fediir_grad_mean_norm"))


# -------------------------------------------------------------------------------------- configuration
@pytest.mark.parametrize("algorithm,field,value", [
    ("fediir", "fediir_penalty", -1e-3), ("fediir", "fediir_ema", 1.0), ("fediir", "fediir_ema", "x"),
    ("fishr", "fishr_penalty", -1), ("fishr", "fishr_ema", 1.5), ("fishr", "fishr_anneal_iters", -1),
    ("fishr", "fishr_anneal_iters", 2.5), ("fishr", "fishr_distance", "l1"),
])
def test_bad_hyperparameters_are_one_config_error_line(algorithm, field, value):
    with pytest.raises(ConfigError) as err:
        _cfg(algorithm=algorithm, **{field: value})
    msg = str(err.value)
    assert f"field '{field}'" in msg and "\n" not in msg


@pytest.mark.parametrize("algorithm", ["fediir", "fishr"])
def test_fp16_is_refused_and_the_defaults_are_the_authors(algorithm):
    with pytest.raises(ConfigError, match="fp16"):
        _cfg(algorithm=algorithm, precision="fp16")
    hp = _cfg(algorithm=algorithm).resolved.hyperparameters(_cfg(algorithm=algorithm))
    fediir = {"fediir_penalty": 1e-3, "fediir_ema": 0.95, "client_weighting": "uniform"}  # the authors' plain mean
    fishr = {"fishr_penalty": 1000.0, "fishr_ema": 0.95, "fishr_anneal_iters": 1500, "fishr_distance": "mean",
             "client_weighting": "examples"}
    assert hp == (fediir if algorithm == "fediir" else fishr)
