"""FedADG (client method ``fedadg`` with its server side, docs/methods-benchmark.md §24).

The rounds are checked against a float64 reference written from the authors' code
(``github:wzml/FedADG``: ``pacs-ours/localTrain.py`` and ``Nets.py`` for PACS, ``src/localTrain.py``
and ``models/Nets.py`` for VLCS) and from Bai et al.'s (``github:inouye-lab/FedDG_Benchmark``
``src/client.py`` ``FedADGClient``): functional nets, hand-written SGD, the same random draws, no
fedtune code. Also: the nets' shapes and initialisation, the readings one flag away, the server's
mean and checkpoint, a run, the trial ids, and bad values in one line."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

from fedtune.algorithms.client.fedadg import (DISCRIMINATOR_KEY, Discriminator, FeatureGenerator, FedADG,
                                              flat_parameters, load_flat_parameters)
from fedtune.algorithms.client.method import ClientContext
from fedtune.algorithms.server.fedadg import GENERATOR_KEY, FedADGServer, mean_generator
from fedtune.algorithms.server.rule import RoundInfo
from fedtune.config import FederatedRunConfig
from fedtune.errors import ConfigError
from fedtune.runtime.examples import TensorExamples

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# ------------------------------------------------------------------ the three codes' readings
# pacs-ours/localTrain.py: alpha = 0.85 (l. 66), the label vector 0.7 at the class (l. 81), D first
# (l. 77-87), D on mean((1 - D(G))^2 + D(F)^2) (l. 84), the model back in train mode (l. 90), G on
# mean(D(G)^2) (l. 104), the pre-training on the same LabelSmoothingLoss (l. 110-127), smoothing 0.01
# (README's PACS command), noise 2048 (train.py l. 30); Nets.py's Discriminator (projection of z,
# then [Pz, y], Kaiming-uniform weights).
AUTHORS = dict(order="disc_first", disc_loss="least_squares", gen="squared", arch="pacs", mode="train",
               pretrain="smoothed", form="authors", soft=0.7, smooth=0.01, alpha=0.85, noise=2048)
# src/localTrain.py: alpha 0.85 (l. 85), 0.6 (l. 101), D first, -mean(D(G)^2 + (1 - D(F))^2) (l. 103),
# G's output detached before its loss (l. 122: G never moves), smoothing 0.2 (README's VLCS command);
# models/Nets.py's Discriminator (projection of [z, y] divided by its norm).
AUTHORS_VLCS = {**AUTHORS, "disc_loss": "negated", "gen": "frozen", "arch": "vlcs", "soft": 0.6, "smooth": 0.2}
# Bai et al.'s FedADGClient: ERM's plain cross-entropy first (ERM.step: ds_bundle.loss), then
# second_step: the model first, CrossEntropyLoss(label_smoothing=0.2), D as the VLCS code, G detached,
# the featurizer left in eval mode; their PACS sweep's hparam1 0.15; hparam5 unset: 0 noise inputs.
BAI = {**AUTHORS_VLCS, "order": "model_first", "mode": "eval_after_disc", "pretrain": "plain", "form": "torch",
       "alpha": 0.15, "noise": 0}
FLIPS = {  # fedtune's flag -> (its value, the reference's reading it names)
    "fedadg_order": ("model_first", {"order": "model_first"}),
    "fedadg_disc_loss": ("negated", {"disc_loss": "negated"}),
    "fedadg_gen_loss": ("frozen", {"gen": "frozen"}),
    "fedadg_disc_arch": ("vlcs", {"arch": "vlcs"}),
    "fedadg_model_mode": ("eval_after_disc", {"mode": "eval_after_disc"}),
    "fedadg_pretrain_loss": ("plain", {"pretrain": "plain"}),
    "fedadg_smoothing_form": ("torch", {"form": "torch"}),
    "fedadg_alpha": (0.15, {"alpha": 0.15}),
    "fedadg_soft_label": (0.6, {"soft": 0.6}),
    "fedadg_label_smoothing": (0.2, {"smooth": 0.2}),
}
LR, GEN_LR, DISC_LR, MOMENTUM = 0.1, 0.05, 0.05, 0.5


def _leaky(h):
    return torch.where(h > 0, h, 0.01 * h)


def _ref_gen(w, u, ys):  # GeneDistrNet: fc1 on [noise, label], LeakyReLU, fc2, ReLU
    h = _leaky(torch.cat([u, ys], 1) @ w["net.0.weight"].T + w["net.0.bias"])
    return torch.clamp(h @ w["net.2.weight"].T + w["net.2.bias"], min=0)


def _ref_disc(w, ys, z, arch):
    if arch == "pacs":  # pacs-ours/Nets.py: projection(z), cat y, features_pro
        h = torch.cat([z @ w["projection.weight"].T, ys], 1)
    else:  # models/Nets.py: cat [z, y], projection, features_pro
        h = torch.cat([z, ys], 1) @ w["projection.weight"].T
    h = _leaky(h @ w["score.0.weight"].T + w["score.0.bias"])
    return torch.sigmoid(h @ w["score.2.weight"].T + w["score.2.bias"])


def _ref_ce(logits, y, s, form):
    logp = logits - torch.logsumexp(logits, 1, keepdim=True)
    k = logits.shape[1]
    onehot = torch.zeros_like(logits)
    onehot[torch.arange(len(y)), y] = 1.0
    if form == "authors":  # utils/utilss.py LabelSmoothingLoss: 1 - s at the class, s/(K - 1) elsewhere
        target = onehot * (1 - s) + (1 - onehot) * s / (k - 1)
    else:  # torch's label_smoothing: (1 - s) one-hot + s/K
        target = onehot * (1 - s) + s / k
    return torch.mean(torch.sum(-target * logp, 1))


def _sgd(params, grads, bufs, lr, momentum, wd):
    with torch.no_grad():
        for i, (p, g) in enumerate(zip(params, grads)):
            g = g + wd * p
            bufs[i] = g.clone() if bufs[i] is None else momentum * bufs[i] + g
            p -= lr * bufs[i]


def _reference_round(model, gen, disc, x, y, r, *, epochs=2, local_steps=2, bs=4):
    """The round in float64 as the code of reading ``r`` runs it."""
    m = copy.deepcopy(model)
    g = {k: v.detach().double().clone().requires_grad_() for k, v in gen.state_dict().items()}
    d = {k: v.detach().double().clone().requires_grad_() for k, v in disc.state_dict().items()}
    enc, head = m[:3], m[3]
    stream = torch.Generator().manual_seed(3)
    mbufs, gbufs, dbufs = [None] * 6, [None] * 4, [None] * 5
    n = len(y)
    perm, losses = torch.randperm(n, generator=stream), []
    for b in range(local_steps):  # the local steps (before_train / ERM's epochs)
        idx = perm[b * bs:(b + 1) * bs]
        logits = m(x[idx])
        loss = (_ref_ce(logits, y[idx], r["smooth"], r["form"]) if r["pretrain"] == "smoothed"
                else _ref_ce(logits, y[idx], 0.0, "torch"))
        losses.append(float(loss.detach()))
        _sgd(list(m.parameters()), torch.autograd.grad(loss, list(m.parameters())), mbufs, LR, MOMENTUM, 0.0)
    sums = {"fedadg_disc_loss": 0.0, "fedadg_gen_loss": 0.0, "fedadg_align_loss": 0.0}

    def disc_step(xb, ys, u):
        m.eval()
        with torch.no_grad():
            real, fake = enc(xb), _ref_gen(g, u, ys)
        if r["mode"] == "train":
            m.train()
        if r["disc_loss"] == "least_squares":
            loss = torch.mean((1 - _ref_disc(d, ys, fake, r["arch"])) ** 2 + _ref_disc(d, ys, real, r["arch"]) ** 2)
        else:
            loss = -torch.mean(_ref_disc(d, ys, fake, r["arch"]) ** 2 + (1 - _ref_disc(d, ys, real, r["arch"])) ** 2)
        _sgd(list(d.values()), torch.autograd.grad(loss, list(d.values())), dbufs, DISC_LR, 0.9, 1e-5)
        sums["fedadg_disc_loss"] += float(loss.detach())

    for _ in range(epochs):
        perm = torch.randperm(n, generator=stream)
        for b in range(n // bs):
            idx = perm[b * bs:(b + 1) * bs]
            xb, yb = x[idx], y[idx]
            ys = torch.zeros(len(yb), 3, dtype=torch.float64)
            ys[torch.arange(len(yb)), yb] = r["soft"]
            u = torch.rand(len(yb), r["noise"], generator=stream, dtype=torch.float32).double()
            if r["order"] == "disc_first":
                disc_step(xb, ys, u)
            z = enc(xb)
            align = torch.mean((1 - _ref_disc(d, ys, z, r["arch"])) ** 2)
            loss = r["alpha"] * _ref_ce(head(z), yb, r["smooth"], r["form"]) + (1 - r["alpha"]) * align
            _sgd(list(m.parameters()), torch.autograd.grad(loss, list(m.parameters())), mbufs, LR, MOMENTUM, 0.0)
            sums["fedadg_align_loss"] += float(align.detach())
            if r["order"] == "model_first":
                disc_step(xb, ys, u)
            if r["gen"] == "squared":
                gl = torch.mean(_ref_disc(d, ys, _ref_gen(g, u, ys), r["arch"]) ** 2)
                _sgd(list(g.values()), torch.autograd.grad(gl, list(g.values())), gbufs, GEN_LR, 0.9, 1e-5)
            else:
                with torch.no_grad():
                    gl = torch.mean((1 - _ref_disc(d, ys, _ref_gen(g, u, ys), r["arch"])) ** 2)
            sums["fedadg_gen_loss"] += float(gl.detach())
    steps = epochs * (n // bs)
    return m, g, d, float(np.mean(losses)), {k: v / steps for k, v in sums.items()}


def _cfg(**kw):
    return FederatedRunConfig.from_dict({
        "client_method": "fedadg", "local_steps": 2, "batch_size": 4, "local_momentum": MOMENTUM, "local_lr": LR,
        "weight_decay": 0.0, "model": "mlp", "fedadg_latent": 7, "fedadg_gen_lr": GEN_LR, "fedadg_disc_lr": DISC_LR,
        "fedadg_disc_width": 16, "fedadg_epochs": 2, **kw})


def _setup(cfg):
    """A float64 model with batch norm (eval and training mode differ), the run's nets as the client
    builds them (the generator broadcast, the discriminator from the client's state)."""
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(6, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 3)).double()
    noise, arch = cfg.params.get("fedadg_noise", 2048), cfg.params.get("fedadg_disc_arch", "pacs")
    gen, disc = FeatureGenerator(3, noise, 4, 7), Discriminator(4, 3, 16, arch)
    x, y = torch.randn(8, 6, dtype=torch.float64), torch.tensor([0, 1, 2, 0, 1, 2, 1, 0])
    ctx = ClientContext(model=model, data=TensorExamples(x, y), cfg=cfg, round=1, client_id=0, role="source",
                        generator=torch.Generator().manual_seed(3), device=torch.device("cpu"),
                        payload={GENERATOR_KEY: flat_parameters(gen)},
                        state={DISCRIMINATOR_KEY: copy.deepcopy(disc.state_dict())})
    return model, gen.double(), disc.double(), x, y, ctx


