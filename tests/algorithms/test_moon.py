"""MOON client method (Li, He, Song, CVPR 2021, Eqs. 1-3; docs/methods-baselines.md §10)."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from fedtune.algorithms import CLIENT_METHODS
from fedtune.algorithms.presets import PRESETS
from fedtune.algorithms.client.method import ClientContext
from fedtune.algorithms.client.moon import STATE_KEY, FeatureTap, model_contrastive_loss
from fedtune.config import FederatedRunConfig
from fedtune.errors import ConfigError
from fedtune.models import build_model, encode
from fedtune.runtime.examples import TensorExamples


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _cfg(**values) -> FederatedRunConfig:
    return FederatedRunConfig.from_dict({"backend": "local", "dataset": "rect4", **values})


def _ctx(model, x, y, cfg, *, state, client_id, round=1, seed=0) -> ClientContext:
    return ClientContext(model=model, data=TensorExamples(x, y), cfg=cfg, round=round, client_id=client_id,
                         role="source", generator=torch.Generator().manual_seed(seed), device=torch.device("cpu"),
                         state=state)


def _bn_mlp(seed=0):
    """A small model with batch norm in its encoder (the frozen models must run it in eval mode)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(6, 5), nn.BatchNorm1d(5), nn.ReLU(), nn.Linear(5, 3))


def _data(n=10, seed=0, shift=0.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 6, generator=g) + shift, torch.randint(0, 3, (n,), generator=g)


def _weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# --------------------------------------------------------------------------------- the loss, Eq. 1
def _reference_l_con(z, z_glob, z_prev, tau):
    """Eq. 1 in float64 NumPy, averaged over rows: cosines by hand, the softmax written out."""
    z, z_glob, z_prev = (np.asarray(a, dtype=np.float64) for a in (z, z_glob, z_prev))
    out = []
    for a, g, p in zip(z, z_glob, z_prev):
        pos = a @ g / (math.sqrt(a @ a) * math.sqrt(g @ g))
        neg = a @ p / (math.sqrt(a @ a) * math.sqrt(p @ p))
        out.append(-math.log(math.exp(pos / tau) / (math.exp(pos / tau) + math.exp(neg / tau))))
    return sum(out) / len(out)


@pytest.mark.parametrize("tau", [0.5, 0.1, 1.0])
def test_contrastive_loss_matches_eq1_on_a_hand_set_case(tau):
    z = [[1.0, 0.0, 0.0], [1.0, 1.0, 0.0]]
    z_glob = [[2.0, 0.0, 0.0], [0.0, 1.0, 0.0]]
    z_prev = [[0.0, 3.0, 0.0], [1.0, 1.0, 1.0]]
    # Cosines by hand: row 0: sim(z, z_glob) = 1, sim(z, z_prev) = 0; row 1: 1/sqrt(2) and 2/sqrt(6).
    by_hand = np.mean([-math.log(math.exp(1 / tau) / (math.exp(1 / tau) + math.exp(0.0))),
                       -math.log(math.exp(2 ** -0.5 / tau) / (math.exp(2 ** -0.5 / tau) + math.exp(2 / 6 ** 0.5 / tau)))])
    assert abs(_reference_l_con(z, z_glob, z_prev, tau) - by_hand) < 1e-14
    got = model_contrastive_loss(*(torch.tensor(a, dtype=torch.float64) for a in (z, z_glob, z_prev)), tau)
    assert abs(float(got) - by_hand) < 1e-12
    got32 = model_contrastive_loss(*(torch.tensor(a) for a in (z, z_glob, z_prev)), tau)
    assert abs(float(got32) - by_hand) < 1e-6


