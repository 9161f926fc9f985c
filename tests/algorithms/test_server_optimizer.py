"""Server optimisers (FedAvgM, FedAdam, FedYogi, FedAdagrad) on the step of any server rule:
first steps against hand computations of Reddi et al.'s Algorithm 2 and Flower's strategies,
``sgd`` = the rule itself bit for bit, state checkpointed, bad input refused."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from fedtune.algorithms import SERVER_OPTIMIZERS, SERVER_RULES
from fedtune.algorithms.presets import PRESETS
from fedtune.algorithms.optimizer_declarations import SERVER_V_START
from fedtune.algorithms.server.rule import RoundInfo
from fedtune.algorithms.server.optimizer import FedAdagrad, FedAdam, FedAvgM, FedYogi, ServerOptimizer
from fedtune.config import FederatedRunConfig
from fedtune.errors import ConfigError
from fedtune.runtime.checkpoint import read_checkpoint, write_checkpoint
from fedtune.runtime.coordinator import LOSS_EXPLOSION_FACTOR, loss_exploded
from fedtune.runtime.driver import FederatedRun, run


def cfg(**params):
    return SimpleNamespace(params=params)


THETA = np.array([1.0, -2.0, 0.5], np.float32)
D1 = np.array([0.3, -0.1, 0.0])  # the rule's direction d in round 1 (θ_rule = θ + η d)
D2 = np.array([-0.2, 0.4, 0.1])


def proposed(theta, d, lr):
    return (np.asarray(theta, np.float64) + lr * d).astype(np.float32)


def test_fedadam_first_two_steps_equal_a_hand_computation():
    lr, b1, b2, tau = 0.1, 0.9, 0.99, 1e-3
    opt = FedAdam(cfg(server_beta1=b1, server_beta2=b2, server_tau=tau), global_lr=lr)
    m1 = 0.1 * D1                              # β₁·0 + (1 − β₁)Δ, Δ = the rule's direction d
    v1 = 0.99 * tau ** 2 + 0.01 * D1 ** 2      # v₋₁ = τ²
    want1 = (THETA + lr * m1 / (np.sqrt(v1) + tau)).astype(np.float32)
    got1 = opt.step(THETA, proposed(THETA, D1, lr), D1, round=1)
    np.testing.assert_array_equal(got1, want1)
    assert abs(float(got1[0]) - (1.0 + 0.1 * 0.03 / (math.sqrt(0.99e-6 + 0.0009) + 1e-3))) < 1e-6  # by hand
    m2 = b1 * m1 + (1 - b1) * D2
    v2 = b2 * v1 + (1 - b2) * D2 ** 2
    want2 = (got1.astype(np.float64) + lr * m2 / (np.sqrt(v2) + tau)).astype(np.float32)
    np.testing.assert_array_equal(opt.step(got1, proposed(got1, D2, lr), D2, round=2), want2)


def test_fedadam_with_flowers_bias_correction_scales_the_step():
    lr, b1, b2, tau = 0.1, 0.9, 0.99, 1e-9
    plain = FedAdam(cfg(server_tau=tau), global_lr=lr)
    flower = FedAdam(cfg(server_tau=tau, server_adam_bias_correction=True), global_lr=lr)
    p = proposed(THETA, D1, lr)
    step_plain = plain.step(THETA, p, D1, round=1).astype(np.float64) - THETA
    step_flower = flower.step(THETA, p, D1, round=1).astype(np.float64) - THETA
    scale = math.sqrt(1 - b2 ** 2) / (1 - b1 ** 2)  # Flower: round t=1 uses exponent t + 1
    np.testing.assert_allclose(step_flower[:2], scale * step_plain[:2], rtol=1e-6)


def test_fedyogi_first_two_steps_equal_a_hand_computation():
    lr, b1, b2, tau = 0.05, 0.9, 0.99, 1e-3
    opt = FedYogi(cfg(server_tau=tau), global_lr=lr)
    m1 = (1 - b1) * D1
    v0 = np.full(3, tau ** 2)
    v1 = v0 - (1 - b2) * D1 ** 2 * np.sign(v0 - D1 ** 2)
    want1 = (THETA + lr * m1 / (np.sqrt(v1) + tau)).astype(np.float32)
    got1 = opt.step(THETA, proposed(THETA, D1, lr), D1, round=1)
    np.testing.assert_array_equal(got1, want1)
    # Yogi's v grows additively where Δ² > v (first two coordinates), unlike Adam's decayed average.
    assert v1[0] == pytest.approx(tau ** 2 + 0.01 * D1[0] ** 2)
    m2 = b1 * m1 + (1 - b1) * D2
    v2 = v1 - (1 - b2) * D2 ** 2 * np.sign(v1 - D2 ** 2)
    want2 = (got1.astype(np.float64) + lr * m2 / (np.sqrt(v2) + tau)).astype(np.float32)
    np.testing.assert_array_equal(opt.step(got1, proposed(got1, D2, lr), D2, round=2), want2)


def test_fedavgm_and_fedadagrad_first_steps():
    lr = 0.5
    avgm = FedAvgM(cfg(server_momentum=0.9), global_lr=lr)
    got1 = avgm.step(THETA, proposed(THETA, D1, lr), D1, round=1)
    np.testing.assert_allclose(got1, THETA + lr * D1, atol=1e-6)  # v = Δ in round 1: FedAvg's step
    got2 = avgm.step(got1, proposed(got1, D2, lr), D2, round=2)
    np.testing.assert_allclose(got2.astype(np.float64) - got1, lr * (0.9 * D1 + D2), atol=1e-6)
    ada = FedAdagrad(cfg(server_tau=1e-3), global_lr=lr)
    got = ada.step(THETA, proposed(THETA, D1, lr), D1, round=1).astype(np.float64)
    np.testing.assert_allclose(got - THETA, lr * D1 / (np.sqrt(1e-6 + D1 ** 2) + 1e-3), rtol=1e-5, atol=1e-7)


def test_sgd_is_the_server_rules_step_unchanged():
    p = proposed(THETA, D1, 0.3)
    assert ServerOptimizer(cfg(), 0.3).step(THETA, p, D1, round=1) is p
    assert ServerOptimizer(cfg(), 0.3).step(THETA, p, None, round=1) is p  # a rule without a direction: sgd runs
    with pytest.raises(ValueError, match="direction"):
        FedAdam(cfg(), 0.3).step(THETA, p, None, round=1)
    assert SERVER_OPTIMIZERS["sgd"] is ServerOptimizer and list(SERVER_OPTIMIZERS)[0] == "sgd"  # the default first


BASE = {"dataset": "rect4", "setting": "fl", "num_clients": 4, "participation": 0.5, "rounds": 4, "local_steps": 3,
        "batch_size": 16, "backend": "local"}
# Every server optimiser but the rule's own step, and one preset per server rule (the first that has it).
OPTIMIZERS = [name for name in SERVER_OPTIMIZERS if name != "sgd"]
RULE_PRESETS = {rule: next(n for n, p in PRESETS.items() if p.server_rule == rule) for rule in SERVER_RULES}


def rows(config: dict, n: int = 4) -> list[dict]:
    with FederatedRun(FederatedRunConfig.from_dict(config)) as fr:
        return [fr.step().metrics for _ in range(n)]


def losses(ms):
    return [(m["train_loss"], m["val_acc"], m["target_acc"]) for m in ms]


@pytest.mark.parametrize("algorithm", [n for n in RULE_PRESETS.values() if "fl" in PRESETS[n].settings])
def test_server_optimizer_sgd_is_todays_rule_bit_for_bit_and_adam_changes_it(tmp_path, algorithm):
    base = {**BASE, "algorithm": algorithm, "output": str(tmp_path)}
    today = rows(base)
    assert losses(rows({**base, "server_optimizer": "sgd"})) == losses(today)
    adam = rows({**base, "server_optimizer": "adam", "global_lr": 0.01})
    assert all(math.isfinite(m["train_loss"]) for m in adam) and losses(adam) != losses(today)


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_the_optimizers_state_is_checkpointed_and_resumes_exactly(tmp_path, name):
    config = FederatedRunConfig.from_dict({**BASE, "algorithm": "fedavg", "server_optimizer": name, "global_lr": 0.05,
                                           "output": str(tmp_path)})
    with FederatedRun(config) as fr:
        straight = [fr.step().metrics for _ in range(4)]
    with FederatedRun(config) as fr:
        first = [fr.step().metrics for _ in range(2)]
        write_checkpoint(tmp_path / "ckpt", fr.get_state())
    state = read_checkpoint(tmp_path / "ckpt")
    assert state["optimizer"]["name"] == name and state["optimizer"]["state"]
    assert state["first_loss"] == first[0]["train_loss"]  # the scale of the explosion check resumes too
    with FederatedRun(config) as fr:
        fr.set_state(state)
        resumed = [fr.step().metrics for _ in range(2)]
    assert losses(first + resumed) == losses(straight)
    with FederatedRun(config) as fr:  # without the moments the run does not continue the same way
        fr.set_state({**state, "optimizer": {"name": name, "state": {}}})
        assert losses([fr.step().metrics for _ in range(2)]) != losses(straight[2:])
    other = FederatedRunConfig.from_dict({**BASE, "algorithm": "fedavg", "output": str(tmp_path)})
    with FederatedRun(other) as fr:
        with pytest.raises(ValueError, match="server optimizer"):
            fr.set_state(state)


@pytest.mark.parametrize("values,needle", [
    ({"server_optimizer": "rmsprop"},
     f"field 'server_optimizer': 'rmsprop' is not allowed; allowed: {', '.join(SERVER_OPTIMIZERS)}"),
    ({"server_beta1": 0.5}, "field 'server_beta1' is a hyperparameter of server optimizer adam"),
    ({"server_optimizer": "adam", "server_beta2": 1.5}, "field 'server_beta2'"),
    # β = 1 cannot train: m stays 0 (β₁, the model never moves) or v stays τ² (β₂, the step explodes)
    ({"server_optimizer": "adam", "server_beta1": 1}, "field 'server_beta1' (server optimizer adam, server optimizer yogi): 1.0 is out "
                                                      "of range; allowed: >= 0 and < 1"),
    ({"server_optimizer": "yogi", "server_beta2": 1.0}, "field 'server_beta2' (server optimizer adam, server optimizer yogi): 1.0 is "
                                                        "out of range; allowed: >= 0 and < 1"),
    ({"server_optimizer": "adam", "server_v_start": "one"}, "field 'server_v_start'"),
    ({"server_optimizer": "adagrad", "server_tau": 0}, "field 'server_tau'"),
    ({"server_optimizer": "yogi", "server_adam_bias_correction": True}, "does not use"),
])
def test_bad_server_optimizer_input_is_one_clear_line(values, needle):
    with pytest.raises(ConfigError) as info:
        FederatedRunConfig.from_dict(values)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_the_optimizer_and_its_hyperparameters_are_result_columns():
    hp = FederatedRunConfig.from_dict({"server_optimizer": "avgm", "server_momentum": 0.5}).hyperparameters()
    assert hp["server_optimizer"] == "avgm" and hp["server_momentum"] == 0.5 and "server_beta1" not in hp
    # an sgd run keeps the trial id it had before server optimisers existed
    assert (FederatedRunConfig.from_dict({"server_optimizer": "sgd"}).trial_id()
            == FederatedRunConfig.from_dict({}).trial_id())


# ------------------------------------------------------- the rule's direction, not a float32 difference
def algorithm_2(theta0, directions, lr, name, *, b1=0.9, b2=0.99, tau=1e-9, mu=0.9, v_start=None):
    """Reddi et al.'s Algorithm 2 (and Hsu et al.'s FedAvgM) in float64 throughout, θ included:
    the trajectory x_1, ..., x_R from x_0 = theta0 and the rounds' pseudo-gradients Δ_t."""
    x = np.asarray(theta0, np.float64).copy()
    m = np.zeros_like(x)
    v = np.full_like(x, tau * tau if v_start is None else v_start)
    out = []
    for delta in directions:
        if name == "avgm":
            m = mu * m + delta
            x = x + lr * m
        else:
            m = delta if name == "adagrad" else b1 * m + (1.0 - b1) * delta
            if name == "adam":
                v = b2 * v + (1.0 - b2) * delta * delta
            elif name == "yogi":
                v = v - (1.0 - b2) * delta * delta * np.sign(v - delta * delta)
            else:
                v = v + delta * delta
            x = x + lr * m / (np.sqrt(v) + tau)
        out.append(x.copy())
    return out