def _run(cfg, reading):
    model, gen, disc, x, y, ctx = _setup(cfg)
    m, g, d, ref_loss, ref_metrics = _reference_round(model, gen, disc, x, y, reading)
    out = FedADG(cfg).train(ctx)
    return model, ctx, out, (m, g, d, ref_loss, ref_metrics), gen


def _assert_matches(model, ctx, out, ref):
    m, g, d, ref_loss, ref_metrics = ref
    for key, b in m.state_dict().items():  # parameters and batch-norm statistics
        np.testing.assert_allclose(model.state_dict()[key].numpy(), b.numpy(), rtol=0, atol=1e-10, err_msg=key)
    for key, b in d.items():
        np.testing.assert_allclose(ctx.state[DISCRIMINATOR_KEY][key].numpy(), b.detach().numpy(), rtol=0, atol=1e-10,
                                   err_msg=key)
    # the wire format is float32: the float64 generator rounded
    ref_g = torch.cat([v.detach().reshape(-1) for v in g.values()]).float().numpy()
    np.testing.assert_allclose(out.extras[GENERATOR_KEY], ref_g, rtol=2e-7, atol=1e-12)
    assert out.loss == pytest.approx(ref_loss, rel=0, abs=1e-10)
    for key, value in ref_metrics.items():
        assert out.metrics[key] == pytest.approx(value, rel=0, abs=1e-10), key
    assert out.steps == 2


