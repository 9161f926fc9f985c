"""IRM (client method ``irm``, docs/methods-benchmark.md §18): the IRMv1 penalty against its closed form in
float64 NumPy, singleton domains, local steps against a float64 autograd reference before and after
the warm-up, a run, and bad values in one line. (The warm-up's iteration count and the optimiser
reset are V-REx's, tested in tests/algorithms/test_vrex.py.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fedtune.algorithms.client.irm import IRM, irm_terms
from fedtune.algorithms.client.method import ClientContext, batches
from fedtune.config import FederatedRunConfig
from fedtune.runtime.examples import TensorExamples

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _dce_ds(logits: np.ndarray, y: np.ndarray) -> float:
    """d/ds of mean CE(s · logits, y) at s = 1, in closed form: mean of Σ_j softmax_j l_j − l_y."""
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    return float(((p * logits).sum(1) - logits[np.arange(len(y)), y]).mean())


def _reference(logits: np.ndarray, y: np.ndarray, domains: np.ndarray) -> tuple[float, float]:
    """(mean over domains of their CE, mean over domains with >= 2 rows of the even-half and
    odd-half derivatives' product)."""
    risks, terms = [], []
    for d in np.unique(domains):
        lg, yy = logits[domains == d], y[domains == d]
        lp = lg - np.log(np.exp(lg).sum(1, keepdims=True))
        risks.append(-lp[np.arange(len(yy)), yy].mean())
        if len(yy) >= 2:
            terms.append(_dce_ds(lg[::2], yy[::2]) * _dce_ds(lg[1::2], yy[1::2]))
    return float(np.mean(risks)), float(np.mean(terms)) if terms else 0.0


def test_the_penalty_is_irmv1s_split_half_estimate_of_the_squared_scale_gradient():
    rng = np.random.default_rng(0)
    logits, y = rng.normal(size=(15, 4)) * 2, rng.integers(0, 4, size=15)
    domains = np.array([1, 0, 1, 1, 0, 3, 0, 1, 0, 3, 3, 1, 0, 0, 7])  # domain 7: one row, no halves
    mean, penalty = irm_terms(torch.from_numpy(logits), torch.from_numpy(y), torch.from_numpy(domains))
    ref_mean, ref_penalty = _reference(logits, y, domains)
    assert float(mean) == pytest.approx(ref_mean, rel=1e-12)
    assert float(penalty.detach()) == pytest.approx(ref_penalty, rel=1e-10) and ref_penalty != 0.0


def test_singletons_only_give_no_penalty():
    logits, y = torch.randn(3, 4, dtype=torch.float64), torch.tensor([0, 1, 2])
    mean, penalty = irm_terms(logits, y, torch.tensor([0, 1, 2]))
    assert float(penalty) == 0.0 and float(mean) > 0


def _ctx(model, x, y, domains, cfg):
    return ClientContext(model=model, data=TensorExamples(x, y, domains=domains), cfg=cfg, round=1, client_id=0,
                         role="source", generator=torch.Generator().manual_seed(0), device=torch.device("cpu"))


def _cfg(**kw):
    return FederatedRunConfig.from_dict({"client_method": "irm", "local_steps": 1, "batch_size": 64,
                                         "local_momentum": 0.0, "local_lr": 0.1, "model": "mlp", **kw})


@pytest.mark.parametrize("anneal, weight", [(0, 30.0), (5, 1.0)])  # after the warm-up: irm_lambda; before: 1
def test_one_full_batch_step_follows_the_float64_gradient(anneal, weight):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))
    ref = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3)).double()
    ref.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    x, y, domains = torch.randn(16, 4), torch.randint(0, 3, (16,)), torch.tensor([0, 1] * 8)
    cfg = _cfg(irm_lambda=30.0, irm_anneal_iters=anneal)
    out = IRM(cfg).train(_ctx(model, x, y, domains, cfg))
    # the batch is the client's rows in the order the local loop drew them (the halves depend on it)
    (idx,) = batches(16, 64, 1, torch.Generator().manual_seed(0))
    mean, penalty = irm_terms(ref(x[idx].double()), y[idx], domains[idx])
    grads = torch.autograd.grad(mean + weight * penalty, list(ref.parameters()))
    for p, q, g in zip(model.parameters(), ref.parameters(), grads):
        torch.testing.assert_close(p.detach().double(), (q - 0.1 * g).detach(), rtol=1e-5, atol=1e-6)
    assert out.steps == 1 and out.loss == pytest.approx(float(mean.detach()), rel=1e-5)
    assert out.metrics["irm_penalty"] == pytest.approx(float(penalty.detach()), rel=1e-4, abs=1e-7)


def test_a_run_with_mixed_domain_clients_trains_with_the_penalty(tmp_path):
    from fedtune.results.store import load
    from fedtune.runtime.driver import run

    cfg = FederatedRunConfig.from_dict({
        "algorithm": "fedavg", "client_method": "irm", "dataset": "rect4", "setting": "fdg",
        "domain_homogeneity": 0.5, "num_clients": 3, "rounds": 2, "local_steps": 3, "batch_size": 32,
        "model": "mlp", "mlp_hidden": [16], "backend": "local", "output": str(tmp_path)})
    assert run(cfg, progress=False).status == "completed"
    rows = load(tmp_path / "default").to_pandas()
    assert (rows["diag.irm_penalty"] != 0).all() and np.isfinite(rows["train_loss"]).all()


def test_bad_values_are_one_line():
    from fedtune.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^field 'irm_lambda' \(client method irm\): -1.0 is out of range; allowed: >= 0$"):
        _cfg(irm_lambda=-1)
    with pytest.raises(ConfigError, match=r"^field 'precision'.*irm"):
        _cfg(precision="fp16", client_gpus=1)  # fp16 needs CUDA clients; IRM's inner gradients bypass the scaler
