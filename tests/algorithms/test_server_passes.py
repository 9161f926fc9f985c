"""The server's blocked passes over the updates (fedtune/algorithms/server/blocked.py) and the rules built
on them: exact values on hand-checkable inputs, the same bits for any thread count, FedOMG's
one-read step and auto-β's one-pass estimators against direct formulas."""

from __future__ import annotations

import math

import numpy as np
import pytest

import fedtune.algorithms.server.blocked as blocked
import fedtune.algorithms.server.fedomg as fedomg_mod
from fedtune.algorithms.server.aggregate import fedavg_step, fedavg_weights, weighted_sum
from fedtune.algorithms.server.fedgp_auto_beta import auto_beta_estimates
from fedtune.algorithms.server.blocked import (column_blocks, cross_pass, gram_pass, map_chunks, subtract_rows, sum_blocks,
                                       weighted_rows)
from fedtune.algorithms.server.fedomg import fedomg_step
from fedtune.algorithms.server.fedomg_solvers import omg_solution


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of a few hundred columns and chunks of two blocks, so that small test matrices go
    through many blocks, ragged last blocks and several chunks (the production sizes are 8 MiB
    scratches and chunks of 2^20 columns)."""
    monkeypatch.setattr(blocked, "SCRATCH_ELEMS", 2048)
    monkeypatch.setattr(blocked, "MIN_WIDTH", 64)
    monkeypatch.setattr(blocked, "SUM_WIDTH", 256)
    monkeypatch.setattr(blocked, "CHUNK_COLS", 512)


def _updates(rng: np.random.Generator, num: int, m: int) -> np.ndarray:
    scale = 10.0 ** rng.integers(-3, 2, (num, 1))
    return ((rng.standard_normal((num, m)) + rng.standard_normal(m)) * scale).astype(np.float32)


# ================================================================================ blocks
def test_blocks_tile_the_columns_in_order_and_chunks_group_them(small_blocks):
    plan = column_blocks(1000, 7)  # 2048 // 7 = 292 → 256 columns, chunks of 2 blocks
    assert (plan.width, plan.per_chunk, plan.num_chunks) == (256, 2, 2)
    spans = [b for c in range(plan.num_chunks) for b in plan.blocks(c)]
    assert spans == [(0, 256), (256, 512), (512, 768), (768, 1000)]
    assert list(map_chunks(plan, lambda c: c * 10, threads=3)) == [0, 10]  # yielded in chunk order
    plan = sum_blocks(10_000, 100)
    assert (plan.width, plan.per_chunk) == (256, 2)  # whatever the row count


def test_production_block_sizes():
    assert column_blocks(11_700_000, 100).width == 10_432
    assert column_blocks(200, 100_000).width == blocked.MIN_WIDTH
    assert sum_blocks(11_700_000, 1000).width == blocked.SUM_WIDTH == 32_768


# ================================================================================ weighted sums
def test_weighted_rows_formula_and_float64_accumulation(small_blocks):
    rng = np.random.default_rng(0)
    X = _updates(rng, 9, 1501)
    w = rng.uniform(-1, 2, 9)
    ref = np.array([math.fsum(w[u] * float(X[u, j]) for u in range(9)) for j in range(1501)])
    got = weighted_rows(X, w, np.empty(1501))
    np.testing.assert_allclose(got, ref, rtol=1e-13, atol=1e-13 * np.abs(X).max())
    # base + scale · (offset + Σ over some rows), float32 out
    base = rng.standard_normal(1501).astype(np.float32)
    offset = rng.standard_normal(1501)
    rows = [7, 2, 5]
    out = weighted_rows(X, w[rows], np.empty(1501, np.float32), base=base, scale=0.3, offset=offset, rows=rows)
    expected = base.astype(np.float64) + 0.3 * (offset + sum(w[r] * X[r].astype(np.float64) for r in rows))
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, expected.astype(np.float32))
    # float64 accumulation: 1e8 + 1 − 1e8 is 1, not the 0 a float32 sum gives
    np.testing.assert_array_equal(weighted_rows(np.array([[1e8], [1.0], [-1e8]], np.float32), np.ones(3),
                                                np.empty(1)), [1.0])
    with pytest.raises(ValueError, match="rows to sum"):
        weighted_rows(X, w[:3], np.empty(1501))
    with pytest.raises(ValueError, match="out has shape"):
        weighted_rows(X, w, np.empty(3))


def test_weighted_rows_sums_row_after_row_and_a_streamed_sum_is_the_same_bits(small_blocks):
    """The order of every weighted sum is the streamed one: each column's float64 sum takes
    w_u · x_u (one rounding) then adds it (another), rows in the order given; a Python float loop
    is an independent reference of exactly that, and RowSum fed the rows one at a time (the
    coordinator's streamed FedAvg) gives the same bits, as does gram_pass's g."""
    rng = np.random.default_rng(11)
    X = _updates(rng, 7, 700)
    w = fedavg_weights(rng.integers(1, 50, 7))
    ref = []
    for j in range(700):
        acc = 0.0
        for u in range(7):
            acc = acc + float(w[u]) * float(X[u, j])
        ref.append(acc)
    got = weighted_sum(X, w)
    assert got.tobytes() == np.array(ref).tobytes()
    streamed = blocked.RowSum(700)
    for u in range(7):
        streamed.add(X[u], w[u])
    assert streamed.total.tobytes() == got.tobytes() and streamed.rows == 7
    assert gram_pass(X, w)[1].tobytes() == got.tobytes()
    with pytest.raises(ValueError, match="row has shape"):
        streamed.add(X[0, :5], 1.0)


@pytest.mark.parametrize("threads", [2, 3, 8])
def test_weighted_sums_are_the_same_bits_for_any_thread_count(small_blocks, threads):
    rng = np.random.default_rng(1)
    X = _updates(rng, 70, 3001)  # 70 rows: several row groups; 3001 columns: many chunks, a ragged block
    p = fedavg_weights(rng.integers(1, 50, 70))
    theta = rng.standard_normal(3001).astype(np.float32)
    one = fedavg_step(theta, X, p, 0.7)
    assert fedavg_step(theta, X, p, 0.7, threads=threads).tobytes() == one.tobytes()
    assert weighted_sum(X, p, threads=threads).tobytes() == weighted_sum(X, p).tobytes()
    # ... and the same as the production block sizes give, up to float64 rounding of the sum
    assert np.max(np.abs(one.astype(np.float64) - (theta + 0.7 * (p @ X.astype(np.float64))))) <= \
        np.spacing(np.abs(one)).max()


def test_subtract_rows_builds_the_updates_from_the_states_on_any_thread_count():
    rng = np.random.default_rng(7)
    states = [rng.standard_normal(60).astype(np.float32) for _ in range(5)]  # parameters + 10 buffer entries
    theta = rng.standard_normal(50).astype(np.float32)
    one = subtract_rows(states, theta, np.empty((5, 50), np.float32))
    np.testing.assert_array_equal(one, np.stack([s[:50] - theta for s in states]))
    assert subtract_rows(states, theta, np.empty((5, 50), np.float32), threads=3).tobytes() == one.tobytes()
    with pytest.raises(ValueError, match="expected"):
        subtract_rows(states, theta, np.empty((4, 50), np.float32))


# ================================================================================ products
def test_gram_pass_is_exact_on_integer_data_and_thread_independent(small_blocks):
    rng = np.random.default_rng(2)
    Z = rng.integers(-50, 50, (6, 2999)).astype(np.float32)  # every product and partial sum exact in float64
    p = fedavg_weights(np.arange(1, 7))
    G, g = gram_pass(Z, p)
    Zi = Z.astype(np.int64)
    np.testing.assert_array_equal(G, Zi @ Zi.T)
    np.testing.assert_allclose(g, p @ Z.astype(np.float64), rtol=1e-13, atol=1e-13 * np.abs(Z).max())
    X = _updates(rng, 40, 5003)
    G1, g1 = gram_pass(X, fedavg_weights(np.ones(40)))
    np.testing.assert_array_equal(G1, G1.T)  # syrk: exactly symmetric
    ref = X.astype(np.float64) @ X.astype(np.float64).T
    np.testing.assert_allclose(G1, ref, rtol=1e-12, atol=1e-12 * np.abs(ref).max())
    for threads in (2, 5):
        Gt, gt = gram_pass(X, fedavg_weights(np.ones(40)), threads=threads)
        assert Gt.tobytes() == G1.tobytes() and gt.tobytes() == g1.tobytes()
    assert gram_pass(X)[1] is None


def test_cross_pass_sums_block_products_over_several_matrices(small_blocks):
    rng = np.random.default_rng(3)
    A, B = _updates(rng, 3, 1700), _updates(rng, 2, 1700)

    def products(blocks, z):
        assert z.shape == (3 + 2 + 1, blocks[0].shape[1]) and z.flags.c_contiguous
        np.copyto(z[:3], blocks[0])
        np.copyto(z[3:5], blocks[1])
        z[5] = 1.0
        return z[:5] @ z[3:].T, np.array([float(z[:3].sum())])

    cross, total = cross_pass([A, B], products, extra_rows=1)
    stacked = np.concatenate([A, B]).astype(np.float64)
    np.testing.assert_allclose(cross[:, :2], stacked @ B.astype(np.float64).T, rtol=1e-12)
    np.testing.assert_allclose(cross[:, 2], stacked.sum(axis=1), rtol=1e-12)
    np.testing.assert_allclose(total, [A.astype(np.float64).sum()], rtol=1e-12)
    again = cross_pass([A, B], products, extra_rows=1, threads=3)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(again, (cross, total)))
    with pytest.raises(ValueError, match="one column count"):
        cross_pass([A, B[:, :10]], products)


# ================================================================================ FedOMG
@pytest.mark.parametrize("solver", ["exact", "sgd"])
def test_fedomg_step_matches_the_coefficient_formula(small_blocks, solver):
    rng = np.random.default_rng(4)
    X = _updates(rng, 12, 2500)
    p = fedavg_weights(rng.integers(1, 20, 12))
    theta = rng.standard_normal(2500).astype(np.float32)
    step = fedomg_step(X, p, 0.7, solver=solver, rescale=True, params=theta, global_lr=0.3)
    G = X.astype(np.float64) @ X.astype(np.float64).T
    sol = omg_solution(G, p, 0.7, solver, rescale=True)
    # d = Σ_u (p_u + λ γ_u)/(1 + κ²) Δ_u, the formula the rule states
    expected = theta + 0.3 * (sol.coefficients @ X.astype(np.float64))
    np.testing.assert_allclose(step.out, expected.astype(np.float32), rtol=2e-6, atol=1e-6 * np.abs(expected).max())
    np.testing.assert_allclose(step.gram, G, rtol=1e-12, atol=1e-12 * np.abs(G).max())
    assert step.solution.lam > 0
    again = fedomg_step(X, p, 0.7, solver=solver, rescale=True, params=theta, global_lr=0.3, threads=4)
    assert again.out.tobytes() == step.out.tobytes() and again.gram.tobytes() == step.gram.tobytes()


def test_fedomg_combine_reads_only_the_support_rows(small_blocks, monkeypatch):
    rng = np.random.default_rng(5)
    X = _updates(rng, 30, 1200)
    p = fedavg_weights(np.ones(30))
    seen = {}

    def spy(matrix, weights, out, **kw):
        seen["rows"] = kw.get("rows")
        return weighted_rows(matrix, weights, out, **kw)

    monkeypatch.setattr(fedomg_mod, "weighted_rows", spy)
    step = fedomg_step(X, p, 0.5)
    support = np.flatnonzero(step.solution.gamma > 0)
    assert 0 < len(support) < 30  # the exact solver's Γ* is sparse here
    np.testing.assert_array_equal(seen["rows"], support)


# ================================================================================ auto-β
def _auto_beta_by_definition(t: np.ndarray, s: np.ndarray, scales=None):
    """Appendix A.2's estimators written out directly (per step, per source, in float64)."""
    t = t.astype(np.float64)
    s = s.astype(np.float64) * (1.0 if scales is None else np.asarray(scales)[:, None])
    b = t.shape[0]
    centred = ((t - t.mean(axis=0)) ** 2).sum()
    d2, tau = [], []
    for si in s:
        d2.append(np.mean([((si - tb) ** 2).sum() for tb in t]) - centred / (b - 1))
        norm = np.linalg.norm(si)
        u = si / norm if norm > 0 else np.zeros_like(si)
        r = t - np.outer(t @ u, u)
        tau.append(np.mean((r ** 2).sum(axis=1)) - ((r - r.mean(axis=0)) ** 2).sum() / (b - 1))
    return centred / ((b - 1) * b), np.array(d2), np.array(tau)


@pytest.mark.parametrize("shared", [0.0, 1.0, 100.0])
def test_auto_beta_one_pass_matches_the_definitions(small_blocks, shared):
    rng = np.random.default_rng(6)
    common = rng.standard_normal(2100) * shared  # a large common part: the steps differ little
    t = (rng.standard_normal((7, 2100)) + common).astype(np.float32)
    s = np.concatenate([(rng.standard_normal((2, 2100)) * 0.5 + common), np.zeros((1, 2100))]).astype(np.float32)
    scales = np.array([0.5, 2.0, 1.0])
    est = auto_beta_estimates(t, s, scales)
    sigma2, d2, tau = _auto_beta_by_definition(t, s, scales)
    size = (t.astype(np.float64) ** 2).sum(axis=1).mean()  # ‖t_b‖²: the scale of the cancellations by definition
    assert est.sigma2 == pytest.approx(sigma2, rel=1e-12)
    np.testing.assert_allclose(est.d2, d2, rtol=1e-10, atol=1e-12 * size)
    np.testing.assert_allclose(est.tau_d2, tau, rtol=1e-10, atol=1e-12 * size)
    # s = 0: u = 0 (nothing projected out), τd̂² = ‖t̄‖² − σ̂²
    assert est.tau_d2[2] == pytest.approx(float((t.astype(np.float64).mean(0) ** 2).sum()) - est.sigma2, rel=1e-12)
    again = auto_beta_estimates(t, s, scales, threads=3)
    assert (again.sigma2, again.d2.tobytes(), again.tau_d2.tobytes()) == (est.sigma2, est.d2.tobytes(),
                                                                         est.tau_d2.tobytes())


def test_auto_beta_variance_survives_a_common_part_a_million_times_larger():
    # t_b = c + ε_b with ‖c‖ ≈ 1e6 ‖ε_b‖: Σ‖t_b‖² − B‖t̄‖² would lose every digit of the variance in
    # float64; the centred pass keeps it (the noise is exactly ±1, so σ̂² is known in closed form).
    c = np.full(4096, 3.0e5, np.float32)
    signs = np.array([[1.0, -1.0] * 2048, [-1.0, 1.0] * 2048], np.float32)
    t = c + signs  # exactly representable: 300001 and 299999
    est = auto_beta_estimates(t, c[None, :])
    # t̄ = c, Σ_b ‖t_b − t̄‖² = 2 · 4096, σ̂² = 8192 / (1 · 2); s = c = t̄ so d̂² = 0 − σ̂²
    assert est.sigma2 == 4096.0
    assert est.d2[0] == -4096.0


# ================================================================================ coordinator threads
@pytest.mark.parametrize("algorithm,extra", [
    ("fedomg", {"setting": "fl"}),
    ("fedgp", {"setting": "fda", "gp_beta": "auto", "local_steps": 3}),
])
def test_coordinator_cpus_change_no_bit_of_a_run(small_blocks, tmp_path, algorithm, extra):
    """The server rule runs its passes on ``coordinator_cpus`` threads (in the local backend too):
    two rounds with 1 and with 3 server threads give the same global model bit for bit."""
    from fedtune.config import FederatedRunConfig
    from fedtune.runtime.driver import FederatedRun

    weights, rules = [], []
    for cpus in (0.0, 3.0):
        cfg = FederatedRunConfig.from_dict({"algorithm": algorithm, "dataset": "rect4", "num_clients": 4, "rounds": 2,
                                            "backend": "local", "coordinator_cpus": cpus, "seed": 3,
                                            "output": str(tmp_path / f"c{cpus}"), **extra})
        fr = FederatedRun(cfg)
        fr.start()
        rows = [fr.step().metrics for _ in range(2)]
        rules.append(fr.coordinator.rule.threads)
        weights.append(fr.coordinator.weights.tobytes())
        fr.close()
        assert all(r["num_participants"] >= 2 for r in rows)
    assert rules == [1, 3]
    assert weights[0] == weights[1]