def test_contrastive_loss_gradient_reaches_only_z_and_matches_finite_differences():
    g = torch.Generator().manual_seed(1)
    z, z_glob, z_prev = (torch.randn(4, 3, generator=g, dtype=torch.float64) for _ in range(3))
    z.requires_grad_(True)
    loss = model_contrastive_loss(z, z_glob, z_prev, 0.5)
    loss.backward()
    h, fd = 1e-6, np.zeros((4, 3))
    base = z.detach().numpy()
    for i in range(4):
        for j in range(3):
            up, down = base.copy(), base.copy()
            up[i, j] += h
            down[i, j] -= h
            fd[i, j] = (_reference_l_con(up, z_glob, z_prev, 0.5) - _reference_l_con(down, z_glob, z_prev, 0.5)) / (2 * h)
    np.testing.assert_allclose(z.grad.numpy(), fd, rtol=1e-6, atol=1e-8)
    assert z_glob.grad is None and z_prev.grad is None


def test_the_authors_first_round_term_is_zero_with_zero_gradient():
    """Their first round has no previous model: the logits hold the positive column alone and
    CE(logits, 0) = -log(e^s / e^s) = 0 for any s, with zero gradient. fedtune skips the term."""
    s = torch.tensor([[0.3], [-1.7], [2.0]], requires_grad=True)
    loss = F.cross_entropy(s / 0.5, torch.zeros(3, dtype=torch.long))
    loss.backward()
    assert float(loss.detach()) == 0.0 and torch.count_nonzero(s.grad) == 0


# ----------------------------------------------------------------------------- the representation z
@pytest.mark.parametrize("name,shape", [("mlp", (1, 8, 8)), ("cnn", (1, 8, 8)), ("resnet18", (3, 16, 16))])
def test_the_feature_tap_reads_the_encoder_features_of_the_same_forward(name, shape):
    torch.manual_seed(0)
    model = build_model(name, input_shape=shape, num_classes=3, mlp_hidden=[7]).eval()
    x = torch.randn(2, *shape)
    tap = FeatureTap(model)
    logits = model(x)
    z = tap.take()
    tap.remove()
    assert torch.equal(z, encode(model, x))
    assert logits.shape == (2, 3) and z.shape[0] == 2 and z.shape[1] != 3


# ------------------------------------------------------------------------------ rounds, per client
def _train(method, model, start, x, y, cfg, state, client_id, round):
    model.load_state_dict(start)
    out = method.train(_ctx(model, x, y, cfg, state=state, client_id=client_id, round=round, seed=client_id))
    return out, _weights(model)


def _reference_round(start, glob, prev, x, y, mu, tau, lr):
    """One full-batch SGD step (no momentum, no decay) on CE + mu * l_con, written independently:
    z_glob and z_prev by encode() on eval-mode models, logits from the classifier applied to z."""
    model = _bn_mlp()
    model.load_state_dict(start)
    frozen = []
    for weights in (glob, prev):
        m = _bn_mlp()
        m.load_state_dict(weights)
        with torch.no_grad():
            frozen.append(encode(m.eval(), x))
    model.train()
    z = encode(model, x)
    logits = model[-1](z)

    def cos(a, b):
        return (a * b).sum(1) / (a.pow(2).sum(1).sqrt() * b.pow(2).sum(1).sqrt())

    e_pos, e_neg = torch.exp(cos(z, frozen[0]) / tau), torch.exp(cos(z, frozen[1]) / tau)
    loss = F.cross_entropy(logits, y) + mu * (-torch.log(e_pos / (e_pos + e_neg))).mean()
    model.zero_grad()
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= lr * p.grad
    return _weights(model)


