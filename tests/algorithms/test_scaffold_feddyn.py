"""SCAFFOLD (Karimireddy et al. 2020, Alg. 1 option II) and FedDyn (Acar et al. 2021, Alg. 1):
their clients (fedtune/algorithms/client/scaffold.py, feddyn.py) and server sides (scaffold_server.py,
feddyn_server.py), against float64 references of the papers' lines written here."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fedtune.algorithms import CLIENT_METHODS, SERVER_OPTIMIZERS, SERVER_SIDES
from fedtune.algorithms.presets import PRESETS
from fedtune.algorithms.server.aggregate import fedavg_step, fedavg_weights, weighted_sum
from fedtune.algorithms.client.method import ClientContext
from fedtune.algorithms.client.feddyn import STATE_KEY as DYN_KEY, DynamicRegulariser
from fedtune.algorithms.server.feddyn import feddyn_correct, feddyn_h_update
from fedtune.algorithms.client.scaffold import STATE_KEY as CV_KEY
from fedtune.algorithms.server.scaffold import SCAFFOLD_C, SCAFFOLD_DELTA_C, scaffold_control_update
from fedtune.algorithms.server.rule import AggregateResult, RoundInfo
from fedtune.config import FederatedRunConfig
from fedtune.errors import ConfigError
from fedtune.layout import FlatLayout
from fedtune.runtime.driver import FederatedRun, run
from fedtune.runtime.examples import TensorExamples

D, C = 3, 2  # the tiny linear model: 3 inputs, 2 classes (8 parameters: W [2, 3], b [2])


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _cfg(**values) -> FederatedRunConfig:
    return FederatedRunConfig.from_dict({"backend": "local", "dataset": "rotated-digits", **values})


def _data(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, D, generator=g), torch.randint(0, C, (n,), generator=g)


def _linear(flat=None, seed=0):
    torch.manual_seed(seed)
    model = nn.Linear(D, C)
    if flat is not None:
        _load(model, flat)
    return model


def _load(model, flat):
    with torch.no_grad():
        model.weight.copy_(torch.tensor(np.asarray(flat[:C * D]).reshape(C, D), dtype=torch.float32))
        model.bias.copy_(torch.tensor(np.asarray(flat[C * D:]), dtype=torch.float32))


def _flat(model):
    return np.concatenate([p.detach().numpy().ravel() for p in model.parameters()]).astype(np.float32)


def _ctx(model, x, y, cfg, *, payload=None, state=None, round=1, cid=0, record=None):
    ctx = ClientContext(model=model, data=TensorExamples(x, y), cfg=cfg, round=round, client_id=cid, role="source",
                        generator=torch.Generator().manual_seed(cid * 100 + round), device=torch.device("cpu"),
                        payload={} if payload is None else payload, state={} if state is None else state)
    if record is not None:
        ctx.record_step = record
    return ctx


# --------------------------------------------------------------- independent float64 references
def ce_grad(theta, x, y):
    """Float64 gradient of the mean cross-entropy of the linear model ``theta = [W.ravel(), b]``."""
    W, b = theta[:C * D].reshape(C, D), theta[C * D:]
    logits = x @ W.T + b
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    G = (p - np.eye(C)[y]) / len(y)
    return np.concatenate([(G.T @ x).ravel(), G.sum(0)])


def scaffold_client_ref(x0, c, c_i, x, y, lr, K, wd=0.0):
    """Alg. 1 lines: y ← y − η_l (g_i(y) − c_i + c), K times; option II c_i⁺; (Δy, Δc)."""
    yv = x0.copy()
    for _ in range(K):
        yv = yv - lr * (ce_grad(yv, x, y) + wd * yv - c_i + c)
    c_new = c_i - c + (x0 - yv) / (K * lr)
    return yv, c_new


def feddyn_client_ref(theta_server, grad_prev, x, y, lr, K, alpha):
    """Plain SGD on L_k(θ) − ⟨∇L_k(θ_k^(t−1)), θ⟩ + α/2 ‖θ − θ^(t−1)‖², then the state line."""
    th = theta_server.copy()
    for _ in range(K):
        th = th - lr * (ce_grad(th, x, y) - grad_prev + alpha * (th - theta_server))
    return th, grad_prev - alpha * (th - theta_server)


def _np(x, y):
    return x.double().numpy(), y.numpy()


# ------------------------------------------------------------ an in-process federation (the harness)
def _federate(cfg, clients, schedule, *, num_clients, optimizer=None):
    """What the coordinator does, in process: each round's participants train the linear model
    from the global weights with the server side's payload; FedAvg (example weights), the server
    side's proposal (FedDyn's uniform mean), the server ``optimizer`` (None: sgd), then the server
    side's update. Returns the global weights, the side and the clients' states per round."""
    theta = _flat(_linear(seed=1))
    side = SERVER_SIDES[cfg.resolved.client_method_name](cfg, FlatLayout.of(_linear()), num_clients)
    method = CLIENT_METHODS[cfg.resolved.client_method_name](cfg)
    states = {cid: {} for cid in range(num_clients)}
    history = []
    for rnd, participants in enumerate(schedule, start=1):
        payload = side.payload(rnd)
        rows, extras, n = [], [], []
        for cid in participants:
            model = _linear(theta)
            x, y = clients[cid]
            out = method.train(_ctx(model, x, y, cfg, payload=payload, state=states[cid], round=rnd, cid=cid))
            rows.append(_flat(model) - theta)
            extras.append(out.extras)
            n.append(len(y))
        updates, p = np.stack(rows), fedavg_weights(np.array(n))
        rule = AggregateResult(fedavg_step(theta, updates, p, cfg.effective_global_lr), {}, weighted_sum(updates, p))
        info = RoundInfo(tuple(participants), ("source",) * len(n), (cfg.local_steps,) * len(n), tuple(n))
        step = side.proposal(theta, rule, updates, info=info)  # feddyn_mean uniform: the paper's mean
        new = step.params if optimizer is None else optimizer.step(theta, step.params, step.direction, rnd)
        theta, _ = side.update(theta, new, updates, p, extras=extras, round=rnd, info=info)
        history.append((theta.copy(), {c: {k: v.clone() for k, v in s.items()} for c, s in states.items()}))
    return history, side


CLIENTS = {0: _data(6, 10), 1: _data(9, 11), 2: _data(4, 12)}  # unequal sizes: weighted ≠ unweighted means
SCHEDULE = [(0, 2), (1,), (0, 1, 2)]  # partial participation: |S|/N matters


# ----------------------------------------------------------------------------------------- SCAFFOLD
def test_scaffold_first_round_is_bit_identical_to_sgd_and_a_nonzero_correction_is_not():
    x, y = _data(20, 0)
    common = dict(local_steps=4, batch_size=8, local_lr=0.1, local_momentum=0.9, weight_decay=1e-3)
    sgd_model, scaf_model, corr_model = _linear(), _linear(), _linear()
    sgd_out = CLIENT_METHODS["sgd"](_cfg(**common)).train(_ctx(sgd_model, x, y, _cfg(**common)))
    cfg = _cfg(algorithm="scaffold", **common)
    zero = {SCAFFOLD_C: np.zeros(C * D + C, np.float32)}
    out = CLIENT_METHODS["scaffold"](cfg).train(_ctx(scaf_model, x, y, cfg, payload=zero))
    assert all(torch.equal(a, b) for a, b in zip(sgd_model.parameters(), scaf_model.parameters()))
    assert out.loss == sgd_out.loss and out.steps == 4
    assert np.abs(out.extras[SCAFFOLD_DELTA_C]).max() > 0  # c_i⁺ = mean gradient ≠ 0
    shifted = {SCAFFOLD_C: np.full(C * D + C, 0.05, np.float32)}
    CLIENT_METHODS["scaffold"](cfg).train(_ctx(corr_model, x, y, cfg, payload=shifted))
    assert not torch.equal(corr_model.weight, sgd_model.weight)


@pytest.mark.parametrize("wd", [0.0, 0.01])
def test_scaffold_local_steps_and_option_ii_match_algorithm_1(wd):
    x, y = _data(10, 3)
    rng = np.random.default_rng(0)
    c, c_i = rng.normal(0, 0.3, C * D + C), rng.normal(0, 0.3, C * D + C)
    lr, K = 0.3, 3
    cfg = _cfg(algorithm="scaffold", local_steps=K, batch_size=64, local_lr=lr, local_momentum=0.0, weight_decay=wd)
    model = _linear(seed=2)
    x0 = _flat(model).astype(np.float64)
    state = {CV_KEY: torch.tensor(c_i, dtype=torch.float32)}
    out = CLIENT_METHODS["scaffold"](cfg).train(
        _ctx(model, x, y, cfg, payload={SCAFFOLD_C: c.astype(np.float32)}, state=state))
    want_y, want_c = scaffold_client_ref(x0, c.astype(np.float32).astype(np.float64),
                                         c_i.astype(np.float32).astype(np.float64), *_np(x, y), lr, K, wd)
    np.testing.assert_allclose(_flat(model), want_y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(state[CV_KEY].numpy(), want_c, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out.extras[SCAFFOLD_DELTA_C], want_c - c_i, rtol=1e-4, atol=1e-5)
    # the correction mattered: without it (c = c_i) the model lands elsewhere
    plain, _ = scaffold_client_ref(x0, c_i, c_i, *_np(x, y), lr, K, wd)
    assert np.abs(plain - want_y).max() > 1e-3


def test_scaffold_control_variate_under_momentum_is_the_mean_batch_gradient():
    """fedtune's option II under momentum: c_i⁺ = mean_k (g_k + λ y_k), not (x − y)/(K η_l)."""
    x, y = _data(24, 4)
    cfg = _cfg(algorithm="scaffold", local_steps=5, batch_size=8, local_lr=0.1, local_momentum=0.9, weight_decay=0.01)
    seen = []
    model = _linear()
    x0 = _flat(model)
    out = CLIENT_METHODS["scaffold"](cfg).train(_ctx(
        model, x, y, cfg, payload={SCAFFOLD_C: np.zeros(C * D + C, np.float32)},
        record=lambda ps, gs: seen.append(np.concatenate([(g + 0.01 * p.detach()).numpy().ravel()
                                                          for p, g in zip(ps, gs)]))))
    assert len(seen) == 5
    np.testing.assert_allclose(out.extras[SCAFFOLD_DELTA_C], np.mean(seen, 0), rtol=1e-5, atol=1e-7)
    literal = (x0 - _flat(model)) / (5 * 0.1)
    assert np.abs(literal - np.mean(seen, 0)).max() > 0.1 * np.abs(literal).max()  # momentum inflates it


