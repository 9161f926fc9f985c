"""FedProx, SAM (FedSAM), GFM and GCA client methods (docs/methods-seeds.md §4, seed 004 Alg. 1)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from fedtune.algorithms.declarations import GFM_INTERVAL, SAM_RHO
from fedtune.algorithms.presets import PRESETS
from fedtune.runtime.examples import TensorExamples
from fedtune.algorithms import CLIENT_METHODS, all_hparams
from fedtune.algorithms.client.method import ClientContext
from fedtune.algorithms.client.optim import LocalSGD
from fedtune.algorithms.client.gfm import (
    STATE_KEY,
    AugmenterAdam,
    augmenter_objective,
    augmenter_update,
    new_augmenter,
    triangle_wave,
)
from fedtune.algorithms.client.prox import add_prox_gradient
from fedtune.algorithms.client.sam import sam_perturbation, sam_step
from fedtune.errors import ConfigError
from fedtune.config import FederatedRunConfig


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _cfg(**values) -> FederatedRunConfig:
    return FederatedRunConfig.from_dict({"backend": "local", "dataset": "rotated-digits", **values})


# Every preset whose client method takes SAM steps (it declares sam_rho), and every one whose
# client method trains on an augmenter's images (it declares the augmenter's update interval).
SAM_PRESETS = [n for n, p in PRESETS.items() if SAM_RHO in CLIENT_METHODS.spec(p.client_method).hparams]
AUGMENTER_PRESETS = [n for n, p in PRESETS.items() if GFM_INTERVAL in CLIENT_METHODS.spec(p.client_method).hparams]
# Every client method this file's harness builds: the plain classifier (no model head of its own)
# and no server side whose payload it would need.
PLAIN_CLIENT_METHODS = [s.name for s in CLIENT_METHODS.specs()
                        if s.supervised and s.model_head is None and s.server_side is None]


def _ctx(model, x, y, cfg, *, state=None, round=1, seed=0) -> ClientContext:
    return ClientContext(model=model, data=TensorExamples(x, y), cfg=cfg, round=round, client_id=3, role="source",
                         generator=torch.Generator().manual_seed(seed), device=torch.device("cpu"),
                         state={} if state is None else state)


def _images(n=8, c=1, side=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.rand(n, c, side, side, generator=g) - 0.2) / 0.3  # "normalised" images: range [-2/3, 8/3]
    y = torch.randint(0, 3, (n,), generator=g)
    return x, y


def _small_cnn(c=1, side=8, classes=3, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(c, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * side * side, classes))


def _assert_close(a, b, rtol=1e-5, atol=1e-8):
    """``torch.allclose`` with a message (``torch.testing`` would import sympy: seconds per process)."""
    assert a.shape == b.shape and torch.allclose(a, b, rtol=rtol, atol=atol), \
        f"max |a - b| = {float((a - b).abs().max()):.3g}"


def _params(model):
    return [p.detach().clone() for p in model.parameters()]


# ------------------------------------------------------------------------------------------------ prox
def test_prox_with_zero_mu_is_bit_identical_to_sgd_and_positive_mu_is_not():
    x, y = _images(n=20)
    results = {}
    for name, mu in (("sgd", None), ("prox0", 0.0), ("prox1", 0.5)):
        model = _small_cnn()
        extra = {} if mu is None else {"algorithm": "fedprox", "prox_mu": mu}
        cfg = _cfg(local_steps=4, batch_size=8, local_lr=0.1, local_momentum=0.9, weight_decay=1e-3, **extra)
        method = CLIENT_METHODS["sgd" if mu is None else "prox"](cfg)
        out = method.train(_ctx(model, x, y, cfg))
        results[name] = (_params(model), out)
    assert all(torch.equal(a, b) for a, b in zip(results["sgd"][0], results["prox0"][0]))
    assert results["sgd"][1].loss == results["prox0"][1].loss
    assert not all(torch.equal(a, b) for a, b in zip(results["sgd"][0], results["prox1"][0]))
    assert results["prox1"][1].metrics["prox_penalty"] > 0


def test_prox_gradient_hand_case():
    p = torch.tensor([1.0, -2.0], requires_grad=True)
    q = torch.tensor([3.0], requires_grad=True)
    p.grad, q.grad = torch.tensor([0.5, 0.5]), torch.tensor([0.0])
    penalty = add_prox_gradient([p, q], [torch.tensor([0.0, 0.0]), torch.tensor([1.0])], mu=0.1)
    # mu (theta - anchor) added: p: 0.5 + 0.1*[1, -2]; q: 0.1*2; penalty mu/2 (1 + 4 + 4)
    assert p.grad.tolist() == pytest.approx([0.6, 0.3])
    assert q.grad.tolist() == pytest.approx([0.2])
    assert penalty == pytest.approx(0.05 * 9)


def test_prox_two_steps_match_the_hand_computed_updates():
    # n == batch_size: every batch is the whole set (mean loss: order-free up to float rounding).
    x, y = _images(n=8)
    model = _small_cnn()
    ref = _small_cnn()
    lr, mu = 0.2, 0.7
    cfg = _cfg(algorithm="fedprox", prox_mu=mu, local_steps=2, batch_size=8, local_lr=lr, local_momentum=0.0)
    CLIENT_METHODS["prox"](cfg).train(_ctx(model, x, y, cfg))
    theta0 = _params(ref)

    def grads():
        ref.zero_grad()
        nn.functional.cross_entropy(ref(x), y).backward()
        return [p.grad.clone() for p in ref.parameters()]

    grads_at_start = grads()
    with torch.no_grad():  # step 1: theta == anchor, no prox pull
        for p, g in zip(ref.parameters(), grads_at_start):
            p -= lr * g
    g1 = grads()
    with torch.no_grad():  # step 2: g + mu (theta1 - theta0)
        for p, g, a in zip(ref.parameters(), g1, theta0):
            p -= lr * (g + mu * (p - a))
    for got, want in zip(model.parameters(), ref.parameters()):
        _assert_close(got, want, rtol=1e-5, atol=1e-6)
    # the pull mattered: it moved the weights by more than the tolerance above
    pull = [lr * lr * mu * g for g in grads_at_start]
    assert max(float(q.abs().max()) for q in pull) > 1e-4


# ------------------------------------------------------------------------------------------------ SAM
def test_sam_perturbation_uses_one_global_norm_over_all_tensors():
    eps = sam_perturbation([torch.tensor([3.0, 0.0]), None, torch.tensor([[4.0]])], rho=2.0)
    assert eps[1] is None
    assert eps[0].tolist() == pytest.approx([1.2, 0.0])  # 2 * 3 / 5, not 2 * 3 / 3
    assert eps[2].shape == (1, 1) and float(eps[2]) == pytest.approx(1.6)
    zero = sam_perturbation([torch.zeros(3)], rho=0.5)[0]
    assert torch.equal(zero, torch.zeros(3))


def test_sam_step_on_a_quadratic_matches_the_hand_computed_step():
    # L(θ) = ½ θᵀAθ with θ the weight of a linear "model" (1 x 3, no bias): ∇L = Aθ,
    # θ' = θ − lr·A(θ + ρ Aθ/‖Aθ‖).
    A = np.array([[3.0, 1.0, 0.0], [1.0, 2.0, 0.5], [0.0, 0.5, 1.0]])
    theta = np.array([0.4, -1.0, 2.0])
    lr, rho = 0.1, 0.3
    lin = nn.Linear(3, 1, bias=False).double()
    with torch.no_grad():
        lin.weight.copy_(torch.tensor(theta).reshape(1, 3))
    At = torch.tensor(A)
    opt = LocalSGD(lin.parameters(), lr=lr)
    step = sam_step(opt, lambda: 0.5 * (lin.weight @ At @ lin.weight.T).sum(), rho, model=lin)
    g = A @ theta
    expected = theta - lr * A @ (theta + rho * g / np.linalg.norm(g))
    np.testing.assert_allclose(lin.weight.detach().numpy().ravel(), expected, rtol=1e-12)
    assert step.loss == pytest.approx(0.5 * theta @ A @ theta)
    tp = theta + rho * g / np.linalg.norm(g)
    assert step.perturbed_loss == pytest.approx(0.5 * tp @ A @ tp)
    # plain gradient descent would land elsewhere
    assert not np.allclose(expected, theta - lr * g)


def test_sam_client_updates_batchnorm_stats_from_the_first_pass_only():
    x, y = _images(n=8)
    torch.manual_seed(1)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))
    ref = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))
    ref.load_state_dict(model.state_dict())
    cfg = _cfg(algorithm="fedsam", sam_rho=0.5, local_steps=1, batch_size=8, local_lr=0.1, local_momentum=0.0)
    out = CLIENT_METHODS["sam"](cfg).train(_ctx(model, x, y, cfg))
    ref.train()
    with torch.no_grad():
        ref(x)  # one forward at the unperturbed weights
    bn, bn_ref = model[2], ref[2]
    _assert_close(bn.running_mean, bn_ref.running_mean, rtol=1e-5, atol=1e-7)
    _assert_close(bn.running_var, bn_ref.running_var, rtol=1e-5, atol=1e-7)
    assert int(bn.num_batches_tracked) == 1
    assert out.steps == 1 and out.metrics["sam_sharpness"] > 0


def test_bad_sam_rho_is_a_config_error_naming_it():
    for bad in (0, 0.0, -0.1, "x"):
        for algorithm in SAM_PRESETS:
            with pytest.raises(ConfigError, match="sam_rho"):
                _cfg(algorithm=algorithm, sam_rho=bad)
    assert SAM_RHO.of(_cfg(algorithm="fedsam", sam_rho=0.05)) == 0.05
    assert SAM_RHO.of(_cfg(algorithm="gfm")) == 0.02
    owners, _ = all_hparams()["sam_rho"]
    assert "sam" in owners and "gfm" in owners  # one HParam object shared by both
    with pytest.raises(ConfigError, match="prox_mu"):
        _cfg(algorithm="fedprox", prox_mu=-1)
    with pytest.raises(ConfigError, match="gfm_interval"):
        _cfg(algorithm="gca", gfm_interval=0)


# ------------------------------------------------------------------------------------------------ augmenter
def test_triangle_wave_equals_the_acos_form_and_folds_into_unit_interval():
    v = torch.linspace(-3.0, 3.0, 1001, dtype=torch.float64)
    tri = triangle_wave(v)
    _assert_close(tri, torch.acos(torch.cos(math.pi * v)) / math.pi, rtol=0, atol=1e-6)
    u = torch.rand(1000)
    assert torch.equal(triangle_wave(u), u)  # exact on [0, 1]


def test_augmenter_is_the_identity_at_initialisation_and_not_after_a_change():
    x, _ = _images(n=6, c=3, side=12)
    aug = new_augmenter(3, noise_dim=16, hidden=8, generator=torch.Generator().manual_seed(0))
    aug.set_value_range(x.amin(dim=(0, 2, 3)), x.amax(dim=(0, 2, 3)))
    noise = torch.randn(6, 16)
    out = aug(x, noise)
    assert out.shape == x.shape
    _assert_close(out, x, rtol=0, atol=1e-5)  # extremes included: tri on the valid range
    alpha, beta, residual = aug.transforms(x, noise)
    assert torch.equal(alpha, torch.ones_like(alpha)) and torch.equal(beta, torch.zeros_like(beta))
    assert torch.equal(residual, torch.zeros_like(residual))
    with torch.no_grad():
        aug.geometry_out.weight.normal_()
        aug.color_out.weight.normal_()
    moved = aug(x, noise)
    assert (moved - x).abs().max() > 1e-2
    lo, hi = x.amin(dim=(0, 2, 3)).reshape(1, 3, 1, 1), x.amax(dim=(0, 2, 3)).reshape(1, 3, 1, 1)
    assert bool(((moved >= lo - 1e-5) & (moved <= hi + 1e-5)).all())  # tri keeps values in range


def test_one_augmenter_update_increases_local_minus_global_loss():
    x, y = _images(n=16, seed=2)
    glob = _small_cnn(seed=0)
    local = _small_cnn(seed=0)
    with torch.no_grad():  # local != global
        for p in local.parameters():
            p.add_(0.3 * torch.randn_like(p))
    aug = new_augmenter(1, noise_dim=16, hidden=8, generator=torch.Generator().manual_seed(0))
    aug.set_value_range(x.amin(dim=(0, 2, 3)), x.amax(dim=(0, 2, 3)))
    opt = AugmenterAdam(aug.parameters(), lr=1e-2)
    noise = torch.randn(16, 16, generator=torch.Generator().manual_seed(5))
    local_before, glob_before = _params(local), _params(glob)
    before = float(augmenter_objective(aug, x, y, local, glob, noise)[0].detach())
    loc, gl = augmenter_update(aug, opt, x, y, local, glob, noise)
    after = float(augmenter_objective(aug, x, y, local, glob, noise)[0].detach())
    assert loc - gl == pytest.approx(before, rel=1e-5)
    assert after > before + 1e-4
    assert opt.num_steps == 1
    # the models are untouched: no parameter change, no gradients left behind
    assert all(torch.equal(a, b) for a, b in zip(local_before, _params(local)))
    assert all(torch.equal(a, b) for a, b in zip(glob_before, _params(glob)))
    assert all(p.grad is None for p in (*local.parameters(), *glob.parameters()))


# ------------------------------------------------------------------------------------------------ gfm / gca
@pytest.mark.parametrize("interval,expected", [(1, 5), (2, 2), (10, 0)])
def test_gfm_interval_controls_the_number_of_augmenter_updates(interval, expected):
    x, y = _images(n=12)
    cfg = _cfg(algorithm="gfm", gfm_interval=interval, local_steps=5, batch_size=4, local_lr=0.05)
    method = CLIENT_METHODS["gfm"](cfg)
    state: dict = {}
    ctx = _ctx(_small_cnn(), x, y, cfg, state=state)
    calls = []
    ctx.record_step = lambda params, grads: calls.append(1)
    out = method.train(ctx)
    assert out.steps == 5 and math.isfinite(out.loss) and len(calls) == 5  # record_step at every model step
    assert out.metrics["gfm_aug_updates"] == expected
    assert list(state) == [STATE_KEY]
    assert state[STATE_KEY]["adam.step.geometry_out.weight"] == expected  # Adam steps taken
    assert ("gfm_aug_local_loss" in out.metrics) == (expected > 0)
    assert ("gfm_aug_global_loss" in out.metrics) == (expected > 0)
    # φ persists in ctx.state across rounds: the next round continues the same augmenter and Adam
    method.train(_ctx(_small_cnn(), x, y, cfg, state=state, round=2))
    assert state[STATE_KEY]["adam.step.geometry_out.weight"] == 2 * expected


def _plain_leaves(value, where="state"):
    """Every leaf of ``value`` (through dicts, lists, tuples) with its path."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _plain_leaves(v, f"{where}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _plain_leaves(v, f"{where}[{i}]")
    else:
        yield where, value


