"""FedAvg's ``client_weighting`` (docs/methods-baselines.md §7.4, §8.5) and the presets' own defaults: FedSR's
and FedIIR's authors average the clients' models uniformly (FedSR ``sum(ps)/len(ps)``, FedIIR
``torch.div(..., num_client)``), so the presets ``fedsr`` and ``fediir`` run the uniform mean;
FedOMG's authors weight by examples (``Cal_Weight_Dict``), so ``fedsr-omg`` / ``fediir-omg`` keep
them. Checked against a float64 reference of the authors' averages on 3 clients of 30/25/55."""

from __future__ import annotations

import numpy as np
import pytest

from fedtune.algorithms import SERVER_RULES
from fedtune.algorithms.presets import PRESETS
from fedtune.algorithms.server.aggregate import fedavg_weights
from fedtune.algorithms.server.rule import RoundInfo
from fedtune.config import FederatedRunConfig
from fedtune.errors import ConfigError

SIZES = (30, 25, 55)

# Every preset whose own defaults make FedAvg's mean uniform (its authors' plain mean), and the
# presets that run the same client methods under a rule without ``client_weighting`` (FedOMG's).
UNIFORM_PRESETS = [n for n, p in PRESETS.items() if dict(p.defaults).get("client_weighting") == "uniform"]
UNWEIGHTED_RULE_PRESETS = [
    n for n, p in PRESETS.items()
    if p.client_method in {PRESETS[u].client_method for u in UNIFORM_PRESETS}
    and "client_weighting" not in {h.name for h in SERVER_RULES.spec(p.server_rule).hparams}]


def _cfg(**values) -> FederatedRunConfig:
    return FederatedRunConfig.from_dict({"backend": "local", "dataset": "rect4", "model": "mlp", **values})


def _round(seed=0, m=9, s=4):
    rng = np.random.default_rng(seed)
    theta = rng.standard_normal(m).astype(np.float32)
    updates = rng.standard_normal((3, m)).astype(np.float32)
    buffers = rng.standard_normal((3, s)).astype(np.float32)
    return theta, updates, buffers


def _authors_mean(theta, updates, buffers):
    """The authors' aggregation in float64: the plain mean of the client models' state (parameters
    θ + Δ_u and buffers), ``sum(ps) / len(ps)``."""
    models = [theta.astype(np.float64) + u.astype(np.float64) for u in updates]
    return sum(models) / len(models), sum(b.astype(np.float64) for b in buffers) / len(buffers)


def _aggregate(cfg, theta, updates, buffers):
    rule = cfg.resolved.server_rule(cfg, None)
    info = RoundInfo((0, 1, 2), ("source",) * 3, (1,) * 3, SIZES)
    p = fedavg_weights(np.array(SIZES))
    params = rule.aggregate(theta, updates, p, extras=[{}] * 3, round=1, info=info).params
    return params, rule.aggregate_buffers(np.zeros(buffers.shape[1], np.float32), buffers, p, info=info)


@pytest.mark.parametrize("algorithm", UNIFORM_PRESETS)
def test_fedsr_and_fediir_presets_average_the_models_uniformly_as_their_authors(algorithm):
    cfg = _cfg(algorithm=algorithm)
    assert cfg.params["client_weighting"] == "uniform" and cfg.hyperparameters()["client_weighting"] == "uniform"
    theta, updates, buffers = _round()
    params, bufs = _aggregate(cfg, theta, updates, buffers)
    ref_params, ref_buffers = _authors_mean(theta, updates, buffers)
    np.testing.assert_allclose(params, ref_params, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(bufs, ref_buffers, rtol=1e-6, atol=1e-6)
    # the example weights 0.27/0.23/0.5 are far from it: the test tells the two apart
    weighted = theta.astype(np.float64) + (np.array(SIZES)[:, None] / 110 * updates.astype(np.float64)).sum(0)
    assert np.abs(weighted - ref_params).max() > 0.05


def test_fedavg_keeps_the_example_weights_and_either_preset_can_switch():
    theta, updates, buffers = _round(1)
    p = np.array(SIZES, np.float64) / sum(SIZES)
    expected = theta.astype(np.float64) + (p[:, None] * updates.astype(np.float64)).sum(0)
    for cfg in (_cfg(algorithm="fedavg"), _cfg(algorithm="fedsr", client_weighting="examples")):
        params, bufs = _aggregate(cfg, theta, updates, buffers)
        np.testing.assert_allclose(params, expected, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(bufs, (p[:, None] * buffers.astype(np.float64)).sum(0), rtol=1e-6, atol=1e-6)
    uniform, _ = _aggregate(_cfg(algorithm="fedavg", client_weighting="uniform"), theta, updates, buffers)
    np.testing.assert_allclose(uniform, _authors_mean(theta, updates, buffers)[0], rtol=1e-6, atol=1e-6)


def test_the_omg_presets_keep_fedomgs_example_weights_and_the_default_changes_the_trial_id():
    assert UNWEIGHTED_RULE_PRESETS
    for algorithm in UNWEIGHTED_RULE_PRESETS:
        cfg = _cfg(algorithm=algorithm)
        assert "client_weighting" not in cfg.params and "client_weighting" not in cfg.hyperparameters()
    # an overridden rule that does not declare it: the preset's default is not applied
    assert "client_weighting" not in _cfg(algorithm="fedsr", server_rule="fedomg").params
    # the uniform default is what fedsr computes now: a trial id of its own
    assert _cfg(algorithm="fedsr").trial_id() != _cfg(algorithm="fedsr", client_weighting="examples").trial_id()
    assert _cfg(algorithm="fedsr").trial_id() == _cfg(algorithm="fedsr", client_weighting="uniform").trial_id()


def test_every_preset_default_is_an_allowed_value_of_a_hyperparameter_its_pair_declares():
    for name, preset in PRESETS.items():
        for key, value in preset.defaults:
            cfg = _cfg(algorithm=name)
            spec = cfg.resolved.hparam_specs()[key]
            assert spec.check(value, name) == value and cfg.params[key] == value


@pytest.mark.parametrize("values,field", [({"algorithm": "fedavg", "client_weighting": "size"}, "client_weighting"),
                                          ({"algorithm": "fedsr", "client_weighting": 1}, "client_weighting"),
                                          ({"algorithm": "fedomg", "client_weighting": "uniform"}, "client_weighting")])
def test_bad_client_weighting_is_one_config_error_line(values, field):
    with pytest.raises(ConfigError) as err:
        _cfg(**values)
    msg = str(err.value)
    assert f"field '{field}'" in msg and "\n" not in msg
    assert "examples, uniform" in msg or "does not use" in msg


def test_fedavg_declares_the_weighting_as_a_variant():
    spec = {h.name: h for h in SERVER_RULES.spec("fedavg").hparams}["client_weighting"]
    assert spec.variant and spec.default == "examples" and spec.choices == ("examples", "uniform")
