"""FedOMG's step 2 on the Gram matrix (Nguyen et al., ICLR 2025; docs/methods.md §1; the rule and the
notation: :mod:`fedtune.algorithms.fedomg`).

``Γ* = argmin_{Γ ∈ simplex} ⟨Γg, g_FL⟩ + κ ‖g_FL‖ ‖Γg‖`` depends only on the Gram matrix
``G = [⟨Δ_u, Δ_v⟩]`` and the weights ``p``, so everything here works on ``U``-sized arrays and
never touches an ``M``-sized vector: the objective (:func:`omg_objective`), the certified exact
solver (:func:`solve_omg_exact`, Wolfe's minimum-norm point inside a root search) and the
authors' softmax-SGD iteration (:func:`solve_omg_sgd`), and the direction's coefficients on the
updates (:func:`omg_solution`: ``d = Σ_u (p_u + λ γ_u) Δ_u``) and cosines (:func:`cosines`).

Each public function checks its problem (shapes, ``κ ≥ 0`` finite) once, at its entry, and
works on the checked arrays from there on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

SOLVERS = ("exact", "sgd")


# ============================================================================== objective
def _as_problem(G: np.ndarray, p: np.ndarray, kappa: float) -> tuple[np.ndarray, np.ndarray, float]:
    G = np.asarray(G, dtype=np.float64)
    p = np.asarray(p, dtype=np.float64)
    if G.ndim != 2 or G.shape[0] != G.shape[1] or p.shape != (G.shape[0],):
        raise ValueError(f"G must be [U, U] and p [U]; got G {G.shape}, p {p.shape}")
    if G.shape[0] == 0:
        raise ValueError("FedOMG needs at least one update")
    kappa = float(kappa)
    if not (kappa >= 0 and math.isfinite(kappa)):
        raise ValueError(f"kappa must be a finite number >= 0, got {kappa}")
    return G, p, kappa


def _sqrt0(x: float) -> float:
    """√x for a squared norm that rounding may have made slightly negative."""
    return math.sqrt(x) if x > 0 else 0.0


def omg_objective(gamma: np.ndarray, G: np.ndarray, p: np.ndarray, kappa: float) -> float:
    """The step-2 objective ``⟨Γg, g_FL⟩ + κ ‖g_FL‖ ‖Γg‖`` from the Gram matrix only:
    ``Γᵀ G p + κ √(pᵀ G p) √(Γᵀ G Γ)``.

    >>> G = np.array([[1., 0.], [0., 4.]])   # Δ_1 ⊥ Δ_2, ‖Δ_1‖ = 1, ‖Δ_2‖ = 2
    >>> omg_objective(np.array([1., 0.]), G, np.array([.5, .5]), 0.5)   # 0.5 + 0.5·√1.25·1
    1.0590169943749475
    """
    return _objective(gamma, *_as_problem(G, p, kappa))


def _objective(gamma: np.ndarray, G: np.ndarray, p: np.ndarray, kappa: float) -> float:
    """:func:`omg_objective` on a checked problem (:func:`_as_problem`)."""
    gamma = np.asarray(gamma, dtype=np.float64)
    gp = G @ p
    return float(gamma @ gp + kappa * _sqrt0(float(p @ gp)) * _sqrt0(float(gamma @ G @ gamma)))


# ============================================================================== exact solver
@dataclass(frozen=True)
class ExactSolve:
    """What :func:`solve_omg_exact_info` found: ``gamma`` (Γ*), its ``objective``, a certified
    lower bound on the optimum (``gap = objective − lower_bound ≥ 0``) and the work done."""

    gamma: np.ndarray
    objective: float
    lower_bound: float
    evaluations: int  # min-norm-point solves (one per value of τ)
    degenerate: bool  # optimum at Γg = 0 (objective 0), where the objective is not smooth

    @property
    def gap(self) -> float:
        return self.objective - self.lower_bound


def _affine_minimizer(K: np.ndarray) -> np.ndarray | None:
    """Weights ``α`` (Σα = 1) of the point of least norm in the affine hull of the points with
    Gram matrix ``K``; None when the points are (numerically) affinely dependent."""
    n = K.shape[0]
    if n == 1:
        return np.ones(1)
    A = np.zeros((n + 1, n + 1))
    A[:n, :n] = K
    A[:n, n] = 1.0
    A[n, :n] = 1.0
    rhs = np.zeros(n + 1)
    rhs[n] = 1.0
    try:
        sol = np.linalg.solve(A, rhs)
    except np.linalg.LinAlgError:
        return None
    alpha = sol[:n]
    if not np.all(np.isfinite(alpha)) or abs(alpha.sum() - 1.0) > 1e-8:
        return None
    return alpha


def _min_norm_point(K: np.ndarray, support: list[int], lam: np.ndarray,
                    tol: float = 1e-14) -> tuple[list[int], np.ndarray]:
    """Wolfe's (1976) minimum-norm-point algorithm on a Gram matrix: ``argmin_{λ ∈ simplex} λᵀKλ``.

    ``support``/``lam`` is a start (any point of the simplex on affinely independent points;
    the previous solve's answer is a good warm start). Returns the final corral and its
    weights; finite in exact arithmetic, with the usual tolerances in floating point.

    Every step (affine minimisers, the optimality test ``min_u (Kλ)_u ≥ λᵀKλ``, the ratio test)
    is unchanged when a constant is added to all entries of ``K``, so ``K`` may be a Gram matrix
    minus a constant (not PSD itself); the tolerance is relative to ``max |K|``.
    """
    kmax = float(np.abs(K).max())
    if not kmax > 0:
        return support, lam
    K = K / kmax
    eps = 1e-15
    S = list(support)
    lam = np.asarray(lam, dtype=np.float64).copy()
    added: int | None = None
    for _ in range(100 * K.shape[0] + 100):
        # minor cycle: move to the affine minimiser of the corral, dropping points on the way
        while True:
            alpha = _affine_minimizer(K[np.ix_(S, S)])
            if alpha is None:  # dependent corral (rounding): drop the newest point and stop
                if added is not None and added in S and len(S) > 1:
                    i = S.index(added)
                    S.pop(i)
                    lam = np.delete(lam, i)
                    lam /= lam.sum()
                return S, lam
            if alpha.min() > eps:
                lam = alpha
                break
            neg = alpha <= eps
            with np.errstate(divide="ignore", invalid="ignore"):
                ratios = np.where(lam[neg] - alpha[neg] > 0, lam[neg] / (lam[neg] - alpha[neg]), 0.0)
            k = int(np.flatnonzero(neg)[int(np.argmin(ratios))])
            theta = float(min(1.0, max(0.0, ratios.min())))
            lam = lam + theta * (alpha - lam)
            lam[k] = 0.0
            keep = lam > 0
            keep[k] = False
            if added is not None and S[k] == added and theta == 0.0:
                # the newly added point cannot enter: optimal up to rounding
                S = [s for s, kp in zip(S, keep) if kp]
                lam = lam[keep] / lam[keep].sum()
                return S, lam
            S = [s for s, kp in zip(S, keep) if kp]
            lam = lam[keep]
            lam /= lam.sum()
        # major cycle: is the current point optimal over all points?
        kx = K[:, S] @ lam
        nx2 = float(lam @ kx[S])
        j = int(np.argmin(kx))
        if kx[j] >= nx2 - tol or j in S:
            return S, lam
        S.append(j)
        lam = np.append(lam, 0.0)
        added = j
    return S, lam


def _norm_floor(G: np.ndarray) -> float:
    """How small ``‖Γg‖ = √(ΓᵀGΓ)`` can be and still be told from zero given ``G`` alone: the
    quadratic form's rounding error is at most ``≈ 8 U ε max_u G_uu``, so below
    ``√(8 U ε) max_u ‖Δ_u‖`` (≈ 1e-7 relative for U = 100) ``Γg`` is rounding noise."""
    return math.sqrt(8.0 * G.shape[0] * np.finfo(np.float64).eps * max(float(G.diagonal().max()), 0.0))


def _affine_path(Gn: np.ndarray, b: np.ndarray, S: list[int]) -> tuple[np.ndarray, np.ndarray] | None:
    """On the corral ``S``, the affine minimiser of ``{Δ_u + τ g_FL}`` is ``α0 + τ α1``:
    ``G_SS α + τ b_S = μ 1``, ``1ᵀα = 1`` is linear in ``τ``. None if ``S`` is dependent."""
    n = len(S)
    A = np.zeros((n + 1, n + 1))
    A[:n, :n] = Gn[np.ix_(S, S)]
    A[:n, n] = -1.0
    A[n, :n] = 1.0
    rhs = np.zeros((n + 1, 2))
    rhs[n, 0] = 1.0
    rhs[:n, 1] = -b[S]
    try:
        sol = np.linalg.solve(A, rhs)
    except np.linalg.LinAlgError:
        return None
    if not np.all(np.isfinite(sol)):
        return None
    return sol[:n, 0], sol[:n, 1]


def solve_omg_exact_info(G: np.ndarray, p: np.ndarray, kappa: float, tol: float = 1e-10) -> ExactSolve:
    """Solve step 2 to a certified tolerance from the Gram matrix; see :func:`solve_omg_exact`.

    Method. With ``t > 0``, ``c‖Γg‖ = min_t c (‖Γg‖²/t + t)/2`` (``c = κ‖g_FL‖``), so the optimum
    is ``min_t φ(t)`` with ``φ(t) = min_Γ ⟨Γg, g_FL⟩ + c (‖Γg‖²/t + t)/2``, a convex function of
    ``t``. For fixed ``t`` the inner problem is, up to constants, ``min_Γ ‖Γg + τ g_FL‖²`` with
    ``τ = t/c``: the minimum-norm point of the polytope ``conv{Δ_u + τ g_FL}``, solved exactly by
    Wolfe's algorithm on its Gram matrix ``G + τ(Gp 1ᵀ + 1 pᵀG) + τ² pᵀGp``. As
    ``φ'(t) = c (1 − ‖Γ(t)g‖²/t²)/2`` is non-decreasing, the optimum ``t* = ‖Γ*g‖`` is the root
    of ``‖Γ(t)g‖ = t``. On a fixed support the inner solution is affine in ``τ``, so each solve
    proposes the exact root for its support (a quadratic equation); when that falls outside the
    bracket, safeguarded regula falsi on ``log t`` is used instead. (At the root
    ``d = (Γ*g + τ* g_FL)/τ*``: the CAGrad direction.)

    Certificate. The search stops when ``objective − lower_bound ≤ tol · ‖g_FL‖ max_u ‖Δ_u‖``,
    with lower bounds on the optimum from (a) Frank–Wolfe: ``min_u ∂_u F(Γ)`` at any iterate
    with ``Γg ≠ 0`` (``F`` is convex), (b) convexity of ``φ``: ``φ(t) + φ'(t)(t_end − t)`` with
    ``t_end`` the bracket end beyond ``t*`` (``φ(t)`` from the inner solve, exact to Wolfe's
    tolerance; the rounding of ``‖Γg‖²`` is allowed for), and (c) ``F* ≥ ⟨Γ*g, g_FL⟩ ≥ −‖g_FL‖ t_hi`` once
    ``t* ≤ t_hi``. Bound (c) certifies an optimum at ``Γg = 0`` (objective exactly 0; ``F`` is not
    differentiable there), down to the rounding floor of ``‖Γg‖`` computed from ``G``
    (:func:`_norm_floor`, ≈ 1e-8 to 1e-7 of ``max ‖Δ_u‖``): such optima are certified only to
    ``≈ (1 + κ) ‖g_FL‖ × floor``, whatever ``tol``.

    Degenerate inputs: all updates zero or ``g_FL = 0`` (the objective is identically 0:
    returns ``p``); ``κ = 0`` (linear objective: the vertex of least ``⟨Δ_u, g_FL⟩``, lowest index
    on ties); ``U = 1``.
    """
    return _solve_exact(*_as_problem(G, p, kappa), tol)


def _solve_exact(G: np.ndarray, p: np.ndarray, kappa: float, tol: float = 1e-10) -> ExactSolve:
    """:func:`solve_omg_exact_info` on a checked problem (:func:`_as_problem`)."""
    num = G.shape[0]
    diag = np.maximum(G.diagonal(), 0.0)
    scale = float(diag.mean())
    if num == 1:
        f1 = _objective(np.ones(1), G, p, kappa)
        return ExactSolve(np.ones(1), f1, f1, 0, False)
    if not scale > 0:  # every update is zero: the objective is identically 0
        return ExactSolve(p.copy(), 0.0, 0.0, 0, False)
    Gn = G / scale  # normalised: mean ‖Δ_u‖² = 1 (the objective scales by 1/scale)
    b = Gn @ p  # ⟨Δ_u, g_FL⟩
    a = max(float(p @ b), 0.0)  # ‖g_FL‖²
    gnorm = math.sqrt(a)
    if gnorm == 0:  # g_FL = 0 ⇒ Gp = 0 (G is PSD): the objective is identically 0
        return ExactSolve(p.copy(), 0.0, 0.0, 0, False)
    c = kappa * gnorm
    if c == 0:  # κ = 0: linear objective ⟨Δ_u, g_FL⟩, minimised at a vertex
        k = int(np.argmin(b))
        gamma = np.zeros(num)
        gamma[k] = 1.0
        return ExactSolve(gamma, float(b[k]) * scale, float(b[k]) * scale, 0, False)
    dmax = math.sqrt(float(diag.max()) / scale)  # max_u ‖Δ_u‖ ≥ ‖Γg‖ for every Γ
    floor = _norm_floor(Gn)
    z2_err = floor * floor  # rounding bound of a computed ‖Γg‖²
    stop = tol * gnorm * dmax

    def objective(gamma: np.ndarray) -> tuple[float, float]:
        zn = _sqrt0(float(gamma @ Gn @ gamma))
        return float(gamma @ b) + c * zn, zn

    # Upper bounds from the vertices and from p (a safety net; the solve does at least as well).
    vertex_obj = b + c * np.sqrt(diag / scale)
    k = int(np.argmin(vertex_obj))
    best_gamma = np.zeros(num)
    best_gamma[k] = 1.0
    best_obj = float(vertex_obj[k])
    p_obj, _ = objective(p)
    if p_obj < best_obj:
        best_gamma, best_obj = p.copy(), p_obj
    lower = -math.inf
    evaluations = 0
    support: list[int] = [int(np.argmin(diag))]
    lam = np.ones(1)
    t_lo, t_hi = 0.0, dmax  # t* = ‖Γ*g‖ ∈ [0, max_u ‖Δ_u‖]
    ends: dict[str, tuple[float, float, float, float]] = {}  # "lo"/"hi" -> (t, φ, φ', ‖Γ(t)g‖²)

    def root_on_support() -> float | None:
        """The t solving ‖α(τ)g‖ = c τ for the affine path α(τ) of the current corral, if feasible."""
        path = _affine_path(Gn, b, support)
        if path is None:
            return None
        a0, a1 = path
        G_SS = Gn[np.ix_(support, support)]
        g1 = G_SS @ a1
        # ‖α0 + τ α1‖²_G = c² τ²  ⇔  qa τ² + qb τ + qc = 0
        qa, qb, qc = float(a1 @ g1) - c * c, 2.0 * float(a0 @ g1), float(a0 @ (G_SS @ a0))
        if qa == 0:
            roots = [-qc / qb] if qb else []
        else:
            disc = qb * qb - 4 * qa * qc
            if disc < 0:
                return None
            q = -0.5 * (qb + math.copysign(math.sqrt(disc), qb))  # the stable form of both roots
            roots = [q / qa] + ([qc / q] if q else [])
        for r in roots:
            if r > 0 and np.all(a0 + r * a1 >= 0):
                return float(r) * c
        return None

    def min_norm_point(K: np.ndarray) -> tuple[np.ndarray, float]:
        """Wolfe's point for the Gram matrix ``K`` (warm-started from the last corral) as ``Γ``,
        kept if it is the best seen; returns ``(Γ, ‖Γg‖)``."""
        nonlocal support, lam, best_gamma, best_obj, evaluations
        support, lam = _min_norm_point(K, support, lam)
        evaluations += 1
        gamma = np.zeros(num)
        gamma[support] = lam
        f, zn = objective(gamma)
        if f < best_obj:
            best_gamma, best_obj = gamma, f
        return gamma, zn

    def at(t: float) -> tuple[float, float, float, float]:
        """Solve the inner problem at t: (t, φ(t), φ'(t), ‖Γ(t)g‖²); updates bounds and proposal."""
        nonlocal lower
        # Gram matrix of the points Δ_u + τ g_FL, less the constant τ²‖g_FL‖² (see _min_norm_point)
        gamma, zn = min_norm_point(Gn + (t / c) * (b[:, None] + b[None, :]))
        if zn > floor:  # (a) Frank–Wolfe bound: F* ≥ min_u ∂_u F(Γ)
            lower = max(lower, float(np.min(b + (c / zn) * (Gn @ gamma))))
        return t, float(gamma @ b) + 0.5 * c * (zn * zn / t + t), 0.5 * c * (1.0 - (zn / t) ** 2), zn * zn

    def put(point: tuple[float, float, float, float]) -> None:
        """Make ``point`` a bracket end (φ' < 0: t* lies above it; φ' ≥ 0: at or below it)."""
        nonlocal t_lo, t_hi
        if point[2] < 0:
            ends["lo"], t_lo = point, point[0]
        else:
            ends["hi"], t_hi = point, point[0]

    def certified() -> bool:
        nonlocal lower
        if "lo" in ends:  # (b) at t_lo: φ(t*) ≥ φ(t_lo) + φ'(t_lo)(t_hi − t_lo)
            t, phi, dphi, _ = ends["lo"]
            lower = max(lower, phi + dphi * (t_hi - t) - 0.5 * c * z2_err * (1 / t + (t_hi - t) / t ** 2))
        if "hi" in ends:  # (b) at t_hi: φ(t*) ≥ φ(t_hi) − φ'(t_hi)(t_hi − t_lo), rounding of ‖Γg‖² allowed for
            t, phi, dphi, _ = ends["hi"]
            lower = max(lower, phi + dphi * (t_lo - t) - 0.5 * c * z2_err * (2 * t - t_lo) / t ** 2)
            lower = max(lower, -gnorm * t_hi)  # (c)
        return best_obj - lower <= stop

    # Bracket t*, starting from the FedAvg point (Γ = p: ‖Γg‖ = ‖g_FL‖).
    put(at(min(gnorm, dmax)))
    if "lo" in ends and t_hi > t_lo:
        put(at(t_hi))
    last, w_lo, w_hi = "", 1.0, 1.0
    for _ in range(200):
        if certified():
            break
        proposal = root_on_support()
        if "lo" not in ends:  # t* below every t tried: go down (an optimum at Γg = 0 ends here)
            if t_hi <= floor:
                break
            t = proposal if proposal is not None and proposal < t_hi else t_hi * 1e-3
            put(at(max(t, 0.5 * floor)))
            continue
        if t_hi <= t_lo * (1 + 1e-15):
            break
        if proposal is not None and t_lo < proposal < t_hi:
            t = proposal  # the exact root if the support is right
        else:  # regula falsi (Illinois) on h(s) = log(‖Γ(t)g‖ / t), s = log t
            s_lo, s_hi = math.log(t_lo), math.log(t_hi)
            h_lo = w_lo * 0.5 * math.log(ends["lo"][3] / t_lo ** 2)
            h_hi = w_hi * 0.5 * math.log(ends["hi"][3] / t_hi ** 2) if ends["hi"][3] > 0 else -math.inf
            if math.isfinite(h_hi) and h_lo > h_hi:
                s = s_lo + h_lo * (s_hi - s_lo) / (h_lo - h_hi)
                margin = 1e-3 * (s_hi - s_lo)
                s = min(max(s, s_lo + margin), s_hi - margin)
            else:
                s = 0.5 * (s_lo + s_hi)
            t = math.exp(s)
        point = at(t)
        side = "lo" if point[2] < 0 else "hi"
        if side == "lo":  # Illinois: an end kept twice in a row has its value halved (again each time)
            w_lo, w_hi = 1.0, (w_hi * 0.5 if last == "lo" else w_hi)
        else:
            w_hi, w_lo = 1.0, (w_lo * 0.5 if last == "hi" else w_lo)
        last = side
        put(point)
    if "lo" not in ends and not certified():
        min_norm_point(Gn)  # t* ≤ the rounding floor: finish at t = 0, the minimum-norm point of conv{Δ_u}
    certified()
    degenerate = objective(best_gamma)[1] <= floor
    return ExactSolve(best_gamma, best_obj * scale, min(lower, best_obj) * scale, evaluations, degenerate)


def solve_omg_exact(G: np.ndarray, p: np.ndarray, kappa: float, tol: float = 1e-10) -> np.ndarray:
    """``Γ* = argmin_{Γ ∈ simplex} ⟨Γg, g_FL⟩ + κ ‖g_FL‖ ‖Γg‖`` from the Gram matrix ``G`` and the
    weights ``p`` (``g_FL = Σ p_u Δ_u``), certified to within ``tol · ‖g_FL‖ max_u ‖Δ_u‖`` of the
    optimum (method and degenerate cases: :func:`solve_omg_exact_info`).

    >>> G = np.array([[1., 0.], [0., 1.]])        # two orthonormal updates
    >>> solve_omg_exact(G, np.array([.5, .5]), 0.5).round(6)
    array([0.5, 0.5])
    """
    return solve_omg_exact_info(G, p, kappa, tol).gamma


# ============================================================================== authors' solver
def solve_omg_sgd(G: np.ndarray, p: np.ndarray, kappa: float, lr: float = 25.0, momentum: float = 0.5,
                  steps: int = 20, eps: float = 1e-4) -> np.ndarray:
    """The authors' solver for step 2 (their ``OMG``/``grad_omg``; CAGrad's fast variant), in float64:

    1. normalise ``Ĝ = G / s²`` with ``s = mean_u √(G_uu + eps)`` (their "mean update norm");
    2. ``b = Ĝ p``, ``c = κ √(pᵀĜp + eps)``; ``Γ = softmax(w)`` from ``w = 0``;
    3. ``steps + 1`` evaluations of ``J(w) = Γᵀb + c √(ΓᵀĜΓ + eps)``; after each of the first
       ``steps`` ones, one step of SGD with momentum on ``w`` (torch's rule: ``v ← ∇J`` on the
       first step, then ``v ← momentum · v + ∇J``; ``w ← w − lr · v``);
    4. return ``softmax`` of the iterate with the lowest ``J`` seen (strictly lower wins).

    Defaults are the paper's Table 4 ("training lr 25, iteration 21, momentum 0.5"); ``eps`` is
    their ``1e-4``. Their code uses ``p = 1/U`` (means of ``Ĝ``); with weights ``p`` given, ``b``
    and ``c`` use them. Not reproduced: their FL code's ``StepLR`` schedule (absent from the DG
    code the paper's numbers come from) and the doubled ``lr`` when exactly 50 clients take part.

    >>> solve_omg_sgd(np.eye(2), np.array([.5, .5]), 0.5)   # symmetric: stays at the centre
    array([0.5, 0.5])
    """
    return _solve_sgd(*_as_problem(G, p, kappa), lr, momentum, steps, eps)


def _solve_sgd(G: np.ndarray, p: np.ndarray, kappa: float, lr: float = 25.0, momentum: float = 0.5,
               steps: int = 20, eps: float = 1e-4) -> np.ndarray:
    """:func:`solve_omg_sgd` on a checked problem (:func:`_as_problem`)."""
    num = G.shape[0]
    s = float(np.mean(np.sqrt(np.maximum(G.diagonal(), 0.0) + eps)))
    Gn = G / (s * s)
    b = Gn @ p
    c = math.sqrt(max(float(p @ b), 0.0) + eps) * kappa
    w = np.zeros(num)
    velocity: np.ndarray | None = None
    best_w, best = w.copy(), math.inf
    for i in range(steps + 1):
        gamma = _softmax(w)
        gg = Gn @ gamma
        root = math.sqrt(max(float(gamma @ gg), 0.0) + eps)
        obj = float(gamma @ b) + c * root
        if obj < best:
            best, best_w = obj, w.copy()
        if i < steps:
            grad_gamma = b + (c / root) * gg
            grad_w = gamma * (grad_gamma - float(gamma @ grad_gamma))  # softmax Jacobian (symmetric)
            velocity = grad_w.copy() if velocity is None else momentum * velocity + grad_w
            w = w - lr * velocity
    return _softmax(best_w)


def _softmax(w: np.ndarray) -> np.ndarray:
    e = np.exp(w - w.max())
    return e / e.sum()


# ============================================================================== solution: d on the updates
@dataclass(frozen=True)
class OMGSolution:
    """Step 2–3 from the Gram matrix: ``d = Σ_u coefficients[u] · Δ_u``."""

    gamma: np.ndarray  # Γ*
    coefficients: np.ndarray  # (p + λ Γ*) · rescale
    lam: float  # κ ‖g_FL‖ / ‖Γ*g‖ (0 when ‖Γ*g‖ = 0)
    objective: float  # the step-2 objective at Γ*
    g_fl_norm: float  # ‖g_FL‖
    gamma_g_norm: float  # ‖Γ*g‖


def omg_solution(G: np.ndarray, p: np.ndarray, kappa: float, solver: str = "exact",
                 rescale: bool = False) -> OMGSolution:
    """Solve step 2 with ``solver`` and express ``d`` as coefficients on the updates:
    ``d = g_FL + λ Γ*g = Σ_u (p_u + λ γ_u) Δ_u`` with ``λ = κ ‖g_FL‖ / ‖Γ*g‖`` (``λ = 0`` and so
    ``d = g_FL`` when ``‖Γ*g‖ = 0``), all divided by ``1 + κ²`` when ``rescale``. "``‖Γ*g‖ = 0``"
    means at most the rounding floor of ``‖Γg‖`` computed from ``G`` (:func:`_norm_floor`, about
    1e-7 of ``max_u ‖Δ_u‖``): below it ``Γ*g`` is noise, and ``λ Γ*g`` (always of norm
    ``κ‖g_FL‖``) would point in a random direction.

    >>> sol = omg_solution(np.eye(2), np.array([.5, .5]), 1.0)
    >>> sol.coefficients   # d = g_FL + ‖g_FL‖/‖Γg‖ Γg = 2 g_FL
    array([1., 1.])
    """
    G, p, kappa = _as_problem(G, p, kappa)  # checked once here; the solvers below take it as it is
    if solver == "exact":
        gamma = _solve_exact(G, p, kappa).gamma
    elif solver == "sgd":
        gamma = _solve_sgd(G, p, kappa)
    else:
        raise ValueError(f"solver must be one of {', '.join(SOLVERS)}, got {solver!r}")
    g_fl = _sqrt0(float(p @ G @ p))
    gamma_g = _sqrt0(float(gamma @ G @ gamma))
    lam = kappa * g_fl / gamma_g if gamma_g > _norm_floor(G) else 0.0
    coefficients = p + lam * gamma
    if rescale:
        coefficients = coefficients / (1.0 + kappa * kappa)
    return OMGSolution(gamma, coefficients, lam, _objective(gamma, G, p, kappa), g_fl, gamma_g)


def cosines(G: np.ndarray, coefficients: np.ndarray) -> np.ndarray:
    """``cos(Δ_u, d)`` for ``d = Σ_v coefficients[v] Δ_v``, from ``G`` alone (0 where a norm is 0).

    >>> cosines(np.eye(2), np.array([1., 1.])).round(6)
    array([0.707107, 0.707107])
    """
    G = np.asarray(G, dtype=np.float64)
    dots = G @ coefficients
    d_norm = _sqrt0(float(coefficients @ dots))
    norms = np.sqrt(np.maximum(G.diagonal(), 0.0))
    denom = norms * d_norm
    return np.where(denom > 0, dots / np.where(denom > 0, denom, 1.0), 0.0)


__all__ = ["SOLVERS", "ExactSolve", "OMGSolution", "cosines", "omg_objective", "omg_solution", "solve_omg_exact",
           "solve_omg_exact_info", "solve_omg_sgd"]
