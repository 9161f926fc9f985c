"""FedDA / FedGP / target-only (fedtune/algorithms/server/fedgp.py, docs/methods-seeds.md §2)."""

from __future__ import annotations

import numpy as np
import pytest

from fedtune.algorithms.declarations import GP_ALIGN, GP_BETA
from fedtune.algorithms import SERVER_RULES
from fedtune.algorithms.presets import PRESETS
from fedtune.algorithms.server.fedgp import (FedDA, FedGP, TargetOnly, align_source_magnitude, alignment_factor,
                                     combine_with_target, fedgp_combine, proj_plus, proj_plus_per_tensor)
from fedtune.algorithms.server.fedgp_auto_beta import auto_beta, auto_beta_estimates, beta_from, source_step_scales
from fedtune.algorithms.server.rule import RoundInfo
from fedtune.errors import ConfigError
from fedtune.config import FederatedRunConfig
from fedtune.layout import FlatLayout, TensorSlot


def layout_of(*sizes: int) -> FlatLayout:
    """A parameter-only layout with tensors of the given sizes."""
    slots, off = [], 0
    for k, n in enumerate(sizes):
        slots.append(TensorSlot(f"t{k}", (n,), off, n, True))
        off += n
    return FlatLayout(tuple(slots), off, off)


def fda_cfg(algorithm: str, **params) -> FederatedRunConfig:
    return FederatedRunConfig.from_dict({"algorithm": algorithm, "setting": "fda", "backend": "local", **params})


# ================================================================================ Proj₊
def test_proj_plus_hand_values():
    # <a,b> = 4, |b|^2 = 2  ->  2 b
    np.testing.assert_array_equal(proj_plus(np.array([1., 2., 2.]), np.array([0., 1., 1.])), [0., 2., 2.])
    # <a,b> = 6, |b|^2 = 4 -> 1.5 b = [3, 0]
    np.testing.assert_array_equal(proj_plus(np.array([3., 4.]), np.array([2., 0.])), [3., 0.])
    # opposed (<a,b> = -3 < 0): clipped to 0; b = 0: 0
    np.testing.assert_array_equal(proj_plus(np.array([-3., 4.]), np.array([1., 0.])), [0., 0.])
    np.testing.assert_array_equal(proj_plus(np.array([3., 4.]), np.zeros(2)), [0., 0.])
    # scale-invariant in b (why magnitude alignment does not change FedGP's projections)
    a, b = np.array([0.3, -1.2, 2.0]), np.array([1.0, 0.5, 0.25])
    np.testing.assert_allclose(proj_plus(a, 7.0 * b), proj_plus(a, b), rtol=1e-14)


def test_per_tensor_projection_differs_from_whole_vector_projection():
    a = np.array([1., 0., 0., 1.])
    b = np.array([1., 0., 0., -1.])
    # Whole vector: <a,b> = 1 - 1 = 0 -> nothing.  Per tensor: first tensor aligned (kept), second opposed (0).
    np.testing.assert_array_equal(proj_plus(a, b), [0., 0., 0., 0.])
    np.testing.assert_array_equal(proj_plus_per_tensor(a, b, [slice(0, 2), slice(2, 4)]), [1., 0., 0., 0.])
    np.testing.assert_array_equal(proj_plus_per_tensor(a, b, None), proj_plus(a, b))
    # (name, slice) pairs from a layout work the same way, and FedGP uses them
    pairs = layout_of(2, 2).param_slices()
    np.testing.assert_array_equal(proj_plus_per_tensor(a, b, pairs), [1., 0., 0., 0.])
    per_tensor = fedgp_combine(a, b[None], np.array([1.0]), 1.0, pairs)
    whole = fedgp_combine(a, b[None], np.array([1.0]), 1.0, None)
    np.testing.assert_array_equal(per_tensor, [1., 0., 0., 0.])
    np.testing.assert_array_equal(whole, [0., 0., 0., 0.])
    with pytest.raises(ValueError, match="tile"):
        proj_plus_per_tensor(a, b, [slice(0, 2), slice(3, 4)])


