"""FedOMG — on-server matching gradient (Nguyen et al., ICLR 2025; docs/methods.md §1) as a server rule.

Clients run plain local SGD; the server turns the round's displacements ``Δ_u = θ_u − θ`` into
an *invariant gradient direction*:

1. ``g_FL = Σ_u p_u Δ_u`` (the FedAvg displacement, ``p_u = n_u / Σ n``);
2. ``Γ* = argmin_{Γ ∈ simplex}  ⟨Γg, g_FL⟩ + κ ‖g_FL‖ ‖Γg‖``  with ``Γg = Σ_u γ_u Δ_u``;
3. ``d = g_FL + κ ‖g_FL‖ / ‖Γ*g‖ · Γ*g``  (``d = g_FL`` when ``‖Γ*g‖ = 0``);
4. ``θ ← θ + η_g · d`` (``+``: the ``Δ_u`` already point downhill).

Everything in step 2 depends only on the Gram matrix ``G = [⟨Δ_u, Δ_v⟩]``:
``⟨Γg, g_FL⟩ = Γᵀ G p``, ``‖g_FL‖² = pᵀ G p``, ``‖Γg‖² = Γᵀ G Γ``. A round therefore costs one
pass over the ``[U, M]`` updates to build ``G`` (:func:`gram_matrix`), a ``U``-dimensional solve
that never touches an ``M``-sized vector (:mod:`fedtune.algorithms.fedomg_solvers`:
:func:`solve_omg_exact` or the authors' :func:`solve_omg_sgd`), and one more weighted sum, since ``d = Σ_u (p_u + λ γ_u) Δ_u`` with
``λ = κ ‖g_FL‖ / ‖Γ*g‖`` (:func:`fedomg_step`).

Choices where the paper and the authors' code leave room (each is a flag or stated here):

* ``p_u`` are the example weights (the paper's Eq. 11; its Alg. 1 also allows the plain mean).
  The authors' DG code builds ``G`` from the *weighted* rows ``p_u Δ_u`` and uses their mean as
  ``g_FL``; with equal ``p`` that is the same ``Γ*`` and the same ``d`` up to the factor ``1/U``
  (fold it into ``global_lr`` to match their step size).
* The authors divide the final ``d`` by ``1 + κ²`` (``rescale=True`` / ``omg_rescale``);
  off by default, so ``κ = 0`` is exactly FedAvg and the paper's Eq. 16 holds as written.
* ``solver="exact"`` (default) solves the convex step-2 problem to a certified tolerance;
  ``solver="sgd"`` is the authors' 20-step softmax-SGD iteration. Both feed the same ``d``
  formula (without the authors' ``1e-4`` guards in ``λ``).
* Batch-norm buffers never reach a server rule: the runtime averages them by FedAvg (the
  authors' code leaves them unaggregated — a defect docs/methods.md tells us not to copy).

>>> updates = np.array([[1., 0.], [0., 1.]], np.float32)
>>> d, gamma = fedomg_direction(updates, np.array([.5, .5]), kappa=0.0)   # κ = 0: FedAvg
>>> d
array([0.5, 0.5])
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedtune.algorithms.aggregate import BLOCK, check_updates, combine
from fedtune.algorithms.base import HParam
from fedtune.algorithms.fedomg_solvers import (  # noqa: F401  (the step-2 solvers, re-exported)
    SOLVERS,
    ExactSolve,
    OMGSolution,
    _norm_floor,
    cosines,
    omg_objective,
    omg_solution,
    solve_omg_exact,
    solve_omg_exact_info,
    solve_omg_sgd,
)
from fedtune.algorithms.server import AggregateResult, ServerRule

# ============================================================================== Gram matrix
# Columns per block of the Gram pass: the float64 copy of a [U, cols] block stays around
# GRAM_BLOCK_ELEMS elements (2 MiB), at least 1024 columns so small-U blocks stay long.
GRAM_BLOCK_ELEMS = 4 * BLOCK

_blas_controller: Any = None


def _blas_threads(threads: int | None) -> contextlib.AbstractContextManager:
    """Limit NumPy's BLAS to ``threads`` threads for a ``with`` block (threadpoolctl, which
    scikit-learn brings along); a no-op for ``None`` or when threadpoolctl is missing."""
    global _blas_controller
    if threads is None:
        return contextlib.nullcontext()
    try:
        if _blas_controller is None:
            from threadpoolctl import ThreadpoolController

            _blas_controller = ThreadpoolController()
        return _blas_controller.limit(limits=int(threads), user_api="blas")
    except (ImportError, AttributeError, TypeError, ValueError):  # pragma: no cover - threadpoolctl absent or unusable
        return contextlib.nullcontext()


def gram_matrix(updates: np.ndarray, block_elems: int = GRAM_BLOCK_ELEMS, blas_threads: int | None = 1) -> np.ndarray:
    """``G[u, v] = ⟨updates[u], updates[v]⟩`` (float64 ``[U, U]``) in one pass over the updates.

    The columns are taken in blocks of about ``block_elems / U`` (at least 1024); each block is
    copied to float64 and multiplied with itself (BLAS ``syrk``: exactly symmetric, and the same
    bits whatever the number of BLAS threads, since threads split the output, not the sums), and
    the block results are added in column order in float64. The ``[U, M]`` input is never copied
    whole. Cost: ``U² M / 2`` multiply-adds (FedAvg's weighted sum is ``U M``).

    ``blas_threads`` (default 1; ``None`` = leave the process's setting) caps BLAS threads during
    the pass: the coordinator shares its cores with client actors, and oversubscribed OpenBLAS
    threads spin — measured 10–30× slower than one thread on a busy 2-core machine — while under
    Ray the coordinator runs with one thread anyway (``OMP_NUM_THREADS=1``).

    >>> gram_matrix(np.array([[1., 2.], [3., 4.]], np.float32))
    array([[ 5., 11.],
           [11., 25.]])
    """
    updates = np.asarray(updates)
    if updates.ndim != 2:
        raise ValueError(f"updates must be [U, M], got shape {updates.shape}")
    num, m = updates.shape
    gram = np.zeros((num, num), dtype=np.float64)
    if num == 0 or m == 0:
        return gram
    cols = min(m, max(1024, int(block_elems) // num))
    buf = np.empty((num, cols), dtype=np.float64)
    with _blas_threads(blas_threads):
        for s in range(0, m, cols):
            e = min(s + cols, m)
            blk = buf[:, :e - s]
            blk[...] = updates[:, s:e]
            gram += blk @ blk.T
    return gram


# ============================================================================== step
@dataclass
class FedOMGStep:
    """One FedOMG server step: ``out`` (the direction ``d``, float64, or the new parameters
    ``params + global_lr · d``, float32), the Gram matrix, the solution, and the time split."""

    out: np.ndarray
    gram: np.ndarray
    solution: OMGSolution
    gram_s: float
    solve_s: float
    combine_s: float


def fedomg_step(updates: np.ndarray, weights: np.ndarray, kappa: float, *, solver: str = "exact",
                rescale: bool = False, params: np.ndarray | None = None, global_lr: float = 1.0,
                blas_threads: int | None = 1) -> FedOMGStep:
    """Gram pass (:func:`gram_matrix`, with ``blas_threads``) → solve → combine, timed separately.

    Without ``params``, ``out = d`` (float64). With ``params``, ``out = params + global_lr · d``
    (float32), computed by the same blockwise float64 accumulation as ``fedavg_step`` with the
    weights ``p`` replaced by ``d``'s coefficients — so with ``κ = 0`` (coefficients ``= p``
    exactly) the result is bit-for-bit FedAvg's.
    """
    updates, weights = check_updates(updates, weights)
    t0 = time.perf_counter()
    G = gram_matrix(updates, blas_threads=blas_threads)
    t1 = time.perf_counter()
    sol = omg_solution(G, weights, kappa, solver, rescale)
    t2 = time.perf_counter()
    m = updates.shape[1]
    if params is None:
        out = combine(updates, sol.coefficients, None, 1.0, np.empty(m, dtype=np.float64))
    else:
        if np.shape(params) != (m,):
            raise ValueError(f"params {np.shape(params)} and updates {updates.shape} disagree on the parameter count")
        out = combine(updates, sol.coefficients, np.asarray(params), float(global_lr), np.empty(m, np.float32))
    t3 = time.perf_counter()
    return FedOMGStep(out, G, sol, t1 - t0, t2 - t1, t3 - t2)


def fedomg_direction(updates: np.ndarray, weights: np.ndarray, kappa: float, solver: str = "exact",
                     rescale: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """FedOMG's invariant gradient direction ``d`` (float64 ``[M]``) and ``Γ*`` (``[U]``).

    ``g_FL = Σ p_u Δ_u``; ``Γ*`` solves step 2 (``solver``: ``"exact"`` or the authors' ``"sgd"``);
    ``d = g_FL + κ ‖g_FL‖ / ‖Γ*g‖ · Γ*g`` (``= g_FL`` if ``‖Γ*g‖ = 0``), ÷ ``(1 + κ²)`` if
    ``rescale``. :func:`fedomg_step` gives the same with the gram / solve / combine timings.

    >>> d, gamma = fedomg_direction(np.array([[2., 0.], [0., 2.]], np.float32), np.array([.5, .5]), 1.0)
    >>> d, gamma    # Γ* = (½, ½), Γ*g = g_FL = (1, 1), d = 2 g_FL
    (array([2., 2.]), array([0.5, 0.5]))
    """
    step = fedomg_step(updates, weights, kappa, solver=solver, rescale=rescale)
    return step.out, step.solution.gamma


# ============================================================================== server rule
OMG_KAPPA = HParam("omg_kappa", 0.5, "FedOMG searching radius κ: d = g_FL + κ‖g_FL‖ Γ*g/‖Γ*g‖ (0 = FedAvg; "
                   "paper: 0.5)", "float", lo=0.0)
OMG_SOLVER = HParam("omg_solver", "exact", "FedOMG step-2 solver: exact (certified convex solve on the simplex) "
                    "or sgd (the authors' 20 softmax-SGD steps, lr 25, momentum 0.5)", "choice",
                    choices=SOLVERS, variant=True)
OMG_RESCALE = HParam("omg_rescale", False, "divide FedOMG's direction by 1 + κ² (the authors' code does; the "
                     "paper's Eq. 16 does not)", "bool", variant=True)


class FedOMG(ServerRule):
    """FedOMG (docs/methods.md §1): ``θ ← θ + global_lr · d`` with the invariant direction ``d``.

    Diagnostics per round: ``omg_gamma.<client id>`` (Γ*), ``omg_cos.<client id>`` = cos(Δ_u, d)
    and their spread ``omg_cos_std`` (population std over the round's clients; lower = more
    invariant, the paper's Fig. 2), ``omg_objective`` (step-2 objective at Γ*), ``omg_lambda``
    (κ‖g_FL‖/‖Γ*g‖), and the server time split ``omg_gram_s`` / ``omg_solve_s`` / ``omg_combine_s``.
    Stateless between rounds.
    """

    name = "fedomg"
    description = "FedOMG: θ ← θ + global_lr · (g_FL + κ‖g_FL‖ Γ*g/‖Γ*g‖), Γ* matching the clients' updates"
    hparams = (OMG_KAPPA, OMG_SOLVER, OMG_RESCALE)
    # fedtune's default server step, *not* the paper's η_g: the authors' step is η·d/(U(1+κ²)) and
    # their PACS script uses η = 0.5 (Table 4 says 0.05), while global_lr multiplies d directly
    # (docs/methods.md §1). Compare FedOMG with other rules only with global_lr tuned for each.
    default_global_lr = 0.05

    def __init__(self, cfg: Any, layout: Any):
        super().__init__(cfg, layout)
        # validated with the config (HParam.check); read once
        self.kappa = float(cfg.param("omg_kappa"))
        self.solver = str(cfg.param("omg_solver"))
        self.rescale = bool(cfg.param("omg_rescale"))

    def aggregate(self, params, updates, weights, *, extras, round, info):
        step = fedomg_step(updates, weights, self.kappa, solver=self.solver, rescale=self.rescale,
                           params=params, global_lr=self.global_lr)
        sol = step.solution
        cos = cosines(step.gram, sol.coefficients)
        diag: dict[str, float] = {
            "omg_objective": sol.objective,
            "omg_lambda": sol.lam,
            "omg_cos_std": float(np.std(cos)),
            "omg_gram_s": step.gram_s,
            "omg_solve_s": step.solve_s,
            "omg_combine_s": step.combine_s,
        }
        for cid, g, c in zip(info.client_ids, sol.gamma, cos):
            diag[f"omg_gamma.{cid}"] = float(g)
            diag[f"omg_cos.{cid}"] = float(c)
        return AggregateResult(step.out, diag)
