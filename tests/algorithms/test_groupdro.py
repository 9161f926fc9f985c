"""GroupDRO (client method ``groupdro``, docs/methods-benchmark.md §19): the risks and the weights' update
against float64 NumPy, local steps against a float64 autograd reference that carries q, q kept
across rounds in the client's state, eta = 0 keeps q uniform, a run, and a bad value in one line."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fedtune.algorithms.client.domain_groups import domain_risks
from fedtune.algorithms.client.groupdro import STATE_KEY, GroupDRO, reweighted
from fedtune.algorithms.client.method import ClientContext, batches
from fedtune.config import FederatedRunConfig
from fedtune.runtime.examples import TensorExamples

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_risks_and_the_weights_update_match_float64_numpy():
    rng = np.random.default_rng(0)
    logits, y = rng.normal(size=(9, 3)), rng.integers(0, 3, size=9)
    domains = np.array([4, 1, 4, 4, 1, 4, 1, 4, 4])
    present = torch.tensor([1, 2, 4])  # domain 2 is the client's but not in this batch: risk 0
    risks = domain_risks(torch.from_numpy(logits), torch.from_numpy(y), torch.from_numpy(domains), present)
    lp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    ce = -lp[np.arange(9), y]
    ref = np.array([ce[domains == 1].mean(), 0.0, ce[domains == 4].mean()])
    np.testing.assert_allclose(risks.numpy(), ref, rtol=1e-12)
    q = np.array([0.5, 0.2, 0.3])
    new = reweighted(torch.from_numpy(q), risks, 0.7).numpy()
    expect = q * np.exp(0.7 * ref)
    np.testing.assert_allclose(new, expect / expect.sum(), rtol=1e-12)


def _ctx(model, x, y, domains, cfg, state, round=1):
    return ClientContext(model=model, data=TensorExamples(x, y, domains=domains), cfg=cfg, round=round, client_id=0,
                         role="source", generator=torch.Generator().manual_seed(round), device=torch.device("cpu"),
                         state=state)


def _cfg(**kw):
    return FederatedRunConfig.from_dict({"client_method": "groupdro", "local_steps": 3, "batch_size": 6,
                                         "local_momentum": 0.0, "local_lr": 0.1, "model": "mlp", **kw})


def test_steps_follow_the_float64_reference_and_q_carries_over_rounds():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))
    ref = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3)).double()
    ref.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    x, y = torch.randn(18, 4), torch.randint(0, 3, (18,))
    domains = torch.tensor([0, 0, 2, 0, 2, 2, 0, 0, 0] * 2)  # two domains, unequal
    cfg, state = _cfg(groupdro_eta=0.5), {}
    q = np.array([0.5, 0.5])
    for rnd in (1, 2):
        out = GroupDRO(cfg).train(_ctx(model, x, y, domains, cfg, state, round=rnd))
        for idx in batches(18, 6, 3, torch.Generator().manual_seed(rnd)):  # the reference, step by step
            logits = ref(x[idx].double())
            ce = nn.functional.cross_entropy(logits, y[idx], reduction="none")
            d = domains[idx]
            risks = torch.stack([ce[d == k].mean() if (d == k).any() else ce.new_zeros(()) for k in (0, 2)])
            q = q * np.exp(0.5 * risks.detach().numpy())
            q = q / q.sum()
            grads = torch.autograd.grad((torch.from_numpy(q) * risks).sum(), list(ref.parameters()))
            with torch.no_grad():
                for p, g in zip(ref.parameters(), grads):
                    p -= 0.1 * g
        np.testing.assert_allclose(state[STATE_KEY], q, rtol=1e-5)  # q kept in the client's state
        for p, r in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.detach().double(), r.detach(), rtol=1e-4, atol=1e-5)
        assert out.metrics["groupdro_max_weight"] == pytest.approx(q.max(), rel=1e-5)
    assert abs(q[0] - q[1]) > 1e-3  # the weights moved


def test_eta_zero_keeps_q_uniform():
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))
    x, y, domains = torch.randn(12, 4), torch.randint(0, 3, (12,)), torch.tensor([0, 1, 3] * 4)
    cfg, state = _cfg(groupdro_eta=0.0), {}
    GroupDRO(cfg).train(_ctx(model, x, y, domains, cfg, state))
    np.testing.assert_array_equal(state[STATE_KEY], np.full(3, 1 / 3))


def test_a_run_with_mixed_domain_clients_moves_the_weights(tmp_path):
    from fedtune.results.store import load
    from fedtune.runtime.driver import run

    cfg = FederatedRunConfig.from_dict({
        "algorithm": "fedavg", "client_method": "groupdro", "groupdro_eta": 0.1, "dataset": "rect4",
        "setting": "fdg", "domain_homogeneity": 0.5, "num_clients": 3, "rounds": 2, "local_steps": 3,
        "batch_size": 32, "model": "mlp", "mlp_hidden": [16], "backend": "local", "output": str(tmp_path)})
    assert run(cfg, progress=False).status == "completed"
    rows = load(tmp_path / "default").to_pandas()
    assert np.isfinite(rows["train_loss"]).all() and (rows["diag.groupdro_max_weight"] < 1).all()


def test_bad_value_is_one_line():
    from fedtune.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^field 'groupdro_eta' \(client method groupdro\): -1.0 is out of range; allowed: >= 0$"):
        _cfg(groupdro_eta=-1)