# ================================================================================ combination
def test_a_source_opposed_to_the_target_contributes_nothing():
    t = np.array([1., 1.])
    aligned, opposed = np.array([2., 0.]), np.array([-1., -1.])
    alphas = np.array([0.5, 0.5])
    out = combine_with_target(t, np.stack([aligned, opposed]), alphas, 0.5, None, projection=True)
    # 0.5·(0.5·t + 0.5·Proj₊(t|aligned)) + 0.5·(0.5·t + 0.5·0) = 0.5 t + 0.25 [1, 0]
    np.testing.assert_allclose(out.update, [0.75, 0.5], rtol=1e-15)
    assert out.clipped.tolist() == [[False], [True]]
    # the same round without the opposed source's projection term: identical
    alone = fedgp_combine(t, aligned[None], np.array([0.5]), 0.5) + 0.5 * 0.5 * t
    np.testing.assert_allclose(out.update, alone, rtol=1e-15)
    # FedDA, by contrast, moves against the target along the opposed source
    da = fedgp_combine(t, np.stack([aligned, opposed]), alphas, 0.5, projection=False)
    np.testing.assert_allclose(da, [0.5 + 0.25 * (2 - 1), 0.5 + 0.25 * (0 - 1)], rtol=1e-15)


@pytest.mark.parametrize("projection", [True, False])
def test_beta_zero_is_the_target_step(projection):
    rng = np.random.default_rng(1)
    t = rng.normal(size=10).astype(np.float32)
    s = rng.normal(size=(3, 10)).astype(np.float32)
    out = fedgp_combine(t, s, np.array([0.25, 0.25, 0.5]), 0.0, [slice(0, 4), slice(4, 10)], projection)
    np.testing.assert_array_equal(out, t.astype(np.float64))


def test_beta_one_is_projections_only_for_fedgp_and_the_source_mean_for_fedda():
    t = np.array([1., 2., 3., -1.])
    s = np.array([[1., 0., 1., 1.], [0., 1., -2., 0.]])
    alphas = np.array([0.75, 0.25])
    sl = [slice(0, 2), slice(2, 4)]
    # By hand, per tensor: source 0: (<(1,2),(1,0)> = 1)/1 -> (1,0); (<(3,-1),(1,1)> = 2)/2 -> (1,1)
    #                      source 1: (<(1,2),(0,1)> = 2)/1 -> (0,2); (<(3,-1),(-2,0)> = -6) -> clipped
    gp = fedgp_combine(t, s, alphas, 1.0, sl)
    np.testing.assert_allclose(gp, 0.75 * np.array([1., 0., 1., 1.]) + 0.25 * np.array([0., 2., 0., 0.]), rtol=1e-15)
    da = fedgp_combine(t, s, alphas, 1.0, sl, projection=False)
    np.testing.assert_allclose(da, 0.75 * s[0] + 0.25 * s[1], rtol=1e-15)
    # per-source β: source 0 fully trusted, source 1 not at all
    mixed = fedgp_combine(t, s, alphas, np.array([1.0, 0.0]), sl, projection=False)
    np.testing.assert_allclose(mixed, 0.75 * s[0] + 0.25 * t, rtol=1e-15)


def test_combination_rejects_bad_betas_and_shapes():
    with pytest.raises(ValueError, match="betas"):
        fedgp_combine(np.ones(2), np.ones((1, 2)), np.ones(1), 1.5)
    with pytest.raises(ValueError, match="disagree"):
        fedgp_combine(np.ones(3), np.ones((1, 2)), np.ones(1), 0.5)


# ================================================================================ magnitude alignment
def test_magnitude_alignment_factor_by_hand():
    # (lr_T/lr_S)·(steps_T/steps_S): (0.01/0.05)·(3/12) = 0.05 ; (0.01/0.05)·(3/3) = 0.2
    np.testing.assert_allclose(alignment_factor([12, 3], 3, lr_source=0.05, lr_target=0.01), [0.05, 0.2], rtol=1e-15)
    # fedtune: one local_lr, so the factor is steps_T/steps_S
    d = np.array([[4., -8.], [1., 2.]], np.float32)
    out = align_source_magnitude(d, [8, 2], 2)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [[1., -2.], [1., 2.]])
    np.testing.assert_array_equal(d, [[4., -8.], [1., 2.]])  # not modified without out=
    # s_i = (lr_T/lr_S)·Δ_i/steps_i
    np.testing.assert_allclose(source_step_scales([4, 2], lr_source=0.1, lr_target=0.05), [0.125, 0.25])
    with pytest.raises(ValueError, match="steps"):
        alignment_factor([0], 3)