def test_the_papers_example_a_tiny_direction_at_a_small_learning_rate_moves_the_weight():
    # θ = 0.3, η = 0.01, d = 1e-6: θ + η d rounds back to 0.3 in float32 (η d < ulp(0.3)/2), yet
    # Algorithm 2 moves the coordinate by η · 0.1 d / (√(0.01 d²) + τ) ≈ 0.0099
    theta, d, lr = np.array([0.3], np.float32), np.array([1e-6]), 0.01
    prop = proposed(theta, d, lr)
    assert prop[0] == theta[0]  # the float32 proposal carries no step at all
    got = FedAdam(cfg(), global_lr=lr).step(theta, prop, d, round=1)
    want = algorithm_2(theta, [d], lr, "adam")[0]
    assert float(got[0]) - 0.3 == pytest.approx(0.0099, abs=1e-4)
    assert abs(float(got[0]) - want[0]) <= np.spacing(np.float32(want[0]))


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_six_rounds_at_a_small_learning_rate_follow_algorithm_2_to_float32_precision(name):
    rng = np.random.default_rng(7)
    lr, rounds = 0.01, 6
    theta0 = np.concatenate([[0.3, -1.7, 2.5, 0.01], rng.normal(0, 1, 12)]).astype(np.float32)
    directions = [rng.normal(0, 1e-6, theta0.size) for _ in range(rounds)]  # tiny displacements
    directions[2][0] = 0.0  # a round where one coordinate's Δ is exactly 0
    opt = SERVER_OPTIMIZERS[name](cfg(server_tau=1e-9), global_lr=lr)
    want = algorithm_2(theta0, directions, lr, name)
    theta = theta0
    for r, d in enumerate(directions, start=1):
        theta = opt.step(theta, proposed(theta, d, lr), d, round=r)  # the weights stay float32, as on the server
        # each round rounds θ to float32 once: at most r half-ulps from the float64 trajectory
        bound = r * np.spacing(np.abs(want[r - 1]).astype(np.float32)).astype(np.float64)
        assert np.all(np.abs(theta.astype(np.float64) - want[r - 1]) <= bound), (r, theta - want[r - 1])
    if name != "avgm":  # the adaptive steps are η-sized whatever |d|: float32 differencing lost them
        assert np.abs(want[-1] - theta0).max() > 1e-2