@pytest.mark.parametrize("algorithm", AUGMENTER_PRESETS)
def test_gfm_client_state_is_plain_numpy_and_numbers(algorithm):
    # Checkpoints store client state as NumPy arrays and JSON values only (no pickle).
    x, y = _images(n=8, c=3)
    cfg = _cfg(algorithm=algorithm, gfm_interval=1, local_steps=2, batch_size=4)
    state: dict = {}
    cfg.resolved.client_method(cfg).train(_ctx(_small_cnn(c=3), x, y, cfg, state=state))
    leaves = list(_plain_leaves(state))
    bad = [(w, type(v).__name__) for w, v in leaves
           if not (type(v) in (int, float, str, bool) or (isinstance(v, np.ndarray) and v.dtype == np.float32))]
    assert not bad
    held = state[STATE_KEY]
    aug = new_augmenter(3, generator=torch.Generator().manual_seed(0))
    # every parameter and buffer of the augmenter, and Adam moments + step per parameter
    assert {k for k in held if k.startswith("aug.")} == {f"aug.{n}" for n in aug.state_dict()}
    for name, p in aug.named_parameters():
        assert held[f"adam.exp_avg.{name}"].shape == held[f"adam.exp_avg_sq.{name}"].shape == tuple(p.shape)
        assert held[f"adam.step.{name}"] == 2.0  # two augmenter updates (interval 1, 2 steps)
    # the value range buffers are the data's per-channel min / max
    np.testing.assert_array_equal(held["aug.value_lo"], x.amin(dim=(0, 2, 3)).numpy())
    # the augmenter moved away from its zero-initialised output layer
    assert np.abs(held["aug.geometry_out.weight"]).max() > 0


