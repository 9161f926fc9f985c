"""The two plugin examples (examples/plugins/): FedDecorr, a client method (Shi et al., ICLR 2023,
github.com/bytedance/FedDecorr ``loss.py``), and FedNova, a server rule (Wang et al., NeurIPS 2020,
github.com/JYWa/FedNova ``distoptim/FedNova.py``), each one file outside the package that uses
fedtune's public face only. Their math against float64 references written from the authors' code
and the papers (not calling the plugins), their invariants, their refusals, their composition with
built-in components, and (Ray, slow) the same rows on both backends and a two-trial sweep through
``fedtune sweep --plugin``."""

from __future__ import annotations

import contextlib
import copy
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import fedtune
from fedtune.config import FederatedRunConfig
from fedtune.runtime.examples import TensorExamples

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = ROOT / "examples" / "plugins"
TINY = {"backend": "local", "dataset": "rect4", "model": "mlp", "mlp_hidden": [16], "rounds": 2, "local_steps": 2,
        "batch_size": 16}


@contextlib.contextmanager
def plugin(name: str):
    """``examples/plugins/<name>.py`` loaded as ``fedtune run --plugin`` loads it, and every registry
    as it was afterwards (:func:`fedtune.plugins.isolated`: no other test of this process sees the
    plugin's components)."""
    from fedtune import plugins

    with plugins.isolated():
        plugins.load_plugins([str(PLUGINS / f"{name}.py")])
        yield sys.modules[name]


@pytest.fixture(scope="module")
def feddecorr():
    with plugin("feddecorr") as module:
        yield module


@pytest.fixture(scope="module")
def fednova():
    with plugin("fednova") as module:
        yield module


def cfg_of(tmp_path=None, **values) -> FederatedRunConfig:
    return FederatedRunConfig.from_dict({**TINY, **({"output": str(tmp_path)} if tmp_path else {}), **values})


def test_the_examples_doctests_hold_and_they_use_only_the_public_face(feddecorr, fednova):
    import ast
    import doctest

    for module in (feddecorr, fednova):
        result = doctest.testmod(module, verbose=False)
        assert result.attempted > 0 and result.failed == 0, module.__name__
        tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | \
            {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert imported <= {"__future__", "math", "fedtune", "fedtune.models", "numpy", "torch", "torch.nn"}, imported


# ============================================================================ FedDecorr: the loss
def reference_decorr(z: np.ndarray, form: str) -> float:
    """The authors' ``FedDecorrLoss.forward`` (loss.py) in float64 NumPy: each dimension centred and
    divided by sqrt(1e-8 + its unbiased batch variance), C = zᵀz, the mean of the squared
    off-diagonal entries of C over N; the paper's form ‖C/N‖²_F / d²."""
    z = np.asarray(z, dtype=np.float64)
    n, d = z.shape
    if n == 1:
        return 0.0
    z = z - z.mean(axis=0)
    z = z / np.sqrt(1e-8 + z.var(axis=0, ddof=1))
    c = z.T @ z
    if form == "paper":
        return float(np.sum((c / n) ** 2) / d ** 2)
    return float(sum(c[i, j] ** 2 for i in range(d) for j in range(d) if i != j) / (d * (d - 1)) / n)


@pytest.mark.parametrize("form", ["code", "paper"])
@pytest.mark.parametrize("n,d", [(2, 2), (5, 3), (8, 20), (64, 7)])
def test_feddecorr_loss_is_the_authors_loss_in_float64(feddecorr, form, n, d):
    rng = np.random.default_rng(n * 100 + d)
    z = rng.normal(size=(n, d)) @ rng.normal(size=(d, d))  # correlated dimensions
    got = float(feddecorr.feddecorr_loss(torch.from_numpy(z), form))
    assert got == pytest.approx(reference_decorr(z, form), rel=1e-10, abs=1e-14)


def test_feddecorr_loss_edge_cases(feddecorr):
    assert float(feddecorr.feddecorr_loss(torch.ones(1, 5, dtype=torch.float64))) == 0.0  # one example: 0
    z = torch.arange(12.0, dtype=torch.float64).reshape(3, 2, 2)  # [N, ...] is flattened to [N, 4]
    assert float(feddecorr.feddecorr_loss(z)) == pytest.approx(reference_decorr(z.reshape(3, 4).numpy(), "code"))
    with pytest.raises(RuntimeError, match="at least 2 dimensions"):
        feddecorr.feddecorr_loss(torch.randn(4, 1))
    # the two forms: the code's off-diagonal mean is the paper's off-diagonal sum times d² / (d(d-1)) · N
    z = torch.randn(16, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    assert reference_decorr(z.numpy(), "code") != pytest.approx(reference_decorr(z.numpy(), "paper"), rel=0.5)


# ============================================================================ FedDecorr: the step
def mlp(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 6), nn.Tanh(), nn.Linear(6, 4), nn.Tanh(), nn.Linear(4, 3)).double()


def ctx_of(model, x, y, cfg):
    return fedtune.ClientContext(model=model, data=TensorExamples(x, y), cfg=cfg, round=1, client_id=0, role="source",
                                 generator=torch.Generator().manual_seed(0), device=torch.device("cpu"))


def reference_step(model, x, y, beta, lr, form):
    """One plain SGD step on CE + β·L of the input of the last Linear, by autograd over a float64
    copy, with L written from the authors' loss (a mask for the off-diagonal, not their flatten)."""
    model = copy.deepcopy(model)
    z = model[:-1](x)
    zs = (z - z.mean(0)) / torch.sqrt(1e-8 + ((z - z.mean(0)) ** 2).sum(0) / (len(z) - 1))
    c = zs.T @ zs
    d, n = c.shape[0], len(z)
    off = ~torch.eye(d, dtype=torch.bool)
    decorr = (c[off] ** 2).sum() / (d * (d - 1)) / n if form == "code" else ((c / n) ** 2).sum() / d ** 2
    loss = nn.functional.cross_entropy(model[-1](z), y) + beta * decorr
    grads = torch.autograd.grad(loss, list(model.parameters()))
    with torch.no_grad():
        for p, g in zip(model.parameters(), grads):
            p -= lr * g
    return model.state_dict(), float(decorr.detach())


@pytest.mark.parametrize("form", ["code", "paper"])
def test_one_feddecorr_step_is_sgd_on_ce_plus_beta_decorr_of_the_classifier_input(feddecorr, form):
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(12, 5, generator=g, dtype=torch.float64), torch.randint(0, 3, (12,), generator=g)
    cfg = cfg_of(algorithm="feddecorr", feddecorr_beta=0.7, feddecorr_form=form, local_steps=1, batch_size=12,
                 local_momentum=0.0, local_lr=0.3)
    model = mlp(0)
    want, decorr = reference_step(model, x, y, 0.7, 0.3, form)
    out = fedtune.CLIENT_METHODS["feddecorr"](cfg).train(ctx_of(model, x, y, cfg))
    assert out.steps == 1 and out.metrics["feddecorr"] == pytest.approx(decorr, rel=1e-12)
    # the reported loss is the cross-entropy alone
    assert out.loss == pytest.approx(float(nn.functional.cross_entropy(mlp(0)(x), y).detach()), rel=1e-12)
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, want[key], rtol=1e-10, atol=1e-12)