def test_the_default_round_is_the_authors_pacs_code_in_float64():
    cfg = _cfg()
    assert not [k for k in cfg.params if k in ("fedadg_variant", "fedadg_alpha", "fedadg_soft_label",
                                               "fedadg_label_smoothing", "fedadg_noise")]  # the defaults alone
    model, ctx, out, ref, gen = _run(cfg, AUTHORS)
    _assert_matches(model, ctx, out, ref)
    assert not np.array_equal(out.extras[GENERATOR_KEY], flat_parameters(gen))  # G trains
    assert ref[4]["fedadg_gen_loss"] > 0


@pytest.mark.parametrize("variant, reading", [("authors_vlcs", AUTHORS_VLCS), ("bai", BAI)])
def test_a_named_reading_is_that_codes_round_in_float64(variant, reading):
    cfg = _cfg(fedadg_variant=variant)
    model, ctx, out, ref, gen = _run(cfg, reading)
    _assert_matches(model, ctx, out, ref)
    assert np.array_equal(out.extras[GENERATOR_KEY], flat_parameters(gen))  # their detach: G never moves


@pytest.mark.parametrize("flag", sorted(FLIPS))
def test_each_departure_is_one_flag_away_and_changes_the_round(flag):
    value, change = FLIPS[flag]
    model, ctx, out, ref, _ = _run(_cfg(**{flag: value}), {**AUTHORS, **change})
    _assert_matches(model, ctx, out, ref)
    # ... and the flag matters: the authors' round ends elsewhere
    base = _reference_round(*_setup(_cfg())[:5], AUTHORS)
    gap = max(float((a - b).abs().max()) for a, b in zip(base[0].state_dict().values(), ref[0].state_dict().values()))
    gap = max([gap] + [float((base[2][k] - ref[2][k]).detach().abs().max()) for k in base[2] if base[2][k].shape == ref[2][k].shape])
    assert gap > 1e-6, flag