@pytest.mark.parametrize("algorithm", AUGMENTER_PRESETS)
def test_gfm_continues_bit_identically_from_a_copy_of_its_state_in_a_fresh_method(algorithm):
    import copy

    x, y = _images(n=12, c=3)
    cfg = _cfg(algorithm=algorithm, gfm_interval=1, local_steps=3, batch_size=4, local_lr=0.05)
    method = cfg.resolved.client_method(cfg)
    state: dict = {}
    model = _small_cnn(c=3)
    method.train(_ctx(model, x, y, cfg, state=state, round=1))
    saved_state, saved_model = copy.deepcopy(state), copy.deepcopy(model)

    def continue_rounds(method, model, state):
        losses = [method.train(_ctx(model, x, y, cfg, state=state, round=r)).loss for r in (2, 3)]
        return losses, _params(model)

    straight = continue_rounds(method, model, state)  # the cached augmenter object
    fresh = continue_rounds(cfg.resolved.client_method(cfg), copy.deepcopy(saved_model), copy.deepcopy(saved_state))
    assert fresh[0] == straight[0]
    assert all(torch.equal(a, b) for a, b in zip(fresh[1], straight[1]))
    # the same method object given a copied dict rebuilds from it too, with the same numbers
    again = continue_rounds(method, copy.deepcopy(saved_model), copy.deepcopy(saved_state))
    assert again[0] == straight[0] and all(torch.equal(a, b) for a, b in zip(again[1], straight[1]))
    # the state matters: an empty one (a new identity augmenter) continues differently
    lost = continue_rounds(cfg.resolved.client_method(cfg), copy.deepcopy(saved_model), {})
    assert not all(torch.equal(a, b) for a, b in zip(lost[1], straight[1]))