def test_each_client_keeps_its_own_previous_model_and_round_two_follows_eq3(monkeypatch):
    mu, tau, lr = 5.0, 0.5, 0.1
    cfg = _cfg(algorithm="moon", moon_mu=mu, moon_temperature=tau, local_steps=1, batch_size=64, local_lr=lr,
               local_momentum=0.0, weight_decay=0.0)
    deepcopies = []
    real_deepcopy = copy.deepcopy
    monkeypatch.setattr(copy, "deepcopy", lambda obj, *a: deepcopies.append(type(obj)) or real_deepcopy(obj, *a))
    method = CLIENT_METHODS["moon"](cfg)
    model = _bn_mlp()  # one model object for every client, as on a worker
    g0 = _weights(model)
    (xa, ya), (xb, yb) = _data(seed=1), _data(seed=2, shift=1.5)
    state_a, state_b = {}, {}
    out_a1, wa1 = _train(method, model, g0, xa, ya, cfg, state_a, 0, 1)
    out_b1, wb1 = _train(method, model, g0, xb, yb, cfg, state_b, 1, 1)
    assert _same(state_a[STATE_KEY], wa1) and _same(state_b[STATE_KEY], wb1) and not _same(wa1, wb1)
    assert out_a1.metrics["moon_con"] == 0.0 and out_b1.metrics["moon_con"] == 0.0
    # Round 2 from a new global model: client a pulls towards it and away from its own round-1 model.
    g1 = {k: (wa1[k] + wb1[k]) / 2 if wa1[k].is_floating_point() else wa1[k] for k in g0}
    out_a2, wa2 = _train(method, model, g1, xa, ya, cfg, state_a, 0, 2)
    expected = _reference_round(g1, g1, wa1, xa, ya, mu, tau, lr)
    for k in expected:
        assert torch.allclose(wa2[k].double(), expected[k].double(), rtol=1e-5, atol=1e-6), k
    wrong_prev = _reference_round(g1, g1, wb1, xa, ya, mu, tau, lr)  # b's model: measurably different
    assert max(float((wrong_prev[k] - wa2[k]).abs().max()) for k in wa2 if wa2[k].is_floating_point()) > 1e-4
    assert out_a2.metrics["moon_con"] > 0.0 and math.isfinite(out_a2.metrics["moon_con"])
    assert _same(state_a[STATE_KEY], wa2) and _same(state_b[STATE_KEY], wb1)  # b untouched by a's round
    _train(method, model, g1, xb, yb, cfg, state_b, 1, 2)
    assert deepcopies.count(nn.Sequential) == 2  # the frozen global and previous copies, made once
    # A checkpointed state (tensors -> NumPy -> tensors) continues bit for bit.
    restored = {STATE_KEY: {k: torch.from_numpy(v.numpy().copy()) for k, v in wa1.items()}}
    _, again = _train(CLIENT_METHODS["moon"](cfg), _bn_mlp(seed=9), g1, xa, ya, cfg, restored, 0, 2)
    assert _same(again, wa2)


def test_a_clients_first_round_is_sgd_bit_for_bit_and_later_rounds_are_not():
    cfg = _cfg(algorithm="moon", moon_mu=5.0, local_steps=3, batch_size=4, local_lr=0.1, local_momentum=0.9,
               weight_decay=1e-3)
    sgd_cfg = _cfg(local_steps=3, batch_size=4, local_lr=0.1, local_momentum=0.9, weight_decay=1e-3)
    x, y = _data(n=12, seed=3)
    g0 = _weights(_bn_mlp())
    state = {}
    moon, sgd = CLIENT_METHODS["moon"](cfg), CLIENT_METHODS["sgd"](sgd_cfg)
    out_m, w_m = _train(moon, _bn_mlp(), g0, x, y, cfg, state, 0, 1)
    out_s, w_s = _train(sgd, _bn_mlp(), g0, x, y, sgd_cfg, {}, 0, 1)
    assert _same(w_m, w_s) and out_m.loss == out_s.loss
    out_m2, w_m2 = _train(moon, _bn_mlp(), w_m, x, y, cfg, state, 0, 2)
    out_s2, w_s2 = _train(sgd, _bn_mlp(), w_s, x, y, sgd_cfg, {}, 0, 2)
    assert not _same(w_m2, w_s2) and out_m2.metrics["moon_con"] > 0.0