# ================================================================================ auto-β
def brute_force_estimates(t: np.ndarray, s: np.ndarray) -> tuple[float, float, float]:
    """docs/methods-seeds.md §2 written out literally (explicit r_b)."""
    B = len(t)
    tbar = t.mean(0)
    sigma2 = sum(np.sum((tb - tbar) ** 2) for tb in t) / ((B - 1) * B)
    d2 = np.mean([np.sum((s - tb) ** 2) for tb in t]) - sum(np.sum((tb - tbar) ** 2) for tb in t) / (B - 1)
    u = s / np.linalg.norm(s)
    r = np.array([tb - (tb @ u) * u for tb in t])
    rbar = r.mean(0)
    tau = np.mean([np.sum(rb ** 2) for rb in r]) - sum(np.sum((rb - rbar) ** 2) for rb in r) / (B - 1)
    return sigma2, d2, tau


def test_auto_beta_estimators_match_the_formulas():
    rng = np.random.default_rng(2)
    # P larger than one block (65,536), so the blockwise sums are exercised
    t = (rng.normal(size=(4, 70_001)) * 0.1 + 0.05).astype(np.float32)
    s = (rng.normal(size=(2, 70_001)) * 0.1).astype(np.float32)
    est = auto_beta_estimates(t, s)
    for i in range(2):
        sigma2, d2, tau = brute_force_estimates(t.astype(np.float64), s[i].astype(np.float64))
        assert est.sigma2 == pytest.approx(sigma2, rel=1e-10)
        assert est.d2[i] == pytest.approx(d2, rel=1e-9)
        assert est.tau_d2[i] == pytest.approx(tau, rel=1e-9)
        assert auto_beta(t, s[i]) == pytest.approx((beta_from(sigma2, d2), beta_from(sigma2, tau)), rel=1e-9)
    # source_scales: the same as passing the scaled rows
    scaled = auto_beta_estimates(t, s, [0.5, 2.0])
    direct = auto_beta_estimates(t, s * np.array([[0.5], [2.0]], np.float32))
    np.testing.assert_allclose(scaled.d2, direct.d2, rtol=1e-6)
    np.testing.assert_allclose(scaled.tau_d2, direct.tau_d2, rtol=1e-6)


def test_auto_beta_clips_at_zero_and_needs_two_steps():
    # Source equal to the target mean: d̂² is negative by sampling noise and clipped, so β^DA = 1.
    t = np.array([[1.0, 0.0], [3.0, 0.0], [2.0, 0.3]])
    est = auto_beta_estimates(t, t.mean(0))
    assert est.d2[0] < 0
    assert auto_beta(t, t.mean(0))[0] == 1.0
    # A noiseless target: σ̂² = 0 -> β = 0 (keep the target step), also with 0/0.
    same = np.array([[1.0, 2.0], [1.0, 2.0]])
    assert auto_beta(same, np.array([5.0, -1.0])) == (0.0, 0.0)
    assert auto_beta(same, np.array([1.0, 2.0])) == (0.0, 0.0)
    with pytest.raises(ValueError, match="at least 2"):
        auto_beta(np.ones((1, 3)), np.ones(3))


