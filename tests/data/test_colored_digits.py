"""``colored-digits`` (DomainBed's ColoredMNIST on the embedded digits) and ``target_lr_scale``
(the FDA target client's learning rate, seed 002's 1/5 of the sources')."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedtune.algorithms import LOCAL_OPTIMIZERS
from fedtune.algorithms.client.method import SGD, ClientContext
from fedtune.algorithms.server.fedgp import FedDA
from fedtune.algorithms.server.rule import RoundInfo
from fedtune.config import FederatedRunConfig
from fedtune.data.colored_digits import ColoredDigits
from fedtune.data.digits import read_digits, render
from fedtune.data.registry import get_dataset, list_datasets
from fedtune.errors import ConfigError, DataError
from fedtune.layout import FlatLayout, TensorSlot
from fedtune.runtime.driver import FederatedRun, run

# DomainBed's ColoredMNIST: probability that the colour agrees with the (noisy) label, per domain
AGREE = {"+90%": 0.9, "+80%": 0.8, "-90%": 0.1}


# ================================================================================ the dataset
def test_domains_partition_the_digits_with_domainbeds_label_noise_and_colour_correlations():
    d = get_dataset("colored-digits", data_seed=0)
    assert d.info.domains == ("+90%", "+80%", "-90%") and d.info.classes == ("0", "1")
    assert d.info.input_shape == (2, 28, 28) and d.info.num_classes == 2
    _, digits = read_digits()
    members = [d.members(n) for n in d.info.domains]
    assert [len(m) for m in members] == [599, 599, 599]
    assert np.array_equal(np.sort(np.concatenate(members)), np.arange(1797))  # disjoint, all of them
    for name, m in zip(d.info.domains, members):
        y, c = d.labels(name), d.colors(name)
        clean = (digits[m] < 5).astype(np.int64)  # DomainBed: label 1 = digit 0-4, before noise
        assert set(np.unique(y)) <= {0, 1} and set(np.unique(c)) <= {0, 1}
        noise = float(np.mean(y != clean))
        agree = float(np.mean(c == y))
        # 599 draws: binomial standard deviations 0.018 (noise) and <= 0.017 (colour); 3.5 sd
        assert abs(noise - 0.25) < 0.065, (name, noise)
        assert abs(agree - AGREE[name]) < 0.06, (name, agree)


def test_load_gives_two_channel_images_with_the_digit_in_the_colour_channel():
    d = ColoredDigits(data_seed=3)
    images, _ = read_digits()
    idx = np.array([0, 5, 17, 598])
    x, y = d.load("-90%", idx)
    assert x.shape == (4, 2, 28, 28) and x.dtype == np.float32 and x.flags.c_contiguous
    assert y.dtype == np.int64 and np.array_equal(y, d.labels("-90%")[idx])
    colors = d.colors("-90%")[idx]
    # reference: rotated-digits' rendering at 0 degrees, mapped back from [-1, 1] to [0, 1]
    ref = render(images[d.members("-90%")[idx]], 0)[:, 0] * 0.5 + 0.5
    for k in range(4):
        np.testing.assert_allclose(x[k, colors[k]], ref[k], atol=1e-6)
        assert not x[k, 1 - colors[k]].any()  # the other channel is zeroed
    assert x.min() >= 0.0 and x.max() <= 1.0
    assert d.load("+80%", np.array([], np.int64))[0].shape == (0, 2, 28, 28)
    with pytest.raises(DataError, match="colored-digits domain '\\+90%'"):
        d.load("+90%", np.array([599]))
    with pytest.raises(DataError):
        d.labels("+70%")


def test_construction_is_deterministic_for_data_seed():
    a, b, c = ColoredDigits(data_seed=7), ColoredDigits(data_seed=7), ColoredDigits(data_seed=8)
    for n in a.info.domains:
        assert np.array_equal(a.members(n), b.members(n))
        assert np.array_equal(a.labels(n), b.labels(n)) and np.array_equal(a.colors(n), b.colors(n))
    assert np.array_equal(a.load("+80%", np.arange(6))[0], b.load("+80%", np.arange(6))[0])
    assert not all(np.array_equal(a.labels(n), c.labels(n)) for n in a.info.domains)


def test_registry_lists_it_and_refuses_another_image_size():
    entries = {e.name: e for e in list_datasets()}
    assert "colored-digits" in entries and not entries["colored-digits"].needs_root
    assert get_dataset("colored_digits").info.name == "colored-digits"
    assert get_dataset("colored-digits", image_size=28).info.input_shape == (2, 28, 28)
    with pytest.raises(DataError, match="fixed image size 28"):
        get_dataset("colored-digits", image_size=32)


# ================================================================================ target_lr_scale
def test_target_lr_scale_bad_values_are_one_line_errors():
    for bad, msg in ((0, "out of range; allowed: > 0"), (-0.2, "out of range; allowed: > 0"),
                     ("fast", "expected a number"), (math.inf, "not a finite number")):
        with pytest.raises(ConfigError, match=f"field 'target_lr_scale'.*{msg}") as e:
            FederatedRunConfig.from_dict({"target_lr_scale": bad})
        assert "\n" not in str(e.value)
    # the default is left out of the trial id: studies written before the field keep their ids
    assert (FederatedRunConfig.from_dict({}).trial_id()
            == FederatedRunConfig.from_dict({"target_lr_scale": 1.0}).trial_id()
            != FederatedRunConfig.from_dict({"target_lr_scale": 0.2}).trial_id())


def _ctx(cfg, role: str) -> ClientContext:
    model = torch.nn.Linear(3, 2)
    return ClientContext(model=model, data=None, cfg=cfg, round=1, client_id=0, role=role,
                         generator=torch.Generator(), device=torch.device("cpu"))


@pytest.mark.parametrize("optimizer", LOCAL_OPTIMIZERS)
def test_only_the_target_client_trains_at_the_scaled_rate(optimizer):
    cfg = FederatedRunConfig.from_dict({"setting": "fda", "local_lr": 0.05, "target_lr_scale": 0.2,
                                        "local_optimizer": optimizer, "backend": "local"})
    method = SGD(cfg)
    assert method.start_round(_ctx(cfg, "target")).lr == pytest.approx(0.01, rel=1e-15)
    assert method.start_round(_ctx(cfg, "source")).lr == 0.05
    plain = FederatedRunConfig.from_dict({"setting": "fda", "local_lr": 0.05, "backend": "local"})
    assert SGD(plain).start_round(_ctx(plain, "target")).lr == 0.05


def _layout(*sizes: int) -> FlatLayout:
    slots, off = [], 0
    for k, n in enumerate(sizes):
        slots.append(TensorSlot(f"t{k}", (n,), off, n, True))
        off += n
    return FlatLayout(tuple(slots), off, off)


def test_fedda_aligns_sources_with_the_learning_rate_ratio():
    # sources 0, 1 (steps 4, 8), target 2 (steps 2); lr_T/lr_S = 0.5: Δ̃_i = 0.5 · (2/steps_i) · Δ_i
    cfg = FederatedRunConfig.from_dict({"algorithm": "fedda", "setting": "fda", "backend": "local",
                                        "target_lr_scale": 0.5, "gp_beta": 0.5})
    updates = np.array([[4., 0.], [0., 8.], [1., 1.]], np.float32)
    info = RoundInfo((0, 1, 2), ("source", "source", "target"), (4, 8, 2), (30, 10, 60))
    res = FedDA(cfg, _layout(1, 1)).aggregate(np.zeros(2, np.float32), updates, np.array([0.3, 0.1, 0.6]),
                                               extras=[{}] * 3, round=1, info=info)
    alpha = np.array([0.75, 0.25])
    aligned = np.array([[4.0 * 0.5 * 2 / 4, 0.0], [0.0, 8.0 * 0.5 * 2 / 8]])
    expected = 0.5 * np.array([1.0, 1.0]) + 0.5 * (alpha[:, None] * aligned).sum(0)
    np.testing.assert_allclose(res.params, expected, rtol=1e-7)


def _fit(extra: dict, tmp_path, name: str):
    """One round's client replies and the weights after it (fda on colored-digits, plain SGD)."""
    cfg = FederatedRunConfig.from_dict({
        "dataset": "colored-digits", "setting": "fda", "target_domain": "-90%", "target_fraction": 0.05,
        "model": "mlp", "mlp_hidden": [16], "local_steps": 3, "batch_size": 4, "local_momentum": 0.0,
        "rounds": 1, "backend": "local", "output": str(tmp_path), "name": name, **extra})
    fr = FederatedRun(cfg)
    fr.start()
    try:
        coord = fr.coordinator
        ids = [c.client_id for c in coord.plan.clients]
        (reply,), _ = coord.pool.fit(coord.weights, {}, 1, ids)
        roles = {c.client_id: c.role for c in coord.plan.clients}
        theta = coord.weights.copy()
        result = fr.step()
        assert result.status == "ok"
        return reply, [roles[i] for i in reply.client_ids], theta, coord.weights.copy()
    finally:
        fr.close()


