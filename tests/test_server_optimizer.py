"""Server optimisers (FedAvgM, FedAdam, FedYogi, FedAdagrad) on the step of any server rule:
first steps against hand computations of Reddi et al.'s Algorithm 2 and Flower's strategies,
``sgd`` = the rule itself bit for bit, state checkpointed, bad input refused."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from fedtune.algorithms import SERVER_OPTIMIZERS
from fedtune.algorithms.server_optimizer import FedAdagrad, FedAdam, FedAvgM, FedYogi, ServerOptimizer
from fedtune.config import FederatedRunConfig
from fedtune.errors import ConfigError
from fedtune.runtime.checkpoint import read_checkpoint, write_checkpoint
from fedtune.runtime.driver import FederatedRun


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
    # Δ = d recovered from the float32 proposal: the hand computation uses the same Δ.
    delta1 = (proposed(THETA, D1, lr).astype(np.float64) - THETA) / lr
    m1 = 0.1 * delta1                              # β₁·0 + (1 − β₁)Δ
    v1 = 0.99 * tau ** 2 + 0.01 * delta1 ** 2      # v₋₁ = τ²
    want1 = (THETA + lr * m1 / (np.sqrt(v1) + tau)).astype(np.float32)
    got1 = opt.step(THETA, proposed(THETA, D1, lr), round=1)
    np.testing.assert_array_equal(got1, want1)
    assert abs(float(got1[0]) - (1.0 + 0.1 * 0.03 / (math.sqrt(0.99e-6 + 0.0009) + 1e-3))) < 1e-6  # by hand
    delta2 = (proposed(got1, D2, lr).astype(np.float64) - got1) / lr
    m2 = b1 * m1 + (1 - b1) * delta2
    v2 = b2 * v1 + (1 - b2) * delta2 ** 2
    want2 = (got1.astype(np.float64) + lr * m2 / (np.sqrt(v2) + tau)).astype(np.float32)
    np.testing.assert_array_equal(opt.step(got1, proposed(got1, D2, lr), round=2), want2)


def test_fedadam_with_flowers_bias_correction_scales_the_step():
    lr, b1, b2, tau = 0.1, 0.9, 0.99, 1e-9
    plain = FedAdam(cfg(server_tau=tau), global_lr=lr)
    flower = FedAdam(cfg(server_tau=tau, server_adam_bias_correction=True), global_lr=lr)
    p = proposed(THETA, D1, lr)
    step_plain = plain.step(THETA, p, round=1).astype(np.float64) - THETA
    step_flower = flower.step(THETA, p, round=1).astype(np.float64) - THETA
    scale = math.sqrt(1 - b2 ** 2) / (1 - b1 ** 2)  # Flower: round t=1 uses exponent t + 1
    np.testing.assert_allclose(step_flower[:2], scale * step_plain[:2], rtol=1e-6)


def test_fedyogi_first_two_steps_equal_a_hand_computation():
    lr, b1, b2, tau = 0.05, 0.9, 0.99, 1e-3
    opt = FedYogi(cfg(server_tau=tau), global_lr=lr)
    delta1 = (proposed(THETA, D1, lr).astype(np.float64) - THETA) / lr
    m1 = (1 - b1) * delta1
    v0 = np.full(3, tau ** 2)
    v1 = v0 - (1 - b2) * delta1 ** 2 * np.sign(v0 - delta1 ** 2)
    want1 = (THETA + lr * m1 / (np.sqrt(v1) + tau)).astype(np.float32)
    got1 = opt.step(THETA, proposed(THETA, D1, lr), round=1)
    np.testing.assert_array_equal(got1, want1)
    # Yogi's v grows additively where Δ² > v (first two coordinates), unlike Adam's decayed average.
    assert v1[0] == pytest.approx(tau ** 2 + 0.01 * delta1[0] ** 2)
    delta2 = (proposed(got1, D2, lr).astype(np.float64) - got1) / lr
    m2 = b1 * m1 + (1 - b1) * delta2
    v2 = v1 - (1 - b2) * delta2 ** 2 * np.sign(v1 - delta2 ** 2)
    want2 = (got1.astype(np.float64) + lr * m2 / (np.sqrt(v2) + tau)).astype(np.float32)
    np.testing.assert_array_equal(opt.step(got1, proposed(got1, D2, lr), round=2), want2)


def test_fedavgm_and_fedadagrad_first_steps():
    lr = 0.5
    avgm = FedAvgM(cfg(server_momentum=0.9), global_lr=lr)
    got1 = avgm.step(THETA, proposed(THETA, D1, lr), round=1)
    np.testing.assert_allclose(got1, THETA + lr * D1, atol=1e-6)  # v = Δ in round 1: FedAvg's step
    got2 = avgm.step(got1, proposed(got1, D2, lr), round=2)
    np.testing.assert_allclose(got2.astype(np.float64) - got1, lr * (0.9 * D1 + D2), atol=1e-6)
    ada = FedAdagrad(cfg(server_tau=1e-3), global_lr=lr)
    got = ada.step(THETA, proposed(THETA, D1, lr), round=1).astype(np.float64)
    delta = (proposed(THETA, D1, lr).astype(np.float64) - THETA) / lr
    np.testing.assert_allclose(got - THETA, lr * delta / (np.sqrt(1e-6 + delta ** 2) + 1e-3), rtol=1e-5, atol=1e-7)


def test_sgd_is_the_server_rules_step_unchanged():
    p = proposed(THETA, D1, 0.3)
    assert ServerOptimizer(cfg(), 0.3).step(THETA, p, round=1) is p
    assert SERVER_OPTIMIZERS["sgd"] is ServerOptimizer and list(SERVER_OPTIMIZERS) == ["sgd", "avgm", "adam", "yogi",
                                                                                         "adagrad"]


BASE = {"dataset": "rect4", "setting": "fl", "num_clients": 4, "participation": 0.5, "rounds": 4, "local_steps": 3,
        "batch_size": 16, "backend": "local"}


def rows(config: dict, n: int = 4) -> list[dict]:
    with FederatedRun(FederatedRunConfig.from_dict(config)) as fr:
        return [fr.step().metrics for _ in range(n)]


def losses(ms):
    return [(m["train_loss"], m["val_acc"], m["target_acc"]) for m in ms]


@pytest.mark.parametrize("algorithm", ["fedavg", "fedomg", "fedgala"])
def test_server_optimizer_sgd_is_todays_rule_bit_for_bit_and_adam_changes_it(tmp_path, algorithm):
    base = {**BASE, "algorithm": algorithm, "output": str(tmp_path)}
    today = rows(base)
    assert losses(rows({**base, "server_optimizer": "sgd"})) == losses(today)
    adam = rows({**base, "server_optimizer": "adam", "global_lr": 0.01})
    assert all(math.isfinite(m["train_loss"]) for m in adam) and losses(adam) != losses(today)


@pytest.mark.parametrize("name", ["avgm", "adam", "yogi", "adagrad"])
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
    with FederatedRun(config) as fr:
        fr.set_state(state)
        resumed = [fr.step().metrics for _ in range(2)]
    assert losses(first + resumed) == losses(straight)
    with FederatedRun(config) as fr:  # without the moments the run does not continue the same way
        fr.set_state({**state, "optimizer": {"name": name, "state": {}}})
        assert losses([fr.step().metrics for _ in range(2)]) != losses(straight[2:])
    other = FederatedRunConfig.from_dict({**BASE, "algorithm": "fedavg", "output": str(tmp_path)})
    with FederatedRun(other) as fr:
        with pytest.raises(ValueError, match="server_optimizer"):
            fr.set_state(state)


@pytest.mark.parametrize("values,needle", [
    ({"server_optimizer": "rmsprop"}, "field 'server_optimizer': 'rmsprop' is not allowed; allowed: sgd, avgm, adam"),
    ({"server_beta1": 0.5}, "field 'server_beta1' is a hyperparameter of server optimizer adam"),
    ({"server_optimizer": "adam", "server_beta2": 1.5}, "field 'server_beta2'"),
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
