"""SimCLR client method, encoder features, and the ufdg linear-probe evaluation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedtune.runtime.examples import TensorExamples
from fedtune.algorithms import CLIENT_METHODS, SERVER_SIDES, resolve
from fedtune.algorithms.presets import PRESETS
from fedtune.algorithms.client.method import ClientContext
from fedtune.algorithms.client.simclr import (
    GalaSimCLR,
    SimCLR,
    SimCLRLoss,
    augment,
    nt_xent,
    two_views,
)
from fedtune.errors import ConfigError
from fedtune.config import FederatedRunConfig
from fedtune.data.base import ClientSpec, FederatedPlan
from fedtune.models import build_model, encode
from fedtune.runtime.driver import run
from fedtune.runtime.evaluation import LinearProbe, probe_metrics
from fedtune.runtime.messages import EvalReply, FeatureSet, eval_shards

METRICS = ("train_loss", "val_acc", "val_loss", "target_acc", "target_loss")


def ufdg_cfg(tmp_path, **kw) -> FederatedRunConfig:
    base = {"algorithm": "simclr", "setting": "ufdg", "dataset": "rotated-digits", "model": "mlp", "mlp_hidden": [32],
            "simclr_proj_dim": 16, "rounds": 2, "local_steps": 2, "batch_size": 16, "backend": "local",
            "probe_fraction": 0.2, "output": str(tmp_path)}
    base.update(kw)
    return FederatedRunConfig.from_dict(base)


# ------------------------------------------------------------------------------------- NT-Xent
def test_nt_xent_two_pairs_by_hand():
    # Views a1=(1,0), a2=(0,1); b1=(3,4) (normalised: (0.6,0.8)), b2=(0,2) (normalised: (0,1)); tau=0.5.
    z1 = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    z2 = torch.tensor([[3.0, 4.0], [0.0, 2.0]])
    e = math.exp
    # Per anchor: log(sum over the 3 others of exp(cos/tau)) - cos(anchor, positive)/tau.
    l_a1 = math.log(e(0.0) + e(1.2) + e(0.0)) - 1.2  # a2: 0, b1: 0.6 (pos), b2: 0
    l_a2 = math.log(e(0.0) + e(1.6) + e(2.0)) - 2.0  # a1: 0, b1: 0.8, b2: 1 (pos)
    l_b1 = math.log(e(1.2) + e(1.6) + e(1.6)) - 1.2  # a1: 0.6 (pos), a2: 0.8, b2: 0.8
    l_b2 = math.log(e(0.0) + e(2.0) + e(1.6)) - 2.0  # a1: 0, a2: 1 (pos), b1: 0.8
    expected = (l_a1 + l_a2 + l_b1 + l_b2) / 4
    assert float(nt_xent(z1, z2, 0.5)) == pytest.approx(expected, rel=1e-6)
    # Symmetric in the two views.
    assert float(nt_xent(z2, z1, 0.5)) == pytest.approx(expected, rel=1e-6)
    with pytest.raises(ValueError, match="temperature"):
        nt_xent(z1, z2, 0.0)


def test_nt_xent_is_smaller_when_the_views_coincide():
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        z = torch.randn(8, 16, generator=g)
        same = float(nt_xent(z, z, 0.5))
        other = float(nt_xent(z, torch.randn(8, 16, generator=g), 0.5))
        assert same < other
    # Coinciding, mutually orthogonal views reach the minimum for 2B = 4 anchors:
    # log(e^{1/tau} + 2) - 1/tau (positive cosine 1, negatives 0).
    eye = torch.eye(2, 4)
    assert float(nt_xent(eye, eye, 0.5)) == pytest.approx(math.log(math.exp(2.0) + 2) - 2.0, rel=1e-6)


# ---------------------------------------------------------------------------------- augmentations
def test_views_are_random_reproducible_and_keep_the_shape():
    x = torch.randn(6, 3, 16, 16)
    v1, v2 = two_views(x, torch.Generator().manual_seed(1))
    w1, w2 = two_views(x, torch.Generator().manual_seed(1))
    assert v1.shape == x.shape and torch.equal(v1, w1) and torch.equal(v2, w2)
    assert not torch.allclose(v1, v2) and not torch.allclose(v1, x)
    grey = augment(torch.randn(4, 1, 12, 12), torch.Generator().manual_seed(0))
    assert grey.shape == (4, 1, 12, 12) and torch.isfinite(grey).all()
    vec = torch.randn(32, 2)
    noisy = augment(vec, torch.Generator().manual_seed(0))
    assert noisy.shape == vec.shape and 0 < float((noisy - vec).abs().max()) < 1.0
    with pytest.raises(ValueError, match="images"):
        augment(torch.zeros(3), torch.Generator())


# ---------------------------------------------------------------------------------------- models
@pytest.mark.parametrize("name,shape", [("mlp", (1, 8, 8)), ("cnn", (1, 16, 16)), ("resnet18", (3, 32, 32))])
def test_encode_is_the_input_of_the_head_and_projector_keeps_the_encoder(name, shape):
    torch.manual_seed(0)
    clf = build_model(name, input_shape=shape, num_classes=5, mlp_hidden=[12]).eval()
    torch.manual_seed(0)
    proj = build_model(name, input_shape=shape, num_classes=5, mlp_hidden=[12], head="projector", proj_dim=7).eval()
    x = torch.randn(3, *shape)
    with torch.no_grad():
        h = encode(clf, x)
        head = {"mlp": lambda m: m[-1], "cnn": lambda m: m.classifier[-1], "resnet18": lambda m: m.fc}[name]
        torch.testing.assert_close(head(clf)(h), clf(x))  # the classifier reads exactly the encoder features
        assert proj(x).shape == (3, 7)
        torch.testing.assert_close(encode(proj, x), h)  # same seed => same encoder
    # The projector is an MLP features -> features -> proj_dim in the flat weights (federated).
    d = h.shape[1]
    widths = [tuple(p.shape) for p in head(proj).parameters()]
    assert widths == [(d, d), (d,), (7, d), (7,)]
    names = [n for n, _ in proj.named_parameters()]
    assert names[:-4] == [n for n, _ in clf.named_parameters()][:-2]


def test_build_model_refuses_unknown_heads():
    with pytest.raises(ValueError, match="head"):
        build_model("mlp", input_shape=(4,), num_classes=2, head="decoder")


# -------------------------------------------------------------------------------- client method
def _ctx(model, x, y, cfg, seed=0, record_step=lambda params, grads: None):
    return ClientContext(model=model, data=TensorExamples(x, y), cfg=cfg, round=1, client_id=0, role="source",
                         generator=torch.Generator().manual_seed(seed), device=torch.device("cpu"),
                         record_step=record_step)


def _tiny(seed=0):
    torch.manual_seed(seed)
    return build_model("mlp", input_shape=(1, 8, 8), num_classes=3, mlp_hidden=[16], head="projector", proj_dim=8)


def test_simclr_never_reads_labels_and_calls_record_step():
    cfg = FederatedRunConfig.from_dict({"algorithm": "simclr", "setting": "ufdg", "local_steps": 4, "batch_size": 8,
                               "simclr_temperature": 0.3})
    x = torch.randn(20, 1, 8, 8)
    y = torch.arange(20) % 3
    trained = []
    for labels in (y, torch.zeros_like(y), y[torch.randperm(20)]):
        model, calls = _tiny(), []
        out = SimCLR(cfg).train(_ctx(model, x, labels, cfg, record_step=lambda p, g, calls=calls: calls.append(1)))
        assert out.steps == 4 and len(calls) == 4 and math.isfinite(out.loss)
        trained.append(torch.cat([p.detach().reshape(-1) for p in model.parameters()]))
    assert torch.equal(trained[0], trained[1]) and torch.equal(trained[0], trained[2])
    start = torch.cat([p.detach().reshape(-1) for p in _tiny().parameters()])
    assert not torch.equal(trained[0], start)  # it did train
    # The loss helper on the trained weights equals nt_xent of the two views' projections.
    model = _tiny()
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    v1, v2 = two_views(x[:8], g2)
    z1, z2 = model(torch.cat([v1, v2])).chunk(2)
    assert float(SimCLRLoss(0.3)(model, x[:8], g1).detach()) == pytest.approx(float(nt_xent(z1, z2, 0.3).detach()),
                                                                          rel=1e-6)


def test_simclr_stops_on_a_non_finite_loss():
    cfg = FederatedRunConfig.from_dict({"algorithm": "simclr", "setting": "ufdg", "local_steps": 5, "batch_size": 8})
    model = _tiny()
    with torch.no_grad():
        next(model.parameters())[0, 0] = float("nan")
    out = SimCLR(cfg).train(_ctx(model, torch.randn(16, 1, 8, 8), torch.zeros(16, dtype=torch.long), cfg))
    assert not math.isfinite(out.loss) and out.steps == 1


def test_registration_hparams_and_settings(tmp_path):
    assert CLIENT_METHODS["simclr"] is SimCLR and not CLIENT_METHODS.spec("simclr").supervised
    assert PRESETS["simclr"].client_method == "simclr" and PRESETS["simclr"].settings == ("ufdg",)
    assert resolve(ufdg_cfg(tmp_path)).settings == ("ufdg",)
    with pytest.raises(ConfigError, match="simclr_temperature"):
        ufdg_cfg(tmp_path, simclr_temperature=0)
    with pytest.raises(ConfigError, match="simclr_proj_dim"):
        ufdg_cfg(tmp_path, simclr_proj_dim=0)
    # The preset in a labelled setting is refused before anything runs, naming the setting.
    for setting in ("fdg", None):
        with pytest.raises(ConfigError, match="field 'setting'.*'fdg'.*allowed: ufdg"):
            run(ufdg_cfg(tmp_path, setting=setting), progress=False)
    assert not (tmp_path / "default").exists()


# ---------------------------------------------------------------------------------------- probe
def test_linear_probe_on_a_separable_toy_set_is_near_perfect_and_deterministic():
    rng = np.random.default_rng(0)
    centres = rng.normal(0, 4, size=(3, 10))
    y = np.repeat(np.arange(3), 60)
    x = centres[y] + rng.normal(0, 1, size=(180, 10))
    fit, test = np.arange(180) % 2 == 0, np.arange(180) % 2 == 1
    probe = LinearProbe.fit(x[fit], y[fit])
    counts = probe.counts(x[test], y[test])
    assert counts.count == 90 and counts.acc >= 0.97
    again = LinearProbe.fit(x[fit].copy(), y[fit].copy())
    np.testing.assert_array_equal(again.proba(x[test])[1], probe.proba(x[test])[1])
    # One class: the constant predictor; no data or non-finite features: no probe.
    const = LinearProbe.fit(x[:5], np.full(5, 2))
    assert const.counts(x[:4], np.array([2, 2, 1, 2])).correct == 3
    assert LinearProbe.fit(x[:0], y[:0]) is None
    bad = x[:6].copy()
    bad[0, 0] = np.nan
    assert LinearProbe.fit(bad, y[:6]) is None


def _feature_plan():
    """Two source clients (domains a, b) with 4 val examples each, a target domain t."""
    clients = tuple(ClientSpec(i, f"{d}#0", "source", d, train={d: np.arange(4)}, val={d: np.arange(4)})
                    for i, d in enumerate("ab"))
    return FederatedPlan("ufdg", clients, ("a", "b"), ("t",), target_test={"t": np.arange(6)},
                         target_probe={"t": np.arange(4)})


def test_probe_metrics_fit_on_even_and_score_on_odd_validation_positions():
    plan = _feature_plan()
    shards = eval_shards(plan, shard_size=3)
    assert [(s.shard_id, s.split, len(s.indices)) for s in shards] == [(0, "test", 3), (1, "test", 3), (2, "probe", 3),
                                                                     (3, "probe", 1)]
    e0, e1 = np.array([1.0, 0.0]), np.array([0.0, 1.0])
    # Even positions: class 0 at e0, class 1 at e1. Odd positions (client b): the same points, labels swapped.
    val_a = FeatureSet(np.stack([e0, e0, e1, e1]), np.array([0, 0, 1, 1]))
    val_b = FeatureSet(np.stack([e0, e1, e1, e0]), np.array([0, 0, 1, 1]))
    tgt = lambda cls: FeatureSet(np.stack([e0 if c == 0 else e1 for c in cls]), np.array(cls))
    feats = {0: tgt([0, 1, 0]), 1: tgt([1, 1, 0]), 2: tgt([0, 1, 0]), 3: tgt([1])}
    one = EvalReply([0, 1], [], [], shard_ids=[0, 1, 2, 3], shard_features=[feats[i] for i in range(4)],
                    val_features=[val_a, val_b])
    # The same features spread over two workers (client c and shard s on worker c % 2, s % 2).
    two = [EvalReply([0], [], [], shard_ids=[0, 2], shard_features=[feats[0], feats[2]], val_features=[val_a]),
           EvalReply([1], [], [], shard_ids=[1, 3], shard_features=[feats[1], feats[3]], val_features=[val_b])]
    m = probe_metrics([one], plan, shards)
    assert m == probe_metrics(two, plan, shards) == probe_metrics(two[::-1], plan, shards)
    # Odd positions: a -> (e0: 0 ✓, e1: 1 ✓), b -> (e1 labelled 0 ✗, e0 labelled 1 ✗).
    assert m["val_acc.a"] == 1.0 and m["val_acc.b"] == 0.0 and m["val_acc"] == 0.5
    assert m["target_acc"] == m["target_acc.t"] == 1.0
    assert m["target_loss"] < m["val_loss"]


# ------------------------------------------------------------------------------------ end to end
def test_simclr_ufdg_run_reports_probe_accuracies(tmp_path):
    res = run(ufdg_cfg(tmp_path), progress=False)
    assert res.status == "completed" and len(res.rows) == 2
    last = res.rows[-1]
    assert last["client_method"] == "simclr" and last["setting"] == "ufdg"
    assert {f"val_acc.{d}" for d in ("15", "30", "45", "60", "75")} <= set(last)
    for row in res.rows:
        for key in ("val_acc", "target_acc", "target_acc.0"):
            assert 0.0 <= row[key] <= 1.0
        assert math.isfinite(row["target_loss"]) and math.isfinite(row["train_loss"])
    # Linear probes on the federated encoder's features beat chance (10 classes) by far.
    assert last["target_acc"] > 0.3 and last["val_acc"] > 0.3


def test_fedgala_in_ufdg_runs_gated_simclr(tmp_path):
    assert CLIENT_METHODS["gala-simclr"] is GalaSimCLR and "gala-simclr" in SERVER_SIDES
    cfg = ufdg_cfg(tmp_path, algorithm="fedgala", gala_tau=0.0, rounds=2, local_steps=3)
    assert resolve(cfg).client_method is GalaSimCLR
    res = run(cfg, progress=False)
    assert res.status == "completed"
    skipped = [r["diag.gala_skipped"] for r in res.rows]
    assert skipped[0] == 0.0 and 0.0 <= skipped[1] <= 1.0  # no global move (no gate) in round 1
    assert 0.0 <= res.rows[-1]["target_acc"] <= 1.0


def test_the_probe_never_imports_torch():
    # The coordinator process is NumPy-only: fitting and scoring a probe must not pull in torch.
    code = ("import sys, numpy as np\nfrom fedtune.runtime.evaluation import LinearProbe\n"
            "x = np.random.default_rng(0).normal(size=(20, 4)); y = np.arange(20) % 2\n"
            "LinearProbe.fit(x, y).counts(x, y)\nprint('torch' in sys.modules)")
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