def test_gfm_checkpoint_round_trip_matches_an_uninterrupted_run(tmp_path):
    from fedtune.runtime.driver import FederatedRun
    from fedtune.runtime.checkpoint import read_checkpoint, write_checkpoint

    cfg = FederatedRunConfig.from_dict({"algorithm": "gfm", "dataset": "rotated-digits", "setting": "fdg", "rounds": 3,
                               "local_steps": 2, "batch_size": 8, "model": "mlp", "mlp_hidden": [16],
                               "gfm_interval": 1, "backend": "local", "output": str(tmp_path)})
    cols = ("train_loss", "val_acc", "target_acc", "diag.gfm_aug_local_loss", "diag.sam_sharpness")

    def rounds(fr, n):
        return [tuple(m[c] for c in cols) for m in (fr.step().metrics for _ in range(n))]

    with FederatedRun(cfg) as fr:
        straight = rounds(fr, 3)
    with FederatedRun(cfg) as fr:
        first = rounds(fr, 2)
        write_checkpoint(tmp_path / "ckpt", fr.get_state())  # raised TypeError with live modules in ctx.state
    state = read_checkpoint(tmp_path / "ckpt")
    assert all(STATE_KEY in s for s in state["clients"].values())
    with FederatedRun(cfg) as fr:
        fr.set_state(state)
        resumed = rounds(fr, 1)
    assert first + resumed == straight
    # the augmenter state matters: without it round 3 differs
    with FederatedRun(cfg) as fr:
        fr.set_state({**state, "clients": {}})
        assert rounds(fr, 1) != straight[2:]


