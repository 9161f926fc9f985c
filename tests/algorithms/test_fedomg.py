"""FedOMG (fedtune/algorithms/server/fedomg.py, docs/methods-seeds.md §1): Gram pass, step-2 solvers, direction, rule."""

from __future__ import annotations

import doctest
import math

import numpy as np
import pytest

import fedtune.algorithms.server.fedomg as fedomg_mod
from fedtune.algorithms.declarations import OMG_KAPPA, OMG_RESCALE, OMG_SOLVER
from fedtune.algorithms import SERVER_RULES, resolve
from fedtune.algorithms.presets import PRESETS
from fedtune.algorithms.server.aggregate import fedavg_step, fedavg_weights, weighted_sum
from fedtune.algorithms.server.fedomg import FedOMG, fedomg_direction, fedomg_step, gram_matrix
from fedtune.algorithms.server.fedomg_solvers import (_norm_floor, cosines, omg_objective, omg_solution, solve_omg_exact,
                                              solve_omg_exact_info, solve_omg_sgd)
from fedtune.algorithms.server.rule import RoundInfo
from fedtune.errors import ConfigError
from fedtune.config import FederatedRunConfig


def _random_problem(rng: np.random.Generator, num: int, dim: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Updates with a shared component and client-specific parts of varied size (like real rounds)."""
    shared = rng.standard_normal(dim) * rng.uniform(0.0, 1.5)
    X = shared + rng.standard_normal((num, dim)) * rng.uniform(0.2, 2.0, (num, 1))
    return X, X @ X.T, rng.dirichlet(np.ones(num))


def _evaluation_noise(G: np.ndarray, p: np.ndarray, kappa: float) -> float:
    """How precisely the objective can be evaluated from G near Γg = 0 (where ‖Γg‖ = √(ΓᵀGΓ) loses
    half its digits): (1 + κ) ‖g_FL‖ × the rounding floor of ‖Γg‖. Elsewhere it is ~1e-16 relative."""
    return (1 + kappa) * math.sqrt(max(p @ G @ p, 0.0)) * _norm_floor(G) + 1e-13 * np.abs(G).max()


# ================================================================================ Gram matrix
def test_gram_matrix_equals_updates_times_their_transpose():
    rng = np.random.default_rng(0)
    X = (rng.standard_normal((5, 10_007)) * 10.0 ** rng.integers(-3, 2, (5, 1))).astype(np.float32)
    G = gram_matrix(X, block_elems=5 * 1024)  # 1024-column blocks: 10 full blocks and a ragged one
    ref = X.astype(np.float64) @ X.astype(np.float64).T
    assert G.dtype == np.float64 and G.shape == (5, 5)
    np.testing.assert_allclose(G, ref, rtol=1e-12, atol=0)
    np.testing.assert_array_equal(G, G.T)  # syrk: exactly symmetric
    # Integer-valued float32 updates: every product and partial sum is exact in float64 → equality.
    Z = rng.integers(-50, 50, (4, 3001)).astype(np.float32)
    np.testing.assert_array_equal(gram_matrix(Z, block_elems=4 * 1024), Z.astype(np.int64) @ Z.astype(np.int64).T)
    # the block size only changes the order of float64 partial sums
    np.testing.assert_allclose(gram_matrix(X), G, rtol=1e-13)
    with pytest.raises(ValueError, match="must be"):
        gram_matrix(np.zeros(3, np.float32))


# ================================================================================ κ = 0 is FedAvg
@pytest.mark.parametrize("solver", ["exact", "sgd"])
@pytest.mark.parametrize("rescale", [False, True])
def test_kappa_zero_is_fedavg_bit_for_bit(solver, rescale):
    # Bit-for-bit, not just within float32 eps: with κ = 0, λ = κ‖g_FL‖/‖Γ*g‖ is exactly 0.0, so the
    # coefficients p + λΓ* (÷ (1 + 0²) = 1) are exactly p, and the combine is server._combine with the
    # very same inputs fedavg_step uses — the same float64 operations in the same order.
    rng = np.random.default_rng(1)
    theta = rng.standard_normal(3001).astype(np.float32)
    updates = (rng.standard_normal((5, 3001)) * 0.01).astype(np.float32)
    p = fedavg_weights(np.array([3, 1, 4, 1, 5]))
    cfg = FederatedRunConfig.from_dict({"algorithm": "fedomg", "dataset": "rect4", "backend": "local", "global_lr": 0.3,
                               "omg_kappa": 0, "omg_solver": solver, "omg_rescale": rescale})
    rule = FedOMG(cfg, None)
    res = rule.aggregate(theta, updates, p, extras=[{}] * 5, round=1, info=RoundInfo.sources(5))
    expected = fedavg_step(theta, updates, p, 0.3)
    assert res.params.dtype == np.float32
    assert res.params.tobytes() == expected.tobytes()
    d, _ = fedomg_direction(updates, p, 0.0, solver=solver, rescale=rescale)
    assert d.tobytes() == weighted_sum(updates, p).tobytes()


# ================================================================================ exact solver
def _grid_objectives(G: np.ndarray, p: np.ndarray, kappa: float, n: int) -> np.ndarray:
    num = len(p)
    if num == 2:
        a = np.linspace(0.0, 1.0, n + 1)
        grid = np.stack([a, 1 - a], 1)
    else:
        i, j = np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij")
        keep = i + j <= n
        grid = np.stack([i[keep], j[keep], n - i[keep] - j[keep]], 1) / n
    quad = np.einsum("ku,uv,kv->k", grid, G, grid)
    return grid @ (G @ p) + kappa * math.sqrt(p @ G @ p) * np.sqrt(np.maximum(quad, 0.0))


@pytest.mark.parametrize("num,n", [(2, 20_000), (3, 300)])
def test_exact_solve_is_at_least_as_good_as_a_fine_simplex_grid(num, n):
    rng = np.random.default_rng(10 + num)
    interior = 0
    for case in range(25):
        _, G, p = _random_problem(rng, num, int(rng.integers(1, 6)))
        kappa = float(rng.uniform(0.05, 2.5))
        sol = solve_omg_exact_info(G, p, kappa)
        grid_best = float(_grid_objectives(G, p, kappa, n).min())
        noise = _evaluation_noise(G, p, kappa)
        assert sol.objective == pytest.approx(omg_objective(sol.gamma, G, p, kappa), rel=1e-12, abs=noise)
        assert sol.gamma.min() >= 0 and sol.gamma.sum() == pytest.approx(1.0, abs=1e-12)
        assert sol.objective <= grid_best + noise, (case, sol, grid_best)
        # and the certificate brackets the optimum: no grid point lies below the certified lower bound
        assert sol.lower_bound <= grid_best + noise
        interior += int(np.count_nonzero(sol.gamma) > 1)
    assert interior >= 5  # the cases exercise interior optima, not only vertices


def test_exact_solve_certifies_its_gap_on_larger_problems():
    rng = np.random.default_rng(5)
    for num in (10, 40):
        for kappa in (0.1, 0.5, 2.0):
            _, G, p = _random_problem(rng, num, 300)
            sol = solve_omg_exact_info(G, p, kappa, tol=1e-10)
            scale = math.sqrt(p @ G @ p) * math.sqrt(G.diagonal().max())
            assert 0 <= sol.gap <= 1e-10 * scale + _evaluation_noise(G, p, kappa)
            # KKT at the certified point: ∂_u F ≥ min on the support, equal on it (smooth optimum)
            zn = math.sqrt(sol.gamma @ G @ sol.gamma)
            grad = G @ p + kappa * math.sqrt(p @ G @ p) * (G @ sol.gamma) / zn
            on = sol.gamma > 0
            assert grad[on].max() - grad.min() <= 1e-8 * scale


def test_two_orthogonal_updates_closed_form():
    # Δ_1 = e_1, Δ_2 = e_2 (orthonormal), weights p = (p_1, p_2), Γ = (γ, 1 − γ), x = 2γ − 1:
    #   g_FL = p_1 e_1 + p_2 e_2, n = ‖g_FL‖ = √(p_1² + p_2²)
    #   ⟨Γg, g_FL⟩ = γ p_1 + (1 − γ) p_2,  ‖Γg‖ = √(γ² + (1 − γ)²) = √((1 + x²)/2)
    #   F(x) = (p_1 + p_2)/2 + x (p_1 − p_2)/2 + κ n √((1 + x²)/2)
    #   F'(x) = 0  ⇔  κ n √2 · x / √(1 + x²) = p_2 − p_1  ⇔  x = (p_2 − p_1) / √(2κ²n² − (p_2 − p_1)²)
    # (convex, so this stationary point is the optimum when |x| ≤ 1). With p = (0.6, 0.4), κ = 1:
    #   n² = 0.52, x = −0.2 / √(1.04 − 0.04) = −0.2  ⇒  Γ* = (0.4, 0.6);
    #   ‖Γ*g‖ = √(0.16 + 0.36) = √0.52 = n  ⇒  λ = κ n / ‖Γ*g‖ = 1
    #   d = g_FL + Γ*g = (0.6 + 0.4) e_1 + (0.4 + 0.6) e_2 = e_1 + e_2;  F* = 0.24 + 0.24 + 0.52 = 1
    #   cos(Δ_u, d) = 1/√2 for both: the matched direction treats the two clients alike.
    G = np.eye(2)
    p = np.array([0.6, 0.4])
    gamma = solve_omg_exact(G, p, 1.0)
    np.testing.assert_allclose(gamma, [0.4, 0.6], atol=1e-9)
    assert omg_objective(gamma, G, p, 1.0) == pytest.approx(1.0, abs=1e-12)
    updates = np.array([[1, 0, 0], [0, 1, 0]], np.float32)
    d, gamma = fedomg_direction(updates, p, 1.0)
    np.testing.assert_allclose(d, [1.0, 1.0, 0.0], atol=1e-9)
    np.testing.assert_allclose(cosines(G, omg_solution(G, p, 1.0).coefficients), [2 ** -0.5] * 2, atol=1e-9)
    # the same formula for other weights and radii (all with |x| < 1)
    for p1, kappa in ((0.7, 0.8), (0.3, 1.5), (0.55, 0.4), (0.9, 3.0)):
        p = np.array([p1, 1 - p1])
        n2 = p1 ** 2 + (1 - p1) ** 2
        x = (1 - 2 * p1) / math.sqrt(2 * kappa ** 2 * n2 - (1 - 2 * p1) ** 2)
        assert abs(x) < 1
        np.testing.assert_allclose(solve_omg_exact(G, p, kappa), [(1 + x) / 2, (1 - x) / 2], atol=1e-9)


def test_direction_formula_on_hand_cases():
    # (a) Δ_1 = (1, 0), Δ_2 = (0, 2), p = (½, ½), κ = ½. Γ = (γ, 1 − γ):
    #   F(γ) = γ/2 + 2(1 − γ) + κ‖g_FL‖ √(γ² + 4(1 − γ)²), ‖g_FL‖ = ‖(½, 1)‖ = √5/2;
    #   F'(1) = −3/2 + κ(√5/2)·(2γ − 8(1 − γ))/(2‖Γg‖)|_{γ=1} = −3/2 + √5/4 < 0, F convex ⇒ Γ* = (1, 0).
    #   Γ*g = Δ_1, ‖Γ*g‖ = 1 ⇒ d = g_FL + κ‖g_FL‖ Δ_1 = (½ + √5/4, 1).
    updates = np.array([[1, 0], [0, 2]], np.float32)
    p = np.array([0.5, 0.5])
    d, gamma = fedomg_direction(updates, p, 0.5)
    np.testing.assert_allclose(gamma, [1.0, 0.0], atol=1e-12)
    np.testing.assert_allclose(d, [0.5 + math.sqrt(5) / 4, 1.0], rtol=1e-12)
    d_rescaled, _ = fedomg_direction(updates, p, 0.5, rescale=True)  # the authors' ÷ (1 + κ²) = ÷ 1.25
    np.testing.assert_allclose(d_rescaled, [(0.5 + math.sqrt(5) / 4) / 1.25, 1.0 / 1.25], rtol=1e-12)
    # (b) Γ*g = 0: Δ = ±e_1, p = (0.7, 0.3), κ = 2. With x = γ_1 − γ_2, Γg = x e_1, g_FL = 0.4 e_1:
    #   F = 0.4x + 0.8|x| ≥ 0, minimum 0 at x = 0 ⇒ Γ* = (½, ½), Γ*g = 0 ⇒ d = g_FL = (0.4, 0).
    updates = np.array([[1, 0], [-1, 0]], np.float32)
    d, gamma = fedomg_direction(updates, np.array([0.7, 0.3]), 2.0)
    np.testing.assert_allclose(gamma, [0.5, 0.5], atol=1e-9)
    np.testing.assert_allclose(d, [0.4, 0.0], atol=1e-12)
    # ... while κ = ½ < 1 makes x < 0 pay: F = 0.4x + 0.2|x| is least at x = −1 ⇒ Γ* = e_2,
    #   d = g_FL + ½ · 0.4 · Δ_2 / 1 = (0.4 − 0.2, 0) = (0.2, 0).
    d, gamma = fedomg_direction(updates, np.array([0.7, 0.3]), 0.5)
    np.testing.assert_allclose(gamma, [0.0, 1.0], atol=1e-12)
    np.testing.assert_allclose(d, [0.2, 0.0], atol=1e-12)
    # (c) one client: Γ* = (1), d = (1 + κ) Δ
    d, gamma = fedomg_direction(np.array([[2, -1]], np.float32), np.array([1.0]), 0.5)
    np.testing.assert_array_equal(gamma, [1.0])
    np.testing.assert_allclose(d, [3.0, -1.5], rtol=1e-15)


def test_optimum_at_zero_gives_fedavg_direction_not_rounding_noise():
    # 4 updates in the plane around the origin (0 ∈ their hull) and κ = 3 > 1: F ≥ (κ − 1)‖g_FL‖‖Γg‖ ≥ 0,
    # so Γ*g = 0 and d = g_FL. Computed from G, ‖Γ*g‖ is rounding noise (√1e-18 ≈ 1e-9, either sign
    # of ΓᵀGΓ); λ = κ‖g_FL‖/noise would add a vector of norm κ‖g_FL‖ in a random direction.
    rng = np.random.default_rng(0)
    for _ in range(8):
        X = rng.standard_normal((4, 2))
        X = (X - 0.9 * X.mean(0)).astype(np.float32)
        p = rng.dirichlet(np.ones(4))
        G = gram_matrix(X)
        assert solve_omg_exact_info(G, p, 3.0).degenerate
        d, gamma = fedomg_direction(X, p, 3.0)
        g_fl = p @ X.astype(np.float64)
        np.testing.assert_allclose(d, g_fl, rtol=0, atol=1e-12)
        assert np.linalg.norm(gamma @ X.astype(np.float64)) < 1e-6 * np.abs(X).max()


def test_exact_solver_degenerate_inputs():
    p = np.array([0.25, 0.75])
    # all updates zero: objective ≡ 0, returns p
    np.testing.assert_array_equal(solve_omg_exact(np.zeros((2, 2)), p, 0.5), p)
    d, gamma = fedomg_direction(np.zeros((2, 4), np.float32), p, 0.5)
    np.testing.assert_array_equal(d, np.zeros(4))
    np.testing.assert_array_equal(gamma, p)
    # g_FL = 0 with nonzero updates (Δ_2 = −3 Δ_1, p = (¾, ¼)): objective ≡ 0, d = 0
    updates = np.array([[1, 2], [-3, -6]], np.float32)
    d, _ = fedomg_direction(updates, np.array([0.75, 0.25]), 0.5)
    np.testing.assert_array_equal(d, [0.0, 0.0])
    # κ = 0: linear objective ⟨Δ_u, g_FL⟩ ⇒ the vertex with the least one (lowest index on ties)
    G = np.array([[4.0, 1.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 9.0]])
    np.testing.assert_array_equal(solve_omg_exact(G, np.ones(3) / 3, 0.0), [0.0, 1.0, 0.0])
    with pytest.raises(ValueError, match="kappa"):
        solve_omg_exact(G, np.ones(3) / 3, -0.5)
    with pytest.raises(ValueError, match="solver"):
        omg_solution(G, np.ones(3) / 3, 0.5, solver="adam")


# ================================================================================ authors' solver
def _authors_iteration(G: list[list[float]], p: list[float], kappa: float, lr: float = 25.0, momentum: float = 0.5,
                       steps: int = 20, eps: float = 1e-4) -> list[float]:
    """docs/methods-seeds.md §1 / the paper's Table 4, written out in plain Python: normalise G by the squared
    mean update norm √(G_uu + eps); Γ = softmax(w) from w = 0; steps + 1 evaluations of
    J = Γᵀ(Ĝp) + κ√(pᵀĜp + eps)·√(ΓᵀĜΓ + eps), each of the first `steps` followed by one SGD step
    with momentum (v = ∇J first, then v = momentum·v + ∇J; w −= lr·v); keep the best iterate."""
    n = len(p)
    s = sum(math.sqrt(G[u][u] + eps) for u in range(n)) / n
    Gn = [[G[u][v] / s ** 2 for v in range(n)] for u in range(n)]
    b = [sum(Gn[u][v] * p[v] for v in range(n)) for u in range(n)]
    c = kappa * math.sqrt(sum(p[u] * b[u] for u in range(n)) + eps)
    w = [0.0] * n
    v_mom: list[float] | None = None
    best, best_w = float("inf"), list(w)
    for i in range(steps + 1):
        m = max(w)
        e = [math.exp(x - m) for x in w]
        gam = [x / sum(e) for x in e]
        Gg = [sum(Gn[u][v] * gam[v] for v in range(n)) for u in range(n)]
        root = math.sqrt(sum(gam[u] * Gg[u] for u in range(n)) + eps)
        J = sum(gam[u] * b[u] for u in range(n)) + c * root
        if J < best:
            best, best_w = J, list(w)
        if i < steps:
            dJ_dgam = [b[u] + c * Gg[u] / root for u in range(n)]
            mean = sum(gam[u] * dJ_dgam[u] for u in range(n))
            grad = [gam[u] * (dJ_dgam[u] - mean) for u in range(n)]  # softmax backward
            v_mom = grad if v_mom is None else [momentum * a + g for a, g in zip(v_mom, grad)]
            w = [x - lr * a for x, a in zip(w, v_mom)]
    m = max(best_w)
    e = [math.exp(x - m) for x in best_w]
    return [x / sum(e) for x in e]


def test_sgd_solver_reproduces_the_authors_iteration():
    rng = np.random.default_rng(7)
    for num, kappa in ((3, 0.5), (5, 0.5), (4, 2.0), (8, 0.1)):
        X = (rng.standard_normal((num, 40)) + rng.standard_normal(40)) * 0.03  # update-sized norms (eps matters)
        G, p = X @ X.T, rng.dirichlet(np.ones(num))
        ref = _authors_iteration(G.tolist(), p.tolist(), kappa)
        got = solve_omg_sgd(G, p, kappa)
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-12)
        assert not np.allclose(got, np.ones(num) / num, atol=1e-3)  # it moved away from w = 0
    # other hyperparameters flow through (one step, lr 1, no momentum)
    np.testing.assert_allclose(solve_omg_sgd(G, p, 0.5, lr=1.0, momentum=0.0, steps=1),
                               _authors_iteration(G.tolist(), p.tolist(), 0.5, lr=1.0, momentum=0.0, steps=1),
                               atol=1e-14)


def test_sgd_solver_matches_the_authors_torch_code():
    """Their OMG() (FedOMG-DG utils/fed_merge.py: torch.optim.SGD on softmax weights, autograd),
    in float64, with their p = 1/U."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(8)
    num, kappa = 4, 0.5
    X = (rng.standard_normal((num, 30)) + rng.standard_normal(30)) * 0.05
    GG = torch.tensor(X @ X.T, dtype=torch.float64)
    scale = (torch.diag(GG) + 1e-4).sqrt().mean()
    GG = GG / scale.pow(2)
    Gg = GG.mean(1, keepdim=True)
    gg = Gg.mean(0, keepdim=True)
    w = torch.zeros(num, 1, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.SGD([w], lr=25, momentum=0.5)
    c = (gg + 1e-4).sqrt() * kappa
    w_best, obj_best = None, math.inf
    for i in range(21):
        opt.zero_grad()
        ww = torch.softmax(w, 0)
        obj = ww.t().mm(Gg) + c * (ww.t().mm(GG).mm(ww) + 1e-4).sqrt()
        if obj.item() < obj_best:
            obj_best, w_best = obj.item(), w.clone()
        if i < 20:
            obj.backward()
            opt.step()
    theirs = torch.softmax(w_best, 0).detach().numpy().ravel()
    np.testing.assert_allclose(solve_omg_sgd(X @ X.T, np.ones(num) / num, kappa), theirs, atol=1e-13)


def test_exact_objective_is_never_worse_than_sgd():
    rng = np.random.default_rng(9)
    strictly_better = 0
    for case in range(40):
        num = int(rng.integers(2, 25))
        _, G, p = _random_problem(rng, num, int(rng.integers(2, 60)))
        kappa = float(rng.uniform(0.0, 2.0))
        exact = omg_objective(solve_omg_exact(G, p, kappa), G, p, kappa)
        sgd = omg_objective(solve_omg_sgd(G, p, kappa), G, p, kappa)
        assert exact <= sgd + _evaluation_noise(G, p, kappa), case
        scale = math.sqrt(p @ G @ p) * math.sqrt(G.diagonal().max())
        strictly_better += int(exact < sgd - 1e-6 * scale)
    assert strictly_better >= 10  # the authors' 20 steps often stop short of the optimum


# ================================================================================ the rule
def test_rule_step_and_diagnostics_by_hand():
    # case (a) of test_direction_formula_on_hand_cases: d = (½ + √5/4, 1), Γ* = (1, 0)
    cfg = FederatedRunConfig.from_dict({"algorithm": "fedomg", "dataset": "rect4", "backend": "local"})
    assert resolve(cfg).server_rule is FedOMG and SERVER_RULES["fedomg"] is FedOMG
    assert PRESETS["fedomg"].settings == ("fdg", "fl") and PRESETS["fedomg"].server_rule == "fedomg"
    rule = FedOMG(cfg, None)
    assert rule.global_lr == 0.05 and OMG_KAPPA.of(cfg) == 0.5 and OMG_SOLVER.of(cfg) == "exact"
    assert OMG_RESCALE.of(cfg) is False and rule.state_dict() == {}
    theta = np.array([1.0, -1.0], np.float32)
    updates = np.array([[1, 0], [0, 2]], np.float32)
    info = RoundInfo((3, 7), ("source", "source"), (1, 1), (10, 10))
    res = rule.aggregate(theta, updates, np.array([0.5, 0.5]), extras=[{}, {}], round=1, info=info)
    d = np.array([0.5 + math.sqrt(5) / 4, 1.0])
    np.testing.assert_allclose(res.params, (theta + 0.05 * d).astype(np.float32), rtol=1e-7)
    diag = res.diagnostics
    assert diag["omg_gamma.3"] == pytest.approx(1.0) and diag["omg_gamma.7"] == pytest.approx(0.0, abs=1e-12)
    cos = [d[0] / np.linalg.norm(d), 2 * d[1] / (2 * np.linalg.norm(d))]
    assert diag["omg_cos.3"] == pytest.approx(cos[0]) and diag["omg_cos.7"] == pytest.approx(cos[1])
    assert diag["omg_cos_std"] == pytest.approx(abs(cos[0] - cos[1]) / 2)
    # F(Γ*) = ⟨Δ_1, g_FL⟩ + κ‖g_FL‖‖Δ_1‖ = ½ + ½ · √5/2
    assert diag["omg_objective"] == pytest.approx(0.5 + math.sqrt(5) / 4)
    assert diag["omg_lambda"] == pytest.approx(0.5 * math.sqrt(5) / 2)
    assert all(diag[k] >= 0 for k in ("omg_gram_s", "omg_solve_s", "omg_combine_s"))


def test_fedomg_step_timings_and_solvers_agree_on_direction_form():
    rng = np.random.default_rng(11)
    X = rng.standard_normal((6, 5000)).astype(np.float32)
    p = fedavg_weights(rng.integers(1, 9, 6))
    for solver in ("exact", "sgd"):
        step = fedomg_step(X, p, 0.5, solver=solver)
        sol = step.solution
        # d = g_FL + λ Γ*g with λ = κ‖g_FL‖/‖Γ*g‖, computed here directly in float64
        X64 = X.astype(np.float64)
        g_fl, gg = p @ X64, sol.gamma @ X64
        expected = g_fl + 0.5 * np.linalg.norm(g_fl) / np.linalg.norm(gg) * gg
        np.testing.assert_allclose(step.out, expected, rtol=1e-10, atol=1e-12)
        assert min(step.gram_s, step.solve_s, step.combine_s) >= 0


def test_fedomg_end_to_end_on_rotated_digits(tmp_path):
    from fedtune.runtime.driver import run

    cfg = FederatedRunConfig.from_dict({"algorithm": "fedomg", "dataset": "rotated-digits", "setting": "fdg", "rounds": 2,
                               "local_steps": 1, "batch_size": 16, "model": "mlp", "mlp_hidden": [16],
                               "backend": "local", "output": str(tmp_path), "name": "omg", "omg_kappa": 0.5})
    result = run(cfg, progress=False)
    assert result.status == "completed" and len(result.rows) == 2
    for row in result.rows:
        ids = sorted(int(k.split(".")[-1]) for k in row if k.startswith("diag.omg_gamma."))
        assert len(ids) == row["num_participants"] == 5  # 6 rotations, one held out
        gammas = [row[f"diag.omg_gamma.{c}"] for c in ids]
        assert sum(gammas) == pytest.approx(1.0) and min(gammas) >= 0
        assert all(-1 <= row[f"diag.omg_cos.{c}"] <= 1 for c in ids)
        for key in ("omg_cos_std", "omg_objective", "omg_lambda", "omg_gram_s", "omg_solve_s", "omg_combine_s"):
            assert math.isfinite(row[f"diag.{key}"]), key
        assert 0 <= row["target_acc"] <= 1


def test_bad_hyperparameters_are_config_errors():
    base = {"algorithm": "fedomg", "dataset": "rect4", "backend": "local"}
    with pytest.raises(ConfigError, match="omg_kappa.*>= 0"):
        FederatedRunConfig.from_dict({**base, "omg_kappa": -1})
    with pytest.raises(ConfigError, match="omg_solver.*exact, sgd"):
        FederatedRunConfig.from_dict({**base, "omg_solver": "adam"})
    with pytest.raises(ConfigError, match="omg_rescale"):
        FederatedRunConfig.from_dict({**base, "omg_rescale": "maybe"})
    assert OMG_KAPPA.of(FederatedRunConfig.from_dict({**base, "omg_kappa": 0.25, "omg_solver": "sgd"})) == 0.25


def test_module_doctests():
    failures, tried = doctest.testmod(fedomg_mod)
    assert tried > 5 and failures == 0
