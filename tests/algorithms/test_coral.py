"""DeepCORAL (client method ``coral``, docs/methods-benchmark.md §15): the penalty against an independent
float64 reference of DomainBed's equations, its edge cases, one local step against a float64
autograd reference, and the invariant coral_weight = 0 => plain SGD."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fedtune.algorithms.client.method import ClientContext
from fedtune.algorithms.client.coral import DeepCORAL, coral_penalty
from fedtune.config import FederatedRunConfig
from fedtune.runtime.examples import TensorExamples

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _reference(features: np.ndarray, domains: np.ndarray) -> float:
    """DomainBed's CORAL penalty in float64 NumPy: mean over pairs of domains (>= 2 examples each)
    of mean squared mean difference + mean squared covariance difference."""
    groups = [features[domains == d] for d in np.unique(domains) if (domains == d).sum() >= 2]
    pairs = [(a, b) for i, a in enumerate(groups) for b in groups[i + 1:]]
    if not pairs:
        return 0.0
    out = 0.0
    for a, b in pairs:
        out += ((a.mean(0) - b.mean(0)) ** 2).mean() + ((np.cov(a, rowvar=False) - np.cov(b, rowvar=False)) ** 2).mean()
    return out / len(pairs)


def test_the_penalty_is_domainbeds_coral_over_the_domain_pairs_of_the_batch():
    rng = np.random.default_rng(0)
    feats = rng.normal(size=(23, 5)) * rng.uniform(0.5, 2.0, size=5)
    domains = np.array([0] * 7 + [2] * 9 + [3] * 6 + [1])  # domain 1 has a single example: left out
    got = coral_penalty(torch.from_numpy(feats), torch.from_numpy(domains))
    assert got.dtype == torch.float64
    assert float(got) == pytest.approx(_reference(feats, domains), rel=1e-12)


def test_one_domain_or_singletons_give_no_penalty():
    feats = torch.randn(6, 3)
    assert float(coral_penalty(feats, torch.zeros(6, dtype=torch.int64))) == 0.0
    assert float(coral_penalty(feats, torch.arange(6))) == 0.0  # every domain a singleton


def _ctx(model, x, y, domains, cfg):
    data = TensorExamples(x, y, domains=domains)
    return ClientContext(model=model, data=data, cfg=cfg, round=1, client_id=0, role="source",
                         generator=torch.Generator().manual_seed(0), device=torch.device("cpu"))


def _cfg(**kw):
    return FederatedRunConfig.from_dict({"client_method": "coral", "local_steps": 1, "batch_size": 64,
                                         "local_momentum": 0.0, "local_lr": 0.1, "model": "mlp", **kw})


def test_one_full_batch_step_follows_the_float64_gradient_of_ce_plus_weighted_penalty():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))
    ref = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3)).double()
    ref.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    x, y = torch.randn(12, 4), torch.randint(0, 3, (12,))
    domains = torch.tensor([0, 1, 2] * 4)
    cfg = _cfg(coral_weight=0.7)
    out = DeepCORAL(cfg).train(_ctx(model, x, y, domains, cfg))
    # the float64 reference: theta - lr * grad(CE + 0.7 * penalty(z)), z the classifier's input
    z = ref[1](ref[0](x.double()))
    loss = nn.functional.cross_entropy(ref[2](z), y) + 0.7 * coral_penalty(z, domains)
    grads = torch.autograd.grad(loss, list(ref.parameters()))
    for p, q, g in zip(model.parameters(), ref.parameters(), grads):
        torch.testing.assert_close(p.detach().double(), (q - 0.1 * g).detach(), rtol=1e-5, atol=1e-6)
    assert out.steps == 1 and out.metrics["coral_penalty"] > 0


def test_weight_zero_is_plain_sgd_bit_for_bit():
    from fedtune.algorithms.client.method import SGD

    torch.manual_seed(1)
    a = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))
    b = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))
    b.load_state_dict(a.state_dict())
    x, y, domains = torch.randn(20, 4), torch.randint(0, 3, (20,)), torch.tensor([0, 1] * 10)
    coral_cfg = _cfg(coral_weight=0.0, local_steps=3, batch_size=8, local_momentum=0.9)
    DeepCORAL(coral_cfg).train(_ctx(a, x, y, domains, coral_cfg))
    sgd_cfg = FederatedRunConfig.from_dict({"local_steps": 3, "batch_size": 8, "local_momentum": 0.9,
                                            "local_lr": 0.1, "model": "mlp"})
    SGD(sgd_cfg).train(_ctx(b, x, y, domains, sgd_cfg))
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def test_a_run_with_mixed_domain_clients_aligns_their_features(tmp_path):
    from fedtune.results.store import load
    from fedtune.runtime.driver import run

    cfg = FederatedRunConfig.from_dict({
        "algorithm": "fedavg", "client_method": "coral", "dataset": "rect4", "setting": "fdg",
        "domain_homogeneity": 0.5, "num_clients": 3, "rounds": 2, "local_steps": 3, "batch_size": 32,
        "model": "mlp", "mlp_hidden": [16], "backend": "local", "output": str(tmp_path)})
    assert run(cfg, progress=False).status == "completed"
    rows = load(tmp_path / "default").to_pandas()
    assert (rows["diag.coral_penalty"] > 0).all() and np.isfinite(rows["train_loss"]).all()


def test_bad_weight_is_one_line():
    from fedtune.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^field 'coral_weight' \(client method coral\): -1.0 is out of range; allowed: >= 0$"):
        _cfg(coral_weight=-1)
