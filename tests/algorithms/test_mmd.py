"""MMD (client method ``mmd``, docs/methods-benchmark.md §16): the penalty against an independent float64
reference of DomainBed's equations, its edge cases, one local step against a float64 autograd
reference, the invariant mmd_weight = 0 => plain SGD, a run, and a bad weight in one line."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fedtune.algorithms.client.method import ClientContext
from fedtune.algorithms.client.mmd import MMD, mmd_penalty
from fedtune.config import FederatedRunConfig
from fedtune.runtime.examples import TensorExamples

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _kernel(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Σ_γ exp(−γ ‖a_i − b_j‖²), the squared distances taken directly (not by norms and products)."""
    d = ((a[:, None, :] - b[None, :, :]) ** 2).sum(-1)
    return sum(np.exp(-g * np.maximum(d, 1e-30)) for g in (1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0, 1e3))


def _reference(features: np.ndarray, domains: np.ndarray) -> float:
    """DomainBed's MMD penalty in float64 NumPy: the mean over pairs of the domains present of
    mean K(x, x) + mean K(y, y) − 2 mean K(x, y)."""
    groups = [features[domains == d] for d in np.unique(domains)]
    pairs = [(a, b) for i, a in enumerate(groups) for b in groups[i + 1:]]
    if not pairs:
        return 0.0
    total = sum(_kernel(a, a).mean() + _kernel(b, b).mean() - 2 * _kernel(a, b).mean() for a, b in pairs)
    return total / len(pairs)


def test_the_penalty_is_domainbeds_mmd_over_the_domain_pairs_of_the_batch():
    rng = np.random.default_rng(0)
    feats = rng.normal(size=(17, 4)) * 0.3  # distances of order 1: every bandwidth contributes
    domains = np.array([0] * 5 + [2] * 6 + [3] * 5 + [1])  # a singleton domain counts for MMD
    got = mmd_penalty(torch.from_numpy(feats), torch.from_numpy(domains))
    assert got.dtype == torch.float64
    assert float(got) == pytest.approx(_reference(feats, domains), rel=1e-9)
    shifted = feats + (domains == 2)[:, None] * 1.0  # move one domain away: the penalty grows
    assert float(mmd_penalty(torch.from_numpy(shifted), torch.from_numpy(domains))) > float(got)


def test_one_domain_gives_no_penalty_and_identical_domains_none_either():
    feats = torch.randn(6, 3, dtype=torch.float64)
    assert float(mmd_penalty(feats, torch.zeros(6, dtype=torch.int64))) == 0.0
    same = torch.cat([feats, feats])  # two domains with the same features: MMD 0 (to rounding)
    assert abs(float(mmd_penalty(same, torch.tensor([0] * 6 + [1] * 6)))) < 1e-12


def _ctx(model, x, y, domains, cfg):
    data = TensorExamples(x, y, domains=domains)
    return ClientContext(model=model, data=data, cfg=cfg, round=1, client_id=0, role="source",
                         generator=torch.Generator().manual_seed(0), device=torch.device("cpu"))


def _cfg(**kw):
    return FederatedRunConfig.from_dict({"client_method": "mmd", "local_steps": 1, "batch_size": 64,
                                         "local_momentum": 0.0, "local_lr": 0.1, "model": "mlp", **kw})


def test_one_full_batch_step_follows_the_float64_gradient_of_ce_plus_weighted_penalty():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))
    ref = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3)).double()
    ref.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    x, y = torch.randn(12, 4), torch.randint(0, 3, (12,))
    domains = torch.tensor([0, 1, 2] * 4)
    cfg = _cfg(mmd_weight=0.7)
    out = MMD(cfg).train(_ctx(model, x, y, domains, cfg))
    z = ref[1](ref[0](x.double()))  # the classifier's input
    loss = nn.functional.cross_entropy(ref[2](z), y) + 0.7 * mmd_penalty(z, domains)
    grads = torch.autograd.grad(loss, list(ref.parameters()))
    for p, q, g in zip(model.parameters(), ref.parameters(), grads):
        torch.testing.assert_close(p.detach().double(), (q - 0.1 * g).detach(), rtol=1e-5, atol=1e-6)
    assert out.steps == 1 and out.metrics["mmd_penalty"] > 0


def test_weight_zero_is_plain_sgd_bit_for_bit():
    from fedtune.algorithms.client.method import SGD

    torch.manual_seed(1)
    a = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))
    b = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))
    b.load_state_dict(a.state_dict())
    x, y, domains = torch.randn(20, 4), torch.randint(0, 3, (20,)), torch.tensor([0, 1] * 10)
    mmd_cfg = _cfg(mmd_weight=0.0, local_steps=3, batch_size=8, local_momentum=0.9)
    MMD(mmd_cfg).train(_ctx(a, x, y, domains, mmd_cfg))
    sgd_cfg = FederatedRunConfig.from_dict({"local_steps": 3, "batch_size": 8, "local_momentum": 0.9,
                                            "local_lr": 0.1, "model": "mlp"})
    SGD(sgd_cfg).train(_ctx(b, x, y, domains, sgd_cfg))
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def test_a_run_with_mixed_domain_clients_matches_their_features(tmp_path):
    from fedtune.results.store import load
    from fedtune.runtime.driver import run

    cfg = FederatedRunConfig.from_dict({
        "algorithm": "fedavg", "client_method": "mmd", "dataset": "rect4", "setting": "fdg",
        "domain_homogeneity": 0.5, "num_clients": 3, "rounds": 2, "local_steps": 3, "batch_size": 32,
        "model": "mlp", "mlp_hidden": [16], "backend": "local", "output": str(tmp_path)})
    assert run(cfg, progress=False).status == "completed"
    rows = load(tmp_path / "default").to_pandas()
    assert (rows["diag.mmd_penalty"] > 0).all() and np.isfinite(rows["train_loss"]).all()


def test_bad_weight_is_one_line():
    from fedtune.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^field 'mmd_weight' \(client method mmd\): -1.0 is out of range; allowed: >= 0$"):
        _cfg(mmd_weight=-1)