def test_target_lr_scale_in_a_run_scales_the_target_step_and_the_auto_beta_samples(tmp_path):
    base = {"algorithm": "fedda", "gp_beta": "auto"}
    r1, roles, theta, _ = _fit(base, tmp_path, "s1")
    r2, roles2, theta2, _ = _fit({**base, "target_lr_scale": 0.5}, tmp_path, "s2")
    assert roles == roles2 and roles.count("target") == 1 and np.array_equal(theta, theta2)
    t = roles.index("target")
    for u, role in enumerate(roles):
        if role == "source":  # the sources train exactly as before ...
            assert np.array_equal(r1.states[u], r2.states[u])
            # ... and their mean raw step is recorded at the target's rate: s_i = (lr_T/lr_S)·mean(−lr_S ∇)
            np.testing.assert_allclose(r2.extras[u]["mean_step_update"], 0.5 * r1.extras[u]["mean_step_update"],
                                       rtol=1e-6, atol=1e-12)
    # the target's first step is taken at θ by both runs: the same gradient, half the step
    s1, s2 = r1.extras[t]["step_updates"], r2.extras[t]["step_updates"]
    assert s1.shape[0] == s2.shape[0] == 3
    np.testing.assert_allclose(s2[0], 0.5 * s1[0], rtol=1e-6, atol=1e-12)
    P = s1.shape[1]
    np.testing.assert_allclose(r2.states[t][:P] - theta[:P], s2.sum(0), rtol=1e-4, atol=1e-6)  # plain SGD
    assert not np.allclose(r1.states[t], r2.states[t])