def test_flowers_v_start_at_zero_is_offered_and_differs_where_delta_is_near_tau():
    # τ = 1e-3 (the spaces' default), Δ = 1e-3, η = 1: v from τ² gives m/(√v + τ) = 1e-4 / 2e-3 =
    # 0.05; Flower's v from 0 gives 1e-4 / (1e-4 + 1e-3) = 0.0909
    theta, d = np.zeros(1, np.float32), np.array([1e-3])
    reddi = FedAdam(cfg(server_tau=1e-3), global_lr=1.0).step(theta, proposed(theta, d, 1.0), d, round=1)
    flower = FedAdam(cfg(server_tau=1e-3, server_v_start="zero"), global_lr=1.0).step(theta, proposed(theta, d, 1.0),
                                                                                       d, round=1)
    assert float(reddi[0]) == pytest.approx(0.05, rel=1e-6)
    assert float(flower[0]) == pytest.approx(1e-4 / (1e-4 + 1e-3), rel=1e-6)
    for name in (s.name for s in SERVER_OPTIMIZERS.specs() if SERVER_V_START in s.hparams):  # Flower's start v at 0
        opt = SERVER_OPTIMIZERS[name](cfg(server_tau=1e-3, server_v_start="zero"), global_lr=1.0)
        want = algorithm_2(theta, [d, -d], 1.0, name, tau=1e-3, v_start=0.0)
        got = opt.step(theta, proposed(theta, d, 1.0), d, round=1)
        got = opt.step(got, proposed(got, -d, 1.0), -d, round=2)
        np.testing.assert_allclose(got, want[1], rtol=1e-6)
    assert "server_v_start" in FederatedRunConfig.from_dict({"server_optimizer": "adagrad"}).hyperparameters()