def test_feddecorr_at_beta_zero_is_sgd_bit_for_bit_and_not_otherwise(feddecorr):
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(20, 5, generator=g), torch.randint(0, 3, (20,), generator=g)
    trained = {}
    for name, beta in (("sgd", None), ("feddecorr", 0.0), ("feddecorr", 0.1)):
        cfg = cfg_of(algorithm="fedavg" if name == "sgd" else "feddecorr", local_steps=4, batch_size=8,
                     **({} if beta is None else {"feddecorr_beta": beta}))
        model = mlp(3).float()
        fedtune.CLIENT_METHODS[name](cfg).train(ctx_of(model, x, y, cfg))
        trained[(name, beta)] = model.state_dict()
    sgd, zero, some = trained[("sgd", None)], trained[("feddecorr", 0.0)], trained[("feddecorr", 0.1)]
    assert all(torch.equal(sgd[k], zero[k]) for k in sgd)
    assert not all(torch.equal(sgd[k], some[k]) for k in sgd)


def test_feddecorr_hyperparameters_are_checked_in_one_line(feddecorr):
    with pytest.raises(fedtune.ConfigError, match="feddecorr_beta.*out of range"):
        cfg_of(algorithm="feddecorr", feddecorr_beta=-0.1)
    with pytest.raises(fedtune.ConfigError, match="feddecorr_form.*allowed: code, paper"):
        cfg_of(algorithm="feddecorr", feddecorr_form="both")
    assert fedtune.PRESETS["feddecorr"].client_method == "feddecorr"
    assert fedtune.PRESETS["feddecorr"].server_rule == "fedavg"


# ============================================================================ FedNova: a_i and the aggregate
def closed_form_a(tau: int, rho: float, eta_mu: float) -> float:
    """a_i in closed form (the paper's for momentum SGD and proximal SGD; ρ = 1 is the limit
    τ(τ+1)/2; both at once: the authors' recurrence a_k = q(a_{k-1} + c_k) + 1, c_k = (1 − ρ^k)/(1 − ρ),
    q = 1 − ημ, summed: Σ_k q^{τ−k}(q c_k + 1))."""
    if rho == 0 and eta_mu == 0:
        return float(tau)
    if eta_mu == 0:
        return tau * (tau + 1) / 2 if rho == 1 else (tau - rho * (1 - rho ** tau) / (1 - rho)) / (1 - rho)
    q = 1 - eta_mu
    if rho == 0:
        return (1 - q ** tau) / eta_mu
    return float(sum(q ** (tau - k) * (q * (1 - rho ** k) / (1 - rho) + 1) for k in range(1, tau + 1)))


