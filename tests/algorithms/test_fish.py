"""Fish (client method ``fish``, docs/methods-benchmark.md §20): local meta steps against a float64 reference
of Algorithm 1 with the inner optimiser fresh at every meta step and kept across steps, against a
float64 reference of DomainBed's ``Fish.update`` (the inner optimiser's state carried across meta
steps, Adam and SGD with momentum: the default), the one-domain / meta_lr = 1 invariant, a run, new
trial ids, bad values."""

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


def _domainbed_reference(model, x, y, domains, meta_lr, kind, carry, lr, wd, mom=0.9, steps=4):
    """DomainBed's Fish.update (domainbed/algorithms.py) in float64, optimisers written out: each meta
    step clones the network, builds the inner optimiser and, when ``carry``, loads the previous one's
    state (``optimizer_inner_state``); one step per domain (ascending id, that domain's rows of the
    batch); then ``meta += meta_lr * (inner - meta)``. Adam: torch's (L2 weight decay, bias-corrected
    moments, betas 0.9/0.999, eps 1e-8); SGD: heavy ball ``buf <- mom * buf + g`` (first: ``g``)."""
    meta = [p.detach().double().clone() for p in model.parameters()]
    state = None
    for idx in batches(len(y), 8, steps, torch.Generator().manual_seed(0)):
        inner = [p.clone().requires_grad_(True) for p in meta]
        if not carry or state is None:
            state = {"t": 0, "m": [torch.zeros_like(p) for p in meta], "v": [torch.zeros_like(p) for p in meta],
                     "buf": None}
        for k in torch.unique(domains[idx]):
            rows = idx[domains[idx] == k]
            logits = x[rows].double() @ inner[0].T + inner[1]
            grads = torch.autograd.grad(nn.functional.cross_entropy(logits, y[rows]), inner)
            grads = [g + wd * p.detach() for g, p in zip(grads, inner)]
            with torch.no_grad():
                if kind == "adam":
                    state["t"] += 1
                    t = state["t"]
                    for i, (p, g) in enumerate(zip(inner, grads)):
                        state["m"][i] = 0.9 * state["m"][i] + 0.1 * g
                        state["v"][i] = 0.999 * state["v"][i] + 0.001 * g * g
                        m_hat = state["m"][i] / (1 - 0.9 ** t)
                        denom = state["v"][i].sqrt() / (1 - 0.999 ** t) ** 0.5 + 1e-8
                        p -= lr * m_hat / denom
                else:
                    state["buf"] = list(grads) if state["buf"] is None else \
                        [mom * b + g for b, g in zip(state["buf"], grads)]
                    for p, b in zip(inner, state["buf"]):
                        p -= lr * b
        meta = [m + meta_lr * (p.detach() - m) for m, p in zip(meta, inner)]
    return meta


@pytest.mark.parametrize("kind, lr", [("adam", 0.05), ("sgd", 0.1)])
def test_the_default_is_domainbeds_update_with_the_inner_state_carried_across_meta_steps(kind, lr):
    x = torch.randn(24, 4, generator=torch.Generator().manual_seed(7))
    y = torch.randint(0, 3, (24,), generator=torch.Generator().manual_seed(8))
    domains = torch.tensor([0, 1, 1] * 8)
    wd = 0.01
    base = {"client_method": "fish", "local_steps": 4, "batch_size": 8, "local_lr": lr, "weight_decay": wd,
            "model": "mlp", "fish_meta_lr": 0.5, "local_optimizer": kind,
            **({"local_momentum": 0.9} if kind == "sgd" else {})}

    def trained(**kw):
        torch.manual_seed(1)
        model = nn.Linear(4, 3)
        start = nn.Linear(4, 3)
        start.load_state_dict(model.state_dict())
        cfg = FederatedRunConfig.from_dict({**base, **kw})
        Fish(cfg).train(_ctx(model, x, y, domains, cfg))
        return [p.detach().double() for p in model.parameters()], start

    default, start = trained()
    carried = _domainbed_reference(start, x, y, domains, 0.5, kind, True, lr, wd)
    for p, q in zip(default, carried):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
    fresh, _ = trained(fish_inner_optimizer="fresh")
    for p, q in zip(fresh, _domainbed_reference(start, x, y, domains, 0.5, kind, False, lr, wd)):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)  # fresh: the state dropped every meta step
    assert not all(torch.allclose(p, q, atol=1e-4) for p, q in zip(fresh, carried))


def test_runs_at_the_new_default_get_new_trial_ids(monkeypatch):
    import fedtune.trial_ids as trial_ids

    base = {"algorithm": "fish"}
    unset = FederatedRunConfig.from_dict(base)
    assert unset.trial_id() == FederatedRunConfig.from_dict({**base, "fish_inner_optimizer": "round"}).trial_id()
    assert unset.trial_id() != FederatedRunConfig.from_dict({**base, "fish_inner_optimizer": "fresh"}).trial_id()
    new = unset.trial_id()
    monkeypatch.setattr(trial_ids, "params_roles",  # the hash of the set params only (before)
                        lambda roles=trial_ids.params_roles(): (roles[0], ()))
    assert FederatedRunConfig.from_dict(base).trial_id() != new


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
    with pytest.raises(ConfigError, match=r"^field 'fish_meta_lr' \(client method fish\): 0.0 is out of range"):
        _cfg(fish_meta_lr=0.0)  # theta would never move
    assert _cfg(fish_meta_lr=1e-3).params["fish_meta_lr"] == 1e-3
    with pytest.raises(ConfigError, match=r"^field 'fish_inner_optimizer' \(client method fish\): .*allowed: round, fresh"):
        _cfg(fish_inner_optimizer="adam")
    assert Fish(_cfg()).fresh is False  # the default keeps the round's optimiser