def test_zero_adversarial_epochs_with_plain_local_steps_is_plain_local_training():
    cfg = _cfg(fedadg_epochs=0, fedadg_pretrain_loss="plain")
    model, _, _, x, y, ctx = _setup(cfg)
    ref = copy.deepcopy(model)
    FedADG(cfg).train(ctx)
    opt = torch.optim.SGD(ref.parameters(), lr=LR, momentum=MOMENTUM)
    for idx in torch.randperm(8, generator=torch.Generator().manual_seed(3)).split(4):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ref(x[idx]), y[idx]).backward()
        opt.step()
    for a, b in zip(model.state_dict().values(), ref.state_dict().values()):
        assert torch.equal(a, b)


def test_the_nets_are_the_authors():
    torch.manual_seed(0)
    g = FeatureGenerator(num_classes=3, noise=5, features=4, latent=7)
    assert [type(m) for m in g.net] == [nn.Linear, nn.LeakyReLU, nn.Linear, nn.ReLU]
    assert (g.net[0].in_features, g.net[0].out_features, g.net[2].out_features) == (8, 7, 4)
    assert FeatureGenerator(3, 0, 4, 7).net[0].in_features == 3  # Bai et al.'s PACS runs: no noise inputs
    vlcs = Discriminator(features=4, num_classes=3, arch="vlcs")
    assert vlcs.projection.bias is None and vlcs.projection.weight.shape == (1024, 7)
    assert float(torch.norm(vlcs.projection.weight.detach())) == pytest.approx(1.0, abs=1e-6)
    assert vlcs.score[0].weight.shape == (1024, 1024)
    pacs = Discriminator(features=64, num_classes=3)  # the default: pacs-ours/Nets.py
    assert pacs.projection.bias is None and pacs.projection.weight.shape == (1024, 64)
    assert pacs.score[0].weight.shape == (1024, 1027) and pacs.score[2].weight.shape == (1, 1024)
    for layer, fan_in in ((pacs.projection, 64), (pacs.score[0], 1027), (pacs.score[2], 1024)):
        w = layer.weight.detach()  # kaiming_uniform_: U(-sqrt(6/fan_in), sqrt(6/fan_in)), the norm division undone
        assert float(w.abs().max()) <= np.sqrt(6 / fan_in) and float(w.std()) == pytest.approx(np.sqrt(2 / fan_in), rel=0.05)
    out = pacs(torch.zeros(2, 3), torch.randn(2, 64))
    assert out.shape == (2, 1) and bool(((out > 0) & (out < 1)).all())
    v = flat_parameters(g)
    h = FeatureGenerator(3, 5, 4, 7)
    load_flat_parameters(h, v)
    assert np.array_equal(flat_parameters(h), v)
    with pytest.raises(ValueError, match="^FedADG: the broadcast generator holds 3 parameters, this model's has"):
        load_flat_parameters(h, np.zeros(3, np.float32))