def test_auto_beta_estimators_are_unbiased():
    """Synthetic target steps t_b = μ + ε_b, ε_b ~ N(0, v·I_m), b = 1..B, and a source step s at known
    distance ‖s − μ‖² = d² = 1. Truths: σ² = E‖t̄ − μ‖² = m·v/B, d² = 1, τd² = ‖μ − ⟨μ,u⟩u‖²
    (u = s/‖s‖: the target mean's component orthogonal to the source direction).

    Tolerance: the mean of R seeded draws must lie within 4 standard errors (SE = sample std/√R) of
    the truth. The SEs here are ~1e-3 (σ̂²) and ~5e-3 (d̂², τd̂²), while the usual slips — dividing
    by B instead of B−1, or forgetting a variance term — shift the mean by ≥ σ²/B ≈ 0.1, i.e. ≥ 20 SE
    (asserted below, so the test has the power to fail).
    """
    rng = np.random.default_rng(0)
    m, B, v, R = 64, 5, 0.04, 2000
    mu = rng.normal(size=m) * 0.3
    delta = rng.normal(size=m)
    s = mu + delta / np.linalg.norm(delta)
    u = s / np.linalg.norm(s)
    true = {"sigma2": m * v / B, "d2": 1.0, "tau_d2": float(np.sum((mu - (mu @ u) * u) ** 2))}
    assert abs(true["tau_d2"] - true["d2"]) > 0.05  # τd² and d² are told apart by this case
    noise = rng.normal(size=(R, B, m)) * np.sqrt(v)
    draws = {"sigma2": [], "d2": [], "tau_d2": [], "beta_da": [], "beta_gp": []}
    for r in range(R):
        e = auto_beta_estimates(mu + noise[r], s)
        draws["sigma2"].append(e.sigma2)
        draws["d2"].append(e.d2[0])
        draws["tau_d2"].append(e.tau_d2[0])
        draws["beta_da"].append(e.beta_da[0])
        draws["beta_gp"].append(e.beta_gp[0])
    d = {k: np.asarray(x) for k, x in draws.items()}
    se = {k: d[k].std(ddof=1) / np.sqrt(R) for k in d}
    for k in ("sigma2", "d2", "tau_d2"):
        assert abs(d[k].mean() - true[k]) < 4 * se[k], (k, d[k].mean(), true[k], se[k])
        assert 4 * se[k] < 0.25 * true["sigma2"] / B  # power: a σ²/B slip would be caught
    # β from the averaged estimates against the true σ²/(d²+σ²) (and with τd²). Tolerance: the
    # 4-SE error bars of the averages propagated through β(x, y) = x/(x+y) (|∂β/∂x| = y/(x+y)²,
    # |∂β/∂y| = x/(x+y)²).
    for beta_key, dist_key in (("beta_da", "d2"), ("beta_gp", "tau_d2")):
        x, y = true["sigma2"], true[dist_key]
        beta_true = x / (x + y)
        tol = 4 * (y * se["sigma2"] + x * se[dist_key]) / (x + y) ** 2
        assert abs(beta_from(d["sigma2"].mean(), d[dist_key].mean()) - beta_true) < tol
        # Per-draw β̂ is a ratio, hence slightly biased (second-order delta method:
        # ½·∂²β/∂y²·Var(d̂²) = x·Var/(x+y)³ ≈ 0.006 here); its mean stays within 0.02 of the truth.
        assert abs(d[beta_key].mean() - beta_true) < 0.02
    assert d["beta_gp"].mean() > d["beta_da"].mean()  # τd² < d² here: FedGP trusts the source more


# ================================================================================ rules
def rule(cls, algorithm: str, sizes=(1, 1), **params):
    return cls(fda_cfg(algorithm, **params), layout_of(*sizes))


def hand_round():
    """Sources 0, 1 (steps 4, 8; n 30, 10) and target 2 (steps 2, n 60); θ = 0."""
    updates = np.array([[4., 0.], [0., 8.], [1., 1.]], np.float32)
    weights = np.array([0.3, 0.1, 0.6])
    info = RoundInfo((0, 1, 2), ("source", "source", "target"), (4, 8, 2), (30, 10, 60))
    return np.zeros(2, np.float32), updates, weights, info


def test_fedda_and_fedgp_rules_by_hand():
    params, updates, weights, info = hand_round()
    # α = (0.3, 0.1)/0.4 = (0.75, 0.25); aligned Δ̃ = (4,0)·2/4 = (2,0), (0,8)·2/8 = (0,2)
    res = rule(FedDA, "fedda").aggregate(params, updates.copy(), weights, extras=[{}] * 3, round=1, info=info)
    # 0.5·(1,1) + 0.5·(0.75·(2,0) + 0.25·(0,2))
    np.testing.assert_allclose(res.params, [1.25, 0.75], rtol=1e-7)
    assert res.params.dtype == np.float32
    assert res.diagnostics["gp_beta.0"] == 0.5 and res.diagnostics["gp_beta.1"] == 0.5
    assert "gp_beta.2" not in res.diagnostics  # the target is not a source
    # Without alignment: 0.5·(1,1) + 0.5·(0.75·(4,0) + 0.25·(0,8))
    res = rule(FedDA, "fedda", gp_align=False).aggregate(params, updates.copy(), weights, extras=[{}] * 3,
                                                         round=1, info=info)
    np.testing.assert_allclose(res.params, [2.0, 1.5], rtol=1e-7)
    # FedGP, tensors of size 1: Proj₊((1,1)|(2,0)) = (1,0), Proj₊((1,1)|(0,2)) = (0,1); global_lr 2
    res = rule(FedGP, "fedgp", global_lr=2.0).aggregate(params, updates.copy(), weights, extras=[{}] * 3,
                                                         round=1, info=info)
    np.testing.assert_allclose(res.params, 2.0 * np.array([0.5 + 0.5 * 0.75, 0.5 + 0.5 * 0.25]), rtol=1e-7)
    assert res.diagnostics["gp_clipped_frac"] == 0.0
    # the coordinator's scratch rows are not modified
    _, fresh, _, _ = hand_round()
    np.testing.assert_array_equal(updates, fresh)