def test_target_lr_scale_one_is_bit_identical_to_the_default(tmp_path):
    base = {"dataset": "colored-digits", "setting": "fda", "target_domain": "+80%", "target_fraction": 0.05,
            "model": "mlp", "mlp_hidden": [16], "local_steps": 3, "batch_size": 4, "rounds": 2,
            "local_optimizer": "adam", "local_lr": 1e-3, "algorithm": "fedgp", "gp_beta": "auto",
            "backend": "local", "output": str(tmp_path)}
    a = run(FederatedRunConfig.from_dict({**base, "name": "a"}), progress=False).rows
    b = run(FederatedRunConfig.from_dict({**base, "name": "b", "target_lr_scale": 1.0}), progress=False).rows
    keys = [k for k in a[-1] if k.startswith(("target_acc", "val_acc", "diag.gp_", "train_loss"))]
    assert keys and all(a[-1][k] == b[-1][k] for k in keys)


def test_two_round_fda_run_on_colored_digits_with_the_papers_settings(tmp_path):
    """Seed 002's ColoredMNIST setup in small: Adam, target at 1/5 of the sources' rate, auto-β."""
    cfg = FederatedRunConfig.from_dict({
        "dataset": "colored-digits", "setting": "fda", "target_domain": "-90%", "target_fraction": 0.05,
        "model": "mlp", "mlp_hidden": [16], "local_steps": 4, "batch_size": 4, "rounds": 2,
        "local_optimizer": "adam", "local_lr": 1e-3, "target_lr_scale": 0.2, "algorithm": "fedda",
        "gp_beta": "auto", "backend": "local", "output": str(tmp_path), "name": "cd"})
    res = run(cfg, progress=False)
    assert res.status == "completed" and len(res.rows) == 2
    for row in res.rows:
        assert 0.0 <= row["target_acc"] <= 1.0 and math.isfinite(row["train_loss"])
        betas = [v for k, v in row.items() if k.startswith("diag.gp_beta.")]
        assert len(betas) == 2 and all(0.0 <= v <= 1.0 for v in betas)  # two source domains
        assert row["diag.gp_sigma2"] > 0.0 and row["diag.gp_target_steps"] == 4
