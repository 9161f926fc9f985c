"""FedOMG's step 2 on the Gram matrix (Nguyen et al., ICLR 2025; docs/methods-seeds.md §1; the rule and the
notation: :mod:`fedtune.algorithms.server.fedomg`).

``Γ* = argmin_{Γ ∈ simplex} ⟨Γg, g_FL⟩ + κ ‖g_FL‖ ‖Γg‖`` depends only on the Gram matrix
``G = [⟨Δ_u, Δ_v⟩]`` and the weights ``p``, so everything here works on ``U``-sized arrays and
never touches an ``M``-sized vector: the objective (:func:`omg_objective`), the certified exact
solver (:func:`solve_omg_exact`: Wolfe's minimum-norm point, :mod:`fedtune.algorithms.server.wolfe`,
inside a root search, :class:`_ExactSearch`) and the authors' softmax-SGD iteration
(:func:`solve_omg_sgd`), and the direction's coefficients on the updates (:func:`omg_solution`:
``d = Σ_u (p_u + λ γ_u) Δ_u``) and cosines (:func:`cosines`).

Each public function checks its problem (shapes, ``κ ≥ 0`` finite) once, at its entry, and
works on the checked arrays from there on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedtune.algorithms.declarations import SOLVERS
from fedtune.algorithms.server.wolfe import min_norm_point



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
    """:func:`solve_omg_exact_info` on a checked problem (:func:`_as_problem`): the degenerate
    cases here, the root search on the normalised problem in :class:`_ExactSearch`."""
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
    search = _ExactSearch(Gn, b, p, c, gnorm, diag, scale, tol)
    search.run()
    degenerate = search.objective(search.best_gamma)[1] <= search.floor
    return ExactSolve(search.best_gamma, search.best_obj * scale, min(search.lower, search.best_obj) * scale,
                      search.evaluations, degenerate)


class _ExactSearch:
    """The root search of :func:`solve_omg_exact_info` on the normalised problem (``Gn``, ``b =
    Gn p``, ``c = κ‖g_FL‖ > 0``): Wolfe's warm-started corral (``support``, ``lam``), the best
    ``Γ`` seen and its objective (upper bound), the certified ``lower`` bound, and the bracket
    ``[t_lo, t_hi]`` of ``t* = ‖Γ*g‖`` with its ends ``ends["lo"/"hi"] = (t, φ, φ', ‖Γ(t)g‖²)``."""

    def __init__(self, Gn: np.ndarray, b: np.ndarray, p: np.ndarray, c: float, gnorm: float, diag: np.ndarray,
                 scale: float, tol: float):
        self.Gn, self.b, self.c, self.gnorm = Gn, b, c, gnorm
        self.num = Gn.shape[0]
        self.dmax = math.sqrt(float(diag.max()) / scale)  # max_u ‖Δ_u‖ ≥ ‖Γg‖ for every Γ
        self.floor = _norm_floor(Gn)
        self.z2_err = self.floor * self.floor  # rounding bound of a computed ‖Γg‖²
        self.stop = tol * gnorm * self.dmax
        # Upper bounds from the vertices and from p (a safety net; the solve does at least as well).
        vertex_obj = b + c * np.sqrt(diag / scale)
        k = int(np.argmin(vertex_obj))
        self.best_gamma = np.zeros(self.num)
        self.best_gamma[k] = 1.0
        self.best_obj = float(vertex_obj[k])
        p_obj, _ = self.objective(p)
        if p_obj < self.best_obj:
            self.best_gamma, self.best_obj = p.copy(), p_obj
        self.lower = -math.inf
        self.evaluations = 0
        self.support: list[int] = [int(np.argmin(diag))]
        self.lam = np.ones(1)
        self.t_lo, self.t_hi = 0.0, self.dmax  # t* = ‖Γ*g‖ ∈ [0, max_u ‖Δ_u‖]
        self.ends: dict[str, tuple[float, float, float, float]] = {}
        self.last, self.w_lo, self.w_hi = "", 1.0, 1.0  # Illinois: the end kept last, the ends' weights

    def objective(self, gamma: np.ndarray) -> tuple[float, float]:
        """``(F(Γ), ‖Γg‖)`` on the normalised problem."""
        zn = _sqrt0(float(gamma @ self.Gn @ gamma))
        return float(gamma @ self.b) + self.c * zn, zn

    def run(self) -> None:
        """Bracket ``t*`` from the FedAvg point (``Γ = p``: ``‖Γg‖ = ‖g_FL‖``), then narrow the
        bracket until the gap is certified (at most 200 inner solves more)."""
        self.put(self.at(min(self.gnorm, self.dmax)))
        if "lo" in self.ends and self.t_hi > self.t_lo:
            self.put(self.at(self.t_hi))
        for _ in range(200):
            if self.certified():
                break
            proposal = self.root_on_support()
            if "lo" not in self.ends:  # t* below every t tried: go down (an optimum at Γg = 0 ends here)
                if self.t_hi <= self.floor:
                    break
                t = proposal if proposal is not None and proposal < self.t_hi else self.t_hi * 1e-3
                self.put(self.at(max(t, 0.5 * self.floor)))
                continue
            if self.t_hi <= self.t_lo * (1 + 1e-15):
                break
            self.narrow(proposal)
        if "lo" not in self.ends and not self.certified():
            self.min_norm_point(self.Gn)  # t* ≤ the rounding floor: finish at t = 0, the minimum-norm point of conv{Δ_u}
        self.certified()

    def narrow(self, proposal: float | None) -> None:
        """One solve inside the bracket: at ``proposal`` (the exact root if the support is right)
        when it lies inside, else at the Illinois regula falsi point (:meth:`regula_falsi`)."""
        t = proposal if proposal is not None and self.t_lo < proposal < self.t_hi else self.regula_falsi()
        point = self.at(t)
        side = "lo" if point[2] < 0 else "hi"
        if side == "lo":  # Illinois: an end kept twice in a row has its value halved (again each time)
            self.w_lo, self.w_hi = 1.0, (self.w_hi * 0.5 if self.last == "lo" else self.w_hi)
        else:
            self.w_hi, self.w_lo = 1.0, (self.w_lo * 0.5 if self.last == "hi" else self.w_lo)
        self.last = side
        self.put(point)

    def regula_falsi(self) -> float:
        """Regula falsi (Illinois) on ``h(s) = log(‖Γ(t)g‖ / t)``, ``s = log t``, between the ends
        (kept a margin inside them); bisection in ``s`` when ``h`` does not bracket a root."""
        s_lo, s_hi = math.log(self.t_lo), math.log(self.t_hi)
        h_lo = self.w_lo * 0.5 * math.log(self.ends["lo"][3] / self.t_lo ** 2)
        h_hi = (self.w_hi * 0.5 * math.log(self.ends["hi"][3] / self.t_hi ** 2) if self.ends["hi"][3] > 0
                else -math.inf)
        if math.isfinite(h_hi) and h_lo > h_hi:
            s = s_lo + h_lo * (s_hi - s_lo) / (h_lo - h_hi)
            margin = 1e-3 * (s_hi - s_lo)
            s = min(max(s, s_lo + margin), s_hi - margin)
        else:
            s = 0.5 * (s_lo + s_hi)
        return math.exp(s)

    def root_on_support(self) -> float | None:
        """The t solving ‖α(τ)g‖ = c τ for the affine path α(τ) of the current corral, if feasible."""
        c, support = self.c, self.support
        path = _affine_path(self.Gn, self.b, support)
        if path is None:
            return None
        a0, a1 = path
        G_SS = self.Gn[np.ix_(support, support)]
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

    def min_norm_point(self, K: np.ndarray) -> tuple[np.ndarray, float]:
        """Wolfe's point for the Gram matrix ``K`` (warm-started from the last corral) as ``Γ``,
        kept if it is the best seen; returns ``(Γ, ‖Γg‖)``."""
        self.support, self.lam = min_norm_point(K, self.support, self.lam)
        self.evaluations += 1
        gamma = np.zeros(self.num)
        gamma[self.support] = self.lam
        f, zn = self.objective(gamma)
        if f < self.best_obj:
            self.best_gamma, self.best_obj = gamma, f
        return gamma, zn

    def at(self, t: float) -> tuple[float, float, float, float]:
        """Solve the inner problem at t: (t, φ(t), φ'(t), ‖Γ(t)g‖²); updates bounds and proposal."""
        c, b = self.c, self.b
        # Gram matrix of the points Δ_u + τ g_FL, less the constant τ²‖g_FL‖² (see min_norm_point)
        gamma, zn = self.min_norm_point(self.Gn + (t / c) * (b[:, None] + b[None, :]))
        if zn > self.floor:  # (a) Frank–Wolfe bound: F* ≥ min_u ∂_u F(Γ)
            self.lower = max(self.lower, float(np.min(b + (c / zn) * (self.Gn @ gamma))))
        return t, float(gamma @ b) + 0.5 * c * (zn * zn / t + t), 0.5 * c * (1.0 - (zn / t) ** 2), zn * zn

    def put(self, point: tuple[float, float, float, float]) -> None:
        """Make ``point`` a bracket end (φ' < 0: t* lies above it; φ' ≥ 0: at or below it)."""
        if point[2] < 0:
            self.ends["lo"], self.t_lo = point, point[0]
        else:
            self.ends["hi"], self.t_hi = point, point[0]

    def certified(self) -> bool:
        """Tighten ``lower`` with bounds (b) and (c) of :func:`solve_omg_exact_info`; whether the gap
        is within the tolerance."""
        c, z2_err, t_lo, t_hi = self.c, self.z2_err, self.t_lo, self.t_hi
        if "lo" in self.ends:  # (b) at t_lo: φ(t*) ≥ φ(t_lo) + φ'(t_lo)(t_hi − t_lo)
            t, phi, dphi, _ = self.ends["lo"]
            self.lower = max(self.lower, phi + dphi * (t_hi - t) - 0.5 * c * z2_err * (1 / t + (t_hi - t) / t ** 2))
        if "hi" in self.ends:  # (b) at t_hi: φ(t*) ≥ φ(t_hi) − φ'(t_hi)(t_hi − t_lo), rounding of ‖Γg‖² allowed for
            t, phi, dphi, _ = self.ends["hi"]
            self.lower = max(self.lower, phi + dphi * (t_lo - t) - 0.5 * c * z2_err * (2 * t - t_lo) / t ** 2)
            self.lower = max(self.lower, -self.gnorm * t_hi)  # (c)
        return self.best_obj - self.lower <= self.stop


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


__all__ = ["ExactSolve", "OMGSolution", "cosines", "omg_objective", "omg_solution", "solve_omg_exact",
           "solve_omg_exact_info", "solve_omg_sgd"]