def test_target_only_rule_and_missing_clients():
    params, updates, weights, info = hand_round()
    res = rule(TargetOnly, "target-only").aggregate(params + 1, updates, weights, extras=[{}] * 3, round=1, info=info)
    np.testing.assert_array_equal(res.params, [2.0, 2.0])
    # no target client this round: θ unchanged, recorded
    src_only = RoundInfo((0, 1), ("source", "source"), (4, 8), (30, 10))
    for r in (rule(TargetOnly, "target-only"), rule(FedGP, "fedgp"), rule(FedDA, "fedda")):
        res = r.aggregate(params + 3, updates[:2], weights[:2] / 0.4, extras=[{}] * 2, round=1, info=src_only)
        np.testing.assert_array_equal(res.params, [3.0, 3.0])
        assert res.diagnostics["target_missing"] == 1.0
    # the target alone: its step
    tgt_only = RoundInfo((2,), ("target",), (2,), (60,))
    res = rule(FedGP, "fedgp").aggregate(params, updates[2:], np.ones(1), extras=[{}], round=1, info=tgt_only)
    np.testing.assert_array_equal(res.params, [1.0, 1.0])


def test_auto_beta_rule_uses_the_target_steps_and_the_sources_mean_raw_steps():
    params, updates, weights, info = hand_round()
    steps = np.array([[0.8, 0.3], [0.2, 0.7]], np.float32)  # the target's raw steps −lr·∇_b
    # the sources' mean raw steps s_i (not Δ_i / steps_i = (1, 0), (0, 1): with momentum those differ)
    src_means = [np.array([0.9, 0.1], np.float32), np.array([0.2, 0.6], np.float32)]
    extras = [{"mean_step_update": src_means[0]}, {"mean_step_update": src_means[1]}, {"step_updates": steps}]
    fedgp = rule(FedGP, "fedgp", gp_beta="auto")
    res = fedgp.aggregate(params, updates.copy(), weights, extras=extras, round=1, info=info)
    est = auto_beta_estimates(steps, np.stack(src_means))
    assert not np.allclose(est.d2, auto_beta_estimates(steps, np.array([[1., 0.], [0., 1.]])).d2)
    diag = res.diagnostics
    assert diag["gp_sigma2"] == pytest.approx(est.sigma2, rel=1e-12)
    for i in (0, 1):
        assert diag[f"gp_beta.{i}"] == pytest.approx(est.beta_gp[i], rel=1e-12)
        assert diag[f"gp_beta_da.{i}"] == pytest.approx(est.beta_da[i], rel=1e-12)
        assert diag[f"gp_d2.{i}"] == pytest.approx(est.d2[i], rel=1e-12)
    assert 0.0 <= diag["gp_beta.0"] <= 1.0 and diag["gp_beta.0"] != 0.5
    aligned = np.array([[2., 0.], [0., 2.]])
    expected = combine_with_target(np.ones(2), aligned, np.array([0.75, 0.25]), est.beta_gp,
                                   layout_of(1, 1).param_slices()).update
    np.testing.assert_allclose(res.params, expected, rtol=1e-6)
    fedda = rule(FedDA, "fedda", gp_beta="auto").aggregate(params, updates.copy(), weights, extras=extras, round=1,
                                                            info=info)
    assert fedda.diagnostics["gp_beta.1"] == pytest.approx(est.beta_da[1], rel=1e-12)
    # missing or too few step updates are explained
    with pytest.raises(ValueError, match="step_updates"):
        fedgp.aggregate(params, updates.copy(), weights, extras=[{}] * 3, round=1, info=info)
    with pytest.raises(ValueError, match=r"mean_step_update.*\[1\]"):
        fedgp.aggregate(params, updates.copy(), weights, extras=[extras[0], {}, extras[2]], round=1, info=info)
    with pytest.raises(ValueError, match="at least 2"):
        fedgp.aggregate(params, updates.copy(), weights, extras=[{}, {}, {"step_updates": steps[:1]}], round=1,
                        info=info)