def _rule_case(algorithm: str, **params):
    """A rule of ``algorithm``, its inputs (θ, updates, p, extras, info) and the arithmetic the rule
    used before directions existed (one fused float32 pass), for a bit-for-bit comparison."""
    from fedtune.algorithms.server.aggregate import combine
    from fedtune.algorithms.server.fedgp import combine_with_target
    from fedtune.layout import FlatLayout, TensorSlot

    rng = np.random.default_rng(3)
    sizes = (5, 9)
    layout = FlatLayout((TensorSlot("t0", (5,), 0, 5, True), TensorSlot("t1", (9,), 5, 9, True)), 14, 14)
    theta = rng.normal(size=14).astype(np.float32)
    updates = rng.normal(0, 0.1, (3, 14)).astype(np.float32)
    p = np.array([0.2, 0.3, 0.5])
    setting = "fda" if SERVER_RULES.spec(PRESETS[algorithm].server_rule).needs_target_client else "fl"
    config = FederatedRunConfig.from_dict({"algorithm": algorithm, "setting": setting, "backend": "local",
                                           "global_lr": 0.3, **params})
    roles = ("source", "source", "target") if setting == "fda" else ("source",) * 3
    info = RoundInfo((1, 4, 6), roles, (2, 2, 2), (2, 3, 5))
    extras = [{"ga_loss_global": np.array([1.0 + u]), "ga_loss_local": np.array([0.5]),
               "ga_acc_global": np.array([0.5]), "ga_acc_local": np.array([0.5])} for u in range(3)]
    rule = config.resolved.server_rule(config, layout)
    res = rule.aggregate(theta, updates, p, extras=extras, round=2, info=info)

    def old(coefficients=None, fused=None):
        out = np.empty(14, np.float32)
        if fused is not None:
            return (theta.astype(np.float64) + 0.3 * np.asarray(fused, np.float64)).astype(np.float32)
        return combine(updates, coefficients, theta, 0.3, out)

    if algorithm in ("fedda", "fedgp"):
        alphas = p[:2] / p[:2].sum()
        beta = rule.beta
        before = old(fused=combine_with_target(updates[2], updates[:2], alphas, np.full(2, beta),
                                               layout.param_slices(), algorithm == "fedgp").update)
    elif algorithm == "target-only":
        before = old(fused=updates[2])
    elif algorithm == "fedga":
        before = old(np.array([res.diagnostics[f"fedga_weight.{c}"] for c in info.client_ids]))
    elif algorithm == "fedomg":
        from fedtune.algorithms.server.blocked import weighted_rows
        from fedtune.algorithms.server.fedomg import fedomg_step

        sol = fedomg_step(updates, p, rule.kappa, solver=rule.solver, rescale=rule.rescale).solution
        g_fl = combine(updates, p, None, 1.0, np.empty(14))
        support = np.flatnonzero(sol.gamma > 0)
        before = np.empty(14, np.float32)
        weighted_rows(updates, sol.lam * sol.gamma[support], before, base=theta, scale=0.3 / (1 + rule.kappa ** 2),
                      offset=g_fl, rows=support)
    elif algorithm == "fedgma":  # its masked FedAvg direction (its math: tests/algorithms/test_fedgma.py)
        from fedtune.algorithms.server.fedgma import fedgma_direction

        before = old(fused=fedgma_direction(updates, p, rule.tau, rule.mask)[0])
    elif algorithm == "fedgala":
        from fedtune.algorithms.server.gala import gala_global_weights

        w, _ = gala_global_weights(updates, p, iters=rule.iters, slices=layout.param_slices())
        before = np.empty(14, np.float32)
        for k, sl in enumerate((slice(0, 5), slice(5, 14))):
            c = p * (1.0 - rule.mix) + rule.mix * w[k]
            combine(updates[:, sl], c, theta[sl], 0.3, before[sl])
    else:
        before = old(p)
    return theta, res, before, sizes