@pytest.mark.parametrize("tau", [0, 1, 2, 7, 40])
@pytest.mark.parametrize("rho,eta_mu", [(0.0, 0.0), (0.9, 0.0), (0.5, 0.0), (1.0, 0.0), (0.0, 0.01), (0.0, 0.3),
                                        (0.9, 0.05)])
def test_normalizing_factor_is_the_closed_form(fednova, tau, rho, eta_mu):
    assert fednova.normalizing_factor(tau, rho, eta_mu) == pytest.approx(closed_form_a(tau, rho, eta_mu), rel=1e-12)


def reference_direction(updates, p, steps, a, proximal):
    """The authors' ``FedNova.average`` in float64: Σ_i p_i (τ_eff / a_i) Δ_i, τ_eff = Σ p_i a_i (or
    Σ p_i τ_i under a proximal solver)."""
    u = np.asarray(updates, dtype=np.float64)
    tau_eff = float(np.sum(p * (steps if proximal else a)))
    return sum(p[i] * tau_eff / a[i] * u[i] for i in range(len(p)) if a[i] > 0), tau_eff


CASES = [  # (algorithm, run values, roles)
    ("fednova", {"local_momentum": 0.0}, None),
    ("fednova", {"local_momentum": 0.9}, None),
    ("fednova", {"local_momentum": 0.9, "fednova_normalizer": "steps"}, None),
    ("fedprox", {"server_rule": "fednova", "local_momentum": 0.0, "prox_mu": 0.5, "local_lr": 0.1}, None),
    ("fedprox", {"server_rule": "fednova", "local_momentum": 0.5, "prox_mu": 0.2, "local_lr": 0.05,
                 "setting": "fda", "target_lr_scale": 0.2}, ("source", "source", "target")),
]


@pytest.mark.parametrize("algorithm,values,roles", CASES)
def test_fednova_aggregate_is_the_authors_average_in_float64(fednova, algorithm, values, roles):
    cfg = cfg_of(algorithm=algorithm, global_lr=0.7, **values)
    rng = np.random.default_rng(7)
    params, updates = rng.normal(size=9).astype(np.float32), rng.normal(size=(3, 9)).astype(np.float32)
    n, steps = np.array([30, 10, 60]), np.array([5, 17, 2])
    p = n / n.sum()
    roles = roles or ("source",) * 3
    info = fedtune.RoundInfo((0, 1, 2), roles, tuple(int(s) for s in steps), tuple(int(x) for x in n))
    rho, mu = cfg.local_momentum, cfg.params.get("prox_mu", 0.0) if algorithm == "fedprox" else 0.0
    lrs = [cfg.local_lr * (cfg.target_lr_scale if r == "target" else 1.0) for r in roles]
    if cfg.params.get("fednova_normalizer") == "steps":
        a = steps.astype(float)
    else:
        a = np.array([closed_form_a(int(t), rho, lr * mu) for t, lr in zip(steps, lrs)])
    want, tau_eff = reference_direction(updates, p, steps, a, mu != 0)
    rule = fedtune.SERVER_RULES["fednova"](cfg, None)
    out = rule.aggregate(params, updates, p, extras=[{}] * 3, round=1, info=info)
    np.testing.assert_allclose(out.direction, want, rtol=1e-10, atol=1e-12)
    assert out.diagnostics["fednova_tau_eff"] == pytest.approx(tau_eff, rel=1e-12)
    expected = (params.astype(np.float64) + 0.7 * want).astype(np.float32)
    np.testing.assert_array_max_ulp(out.params, expected, maxulp=1)
    assert out.params.dtype == np.float32 and out.direction.dtype == np.float64


