"""FedSR client method and its probabilistic head (fedtune/algorithms/client/fedsr.py, fedtune/models.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedtune.algorithms import CLIENT_METHODS, own_knobs
from fedtune.algorithms.presets import PRESETS
from fedtune.algorithms.client.method import SGD, ClientContext
from fedtune.algorithms.client.fedsr import PRIOR_STATE_KEYS, FedSR
from fedtune.config import FederatedRunConfig
from fedtune.errors import ConfigError
from fedtune.layout import FlatLayout
from fedtune.model_heads import EVAL_NOISE_SEED, ProbabilisticHead, probabilistic_head, recording_draws
from fedtune.models import build_model, check_model_size, encode
from fedtune.runtime.examples import TensorExamples


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _cfg(**values) -> FederatedRunConfig:
    return FederatedRunConfig.from_dict({"backend": "local", "dataset": "rect4", "model": "mlp", "algorithm": "fedsr", **values})


def _ctx(model, x, y, cfg, state=None) -> ClientContext:
    return ClientContext(model=model, data=TensorExamples(x, y), cfg=cfg, round=1, client_id=2, role="source",
                         generator=torch.Generator().manual_seed(7), device=torch.device("cpu"),
                         state={} if state is None else state)


def _tiny_model() -> torch.nn.Module:
    """A linear probabilistic model: 3 inputs -> (mu, pre-sigma) of z in R^2 -> 3 classes, every
    weight set by hand (prior and C not at their initial values)."""
    model = build_model("mlp", input_shape=(3,), num_classes=3, mlp_hidden=[], head="probabilistic", z_dim=2)
    head = probabilistic_head(model)
    with torch.no_grad():
        head.dist.weight.copy_(torch.tensor([[0.5, -0.2, 0.1], [0.3, 0.4, -0.6], [0.2, 0.1, 0.3], [-0.4, 0.2, 0.5]]))
        head.dist.bias.copy_(torch.tensor([0.1, -0.2, 0.3, -0.1]))
        head.classifier.weight.copy_(torch.tensor([[1.0, -0.5], [0.2, 0.8], [-0.7, 0.3]]))
        head.classifier.bias.copy_(torch.tensor([0.05, -0.1, 0.0]))
        head.r_mu.copy_(torch.tensor([[0.2, -0.1], [0.0, 0.3], [-0.4, 0.5]]))
        head.r_sigma.copy_(torch.tensor([[0.5, 1.5], [-0.3, 0.8], [1.0, 0.2]]))
        head.z_scale.fill_(1.3)
    return model


X = torch.tensor([[1.0, 0.5, -1.0], [0.2, -0.3, 0.8], [-0.6, 1.2, 0.4], [0.9, 0.0, 0.3]])
Y = torch.tensor([0, 2, 2, 1])


def _reference(model, x, y, eps, form):
    """The paper's objective in float64 NumPy, from the model's weights and the noise ``eps``:
    CE + L2R + the closed-form KL(N(m1, v1) || N(m2, v2)) = 1/2 (v1/v2 + (m1-m2)^2/v2 - 1 + ln(v2/v1))."""
    head = probabilistic_head(model)
    w = {k: v.detach().double().numpy() for k, v in head.state_dict().items()}
    xs, ys, e = x.double().numpy(), y.numpy(), eps.double().numpy()
    out = xs @ w["dist.weight"].T + w["dist.bias"]
    mu, sigma = out[:, :2], np.log1p(np.exp(out[:, 2:]))
    z = mu + sigma * e
    logits = z @ w["classifier.weight"].T + w["classifier.bias"]
    logp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    ce = -logp[np.arange(len(ys)), ys].mean()
    l2 = (z ** 2).sum(1)
    l2r = l2.mean() if form == "squared" else np.sqrt(l2).mean()
    c = float(w["z_scale"])
    m1, v1 = c * mu, (c * sigma) ** 2
    m2, v2 = w["r_mu"][ys], np.log1p(np.exp(w["r_sigma"][ys])) ** 2
    kl = 0.5 * (v1 / v2 + (m1 - m2) ** 2 / v2 - 1.0 + np.log(v2 / v1))
    return ce, l2r, kl.sum(1).mean()


@pytest.mark.parametrize("form", ["squared", "norm"])
def test_objective_matches_a_float64_reference_of_the_papers_terms(form):
    model = _tiny_model().train()
    method = FedSR(_cfg(fedsr_l2r=0.3, fedsr_cmi=0.7, fedsr_l2r_form=form))
    torch.manual_seed(11)
    eps = torch.randn(4, 2)  # what the head's randn_like draws after the same seed
    torch.manual_seed(11)
    with recording_draws(model) as draws:
        obj, ce, l2r, cmi = method.objective(model, draws, X, Y)
        assert draws == []  # the step took its draw
    ce_ref, l2r_ref, cmi_ref = _reference(model, X, Y, eps, form)
    assert float(ce.detach()) == pytest.approx(ce_ref, rel=1e-5)
    assert l2r == pytest.approx(l2r_ref, rel=1e-5) and cmi == pytest.approx(cmi_ref, rel=1e-5)
    assert float(obj.detach()) == pytest.approx(ce_ref + 0.3 * l2r_ref + 0.7 * cmi_ref, rel=1e-5)
    assert cmi_ref > 0.1 and l2r_ref > 0.1  # the terms are not trivially zero here


def test_prior_parameters_get_gradient_for_the_batch_classes_and_change_in_training():
    model = _tiny_model().train()
    method = FedSR(_cfg(fedsr_l2r=0.0, fedsr_cmi=0.5))
    head = probabilistic_head(model)
    torch.manual_seed(0)
    with recording_draws(model) as draws:
        obj, *_ = method.objective(model, draws, X[:2], Y[:2])  # classes 0 and 2 only
    obj.backward()
    assert head.r_mu.grad[[0, 2]].abs().min() > 0 and head.r_sigma.grad[[0, 2]].abs().min() > 0
    assert torch.equal(head.r_mu.grad[1], torch.zeros(2)) and torch.equal(head.r_sigma.grad[1], torch.zeros(2))
    assert float(head.z_scale.grad) != 0.0
    before = [p.detach().clone() for p in (head.r_mu, head.r_sigma, head.z_scale)]
    model.zero_grad()
    torch.manual_seed(0)
    cfg = _cfg(fedsr_l2r=0.0, fedsr_cmi=0.5, local_steps=3, batch_size=4, weight_decay=0.0)
    out = FedSR(cfg).train(_ctx(model, X, Y, cfg))
    assert out.steps == 3 and math.isfinite(out.loss) and out.metrics["fedsr_cmi_term"] > 0
    after = (head.r_mu, head.r_sigma, head.z_scale)
    assert all(not torch.equal(a, b) for a, b in zip(before, after))


def _probabilistic_mlp(seed=0):
    torch.manual_seed(seed)
    return build_model("mlp", input_shape=(1, 8, 8), num_classes=4, mlp_hidden=[16], head="probabilistic", z_dim=6)


def _data(n=12, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 4, (n,), generator=g)


def test_zero_weights_train_bit_identically_to_plain_cross_entropy_on_the_same_model():
    x, y = _data()
    cfg0 = _cfg(fedsr_l2r=0.0, fedsr_cmi=0.0, local_steps=4, batch_size=5, weight_decay=5e-4)
    runs = {}
    for name, method, cfg in (("fedsr0", FedSR(cfg0), cfg0), ("ce", SGD(cfg0), cfg0),
                              ("fedsr", FedSR(_cfg(local_steps=4, batch_size=5, weight_decay=5e-4)), cfg0)):
        model = _probabilistic_mlp()
        torch.manual_seed(3)  # the sampling noise: the runtime seeds it per client and round
        out = method.train(_ctx(model, x, y, cfg))
        runs[name] = (out, [t.clone() for t in model.state_dict().values()])
    (o0, s0), (oc, sc), (_, s1) = runs["fedsr0"], runs["ce"], runs["fedsr"]
    assert o0.loss == oc.loss and o0.steps == oc.steps == 4
    assert all(torch.equal(a, b) for a, b in zip(s0, sc))
    assert o0.metrics == {"fedsr_l2r_term": 0.0, "fedsr_cmi_term": 0.0}
    assert any(not torch.equal(a, b) for a, b in zip(s0, s1))  # the regularisers change training


def test_eval_forward_is_the_classifier_on_the_mean_and_leaves_the_rng_alone():
    model = _tiny_model().eval()
    head = probabilistic_head(model)
    rng = torch.get_rng_state()
    with torch.no_grad():
        a, b = model(X), model(X)
        mu, _ = head.moments(X)
        expected = mu @ head.classifier.weight.T + head.classifier.bias
    assert torch.equal(a, b) and torch.allclose(a, expected, atol=1e-6)
    assert torch.equal(torch.get_rng_state(), rng)
    model.train()
    with torch.no_grad():
        assert not torch.equal(model(X), model(X))  # training samples z


def test_eval_samples_average_the_softmax_over_fixed_samples():
    model = _tiny_model()
    head = probabilistic_head(model)
    head.eval_samples = 5
    model.eval()
    with torch.no_grad():
        a, b = model(X), model(X)
        mu, sigma = (t.double().numpy() for t in head.moments(X))
    assert torch.equal(a, b)
    eps = torch.randn((5, 4, 2), generator=torch.Generator().manual_seed(EVAL_NOISE_SEED)).double().numpy()
    w, bias = head.classifier.weight.detach().double().numpy(), head.classifier.bias.detach().double().numpy()
    logits = (mu + sigma * eps) @ w.T + bias  # [S, B, K]
    probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    np.testing.assert_allclose(a.numpy(), np.log(probs.mean(0)), rtol=1e-5, atol=1e-6)
    assert not np.allclose(a.numpy(), np.log(np.exp(mu @ w.T + bias) / np.exp(mu @ w.T + bias).sum(-1, keepdims=True)))


@pytest.mark.parametrize("name,shape,features", [("mlp", (1, 8, 8), 16), ("cnn", (1, 16, 16), 512),
                                                 ("resnet18", (3, 32, 32), 512)])
def test_head_replaces_the_classifier_with_the_same_encoder_draws(name, shape, features):
    kw = dict(input_shape=shape, num_classes=5, mlp_hidden=[16], weights="none")
    torch.manual_seed(0)
    clf = build_model(name, **kw).eval()
    torch.manual_seed(0)
    prob = build_model(name, head="probabilistic", z_dim=7, **kw).eval()
    head = probabilistic_head(prob)
    assert (head.dist.in_features, head.dist.out_features) == (features, 14)
    assert (head.classifier.in_features, head.classifier.out_features) == (7, 5)
    assert head.r_mu.shape == head.r_sigma.shape == (5, 7) and head.z_scale.shape == ()
    clf_state = clf.state_dict()
    encoder = [k for k in prob.state_dict() if k in clf_state]
    assert len(encoder) == len(clf_state) - 2  # all but the replaced classifier's weight and bias
    assert all(torch.equal(prob.state_dict()[k], clf_state[k]) for k in encoder)
    x = torch.randn(2, *shape)
    with torch.no_grad():
        assert prob(x).shape == (2, 5)
        assert torch.equal(encode(prob, x), encode(clf, x))
    layout = FlatLayout.of(prob)
    assert layout.num_params == sum(p.numel() for p in prob.parameters())
    extra = (features * 14 + 14) + (7 * 5 + 5) + 2 * 5 * 7 + 1 - (features * 5 + 5)
    head_kw = {"head": "probabilistic", "z_dim": 7}
    expected = 0 if name == "resnet18" else layout.num_params
    assert check_model_size(name, shape, 5, [16], head_kw) == expected
    if name != "resnet18":
        assert check_model_size(name, shape, 5, [16], {}) == expected - extra


def test_the_runtime_builds_the_methods_head_from_its_hyperparameters():
    cfg = _cfg(algorithm="fedsr", fedsr_z_dim=9, fedsr_eval_samples=3)
    assert CLIENT_METHODS.spec("fedsr").head(cfg) == {"head": "probabilistic", "z_dim": 9, "eval_samples": 3}
    assert CLIENT_METHODS.spec("sgd").head(cfg) == {}
    assert CLIENT_METHODS.spec("simclr").head(cfg)["head"] == "projector"
    m = build_model("mlp", input_shape=(4,), num_classes=2, mlp_hidden=[3],
                    **CLIENT_METHODS.spec("fedsr").head(cfg))
    assert isinstance(m[-1], ProbabilisticHead) and m[-1].eval_samples == 3
    with pytest.raises(TypeError, match="probabilistic head"):
        FedSR(cfg).train(_ctx(build_model("mlp", input_shape=(4,), num_classes=2, mlp_hidden=[3]),
                              torch.zeros(4, 4), torch.zeros(4, dtype=torch.long), cfg))


def test_presets_and_own_knobs():
    assert (PRESETS["fedsr"].client_method, PRESETS["fedsr"].server_rule) == ("fedsr", "fedavg")
    assert (PRESETS["fedsr-omg"].client_method, PRESETS["fedsr-omg"].server_rule) == ("fedsr", "fedomg")
    assert own_knobs("fedsr")[:3] == ("fedsr_z_dim", "fedsr_l2r", "fedsr_cmi") and own_knobs("fedsr-omg")[-1] == "global_lr"


@pytest.mark.parametrize("field,value", [("fedsr_z_dim", 0), ("fedsr_z_dim", 2.5), ("fedsr_z_dim", "wide"),
                                         ("fedsr_l2r", -0.1), ("fedsr_cmi", "x"), ("fedsr_l2r_form", "cube"),
                                         ("fedsr_prior", "global"), ("fedsr_eval_samples", -1)])
def test_bad_hyperparameters_are_one_config_error_line(field, value):
    with pytest.raises(ConfigError) as err:
        _cfg(algorithm="fedsr", **{field: value})
    msg = str(err.value)
    assert f"field '{field}'" in msg and "\n" not in msg and ("allowed" in msg or "expected" in msg)


def test_local_prior_stays_on_the_client_and_sends_no_update():
    x, y = _data()
    cfg_local = _cfg(fedsr_prior="local", fedsr_cmi=0.1, local_steps=3, batch_size=6)
    cfg_fed = _cfg(fedsr_cmi=0.1, local_steps=3, batch_size=6)
    fed, local, state = _probabilistic_mlp(), _probabilistic_mlp(), {}
    received = [p.detach().clone() for p in (probabilistic_head(local).r_mu, probabilistic_head(local).r_sigma)]
    for model, cfg, st in ((fed, cfg_fed, {}), (local, cfg_local, state)):
        torch.manual_seed(4)
        FedSR(cfg).train(_ctx(model, x, y, cfg, st))
    head_f, head_l = probabilistic_head(fed), probabilistic_head(local)
    # round 1: the same training; the local run hands back the prior it received and keeps its own
    for (name, pf), (_, pl) in zip(fed.named_parameters(), local.named_parameters()):
        if name.rsplit(".", 1)[-1] in ("r_mu", "r_sigma", "z_scale"):
            continue
        assert torch.equal(pf, pl), name
    assert torch.equal(head_l.r_mu, received[0]) and torch.equal(head_l.r_sigma, received[1])
    assert set(PRIOR_STATE_KEYS) <= set(state) and all(state[k].dtype == np.float32 for k in PRIOR_STATE_KEYS)
    np.testing.assert_array_equal(state["fedsr.r_mu"], head_f.r_mu.detach().numpy())
    # round 2 starts from the client's own prior, not the global one
    kept = state["fedsr.r_mu"].copy()
    torch.manual_seed(5)
    FedSR(cfg_local).train(_ctx(local, x, y, cfg_local, state))
    assert torch.equal(head_l.r_mu, received[0]) and not np.array_equal(state["fedsr.r_mu"], kept)


def test_two_rounds_end_to_end_are_finite_and_differ_from_zero_weights(tmp_path):
    from fedtune.runtime.driver import run

    base = {"dataset": "rect4", "model": "mlp", "mlp_hidden": [32], "rounds": 2, "local_steps": 2, "backend": "local",
            "fedsr_z_dim": 8}
    rows = run(FederatedRunConfig.from_dict({**base, "algorithm": "fedsr", "output": str(tmp_path / "a")}),
               progress=False).rows
    zero = run(FederatedRunConfig.from_dict({**base, "algorithm": "fedsr", "fedsr_l2r": 0.0, "fedsr_cmi": 0.0,
                                             "output": str(tmp_path / "b")}), progress=False).rows
    assert [r["status"] for r in rows] == ["ok", "ok"]
    keys = ("train_loss", "val_loss", "target_loss", "diag.fedsr_l2r_term", "diag.fedsr_cmi_term")
    assert all(math.isfinite(r[k]) for r in rows for k in keys)
    assert all(r["diag.fedsr_l2r_term"] > 0 and r["diag.fedsr_cmi_term"] > 0 for r in rows)
    assert rows[-1]["val_loss"] != zero[-1]["val_loss"]
    assert rows[0]["client_method"] == "fedsr" and rows[0]["hp.fedsr_prior"] == "federated"