# Off-default values that take a rule down its less plain path, set where the rule declares them.
OFF_DEFAULT = {"omg_rescale": True, "gala_mix": 0.7}


@pytest.mark.parametrize("algorithm,params", [
    (n, {k: v for k, v in OFF_DEFAULT.items() if any(h.name == k for h in SERVER_RULES.spec(rule).hparams)})
    for rule, n in RULE_PRESETS.items()])
def test_every_rule_hands_its_float64_direction_and_keeps_its_float32_step_bit_for_bit(algorithm, params):
    theta, res, before, _ = _rule_case(algorithm, **params)
    assert res.direction is not None and res.direction.dtype == np.float64 and res.direction.shape == theta.shape
    # sgd's rows stay what they were: the same bits as the rule's fused float32 pass before directions
    np.testing.assert_array_equal(res.params, before)
    # and the direction is the step: θ + η d rounds to the rule's parameters, and d is not a float32 difference
    np.testing.assert_allclose(res.direction, (res.params.astype(np.float64) - theta) / 0.3, rtol=0, atol=1e-5)
    assert np.abs(res.direction).max() > 0


# ------------------------------------------------------------------ a loss that explodes is divergence
def test_loss_exploded_is_a_thousandfold_jump_over_the_first_rounds_loss_floored_at_1():
    assert LOSS_EXPLOSION_FACTOR == 1e3
    assert loss_exploded(2.4e24, 2.3) and loss_exploded(2301.0, 2.3) and not loss_exploded(2299.0, 2.3)
    assert loss_exploded(1001.0, 1e-3) and not loss_exploded(999.0, 1e-3)  # floor: max(|first|, 1)
    assert loss_exploded(-5000.0, 2.0) and not loss_exploded(1e30, None)  # round 1 is the scale itself