def test_fednova_with_equal_steps_and_plain_sgd_is_fedavg_and_not_otherwise(fednova):
    cfg = cfg_of(algorithm="fednova", local_momentum=0.0)
    rng = np.random.default_rng(3)
    params, updates = rng.normal(size=50).astype(np.float32), rng.normal(size=(4, 50)).astype(np.float32)
    p = np.array([0.1, 0.2, 0.3, 0.4])
    fedavg = fedtune.SERVER_RULES["fedavg"](cfg, None)
    nova = fedtune.SERVER_RULES["fednova"](cfg, None)
    same = fedtune.RoundInfo((0, 1, 2, 3), ("source",) * 4, (6, 6, 6, 6), (1, 2, 3, 4))
    mixed = fedtune.RoundInfo((0, 1, 2, 3), ("source",) * 4, (6, 2, 6, 9), (1, 2, 3, 4))
    want = fedavg.aggregate(params, updates, p, extras=[{}] * 4, round=1, info=same)
    got = nova.aggregate(params, updates, p, extras=[{}] * 4, round=1, info=same)
    np.testing.assert_allclose(got.direction, want.direction, rtol=1e-13, atol=1e-15)
    np.testing.assert_array_max_ulp(got.params, want.params, maxulp=1)
    other = nova.aggregate(params, updates, p, extras=[{}] * 4, round=1, info=mixed)
    assert np.abs(other.direction - want.direction).max() > 1e-3
    # a participant that took no step adds nothing (never 0/0)
    idle = fedtune.RoundInfo((0, 1, 2, 3), ("source",) * 4, (6, 0, 6, 6), (1, 2, 3, 4))
    upd = updates.copy()
    upd[1] = 0.0
    out = nova.aggregate(params, upd, p, extras=[{}] * 4, round=1, info=idle)
    assert np.isfinite(out.direction).all()
    np.testing.assert_allclose(out.direction, reference_direction(upd, p, np.array([6, 0, 6, 6]),
                                                                  np.array([6.0, 0.0, 6.0, 6.0]), False)[0], rtol=1e-12)


def test_fednova_refuses_what_has_no_normalising_factor_in_one_line(fednova):
    with pytest.raises(fedtune.ConfigError, match="local_optimizer.*adam has no FedNova normalising.*allowed: sgd"):
        cfg_of(algorithm="fednova", local_optimizer="adam")
    with pytest.raises(fedtune.ConfigError, match="fedex_knobs.*local_momentum"):
        cfg_of(algorithm="fednova", fedex_configs=2, fedex_knobs=["local_momentum"])
    with pytest.raises(fedtune.ConfigError, match="fednova_normalizer.*allowed: solver, steps"):
        cfg_of(algorithm="fednova", fednova_normalizer="tau")
    cfg_of(algorithm="fednova", fedex_configs=2, fedex_knobs=["local_momentum"], fednova_normalizer="steps")  # fine
    assert (fedtune.PRESETS["fednova"].client_method, fedtune.PRESETS["fednova"].server_rule) == ("sgd", "fednova")


# ============================================================================ composition (local runs)
def rows_of(result) -> list[dict]:
    return [dict(r) for r in result.rows]


@pytest.mark.parametrize("values", [{}, {"server_rule": "fedomg"}, {"server_optimizer": "adam"}])
def test_feddecorr_composes_with_server_rules_and_server_optimizers(feddecorr, tmp_path, values):
    res = fedtune.run(cfg_of(tmp_path, algorithm="feddecorr", **values), progress=False)
    rows = rows_of(res)
    assert res.status == "completed" and [r["round"] for r in rows] == [1, 2]
    assert rows[0]["server_rule"] == values.get("server_rule", "fedavg") and rows[0]["client_method"] == "feddecorr"
    assert all(math.isfinite(r["train_loss"]) and r["diag.feddecorr"] > 0 for r in rows)
    assert rows[0]["hp.server_optimizer"] == values.get("server_optimizer", "sgd")


@pytest.mark.parametrize("algorithm,values,tau_eff", [
    ("fednova", {"local_momentum": 0.9}, 1 + 1.9),  # τ = 2 steps of momentum 0.9: a = 1 + (0.9 + 1)
    ("fednova", {"local_momentum": 0.0, "server_optimizer": "avgm"}, 2.0),  # the authors' gmf
    ("fedprox", {"server_rule": "fednova", "prox_mu": 0.1}, 2.0),  # proximal: τ_eff = Σ p_i τ_i
])
def test_fednova_composes_with_client_methods_and_server_optimizers(fednova, tmp_path, algorithm, values, tau_eff):
    res = fedtune.run(cfg_of(tmp_path, algorithm=algorithm, **values), progress=False)
    rows = rows_of(res)
    assert res.status == "completed" and rows[0]["server_rule"] == "fednova"
    assert rows[0]["client_method"] == ("prox" if algorithm == "fedprox" else "sgd")
    assert [r["diag.fednova_tau_eff"] for r in rows] == pytest.approx([tau_eff, tau_eff], rel=1e-12)


# ============================================================================ both backends, a sweep (Ray)
SMALL = ["--dataset", "rect4", "--set", "model=mlp", "--set", "mlp_hidden=[16]", "--set", "local_steps=2",
         "--set", "batch_size=16", "--set", "client_cpus=0.5"]
TIMING = ("bytes_moved", "attempt", "actor_restarts", "study")