def test_target_steps_are_recorded_only_for_auto_beta():
    records = ("fedtune.algorithms.client.step_records:StepRecords",)
    assert SERVER_RULES.spec("fedgp").hooks(fda_cfg("fedgp", gp_beta="auto")) == records
    assert SERVER_RULES.spec("fedda").hooks(fda_cfg("fedda", gp_beta="auto")) == records
    assert SERVER_RULES.spec("fedgp").hooks(fda_cfg("fedgp")) == ()
    assert SERVER_RULES.spec("fedda").hooks(fda_cfg("fedda", gp_beta=0.3)) == ()
    assert SERVER_RULES.spec("fedavg").hooks(fda_cfg("fedavg")) == ()


# ================================================================================ configuration
def test_registration():
    assert {"fedda", "fedgp", "target_only"} <= set(SERVER_RULES)
    assert PRESETS["fedgp"].server_rule == "fedgp" and PRESETS["fedgp"].settings == ("fda",)
    assert PRESETS["target-only"].server_rule == "target_only"
    assert SERVER_RULES.spec("fedda").hparams[0] is SERVER_RULES.spec("fedgp").hparams[0]  # one shared gp_beta
    cfg = fda_cfg("fedda", gp_beta="auto", gp_align=False)
    assert GP_BETA.of(cfg) == "auto" and GP_ALIGN.of(cfg) is False
    assert GP_BETA.of(fda_cfg("fedgp")) == 0.5


@pytest.mark.parametrize("bad", [1.5, -0.1, "bogus"])
def test_bad_gp_beta_is_a_config_error(bad):
    with pytest.raises(ConfigError, match="gp_beta"):
        fda_cfg("fedgp", gp_beta=bad)


def test_auto_beta_with_one_local_step_is_a_config_error():
    with pytest.raises(ConfigError, match="local_steps"):
        rule(FedGP, "fedgp", gp_beta="auto", local_steps=1)


@pytest.mark.parametrize("algorithm", [n for n, p in PRESETS.items()
                                       if SERVER_RULES.spec(p.server_rule).needs_target_client])
def test_a_target_client_rule_is_refused_outside_fda(algorithm):
    from fedtune.runtime.driver import build_plan

    cfg = FederatedRunConfig.from_dict({"algorithm": algorithm, "setting": "fdg", "backend": "local"})
    with pytest.raises(ConfigError, match="'fdg'"):
        build_plan(cfg)


# ================================================================================ end to end
def test_end_to_end_fda_runs(tmp_path):
    from fedtune.runtime.driver import run

    base = {"dataset": "rotated-digits", "setting": "fda", "target_fraction": 0.05, "rounds": 2, "local_steps": 3,
            "batch_size": 4, "model": "mlp", "mlp_hidden": [16], "backend": "local", "output": str(tmp_path)}
    rows = {}
    for name, extra in (("fedda", {"algorithm": "fedda"}),
                        ("fedgp", {"algorithm": "fedgp", "gp_beta": 0.5}),
                        ("fedgp-auto", {"algorithm": "fedgp", "gp_beta": "auto"}),
                        ("fedgp-0", {"algorithm": "fedgp", "gp_beta": 0.0}),
                        ("target-only", {"algorithm": "target-only"})):
        result = run(FederatedRunConfig.from_dict({**base, **extra, "name": name}), progress=False)
        rows[name] = result.rows
        assert len(result.rows) == 2 and all(np.isfinite(r["train_loss"]) for r in result.rows)
    # rotated-digits: 6 domains, target "0" -> sources 0..4, the target client is id 5
    for name in ("fedda", "fedgp", "fedgp-auto"):
        last = rows[name][-1]
        assert [f"diag.gp_beta.{i}" in last for i in range(6)] == [True] * 5 + [False]
        assert last["diag.target_missing"] == 0.0
    assert all(rows["fedgp"][-1][f"diag.gp_beta.{i}"] == 0.5 for i in range(5))
    assert 0.0 <= rows["fedgp"][-1]["diag.gp_clipped_frac"] <= 1.0
    auto = rows["fedgp-auto"][-1]
    assert auto["diag.gp_sigma2"] > 0
    assert all(0.0 <= auto[f"diag.gp_beta.{i}"] <= 1.0 for i in range(5))
    assert all(auto[f"diag.gp_beta.{i}"] == auto[f"diag.gp_beta_gp.{i}"] for i in range(5))
    assert "diag.gp_sigma2" not in rows["fedgp"][-1]  # no step recording without auto
    assert "diag.target_missing" in rows["target-only"][-1]
    # FedGP with β = 0 is the target-only step: round 2 trains from the same θ (up to Σα = 1 rounding)
    for r0, rt in zip(rows["fedgp-0"], rows["target-only"]):
        assert r0["train_loss"] == pytest.approx(rt["train_loss"], rel=1e-5)
        assert r0["target_acc"] == pytest.approx(rt["target_acc"], abs=1e-9)
    # and the sources matter with β = 0.5
    assert rows["fedgp"][1]["train_loss"] != pytest.approx(rows["target-only"][1]["train_loss"], rel=1e-5)


