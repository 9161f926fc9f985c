"""FedAvg server math (fedtune/algorithms/server/rule.py) and the SGD client method (client.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedtune.runtime.examples import TensorExamples
from fedtune.algorithms import resolve
from fedtune.algorithms.server.aggregate import fedavg_buffers, fedavg_step, fedavg_weights, weighted_sum
from fedtune.algorithms.client.method import SGD, ClientContext, batches
from fedtune.algorithms.client.steps import local_steps
from fedtune.algorithms.server.rule import FedAvg, RoundInfo
from fedtune.config import FederatedRunConfig
from fedtune.layout import FlatLayout
from fedtune.models import build_model
from fedtune.flat_weights import get_flat


# ================================================================================ server math
def test_weighted_sum_by_hand():
    updates = np.array([[1.0, 2.0, -4.0], [3.0, -2.0, 8.0]], np.float32)
    out = weighted_sum(updates, np.array([0.25, 0.75]))
    # 0.25*1 + 0.75*3 = 2.5 ; 0.25*2 - 0.75*2 = -1 ; -1 + 6 = 5
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, [2.5, -1.0, 5.0])


def test_weighted_sum_accumulates_in_float64():
    # In float32, 1e8 + 1 == 1e8 (spacing 8), so a float32 sum would give 0; float64 keeps the 1.
    updates = np.array([[1e8], [1.0], [-1e8]], np.float32)
    assert np.float32(1e8) + np.float32(1) - np.float32(1e8) == 0  # the trap being avoided
    np.testing.assert_array_equal(weighted_sum(updates, np.ones(3)), [1.0])


def test_weighted_sum_rejects_client_count_mismatch():
    with pytest.raises(ValueError, match="disagree on the client count"):
        weighted_sum(np.zeros((3, 4), np.float32), np.array([0.5, 0.5]))
    with pytest.raises(ValueError, match="disagree on the client count"):
        weighted_sum(np.zeros(4, np.float32), np.array([1.0]))


def test_fedavg_weights():
    np.testing.assert_array_equal(fedavg_weights(np.array([1, 3])), [0.25, 0.75])
    np.testing.assert_array_equal(fedavg_weights(np.array([10, 0, 30])), [0.25, 0.0, 0.75])
    p = fedavg_weights(np.array([7, 11, 13]))
    assert p.dtype == np.float64 and math.isclose(p.sum(), 1.0)
    np.testing.assert_allclose(p, np.array([7, 11, 13]) / 31)


@pytest.mark.parametrize("bad", [[], [0, 0], [3, -1], [[1, 2]]])
def test_fedavg_weights_errors(bad):
    with pytest.raises(ValueError, match="non-negative with a positive sum"):
        fedavg_weights(np.array(bad))


def test_fedavg_step_global_lr_one_is_weighted_mean_of_client_models():
    theta = np.array([1.0, -2.0, 0.5, 4.0], np.float32)
    clients = np.array([[2.0, 0.0, 0.5, 4.0], [1.0, -4.0, 1.5, 0.0], [0.0, -2.0, 0.5, 8.0]], np.float32)
    n = np.array([1, 2, 1])
    p = fedavg_weights(n)  # [0.25, 0.5, 0.25]
    out = fedavg_step(theta, clients - theta, p, 1.0)
    expected = 0.25 * clients[0] + 0.5 * clients[1] + 0.25 * clients[2]  # exact in binary
    assert out.dtype == np.float32 and out.shape == theta.shape
    np.testing.assert_array_equal(out, expected.astype(np.float32))
    np.testing.assert_array_equal(out, [1.0, -2.5, 1.0, 3.0])


@pytest.mark.parametrize("lr", [0.5, 0.1, 2.0])
def test_fedavg_step_global_lr_scales_the_aggregate(lr):
    theta = np.array([1.0, 1.0], np.float32)
    updates = np.array([[2.0, 0.0], [0.0, 4.0]], np.float32)
    out = fedavg_step(theta, updates, np.array([0.5, 0.5]), lr)
    # aggregate = [1, 2]; θ + lr * aggregate
    np.testing.assert_allclose(out, [1 + lr * 1.0, 1 + lr * 2.0], rtol=0, atol=1e-7)


def test_fedavg_step_identical_updates_equal_weights():
    rng = np.random.default_rng(0)
    theta = rng.standard_normal(50).astype(np.float32)
    delta = rng.standard_normal(50).astype(np.float32)
    for u in (1, 2, 4, 8):  # powers of two: 1/u exact, so the mean of u copies is exactly delta
        out = fedavg_step(theta, np.tile(delta, (u, 1)), np.full(u, 1 / u), 1.0)
        np.testing.assert_array_equal(out, (theta.astype(np.float64) + delta).astype(np.float32))


def test_fedavg_step_does_not_modify_inputs():
    theta = np.ones(3, np.float32)
    updates = np.ones((2, 3), np.float32)
    before = theta.copy(), updates.copy()
    fedavg_step(theta, updates, np.array([0.5, 0.5]), 1.0)
    np.testing.assert_array_equal(theta, before[0])
    np.testing.assert_array_equal(updates, before[1])


def test_fedavg_step_rejects_shape_mismatch():
    theta = np.zeros(4, np.float32)
    with pytest.raises(ValueError):
        fedavg_step(theta, np.zeros((2, 3), np.float32), np.array([0.5, 0.5]))
    with pytest.raises(ValueError):
        fedavg_step(theta, np.zeros((3, 4), np.float32), np.array([0.5, 0.5]))
    # a width-1 update or a 1-element theta must not silently broadcast
    with pytest.raises(ValueError):
        fedavg_step(theta, np.zeros((2, 1), np.float32), np.array([0.5, 0.5]))
    with pytest.raises(ValueError):
        fedavg_step(np.zeros(1, np.float32), np.zeros((2, 4), np.float32), np.array([0.5, 0.5]))


def test_fedavg_step_matches_float64_reference_and_is_bit_reproducible():
    rng = np.random.default_rng(1)
    U, M = 7, 1001
    theta = rng.standard_normal(M).astype(np.float32)
    updates = (rng.standard_normal((U, M)) * 10.0 ** rng.integers(-3, 3, (U, 1))).astype(np.float32)
    p = fedavg_weights(rng.integers(1, 100, U))
    lr = 0.7
    out = fedavg_step(theta, updates, p, lr)
    # independent reference: exact-ish float64 sum (fsum per coordinate), then one rounding
    ref = np.array([math.fsum(p[u] * float(updates[u, j]) for u in range(U)) for j in range(M)])
    ref = theta.astype(np.float64) + lr * ref
    ulp = np.spacing(np.abs(ref).astype(np.float32)).astype(np.float64)
    assert np.all(np.abs(out.astype(np.float64) - ref) <= ulp)
    # bit-for-bit reproducible across calls
    again = fedavg_step(theta.copy(), updates.copy(), p.copy(), lr)
    assert out.tobytes() == again.tobytes()


def test_result_independent_of_how_the_caller_assembled_rows():
    rng = np.random.default_rng(2)
    ids = [5, 1, 9, 3, 7]
    M = 257
    by_id = {c: rng.standard_normal(M).astype(np.float32) for c in ids}
    n_by_id = {c: int(rng.integers(1, 50)) for c in ids}
    theta = rng.standard_normal(M).astype(np.float32)

    def assemble(arrival, how):
        order = sorted(arrival)  # the convention: ascending client id
        if how == "stack":
            up = np.stack([by_id[c] for c in order])
        elif how == "fill":
            up = np.empty((len(order), M), np.float32)
            for u, c in enumerate(order):
                up[u] = by_id[c]
        else:  # a Fortran-ordered (column-major) copy
            up = np.asfortranarray(np.stack([by_id[c] for c in order]))
        p = fedavg_weights(np.array([n_by_id[c] for c in order]))
        return fedavg_step(theta, up, p, 1.0)

    results = [assemble(arr, how) for arr in (ids, ids[::-1], sorted(ids))
               for how in ("stack", "fill", "fortran")]
    for r in results[1:]:
        assert r.tobytes() == results[0].tobytes()
    # and permuting rows changes at most the last bits (summation order), never the value
    perm = [by_id[c] for c in ids]
    p_perm = fedavg_weights(np.array([n_by_id[c] for c in ids]))
    np.testing.assert_allclose(fedavg_step(theta, np.stack(perm), p_perm, 1.0), results[0], rtol=1e-6, atol=1e-6)


def test_fedavg_buffers_weighted_mean():
    bufs = np.array([[0.0, 1.0, 4.0], [4.0, 3.0, 0.0]], np.float32)
    out = fedavg_buffers(bufs, np.array([0.75, 0.25]))
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [1.0, 1.5, 3.0])


def test_fedavg_rule_class_aggregate():
    cfg = FederatedRunConfig.from_dict({"global_lr": 0.5, "dataset": "rect4", "backend": "local"})
    assert resolve(cfg).server_rule is FedAvg
    torch.manual_seed(0)
    model = build_model("mlp", input_shape=(2,), num_classes=2, mlp_hidden=[3])
    layout = FlatLayout.of(model)
    theta = get_flat(model, layout)[: layout.num_params]
    updates = np.stack([np.full(layout.num_params, 2.0, np.float32), np.full(layout.num_params, -2.0, np.float32)])
    rule = FedAvg(cfg, layout)
    assert rule.payload(1) == {} and rule.state_dict() == {}
    res = rule.aggregate(theta, updates, np.array([0.75, 0.25]), extras=[{}, {}], round=1,
                         info=RoundInfo.sources(2))
    # aggregate = 0.75*2 - 0.25*2 = 1 ; θ + 0.5 * 1
    np.testing.assert_allclose(res.params, theta + 0.5, rtol=0, atol=1e-6)
    assert res.params.dtype == np.float32 and res.params.shape == (layout.num_params,)
    assert res.diagnostics == {}


# ================================================================================ client SGD
def _cfg(**kw) -> FederatedRunConfig:
    base = {"dataset": "rect4", "backend": "local", "mlp_hidden": [], "local_momentum": 0.0}
    base.update(kw)
    return FederatedRunConfig.from_dict(base)


def _ctx(model, x, y, cfg, seed=0):
    return ClientContext(model=model, data=TensorExamples(x, y), cfg=cfg, round=1, client_id=0, role="source",
                         generator=torch.Generator().manual_seed(seed), device=torch.device("cpu"))


def test_sgd_one_full_batch_step_equals_minus_lr_times_hand_gradient():
    torch.manual_seed(0)
    n, d, k = 6, 3, 4
    x = torch.randn(n, d)
    y = torch.tensor([0, 1, 2, 3, 1, 0])
    lr = 0.3
    cfg = _cfg(local_lr=lr, local_steps=1, batch_size=n)
    model = build_model("mlp", input_shape=(d,), num_classes=k, mlp_hidden=[])
    lin = model[-1]
    W0 = lin.weight.detach().double().numpy().copy()
    b0 = lin.bias.detach().double().numpy().copy()

    # hand gradient of mean cross-entropy of a linear softmax model, in float64
    X = x.double().numpy()
    logits = X @ W0.T + b0
    P = np.exp(logits - logits.max(1, keepdims=True))
    P /= P.sum(1, keepdims=True)
    Y = np.eye(k)[y.numpy()]
    gW = (P - Y).T @ X / n
    gb = (P - Y).mean(0)
    loss_hand = float(-np.mean(np.log(P[np.arange(n), y.numpy()])))

    out = SGD(cfg).train(_ctx(model, x, y, cfg))
    assert out.steps == 1
    assert out.loss == pytest.approx(loss_hand, rel=1e-5)
    np.testing.assert_allclose(lin.weight.detach().double().numpy() - W0, -lr * gW, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(lin.bias.detach().double().numpy() - b0, -lr * gb, rtol=1e-4, atol=1e-6)


def test_sgd_is_deterministic_for_a_seeded_generator():
    torch.manual_seed(0)
    x, y = torch.randn(20, 2), torch.randint(0, 2, (20,))
    cfg = _cfg(local_lr=0.1, local_steps=5, batch_size=4, local_momentum=0.9, mlp_hidden=[4])
    finals = []
    for _ in range(2):
        torch.manual_seed(1)
        model = build_model("mlp", input_shape=(2,), num_classes=2, mlp_hidden=[4])
        out = SGD(cfg).train(_ctx(model, x, y, cfg, seed=3))
        finals.append((out.loss, get_flat(model, FlatLayout.of(model)).tobytes()))
    assert finals[0] == finals[1]


def test_batches_cover_a_permutation_each_epoch():
    n, bs, steps = 10, 3, 7
    got = list(batches(n, bs, steps, torch.Generator().manual_seed(0)))
    assert len(got) == steps
    # 10 = 3 + 3 + 3 + 1: the trailing single example joins the batch before (never a batch of one)
    assert [len(b) for b in got] == [3, 3, 4, 3, 3, 4, 3]
    first_epoch = torch.cat(got[:3]).tolist()
    assert sorted(first_epoch) == list(range(n))
    second = torch.cat(got[3:6]).tolist()
    assert sorted(second) == list(range(n)) and second != first_epoch  # a fresh permutation per epoch


def test_batches_exact_count_and_seeded_order():
    a = [b.tolist() for b in batches(8, 8, 3, torch.Generator().manual_seed(5))]
    b = [b.tolist() for b in batches(8, 8, 3, torch.Generator().manual_seed(5))]
    c = [b.tolist() for b in batches(8, 8, 3, torch.Generator().manual_seed(6))]
    assert len(a) == 3 and all(sorted(e) == list(range(8)) for e in a)
    assert a == b and a != c
    assert list(batches(8, 2, 0, torch.Generator())) == []


def test_local_steps_epochs_vs_steps():
    assert local_steps(100, _cfg(batch_size=32)) == 4  # ceil(100/32)
    assert local_steps(100, _cfg(batch_size=32, local_epochs=3)) == 12
    assert local_steps(96, _cfg(batch_size=32, local_epochs=2)) == 6
    assert local_steps(100, _cfg(batch_size=32, local_epochs=3, local_steps=5)) == 5  # steps override epochs
    assert local_steps(0, _cfg(batch_size=32, local_epochs=2)) == 2  # at least one step per epoch


def test_sgd_counts_steps_from_local_epochs():
    torch.manual_seed(0)
    x, y = torch.randn(10, 2), torch.randint(0, 2, (10,))
    cfg = _cfg(local_lr=0.01, batch_size=4, local_epochs=2)
    model = build_model("mlp", input_shape=(2,), num_classes=2, mlp_hidden=[])
    assert SGD(cfg).train(_ctx(model, x, y, cfg)).steps == 6  # 2 epochs x ceil(10/4)


def test_sgd_nan_loss_stops_training():
    torch.manual_seed(0)
    x, y = torch.randn(8, 2), torch.randint(0, 2, (8,))
    x[0, 0] = float("nan")  # every full batch sees the NaN
    cfg = _cfg(local_lr=0.1, local_steps=5, batch_size=8)
    model = build_model("mlp", input_shape=(2,), num_classes=2, mlp_hidden=[])
    before = get_flat(model, FlatLayout.of(model)).copy()
    out = SGD(cfg).train(_ctx(model, x, y, cfg))
    assert not math.isfinite(out.loss)
    assert out.steps == 1  # stopped at the first non-finite loss, not after 5 steps
    # no optimiser step was taken with the NaN gradient
    np.testing.assert_array_equal(get_flat(model, FlatLayout.of(model)), before)


def test_sgd_divergence_mid_round_stops_early():
    torch.manual_seed(0)
    x, y = torch.randn(32, 2) * 100, torch.randint(0, 2, (32,))
    cfg = _cfg(local_lr=1e30, local_steps=50, batch_size=32, mlp_hidden=[8])
    model = build_model("mlp", input_shape=(2,), num_classes=2, mlp_hidden=[8])
    out = SGD(cfg).train(_ctx(model, x, y, cfg))
    assert not math.isfinite(out.loss)
    assert 1 < out.steps < 50