def test_gfm_moves_batchnorm_stats_once_per_step_and_keeps_the_augmenter_on_the_client():
    x, y = _images(n=8)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                          nn.Linear(4 * 64, 3))
    cfg = _cfg(algorithm="gfm", gfm_interval=1, local_steps=3, batch_size=8)
    out = CLIENT_METHODS["gfm"](cfg).train(_ctx(model, x, y, cfg))
    # 3 SAM steps (2 passes each) and 3 augmenter updates (2 models each): stats moved 3 times only
    assert int(model[1].num_batches_tracked) == 3
    assert out.metrics["gfm_aug_updates"] == 3 and math.isfinite(out.metrics["gfm_aug_local_loss"])


def test_gca_without_augmenter_updates_is_sgd_on_identity_augmented_data_and_gfm_is_not():
    x, y = _images(n=12)
    common = {"local_steps": 3, "batch_size": 4, "local_lr": 0.1, "local_momentum": 0.9}
    finals = {}
    for name, extra in (("sgd", {}), ("gca", {"algorithm": "gca", "gfm_interval": 5}),
                        ("gfm", {"algorithm": "gfm", "gfm_interval": 5, "sam_rho": 0.1})):
        cfg = _cfg(**common, **extra)
        model = _small_cnn()
        CLIENT_METHODS[name](cfg).train(_ctx(model, x, y, cfg))
        finals[name] = _params(model)
    for a, b in zip(finals["sgd"], finals["gca"]):
        _assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert any(not torch.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(finals["sgd"], finals["gfm"]))