# ================================================================================ batch-norm buffers
def test_buffers_follow_the_fda_rule():
    from fedtune.algorithms.server.aggregate import fedavg_buffers
    from fedtune.algorithms.server.rule import FedAvg

    params, updates, weights, info = hand_round()
    old = np.array([0.0, 1.0, 2.0], np.float32)  # the global running mean/var entries
    client = np.array([[4.0, 1.0, 2.0],  # source 0
                       [0.0, 5.0, 2.0],  # source 1
                       [1.0, 2.0, 0.5]], np.float32)  # target
    # target-only: exactly the target's buffers (the sources' ≈ all of the data no longer leak in)
    r = rule(TargetOnly, "target-only")
    r.aggregate(params, updates.copy(), weights, extras=[{}] * 3, round=1, info=info)
    out = r.aggregate_buffers(old, client, weights, info=info)
    assert out.dtype == np.float32 and np.array_equal(out, client[2])
    # FedDA / FedGP at β = 0.5, α = (0.75, 0.25): B + 0.5·ΔB_T + 0.5·(0.75 ΔB_0 + 0.25 ΔB_1)
    # ΔB_T = (1, 1, −1.5), ΔB_0 = (4, 0, 0), ΔB_1 = (0, 4, 0)
    expected = old + 0.5 * np.array([1.0, 1.0, -1.5]) + 0.5 * np.array([3.0, 1.0, 0.0])
    for cls, name in ((FedDA, "fedda"), (FedGP, "fedgp")):
        r = rule(cls, name)
        r.aggregate(params, updates.copy(), weights, extras=[{}] * 3, round=1, info=info)
        np.testing.assert_allclose(r.aggregate_buffers(old, client, weights, info=info), expected, rtol=1e-7)
    # β = 0.25 (source weight): 0.75·ΔB_T + 0.25·(3, 1, 0)
    r = rule(FedDA, "fedda", gp_beta=0.25)
    r.aggregate(params, updates.copy(), weights, extras=[{}] * 3, round=1, info=info)
    np.testing.assert_allclose(r.aggregate_buffers(old, client, weights, info=info),
                               old + 0.75 * np.array([1.0, 1.0, -1.5]) + 0.25 * np.array([3.0, 1.0, 0.0]), rtol=1e-7)
    # no target this round: unchanged; FedAvg: the weighted mean, as before
    src_only = RoundInfo((0, 1), ("source", "source"), (4, 8), (30, 10))
    r.aggregate(params, updates[:2].copy(), weights[:2], extras=[{}] * 2, round=2, info=src_only)
    assert np.array_equal(r.aggregate_buffers(old, client[:2], weights[:2], info=src_only), old)
    fedavg = FedAvg(FederatedRunConfig.from_dict({"algorithm": "fedavg", "backend": "local"}), layout_of(1, 1))
    assert np.array_equal(fedavg.aggregate_buffers(old, client, weights, info=info), fedavg_buffers(client, weights))
    # calling it without the round's aggregate is a programming error, not a silent FedAvg
    with pytest.raises(RuntimeError, match="aggregate"):
        rule(FedGP, "fedgp").aggregate_buffers(old, client, weights, info=info)