def test_scaffold_server_update_hand_case():
    got = scaffold_control_update(np.array([1.0, -1.0]), np.array([[2.0, 0.0], [0.0, 4.0]]), 4)
    np.testing.assert_allclose(got, [1.0 + 2 / 4 * 1.0, -1.0 + 2 / 4 * 2.0])  # c + |S|/N · mean Δc
    with pytest.raises(ValueError, match="participants"):
        scaffold_control_update(np.zeros(2), np.ones((3, 2)), 2)


def test_scaffold_three_rounds_with_partial_participation_match_algorithm_1():
    lr, K = 0.2, 2
    cfg = _cfg(algorithm="scaffold", setting="fl", local_steps=K, batch_size=64, local_lr=lr, local_momentum=0.0,
               global_lr=0.8)
    history, side = _federate(cfg, CLIENTS, SCHEDULE, num_clients=3)
    x = _flat(_linear(seed=1)).astype(np.float64)
    c, cs = np.zeros_like(x), {cid: np.zeros_like(x) for cid in CLIENTS}
    for (theta, states), participants in zip(history, SCHEDULE):
        dys, dcs, n = [], [], []
        for cid in participants:
            yv, c_new = scaffold_client_ref(x, c.astype(np.float32), cs[cid], *_np(*CLIENTS[cid]), lr, K)
            dys.append(yv - x)
            dcs.append(c_new - cs[cid])
            n.append(len(CLIENTS[cid][1]))
            cs[cid] = c_new
        # model: the server rule's FedAvg (example weights, η_g); control variate: Alg. 1's unweighted line
        x = x + 0.8 * np.average(dys, axis=0, weights=n)
        c = c + len(participants) / 3 * np.mean(dcs, axis=0)
        np.testing.assert_allclose(theta, x, rtol=1e-5, atol=1e-6)
        for cid in CLIENTS:
            got = states[cid].get(CV_KEY, torch.zeros(len(x))).numpy()
            np.testing.assert_allclose(got, cs[cid], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(side.c, c, rtol=1e-4, atol=1e-6)
    assert np.abs(c).max() > 1e-2


def test_scaffold_without_its_payload_says_what_is_missing():
    x, y = _data(4, 0)
    cfg = _cfg(algorithm="scaffold", local_steps=1)
    with pytest.raises(KeyError, match="scaffold_c"):
        CLIENT_METHODS["scaffold"](cfg).train(_ctx(_linear(), x, y, cfg))


# ------------------------------------------------------------------------------------------- FedDyn
def test_feddyn_regulariser_gradient_on_a_quadratic_matches_the_float64_reference():
    rng = np.random.default_rng(1)
    A, b = rng.normal(size=(5, 4)), rng.normal(size=5)
    theta, anchor, lin = rng.normal(size=4), rng.normal(size=4), rng.normal(size=4)
    alpha = 0.3
    p = torch.tensor(theta[:3], dtype=torch.float32, requires_grad=True)
    q = torch.tensor(theta[3:], dtype=torch.float32, requires_grad=True)
    At, bt = torch.tensor(A, dtype=torch.float32), torch.tensor(b, dtype=torch.float32)
    (0.5 * (At @ torch.cat([p, q]) - bt).pow(2).sum()).backward()
    split = lambda v: [torch.tensor(v[:3], dtype=torch.float32), torch.tensor(v[3:], dtype=torch.float32)]  # noqa: E731
    DynamicRegulariser([p, q], split(anchor), split(lin), alpha)()
    # ∇[½‖Aθ − b‖² − ⟨lin, θ⟩ + α/2 ‖θ − anchor‖²] in float64
    want = A.T @ (A @ theta - b) - lin + alpha * (theta - anchor)
    np.testing.assert_allclose(torch.cat([p.grad, q.grad]).numpy(), want, rtol=1e-5, atol=1e-6)


def test_feddyn_client_steps_and_state_match_algorithm_1():
    x, y = _data(10, 5)
    rng = np.random.default_rng(2)
    lin = rng.normal(0, 0.2, C * D + C).astype(np.float32)
    lr, K, alpha = 0.3, 3, 0.5
    cfg = _cfg(algorithm="feddyn", feddyn_alpha=alpha, local_steps=K, batch_size=64, local_lr=lr, local_momentum=0.0)
    model = _linear(seed=3)
    theta0 = _flat(model).astype(np.float64)
    state = {DYN_KEY: torch.tensor(lin)}
    CLIENT_METHODS["feddyn"](cfg).train(_ctx(model, x, y, cfg, state=state))
    want_theta, want_grad = feddyn_client_ref(theta0, lin.astype(np.float64), *_np(x, y), lr, K, alpha)
    np.testing.assert_allclose(_flat(model), want_theta, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(state[DYN_KEY].numpy(), want_grad, rtol=1e-5, atol=1e-6)
    plain, _ = feddyn_client_ref(theta0, np.zeros_like(theta0), *_np(x, y), lr, K, 0.0)
    assert np.abs(plain - want_theta).max() > 1e-3


def test_feddyn_server_h_and_model_match_algorithm_1():
    rng = np.random.default_rng(3)
    m, alpha, M = 5, 0.1, 7
    h_ref, h = np.zeros(M), np.zeros(M)
    theta = rng.normal(size=M).astype(np.float32)
    for participants in ((0, 3), (1, 2, 4)):
        models = theta + rng.normal(0, 0.1, (len(participants), M)).astype(np.float32)
        # Alg. 1: h ← h − α (1/m) Σ_{k∈P} (θ_k − θ);  θ ← (1/|P|) Σ_{k∈P} θ_k − h/α
        for k in range(len(participants)):
            h_ref = h_ref - alpha / m * (models[k].astype(np.float64) - theta.astype(np.float64))
        want = models.astype(np.float64).sum(0) / len(participants) - h_ref / alpha
        h = feddyn_h_update(h, models - theta, alpha, m)
        np.testing.assert_allclose(h, h_ref, rtol=1e-12, atol=1e-15)
        theta = feddyn_correct(models.mean(0), h, alpha)
        np.testing.assert_allclose(theta, want, rtol=1e-6, atol=1e-6)
    assert np.abs(h).max() > 1e-3
    assert feddyn_correct(theta, h, 0.0) is theta  # α = 0: no correction


@pytest.mark.parametrize("mean", ["uniform", "rule"])
def test_feddyn_three_rounds_with_partial_participation_match_algorithm_1(mean):
    lr, K, alpha = 0.2, 2, 0.1
    cfg = _cfg(algorithm="feddyn", setting="fl", feddyn_alpha=alpha, feddyn_mean=mean, local_steps=K, batch_size=64,
               local_lr=lr, local_momentum=0.0)
    history, side = _federate(cfg, CLIENTS, SCHEDULE, num_clients=3)
    theta = _flat(_linear(seed=1)).astype(np.float64)
    h, grads = np.zeros_like(theta), {cid: np.zeros_like(theta) for cid in CLIENTS}
    for (got, states), participants in zip(history, SCHEDULE):
        models, n = [], []
        for cid in participants:
            th, grads[cid] = feddyn_client_ref(theta.astype(np.float32), grads[cid], *_np(*CLIENTS[cid]), lr, K, alpha)
            models.append(th)
            n.append(len(CLIENTS[cid][1]))
        h = h - alpha / 3 * np.sum([th - theta for th in models], axis=0)
        # uniform: the paper's (1/|P|) Σ θ_k; rule: FedAvg's example-weighted mean
        theta = np.average(models, axis=0, weights=None if mean == "uniform" else n) - h / alpha
        np.testing.assert_allclose(got, theta, rtol=1e-5, atol=1e-5)
        for cid in CLIENTS:
            np.testing.assert_allclose(states[cid].get(DYN_KEY, torch.zeros(len(theta))).numpy(), grads[cid],
                                       rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(side.h, h, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("mean", ["uniform", "rule"])
def test_feddyns_mean_is_the_step_the_server_optimizer_takes_as_in_algorithm_2(mean):
    # FedAdam (Reddi et al., Algorithm 2) on FedDyn's mean, then θ = result − h/α: the uniform mean
    # used to replace the optimiser's result (adam, avgm and sgd gave the same weights)
    lr, K, alpha, eta, tau, b1, b2 = 0.2, 2, 0.1, 0.1, 1e-3, 0.9, 0.99
    cfg = _cfg(algorithm="feddyn", setting="fl", feddyn_alpha=alpha, feddyn_mean=mean, local_steps=K, batch_size=64,
               local_lr=lr, local_momentum=0.0, server_optimizer="adam", server_tau=tau, global_lr=eta)
    history, _ = _federate(cfg, CLIENTS, SCHEDULE, num_clients=3, optimizer=SERVER_OPTIMIZERS["adam"](cfg, eta))
    theta = _flat(_linear(seed=1)).astype(np.float64)
    h, grads = np.zeros_like(theta), {cid: np.zeros_like(theta) for cid in CLIENTS}
    m, v = np.zeros_like(theta), np.full_like(theta, tau ** 2)
    for (got, _), participants in zip(history, SCHEDULE):
        models, n = [], []
        for cid in participants:
            th, grads[cid] = feddyn_client_ref(theta.astype(np.float32), grads[cid], *_np(*CLIENTS[cid]), lr, K, alpha)
            models.append(th)
            n.append(len(CLIENTS[cid][1]))
        h = h - alpha / 3 * np.sum([th - theta for th in models], axis=0)
        delta = np.average([th - theta for th in models], axis=0, weights=None if mean == "uniform" else n)
        m, v = b1 * m + (1 - b1) * delta, b2 * v + (1 - b2) * delta ** 2
        theta = theta + eta * m / (np.sqrt(v) + tau) - h / alpha
        np.testing.assert_allclose(got, theta, rtol=1e-5, atol=1e-5)


def test_feddyn_uniform_mean_applies_the_server_optimizer_end_to_end(tmp_path):
    base = {"dataset": "rect4", "model": "mlp", "setting": "fl", "num_clients": 4, "participation": 0.5,
            "local_steps": 2, "rounds": 3, "backend": "local", "eval_every": 3, "algorithm": "feddyn",
            "feddyn_alpha": 0.1, "feddyn_mean": "uniform", "global_lr": 0.05}
    weights = {}
    for name in SERVER_OPTIMIZERS:
        with FederatedRun(FederatedRunConfig.from_dict({**base, "server_optimizer": name,
                                                        "output": str(tmp_path / name)})) as fr:
            rows = [fr.step() for _ in range(3)]
            assert all(r.status == "ok" for r in rows)
            weights[name] = fr.coordinator.weights.copy()
    names = list(weights)  # every optimiser moves the weights its own way
    assert all(not np.array_equal(weights[a], weights[b]) for i, a in enumerate(names) for b in names[i + 1:])


def test_feddyn_alpha_zero_is_bit_identical_to_fedavg_over_three_rounds(tmp_path):
    base = {"dataset": "rect4", "model": "mlp", "setting": "fl", "num_clients": 4, "participation": 0.5,
            "local_steps": 2, "rounds": 3, "backend": "local", "eval_every": 3}
    weights = {}
    for name, extra in (("fedavg", {"algorithm": "fedavg"}), ("dyn0", {"algorithm": "feddyn", "feddyn_alpha": 0.0}),
                        ("dyn", {"algorithm": "feddyn", "feddyn_alpha": 0.1})):
        fr = FederatedRun(FederatedRunConfig.from_dict({**base, **extra, "output": str(tmp_path / name)}))
        fr.start()
        losses = [fr.step().metrics["train_loss"] for _ in range(3)]
        weights[name] = (fr.coordinator.weights.copy(), losses)
        fr.close()
    assert np.array_equal(weights["fedavg"][0], weights["dyn0"][0]) and weights["fedavg"][1] == weights["dyn0"][1]
    assert not np.allclose(weights["fedavg"][0], weights["dyn"][0])


# --------------------------------------------------------------------- configuration and state
def test_feddyn_hyperparameters_are_checked():
    with pytest.raises(ConfigError, match="feddyn_alpha"):
        _cfg(algorithm="feddyn", feddyn_alpha=-0.1)
    with pytest.raises(ConfigError, match="feddyn_mean.*fedavg"):
        _cfg(algorithm="feddyn", feddyn_mean="uniform", server_rule="fedomg")
    with pytest.raises(ConfigError, match="feddyn_mean"):
        _cfg(algorithm="feddyn", feddyn_mean="weighted")
    assert _cfg(algorithm="feddyn", server_rule="fedomg").resolved.server_rule_name == "fedomg"
    assert (PRESETS["scaffold"].client_method, PRESETS["feddyn"].client_method) == ("scaffold", "feddyn")


@pytest.mark.parametrize("algorithm", ["scaffold", "feddyn"])
def test_server_side_state_dict_round_trips(algorithm):
    cfg = _cfg(algorithm=algorithm, feddyn_alpha=0.1) if algorithm == "feddyn" else _cfg(algorithm=algorithm)
    layout = FlatLayout.of(_linear())
    P = layout.num_params

    def one_round(side, seed):
        rng = np.random.default_rng(seed)
        updates = rng.normal(size=(2, P)).astype(np.float32)
        extras = [{SCAFFOLD_DELTA_C: rng.normal(size=P).astype(np.float32)} for _ in range(2)]
        return side.update(np.zeros(P, np.float32), updates.mean(0), updates, np.full(2, 0.5), extras=extras,
                           round=seed, info=RoundInfo.sources(2))[0]

    side = SERVER_SIDES[algorithm](cfg, layout, 3)
    one_round(side, 1)
    saved = side.state_dict()
    back = SERVER_SIDES[algorithm](cfg, layout, 3)
    back.load_state_dict(saved)
    assert saved.keys() == back.state_dict().keys() and all(np.abs(v).max() > 0 for v in saved.values())
    assert all(np.array_equal(saved[k], back.state_dict()[k]) for k in saved)
    assert all(np.array_equal(a, b) for a, b in zip(side.payload(2).values(), back.payload(2).values()))
    # the same next round from the original and the restored side: the same bits
    assert np.array_equal(one_round(side, 2), one_round(back, 2))
    assert all(np.array_equal(side.state_dict()[k], back.state_dict()[k]) for k in saved)
    assert not all(np.array_equal(saved[k], side.state_dict()[k]) for k in saved)  # saved was a copy
    with pytest.raises(ValueError, match="shape"):
        back.load_state_dict({k: np.zeros(P + 1) for k in saved})


# ---------------------------------------------------------------------------------- end to end
@pytest.mark.parametrize("algorithm,extra,diag", [("scaffold", {}, "diag.scaffold_c_norm"),
                                                  ("feddyn", {"feddyn_alpha": 0.1}, "diag.feddyn_h_norm")])
def test_a_three_round_local_run_has_finite_rows_and_differs_from_fedavg(tmp_path, algorithm, extra, diag):
    base = {"dataset": "rect4", "model": "mlp", "setting": "fl", "num_clients": 4, "participation": 0.5,
            "local_steps": 2, "rounds": 3, "backend": "local"}
    rows = run(FederatedRunConfig.from_dict({**base, "algorithm": algorithm, **extra, "output": str(tmp_path / "m")}),
               progress=False).rows
    avg = run(FederatedRunConfig.from_dict({**base, "algorithm": "fedavg", "output": str(tmp_path / "a")}),
              progress=False).rows
    assert len(rows) == 3 and all(r["status"] == "ok" for r in rows)
    for r in rows:
        assert all(np.isfinite(v) for k, v in r.items() if isinstance(v, float)), r
    assert all(r[diag] > 0 for r in rows)
    if algorithm == "scaffold":  # round 1: c = c_i = 0, FedAvg exactly
        assert rows[0]["train_loss"] == avg[0]["train_loss"] and rows[0]["val_acc"] == avg[0]["val_acc"]
    assert [r["train_loss"] for r in rows[1:]] != [r["train_loss"] for r in avg[1:]]
