"""V-REx (client method ``vrex``, docs/methods-benchmark.md §17): the risks and their variance against a
float64 NumPy reference, local steps against float64 autograd references (the penalty's weight
after and before the warm-up, the optimiser reset at the switch, the iteration count across
rounds), a run, and bad values in one line."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fedtune.algorithms.client.method import ClientContext
from fedtune.algorithms.client.domain_groups import domain_risks
from fedtune.algorithms.client.vrex import VREx, risk_variance
from fedtune.config import FederatedRunConfig
from fedtune.runtime.examples import TensorExamples

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_the_risks_and_their_variance_match_a_float64_reference():
    rng = np.random.default_rng(0)
    logits, y = rng.normal(size=(11, 4)), rng.integers(0, 4, size=11)
    domains = np.array([2, 0, 2, 5, 0, 0, 5, 2, 2, 0, 5])
    logp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    ce = -logp[np.arange(11), y]
    ref = np.array([ce[domains == d].mean() for d in (0, 2, 5)])  # ascending domain id
    risks = domain_risks(torch.from_numpy(logits), torch.from_numpy(y), torch.from_numpy(domains))
    np.testing.assert_allclose(risks.numpy(), ref, rtol=1e-12)
    assert float(risk_variance(risks)) == pytest.approx(ref.var(), rel=1e-12)  # population variance


def _ctx(model, x, y, domains, cfg, round=1):
    return ClientContext(model=model, data=TensorExamples(x, y, domains=domains), cfg=cfg, round=round,
                         client_id=0, role="source", generator=torch.Generator().manual_seed(0),
                         device=torch.device("cpu"))


def _cfg(**kw):
    return FederatedRunConfig.from_dict({"client_method": "vrex", "local_steps": 1, "batch_size": 64,
                                         "local_momentum": 0.0, "local_lr": 0.1, "model": "mlp", **kw})


def _models(seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))
    ref = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3)).double()
    ref.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    return model, ref


def _grads(ref, x, y, domains, weight):
    risks = domain_risks(ref(x.double()), y, domains)
    return torch.autograd.grad(risks.mean() + weight * risk_variance(risks), list(ref.parameters()))


DATA = (torch.randn(12, 4, generator=torch.Generator().manual_seed(3)),
        torch.randint(0, 3, (12,), generator=torch.Generator().manual_seed(4)), torch.tensor([0, 1, 2] * 4))


@pytest.mark.parametrize("anneal, weight", [(0, 7.0), (5, 1.0)])  # after the warm-up: vrex_lambda; before: 1
def test_one_full_batch_step_follows_the_float64_gradient(anneal, weight):
    model, ref = _models()
    x, y, domains = DATA
    cfg = _cfg(vrex_lambda=7.0, vrex_anneal_iters=anneal)
    before = float(domain_risks(ref(x.double()), y, domains).mean().detach())
    out = VREx(cfg).train(_ctx(model, x, y, domains, cfg))
    for p, q, g in zip(model.parameters(), ref.parameters(), _grads(ref, x, y, domains, weight)):
        torch.testing.assert_close(p.detach().double(), (q - 0.1 * g).detach(), rtol=1e-5, atol=1e-6)
    # the round's loss is the mean risk (not the weighted objective), the metric the variance
    assert out.steps == 1 and out.loss == pytest.approx(before, rel=1e-5) and out.metrics["vrex_penalty"] > 0


def test_the_optimiser_is_reset_when_the_weight_switches_and_iterations_count_across_rounds():
    x, y, domains = DATA
    lr, mom = 0.1, 0.9

    def reference(steps_weights, reset_at):
        _, ref = _models()
        velocity = None
        for i, w in enumerate(steps_weights):
            g = _grads(ref, x, y, domains, w)
            velocity = list(g) if velocity is None or i == reset_at else [mom * v + gi for v, gi in zip(velocity, g)]
            with torch.no_grad():
                for q, v in zip(ref.parameters(), velocity):
                    q -= lr * v
        return ref

    # round 1, 2 full-batch steps, switch at iteration 1: weight 1 then 7, momentum dropped at the switch
    model, _ = _models()
    cfg = _cfg(vrex_lambda=7.0, vrex_anneal_iters=1, local_steps=2, local_momentum=mom)
    VREx(cfg).train(_ctx(model, x, y, domains, cfg))
    ref = reference([1.0, 7.0], reset_at=1)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.detach().double(), q.detach(), rtol=1e-5, atol=1e-6)
    kept = reference([1.0, 7.0], reset_at=-1)  # the same steps without the reset: another model
    assert not all(torch.allclose(p.detach().double(), q.detach(), atol=1e-6) for p, q in zip(model.parameters(),
                                                                                               kept.parameters()))
    # round 2 of 2 steps a round starts at iteration 2: past a switch at 1, weight 7 from its first step
    model, ref = _models()
    VREx(cfg).train(_ctx(model, x, y, domains, cfg, round=2))
    ref = reference([7.0, 7.0], reset_at=-1)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.detach().double(), q.detach(), rtol=1e-5, atol=1e-6)


def test_a_run_with_mixed_domain_clients_penalises_the_risks_variance(tmp_path):
    from fedtune.results.store import load
    from fedtune.runtime.driver import run

    cfg = FederatedRunConfig.from_dict({
        "algorithm": "fedavg", "client_method": "vrex", "dataset": "rect4", "setting": "fdg",
        "domain_homogeneity": 0.5, "num_clients": 3, "rounds": 2, "local_steps": 3, "batch_size": 32,
        "model": "mlp", "mlp_hidden": [16], "backend": "local", "output": str(tmp_path)})
    assert run(cfg, progress=False).status == "completed"
    rows = load(tmp_path / "default").to_pandas()
    assert (rows["diag.vrex_penalty"] > 0).all() and np.isfinite(rows["train_loss"]).all()


def test_bad_values_are_one_line():
    from fedtune.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^field 'vrex_lambda' \(client method vrex\): -1.0 is out of range; allowed: >= 0$"):
        _cfg(vrex_lambda=-1)
    with pytest.raises(ConfigError, match=r"^field 'vrex_anneal_iters' \(client method vrex\): "):
        _cfg(vrex_anneal_iters=-3)