@pytest.mark.parametrize("algorithm,diag", [
    ("gfm", ("gfm_aug_local_loss", "gfm_aug_global_loss", "gfm_aug_updates", "sam_sharpness")),
    ("gca", ("gfm_aug_local_loss", "gfm_aug_global_loss", "gfm_aug_updates")),
    ("fedprox", ("prox_penalty",)),
    ("fedsam", ("sam_sharpness",)),
])
def test_two_rounds_end_to_end_with_diag_columns(tmp_path, algorithm, diag):
    from fedtune.runtime.driver import run

    extra = {"gfm_interval": 1} if algorithm in AUGMENTER_PRESETS else {}
    cfg = FederatedRunConfig.from_dict({"algorithm": algorithm, "dataset": "rotated-digits", "setting": "fdg", "rounds": 2,
                               "local_steps": 2, "batch_size": 8, "model": "mlp", "mlp_hidden": [16],
                               "backend": "local", "output": str(tmp_path), **extra})
    result = run(cfg, progress=False)
    assert result.status == "completed" and [r["round"] for r in result.rows] == [1, 2]
    for row in result.rows:
        for key in diag:
            assert math.isfinite(row[f"diag.{key}"]), key
        assert 0.0 <= row["target_acc"] <= 1.0
    if algorithm in AUGMENTER_PRESETS:
        assert all(r["diag.gfm_aug_updates"] == 2.0 for r in result.rows)
        assert ("diag.sam_sharpness" in result.rows[0]) == (algorithm == "gfm")
        assert result.rows[0]["hp.gfm_interval"] == 1
    if algorithm == "fedprox":
        assert all(r["diag.prox_penalty"] > 0 for r in result.rows)


def test_gfm_on_vector_data_is_a_clear_error(tmp_path):
    from fedtune.runtime.driver import run

    cfg = FederatedRunConfig.from_dict({"algorithm": "gfm", "dataset": "rect4", "rounds": 1, "local_steps": 1,
                               "backend": "local", "output": str(tmp_path)})
    with pytest.raises(ConfigError, match=r"dataset 'rect4'.*vectors"):
        run(cfg, progress=False)


@pytest.mark.parametrize("method", PLAIN_CLIENT_METHODS)
def test_a_non_finite_loss_is_returned_at_once(method):
    x, y = _images(n=8)
    x[:] = float("nan")
    cfg = _cfg(algorithm="fedavg", client_method=method, local_steps=3, batch_size=4)
    ctx = _ctx(_small_cnn(), x, y, cfg)
    if CLIENT_METHODS.spec(method).needs_source_bank:  # FedDG: the run's source bank (here its own data)
        ctx.source_bank = ctx.data
    calls = []
    ctx.record_step = lambda params, grads: calls.append(1)
    out = CLIENT_METHODS[method](cfg).train(ctx)
    assert math.isnan(out.loss) and out.steps == 1 and not calls