def test_a_reading_sets_only_what_is_unset_and_reports_it():
    bai = _cfg(fedadg_variant="bai", fedadg_alpha=0.1)
    assert bai.params["fedadg_alpha"] == 0.1  # their Camelyon17 sweep: the run's value wins
    assert bai.params["fedadg_order"] == "model_first" and bai.params["fedadg_noise"] == 0
    assert bai.params["fedadg_gen_lr"] == GEN_LR  # set above
    hp = bai.hyperparameters()
    assert hp["fedadg_gen_loss"] == "frozen" and hp["fedadg_soft_label"] == 0.6 and hp["fedadg_smoothing_form"] == "torch"
    assert bai.params["client_weighting"] == "examples"  # their server's coefficients len(client) / total
    preset = FederatedRunConfig.from_dict({"algorithm": "fedadg"})
    assert preset.params == {"client_weighting": "uniform"}  # the authors' FedAvg: the plain mean
    assert FederatedRunConfig.from_dict({"algorithm": "fedadg", "fedadg_variant": "bai"}).params["client_weighting"] == "examples"
    vlcs = _cfg(fedadg_variant="authors_vlcs")
    assert "fedadg_order" not in vlcs.params and "client_weighting" not in vlcs.params
    assert vlcs.hyperparameters()["fedadg_order"] == "disc_first" and vlcs.params["fedadg_label_smoothing"] == 0.2


def test_runs_at_the_new_defaults_get_new_trial_ids(monkeypatch):
    import fedtune.trial_ids as trial_ids

    for base in ({"algorithm": "fedadg"}, {"algorithm": "fedomg", "client_method": "fedadg"}):
        unset = FederatedRunConfig.from_dict(base)
        assert unset.trial_id() == FederatedRunConfig.from_dict({**base, "fedadg_variant": "authors"}).trial_id()
        assert unset.trial_id() != FederatedRunConfig.from_dict({**base, "fedadg_variant": "bai"}).trial_id()
        new = unset.trial_id()
        monkeypatch.setattr(trial_ids, "params_roles",  # the hash of the set params only (before)
                            lambda roles=trial_ids.params_roles(): (roles[0], ()))
        assert FederatedRunConfig.from_dict(base).trial_id() != new
        monkeypatch.undo()


