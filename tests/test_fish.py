"""Fish (client method ``fish``, docs/methods.md §20): local meta steps against a float64 reference
of Algorithm 1 with the inner optimiser fresh at every meta step (the paper, DomainBed) and kept
across steps (Bai et al.'s code), the one-domain / meta_lr = 1 invariant, a run, bad values."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fedtune.algorithms.client.fish import Fish
from fedtune.algorithms.client.method import ClientContext, SGD, batches
from fedtune.config import FederatedRunConfig
from fedtune.runtime.examples import TensorExamples

pytestmark = pytest.mark.usefixtures("one_torch_thread")

LR, MOM = 0.1, 0.9


def _ctx(model, x, y, domains, cfg):
    return ClientContext(model=model, data=TensorExamples(x, y, domains=domains), cfg=cfg, round=1, client_id=0,
                         role="source", generator=torch.Generator().manual_seed(0), device=torch.device("cpu"))


def _cfg(**kw):
    return FederatedRunConfig.from_dict({"client_method": "fish", "local_steps": 3, "batch_size": 8,
                                         "local_momentum": MOM, "local_lr": LR, "model": "mlp", **kw})


def _models():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))
    ref = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3)).double()
    ref.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    return model, ref


def _reference(ref, x, y, domains, meta_lr, fresh):
    """Algorithm 1 in float64: per meta step, heavy-ball SGD inner steps over the batch's domains in
    ascending id (velocity reset per meta step when ``fresh``), then the interpolation."""
    velocity = None
    for idx in batches(len(y), 8, 3, torch.Generator().manual_seed(0)):
        if fresh:
            velocity = None
        before = [p.detach().clone() for p in ref.parameters()]
        d = domains[idx]
        for k in torch.unique(d):
            rows = idx[d == k]
            grads = torch.autograd.grad(nn.functional.cross_entropy(ref(x[rows].double()), y[rows]),
                                        list(ref.parameters()))
            velocity = list(grads) if velocity is None else [MOM * v + g for v, g in zip(velocity, grads)]
            with torch.no_grad():
                for p, v in zip(ref.parameters(), velocity):
                    p -= LR * v
        with torch.no_grad():
            for p, b in zip(ref.parameters(), before):
                p.copy_(b + meta_lr * (p - b))
    return ref


DATA = (torch.randn(20, 4, generator=torch.Generator().manual_seed(5)),
        torch.randint(0, 3, (20,), generator=torch.Generator().manual_seed(6)), torch.tensor([0, 3, 1, 3] * 5))


@pytest.mark.parametrize("mode", ["fresh", "round"])
def test_meta_steps_follow_the_float64_reference(mode):
    x, y, domains = DATA
    model, ref = _models()
    cfg = _cfg(fish_meta_lr=0.3, fish_inner_optimizer=mode)
    out = Fish(cfg).train(_ctx(model, x, y, domains, cfg))
    ref = _reference(ref, x, y, domains, 0.3, fresh=mode == "fresh")
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.detach().double(), q.detach(), rtol=1e-4, atol=1e-5)
    assert out.steps == 3 and np.isfinite(out.loss)
    other = _reference(_models()[1], x, y, domains, 0.3, fresh=mode != "fresh")  # the other mode: another model
    assert not all(torch.allclose(p.detach().double(), q.detach(), atol=1e-5)
                   for p, q in zip(model.parameters(), other.parameters()))


def test_one_domain_and_meta_lr_one_is_an_sgd_step():
    x, y, _ = DATA
    one = torch.zeros(20, dtype=torch.int64)
    a, _ = _models()
    b, _ = _models()
    cfg = _cfg(fish_meta_lr=1.0, fish_inner_optimizer="round")
    Fish(cfg).train(_ctx(a, x, y, one, cfg))
    sgd_cfg = FederatedRunConfig.from_dict({"local_steps": 3, "batch_size": 8, "local_momentum": MOM,
                                            "local_lr": LR, "model": "mlp"})
    SGD(sgd_cfg).train(_ctx(b, x, y, one, sgd_cfg))
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)  # b + 1·(t − b) rounds, so not bit for bit


def test_a_run_with_mixed_domain_clients_trains(tmp_path):
    from fedtune.results.store import load
    from fedtune.runtime.driver import run

    cfg = FederatedRunConfig.from_dict({
        "algorithm": "fish", "dataset": "rect4", "setting": "fdg", "domain_homogeneity": 0.5, "num_clients": 3,
        "rounds": 2, "local_steps": 3, "batch_size": 32, "model": "mlp", "mlp_hidden": [16], "backend": "local",
        "output": str(tmp_path)})
    assert run(cfg, progress=False).status == "completed"
    rows = load(tmp_path / "default").to_pandas()
    assert np.isfinite(rows["train_loss"]).all() and (rows["hp.fish_meta_lr"] == 0.5).all()


def test_bad_values_are_one_line():
    from fedtune.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^field 'fish_meta_lr' \(client method fish\): 2.0 is out of range"):
        _cfg(fish_meta_lr=2.0)
    with pytest.raises(ConfigError, match=r"^field 'fish_inner_optimizer' \(client method fish\): .*allowed: fresh, round"):
        _cfg(fish_inner_optimizer="adam")
