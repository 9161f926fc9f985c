"""FedADG (client method ``fedadg`` with its server side, docs/methods.md §24): the generator's and
discriminator's architectures as Bai et al.'s, a round of both phases against a float64 reference
that draws the same numbers, the ``bai`` variant's frozen generator, the server's weighted mean and
its checkpoint, a run, and bad values in one line."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from fedtune.algorithms.client.fedadg import (DISCRIMINATOR_KEY, Discriminator, FeatureGenerator, FedADG,
                                              flat_parameters, load_flat_parameters)
from fedtune.algorithms.client.method import ClientContext, batches
from fedtune.algorithms.server.fedadg import GENERATOR_KEY, FedADGServer, mean_generator
from fedtune.algorithms.server.rule import RoundInfo
from fedtune.config import FederatedRunConfig
from fedtune.runtime.examples import TensorExamples

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_the_nets_are_the_authors():
    torch.manual_seed(0)
    g = FeatureGenerator(num_classes=3, noise=5, features=4, latent=7)
    assert [type(m) for m in g.net] == [nn.Linear, nn.LeakyReLU, nn.Linear, nn.ReLU]
    assert (g.net[0].in_features, g.net[0].out_features, g.net[2].out_features) == (8, 7, 4)
    d = Discriminator(features=4, num_classes=3)
    assert d.projection.bias is None and d.projection.weight.shape == (1024, 7)
    assert float(torch.norm(d.projection.weight.detach())) == pytest.approx(1.0, abs=1e-6)
    out = d(torch.zeros(2, 3), torch.randn(2, 4))
    assert out.shape == (2, 1) and bool(((out > 0) & (out < 1)).all())
    v = flat_parameters(g)
    h = FeatureGenerator(3, 5, 4, 7)
    load_flat_parameters(h, v)
    assert np.array_equal(flat_parameters(h), v)
    with pytest.raises(ValueError, match="^FedADG: the broadcast generator holds 3 parameters, this model's has"):
        load_flat_parameters(h, np.zeros(3, np.float32))


def _cfg(**kw):
    return FederatedRunConfig.from_dict({
        "client_method": "fedadg", "local_steps": 2, "batch_size": 4, "local_momentum": 0.0, "local_lr": 0.1,
        "model": "mlp", "fedadg_noise": 5, "fedadg_latent": 7, "fedadg_alpha": 0.3, "fedadg_gen_lr": 0.05,
        "fedadg_disc_lr": 0.05, "fedadg_disc_width": 16, **kw})


def _setup(variant):
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(6, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 3))
    gen, disc = FeatureGenerator(3, 5, 4, 7), Discriminator(4, 3, 16)
    x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
    cfg = _cfg(fedadg_variant=variant)
    ctx = ClientContext(model=model, data=TensorExamples(x, y), cfg=cfg, round=1, client_id=0, role="source",
                        generator=torch.Generator().manual_seed(3), device=torch.device("cpu"),
                        payload={GENERATOR_KEY: flat_parameters(gen)},
                        state={DISCRIMINATOR_KEY: copy.deepcopy(disc.state_dict())})
    return model, gen, disc, x, y, cfg, ctx


def _reference_round(model, gen, disc, x, y, train_gen):
    """Both phases in float64, following the equations, drawing from the same generator stream."""
    m, g, d = copy.deepcopy(model).double(), copy.deepcopy(gen).double(), copy.deepcopy(disc).double()
    stream = torch.Generator().manual_seed(3)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for idx in batches(8, 4, 2, stream):
        opt.zero_grad()
        F.cross_entropy(m(x[idx].double()), y[idx]).backward()
        opt.step()
    g_opt = torch.optim.SGD(g.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-5)
    d_opt = torch.optim.SGD(d.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-5)
    encoder, head = m[:3], m[3]
    for idx in batches(8, 4, 2, stream):  # one pass: 2 batches
        xb, yb = x[idx].double(), y[idx]
        ys = torch.zeros(len(yb), 3, dtype=torch.float64).scatter_(1, yb.view(-1, 1), 0.6)
        u = torch.rand(len(yb), 5, generator=stream).double()
        z = encoder(xb)
        loss = 0.3 * F.cross_entropy(head(z), yb, label_smoothing=0.2) + 0.7 * torch.mean((1 - d(ys, z)) ** 2)
        opt.zero_grad()
        loss.backward()
        opt.step()
        m.eval()  # the discriminator sees the encoder in eval mode
        with torch.no_grad():
            real, fake = encoder(xb), g(u, ys)
        d_opt.zero_grad()
        (-torch.mean(d(ys, fake) ** 2 + (1 - d(ys, real)) ** 2)).backward()
        d_opt.step()
        if train_gen:  # fixed: training mode again; bai: the encoder stays in eval mode
            m.train()
            g_opt.zero_grad()
            torch.mean((1 - d(ys, g(u, ys))) ** 2).backward()
            g_opt.step()
    return m, g, d


@pytest.mark.parametrize("variant", ["fixed", "bai"])
def test_a_round_follows_the_float64_reference(variant):
    model, gen, disc, x, y, cfg, ctx = _setup(variant)
    m, g, d = _reference_round(model, gen, disc, x, y, train_gen=variant == "fixed")
    out = FedADG(cfg).train(ctx)
    for a, b in zip(model.state_dict().values(), m.state_dict().values()):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-5)
    for key, b in d.state_dict().items():
        np.testing.assert_allclose(ctx.state[DISCRIMINATOR_KEY][key].numpy(), b.numpy(), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(out.extras[GENERATOR_KEY], flat_parameters(g), rtol=1e-4, atol=1e-6)
    moved = not np.array_equal(out.extras[GENERATOR_KEY], flat_parameters(gen))
    assert moved == (variant == "fixed")  # Bai et al.'s detach: the generator never trains
    assert out.steps == 2 and {"fedadg_align_loss", "fedadg_disc_loss", "fedadg_gen_loss"} <= set(out.metrics)


def test_zero_adversarial_epochs_is_plain_local_training():
    model, gen, disc, x, y, cfg, ctx = _setup("fixed")
    ctx.cfg = _cfg(fedadg_epochs=0)
    ref = copy.deepcopy(model)
    FedADG(ctx.cfg).train(ctx)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for idx in batches(8, 4, 2, torch.Generator().manual_seed(3)):
        opt.zero_grad()
        F.cross_entropy(ref(x[idx]), y[idx]).backward()
        opt.step()
    for a, b in zip(model.state_dict().values(), ref.state_dict().values()):
        assert torch.equal(a, b)


def test_the_server_averages_the_generators_by_example_weight_and_checkpoints_them():
    side = FedADGServer(FederatedRunConfig.from_dict({"algorithm": "fedadg"}), None, 3)
    assert side.payload(1) == {}
    rows = [np.random.default_rng(k).normal(size=11).astype(np.float32) for k in range(3)]
    p = np.array([0.5, 0.2, 0.3])
    new, diag = side.update(None, "params", None, p, extras=[{GENERATOR_KEY: r} for r in rows], round=1,
                            info=RoundInfo.sources(3))
    ref = sum(w * r.astype(np.float64) for w, r in zip(p, rows)).astype(np.float32)
    assert new == "params" and np.array_equal(side.payload(2)[GENERATOR_KEY], ref)
    assert diag["fedadg_generator_norm"] == pytest.approx(np.linalg.norm(ref.astype(np.float64)))
    again = FedADGServer(FederatedRunConfig.from_dict({"algorithm": "fedadg"}), None, 3)
    again.load_state_dict(side.state_dict())
    assert np.array_equal(again.payload(2)[GENERATOR_KEY], ref)
    fresh = FedADGServer(FederatedRunConfig.from_dict({"algorithm": "fedadg"}), None, 3)
    fresh.load_state_dict(FedADGServer(FederatedRunConfig.from_dict({"algorithm": "fedadg"}), None, 3).state_dict())
    assert fresh.payload(1) == {}
    np.testing.assert_array_equal(mean_generator(rows[:1], np.ones(1)), rows[0])


def test_a_run_shares_one_generator(tmp_path):
    from fedtune.runtime.driver import FederatedRun

    cfg = FederatedRunConfig.from_dict({
        "algorithm": "fedadg", "fedadg_noise": 8, "fedadg_latent": 16, "fedadg_disc_width": 16, "fedadg_gen_lr": 0.01,
        "dataset": "rect4",
        "num_clients": 3, "rounds": 2, "local_steps": 2, "batch_size": 16, "model": "mlp", "mlp_hidden": [8],
        "backend": "local", "output": str(tmp_path)})
    with FederatedRun(cfg) as fr:
        rows = [fr.step().metrics for _ in range(2)]
        state = fr.get_state()
    assert all(np.isfinite(r["train_loss"]) for r in rows)
    assert rows[0]["diag.fedadg_generator_norm"] != rows[1]["diag.fedadg_generator_norm"]
    assert np.asarray(state["side"]["generator"]).size == (8 + 2 + 1) * 16 + (16 + 1) * 8  # rect4: 2 classes
    assert all(DISCRIMINATOR_KEY in s for s in state["clients"].values())


def test_bad_values_are_one_line():
    from fedtune.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^field 'fedadg_alpha' \(client method fedadg\): 1.5 is out of range; allowed: >= 0 and <= 1$"):
        _cfg(fedadg_alpha=1.5)
    with pytest.raises(ConfigError, match=r"^field 'fedadg_variant' \(client method fedadg\): 'paper' is not allowed; allowed: fixed, bai$"):
        _cfg(fedadg_variant="paper")