# --------------------------------------------------------------------------------- end to end, local
RUN = {"dataset": "rect4", "setting": "fdg", "rounds": 2, "local_steps": 3, "batch_size": 16, "model": "mlp",
       "mlp_hidden": [16], "local_momentum": 0.9, "backend": "local"}


def _rounds(tmp_path, name, **values):
    from fedtune.runtime.driver import FederatedRun

    fr = FederatedRun(FederatedRunConfig.from_dict({**RUN, "output": str(tmp_path / name), **values}))
    fr.start()
    out = []
    for _ in range(2):
        result = fr.step()
        metrics = {k: v for k, v in result.metrics.items() if not k.endswith("_s") and k != "diag.moon_con"}
        out.append((result.status, metrics, fr.coordinator.weights.copy()))
    states = {cid: s.get(STATE_KEY) for cid, s in fr.coordinator.pool.worker.client_state.items()}
    fr.close()
    return out, states


def test_zero_mu_is_bit_identical_to_sgd_over_two_local_rounds_and_mu_changes_round_two(tmp_path):
    sgd, _ = _rounds(tmp_path, "sgd", algorithm="fedavg")
    zero, zero_states = _rounds(tmp_path, "zero", algorithm="moon", moon_mu=0.0)
    moon, states = _rounds(tmp_path, "moon", algorithm="moon", moon_mu=1.0)
    for (s_status, s_metrics, s_w), (z_status, z_metrics, z_w) in zip(sgd, zero):
        assert s_status == z_status == "ok" and s_metrics == z_metrics and np.array_equal(s_w, z_w)
    assert all(v is None for v in zero_states.values())  # mu = 0 keeps nothing
    assert np.array_equal(moon[0][2], sgd[0][2]) and moon[0][1] == sgd[0][1]  # round 1: no previous model yet
    assert not np.array_equal(moon[1][2], sgd[1][2]) and np.isfinite(moon[1][2]).all()
    assert len(states) >= 2 and all(s is not None for s in states.values())
    first, second = list(states.values())[:2]
    assert not _same(first, second)


def test_moon_two_rounds_through_driver_run(tmp_path):
    from fedtune.runtime.driver import run

    result = run(FederatedRunConfig.from_dict({**RUN, "algorithm": "moon", "moon_mu": 5.0,
                                               "output": str(tmp_path)}), progress=False)
    rows = result.rows
    assert result.status == "completed" and [r["round"] for r in rows] == [1, 2]
    assert [r["client_method"] for r in rows] == ["moon"] * 2 and rows[0]["server_rule"] == "fedavg"
    assert rows[0]["hp.moon_mu"] == 5.0 and rows[0]["hp.moon_temperature"] == 0.5
    assert rows[0]["diag.moon_con"] == 0.0 and 0.0 < rows[1]["diag.moon_con"] < 10.0
    for r in rows:
        assert all(math.isfinite(r[k]) for k in ("train_loss", "val_loss", "target_loss", "target_acc"))


def test_the_preset():
    p = PRESETS["moon"]
    assert (p.client_method, p.server_rule, p.settings) == ("moon", "fedavg", ("fdg", "fl"))
    assert CLIENT_METHODS.where("moon") == "fedtune.algorithms.client.moon:MOON"


# ------------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize("field,value,message", [
    ("moon_mu", -0.1, "out of range; allowed: >= 0"),
    ("moon_mu", "strong", "expected a number"),
    ("moon_temperature", 0.0, "out of range; allowed: > 0"),
    ("moon_temperature", -1.0, "out of range; allowed: > 0"),
])
def test_bad_hyperparameters_are_one_config_error_line_naming_the_field(field, value, message):
    with pytest.raises(ConfigError) as info:
        _cfg(algorithm="moon", **{field: value})
    text = str(info.value)
    assert "\n" not in text and f"field '{field}'" in text and message in text, text