def test_a_finite_loss_exploding_by_orders_of_magnitude_marks_the_trial_diverged(tmp_path):
    # server_beta2 near 1 keeps v near τ², so FedAdam's step is about global_lr · 100 per weight: the
    # loss jumps from 0.6 to thousands, finite, and used to end the trial "completed"
    config = FederatedRunConfig.from_dict({**BASE, "algorithm": "fedavg", "server_optimizer": "adam",
                                           "server_beta2": 0.999999, "global_lr": 0.01, "output": str(tmp_path)})
    result = run(config, progress=False)
    last = result.rows[-1]
    assert result.status == "diverged" and last["status"] == "diverged" and len(result.rows) < config.rounds
    assert math.isfinite(last["train_loss"]) and last["train_loss"] > 1e3 * max(result.rows[0]["train_loss"], 1.0)
    assert all(r["status"] == "ok" for r in result.rows[:-1])
    assert "1000 times the first round's" in result.error


# ------------------------------------------------------- each optimiser's own learning rate when unset
ADAPTIVE = ("adam", "yogi", "adagrad")


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_an_unset_global_lr_is_the_optimisers_declared_one_and_a_set_one_is_the_users(name):
    own = SERVER_OPTIMIZERS.spec(name).default_lr
    assert (own == 1e-3) if name in ADAPTIVE else own is None  # Adam's step size; avgm: the rule's
    for algorithm, rule_lr in (("fedavg", 1.0), ("fedomg", 0.05)):
        unset = FederatedRunConfig.from_dict({"algorithm": algorithm, "server_optimizer": name})
        assert unset.effective_global_lr == (own if own is not None else rule_lr)
        assert unset.hyperparameters()["global_lr"] == unset.effective_global_lr
        cfg = FederatedRunConfig.from_dict({"algorithm": algorithm, "server_optimizer": name, "global_lr": 0.3})
        assert cfg.effective_global_lr == 0.3


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_the_default_run_trains_under_each_optimiser_at_its_defaults(tmp_path, name):
    # rotated-digits, the default model and clients; with global_lr unset adam/adagrad used to step at
    # the rule's 1.0 and diverge in round 2, and at 0.01 (tau 1e-9) the loss went 2.26 -> 8.6 -> 2.07
    # and then sat at ln 10, chance: every round's loss must fall
    result = run(FederatedRunConfig.from_dict({"rounds": 3, "backend": "local", "server_optimizer": name,
                                               "output": str(tmp_path)}), progress=False)
    loss = [r["train_loss"] for r in result.rows]
    assert result.status == "completed" and len(loss) == 3 and all(r["status"] == "ok" for r in result.rows)
    assert all(math.isfinite(x) for x in loss) and loss[0] > loss[1] > loss[2], loss


def test_adaptive_runs_with_global_lr_unset_get_new_trial_ids_and_sgd_runs_keep_theirs(monkeypatch):
    import dataclasses

    def id_of(**kw):
        return FederatedRunConfig.from_dict(kw).trial_id()

    for name in ADAPTIVE:
        assert id_of(server_optimizer=name) == id_of(server_optimizer=name, global_lr=1e-3)  # what runs
        assert id_of(server_optimizer=name, global_lr=0.5) != id_of(server_optimizer=name)
    new = {name: id_of(server_optimizer=name) for name in OPTIMIZERS}
    kept = {"sgd": id_of(), "fedomg": id_of(algorithm="fedomg"), "sgd_lr": id_of(global_lr=0.1),
            "avgm": new["avgm"], "adam_lr": id_of(server_optimizer="adam", global_lr=0.1)}
    # before: no optimiser declared a learning rate (the rule's default ran, global_lr None was hashed)
    spec = SERVER_OPTIMIZERS.spec
    monkeypatch.setattr(SERVER_OPTIMIZERS, "spec", lambda name: dataclasses.replace(spec(name), default_lr=None))
    for name in OPTIMIZERS:
        assert (id_of(server_optimizer=name) == new[name]) == (name == "avgm"), name
    assert kept == {"sgd": id_of(), "fedomg": id_of(algorithm="fedomg"), "sgd_lr": id_of(global_lr=0.1),
                    "avgm": id_of(server_optimizer="avgm"), "adam_lr": id_of(server_optimizer="adam", global_lr=0.1)}