def test_a_space_that_fixes_a_reading_fixes_its_knobs_and_bais_example_is_bais_reading():
    from pathlib import Path

    from fedtune.spaces.derive import derive, merge
    from fedtune.spaces.yaml_files import read_space_file

    space = merge(derive({"algorithm": "fedadg"}), {}, {"fedadg_variant": {"distribution": "fixed", "value": "authors_vlcs"},
                                                         "fedadg_soft_label": {"distribution": "fixed", "value": 0.5}})
    assert space.params["fedadg_gen_loss"] == {"distribution": "fixed", "value": "frozen"}
    assert space.params["fedadg_soft_label"]["value"] == 0.5  # the file's own value stands
    assert space.params["fedadg_order"]["value"] == "disc_first"  # not one the reading sets
    sampled = merge(derive({"algorithm": "fedadg"}), {}, {"fedadg_variant": {"distribution": "categorical",
                                                                             "choices": ["authors", "bai"]}})
    assert "fedadg_order" not in sampled.params and "fedadg_latent" in sampled.params  # each trial's reading sets them
    root = Path(__file__).resolve().parents[2]
    example = read_space_file(root / "examples" / "feddg-benchmark" / "pacs-fedadg.yaml")
    cfg = FederatedRunConfig.from_dict({k: v for k, v in example.defaults().items()})
    bai = FederatedRunConfig.from_dict({"algorithm": "fedadg", "fedadg_variant": "bai"})
    for name in bai.params:
        assert cfg.params[name] == bai.params[name], name


@pytest.mark.parametrize("weighting", ["uniform", "examples"])
def test_the_server_averages_the_generators_as_the_model_and_checkpoints_them(weighting):
    """The authors' FedAvg (models/Fed.py CountAvg) divides the sum by the number of clients: the
    preset's default; examples is Bai et al.'s len(client) / total."""
    cfg = FederatedRunConfig.from_dict({"algorithm": "fedadg", **({} if weighting == "uniform" else {"client_weighting": weighting})})
    side = FedADGServer(cfg, None, 3)
    assert side.payload(1) == {}
    rows = [np.random.default_rng(k).normal(size=11).astype(np.float32) for k in range(3)]
    p = np.array([0.5, 0.2, 0.3])
    new, diag = side.update(None, "params", None, p, extras=[{GENERATOR_KEY: r} for r in rows], round=1,
                            info=RoundInfo.sources(3))
    w = np.full(3, 1 / 3) if weighting == "uniform" else p
    ref = sum(wu * r.astype(np.float64) for wu, r in zip(w, rows)).astype(np.float32)
    assert new == "params" and np.array_equal(side.payload(2)[GENERATOR_KEY], ref)
    assert diag["fedadg_generator_norm"] == pytest.approx(np.linalg.norm(ref.astype(np.float64)))
    again = FedADGServer(cfg, None, 3)
    again.load_state_dict(side.state_dict())
    assert np.array_equal(again.payload(2)[GENERATOR_KEY], ref)
    fresh = FedADGServer(cfg, None, 3)
    fresh.load_state_dict(FedADGServer(cfg, None, 3).state_dict())
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


@pytest.mark.parametrize("field, value, allowed", [
    ("fedadg_alpha", 1.5, "is out of range; allowed: >= 0 and <= 1"),
    ("fedadg_variant", "paper", "is not allowed; allowed: authors, authors_vlcs, bai"),
    ("fedadg_variant", "fixed", "was removed: its generator loss mean((1 - D(G))^2) moved G to D's generated side, "
                                "away from the features: the opposite sign of the authors' mean(D(G)^2); use "
                                "fedadg_variant=authors (their PACS code, the default) or bai"),
    ("fedadg_latent", 10 ** 9, "is out of range; allowed: >= 1 and <= 8192"),  # was a 413 GB allocation
    ("fedadg_noise", 10 ** 6, "is out of range; allowed: >= 0 and <= 8192"),
    ("fedadg_noise", -1, "is out of range; allowed: >= 0 and <= 8192"),
    ("fedadg_disc_width", 8193, "is out of range; allowed: >= 1 and <= 8192"),
    ("fedadg_soft_label", 0.0, "is out of range; allowed: > 0 and <= 1"),
    ("fedadg_label_smoothing", 1.0, "is out of range; allowed: >= 0 and < 1"),
    ("fedadg_order", "gen_first", "is not allowed; allowed: disc_first, model_first"),
    ("fedadg_gen_loss", "fixed", "is not allowed; allowed: squared, frozen"),
])
def test_bad_values_are_one_line(field, value, allowed):
    shown = repr(value) if isinstance(value, str) else (f"{value:.1f}" if isinstance(value, float) else str(value))
    with pytest.raises(ConfigError) as err:
        _cfg(**{field: value})
    assert str(err.value) == f"field '{field}' (client method fedadg): {shown} {allowed}"
