"""Auto-β's samples are the raw per-batch steps −lr·∇_b whatever the optimiser (docs/methods-seeds.md §2,
issue 8): the worker's recorder (fedtune.algorithms.client.step_records.StepRecorder) fed through
``ctx.record_step`` by the client methods, and the estimates it leads to under momentum."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from fedtune.runtime.examples import TensorExamples
from fedtune.algorithms.client.method import SGD, ClientContext, batches
from fedtune.algorithms.server.fedgp_auto_beta import auto_beta_estimates
from fedtune.algorithms.client.sam import SAM
from fedtune.config import FederatedRunConfig
from fedtune.layout import FlatLayout
from fedtune.models import build_model
from fedtune.flat_weights import get_flat, set_flat
from fedtune.algorithms.client.step_records import StepRecorder


def _cfg(**kw) -> FederatedRunConfig:
    base = {"algorithm": "fedda", "setting": "fda", "dataset": "rect4", "backend": "local", "gp_beta": "auto",
            "local_lr": 0.1, "local_momentum": 0.9, "weight_decay": 0.0, "batch_size": 4, "local_steps": 5}
    base.update(kw)
    return FederatedRunConfig.from_dict({k: v for k, v in base.items() if v is not None})


def _model(seed=0, dim=5, classes=3, hidden=(4,)):
    torch.manual_seed(seed)
    return build_model("mlp", input_shape=(dim,), num_classes=classes, mlp_hidden=list(hidden))


def _ctx(model, x, y, cfg, seed=7, role="target"):
    return ClientContext(model=model, data=TensorExamples(x, y), cfg=cfg, round=1, client_id=0, role=role,
                         generator=torch.Generator().manual_seed(seed), device=torch.device("cpu"))


def _data(n=12, dim=5, classes=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, dim, generator=g), torch.randint(0, classes, (n,), generator=g)


def _flat_grad(model, x, y):
    grads = torch.autograd.grad(F.cross_entropy(model(x), y), list(model.parameters()))
    return torch.cat([g.reshape(-1) for g in grads])


def test_recorded_samples_are_minus_lr_times_each_batch_gradient_under_momentum_and_decay():
    cfg = _cfg(local_momentum=0.9, weight_decay=0.05)
    x, y = _data()
    model = _model()
    layout = FlatLayout.of(model)
    ctx = _ctx(model, x, y, cfg)
    rec = ctx.record_step = StepRecorder(model, layout, cfg.local_lr)
    theta0 = get_flat(model, layout)
    out = SGD(cfg).train(ctx)
    rows = rec.result()
    assert rows.shape == (5, layout.num_params) and out.steps == 5

    # By hand: the same batches, torch.optim.SGD (momentum, decay) on a twin; the sample of step b
    # is −lr × the plain loss gradient at θ before step b (no momentum, no decay term).
    twin = _model()
    set_flat(twin, layout, theta0)
    opt = torch.optim.SGD(twin.parameters(), lr=cfg.local_lr, momentum=0.9, weight_decay=0.05)
    expected, thetas = [], [get_flat(twin, layout)[:layout.num_params].copy()]
    for idx in batches(len(y), cfg.batch_size, 5, torch.Generator().manual_seed(7)):
        expected.append((-cfg.local_lr * _flat_grad(twin, x[idx], y[idx])).numpy())
        opt.zero_grad()
        F.cross_entropy(twin(x[idx]), y[idx]).backward()
        opt.step()
        thetas.append(get_flat(twin, layout)[:layout.num_params].copy())
    np.testing.assert_allclose(rows, np.stack(expected), rtol=1e-5, atol=1e-8)
    # the twin followed the same path, and the θ differences (the old samples) are not these
    np.testing.assert_allclose(get_flat(model, layout), get_flat(twin, layout), rtol=1e-5, atol=1e-7)
    diffs = np.diff(np.stack(thetas), axis=0)
    assert not np.allclose(rows[1:], diffs[1:], rtol=0.1, atol=0)
    # a source keeps only the mean sample
    np.testing.assert_allclose(rec.mean(), rows.astype(np.float64).mean(0), rtol=1e-6, atol=1e-9)


def test_sam_records_the_gradient_at_the_unperturbed_weights():
    cfg = _cfg(algorithm="fedsam", setting="fdg", gp_beta=None, sam_rho=0.5, local_steps=1, local_momentum=0.0)
    x, y = _data()
    model = _model()
    layout = FlatLayout.of(model)
    theta0 = get_flat(model, layout)
    ctx = _ctx(model, x, y, cfg)
    rec = ctx.record_step = StepRecorder(model, layout, cfg.local_lr)
    SAM(cfg).train(ctx)
    twin = _model()
    set_flat(twin, layout, theta0)
    idx = next(iter(batches(len(y), cfg.batch_size, 1, torch.Generator().manual_seed(7))))
    expected = (-cfg.local_lr * _flat_grad(twin, x[idx], y[idx])).numpy()
    np.testing.assert_allclose(rec.result()[0], expected, rtol=1e-6, atol=1e-9)
    # SAM's actual step used the perturbed gradient: the recorded sample is not the displacement
    moved = get_flat(model, layout)[:layout.num_params] - theta0[:layout.num_params]
    assert not np.allclose(moved, expected, rtol=1e-3, atol=1e-6)


def test_recorder_writes_each_gradient_at_its_layout_slot_and_zeros_for_missing_ones():
    model = _model()
    layout = FlatLayout.of(model)
    params = list(model.parameters())
    grads = [torch.full_like(p, float(i + 1)) for i, p in enumerate(params)]
    grads[1] = None
    rec = StepRecorder(model, layout, lr=0.5, keep_rows=False)
    rec(params, grads)
    rec(params, grads)
    expect = np.concatenate([np.full(p.numel(), 0.0 if g is None else -0.5 * (i + 1), np.float32)
                             for i, (p, g) in enumerate(zip(params, grads))])
    np.testing.assert_array_equal(rec.mean(), expect)
    assert rec.extras().keys() == {"mean_step_update"}


# ---------------------------------------------------------------- the estimates under momentum
def _estimates(seed, momentum, shifted, n=96, dim=12, classes=4, bs=16, epochs=2):
    rng = np.random.default_rng(seed)
    means = rng.normal(size=(classes, dim)) * 1.5
    yy = rng.integers(0, classes, size=n)
    x = torch.tensor(means[yy] + rng.normal(size=(n, dim)), dtype=torch.float32)
    y = torch.tensor(yy, dtype=torch.int64)
    y_src = torch.tensor(rng.permutation(classes), dtype=torch.int64)[y] if shifted else y  # copy / relabelled
    cfg = _cfg(local_lr=0.05, local_momentum=momentum, batch_size=bs, local_steps=None, local_epochs=epochs)
    model = _model(seed, dim, classes, hidden=())
    layout = FlatLayout.of(model)
    theta = get_flat(model, layout)
    samples = {}
    for role, labels, order in (("target", y, 2 * seed + 1), ("source", y_src, 2 * seed + 2)):
        set_flat(model, layout, theta)
        ctx = _ctx(model, x, labels, cfg, seed=order, role=role)
        rec = ctx.record_step = StepRecorder(model, layout, cfg.local_lr, keep_rows=role == "target")
        SGD(cfg).train(ctx)
        samples[role] = rec.extras()
    est = auto_beta_estimates(samples["target"]["step_updates"], samples["source"]["mean_step_update"][None])
    return est.sigma2, float(est.d2[0]), float(est.beta_da[0])


@pytest.mark.parametrize("shifted", [False, True])
def test_momentum_does_not_change_the_auto_beta_estimates(shifted):
    reps = range(12)
    m0 = np.array([_estimates(r, 0.0, shifted) for r in reps])
    m9 = np.array([_estimates(r, 0.9, shifted) for r in reps])
    # σ̂² is a property of the target's batch noise, not of the optimiser: same within sampling error
    assert 0.8 < m9[:, 0].mean() / m0[:, 0].mean() < 1.25
    if not shifted:  # two identical domains: the source is as good as the target => β_DA high
        assert m0[:, 2].mean() > 0.8 and m9[:, 2].mean() > 0.8
    else:  # a relabelled source is far from the target => β_DA low, at either momentum
        assert m0[:, 2].mean() < 0.3 and m9[:, 2].mean() < 0.4
        assert (m9[:, 1] > m9[:, 0]).mean() > 0.9  # d̂² well above σ̂²
