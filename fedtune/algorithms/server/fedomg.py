"""FedOMG — on-server matching gradient (Nguyen et al., ICLR 2025; docs/methods-seeds.md §1) as a server rule.

Clients run plain local SGD; the server turns the round's displacements ``Δ_u = θ_u − θ`` into
an *invariant gradient direction*:

1. ``g_FL = Σ_u p_u Δ_u`` (the FedAvg displacement, ``p_u = n_u / Σ n``);
2. ``Γ* = argmin_{Γ ∈ simplex}  ⟨Γg, g_FL⟩ + κ ‖g_FL‖ ‖Γg‖``  with ``Γg = Σ_u γ_u Δ_u``;
3. ``d = g_FL + κ ‖g_FL‖ / ‖Γ*g‖ · Γ*g``  (``d = g_FL`` when ``‖Γ*g‖ = 0``);
4. ``θ ← θ + η_g · d`` (``+``: the ``Δ_u`` already point downhill).

Everything in step 2 depends only on the Gram matrix ``G = [⟨Δ_u, Δ_v⟩]``:
``⟨Γg, g_FL⟩ = Γᵀ G p``, ``‖g_FL‖² = pᵀ G p``, ``‖Γg‖² = Γᵀ G Γ``. A round therefore costs one
pass over the ``[U, M]`` updates that builds ``G`` and ``g_FL`` together (:func:`fedomg_step`,
BLAS on float64 copies of column blocks: :mod:`fedtune.algorithms.server.blocked`), a ``U``-dimensional
solve that never touches an ``M``-sized vector (:mod:`fedtune.algorithms.server.fedomg_solvers`:
:func:`solve_omg_exact` or the authors' :func:`solve_omg_sgd`), and ``d = g_FL + λ Σ γ_u Δ_u``
with ``λ = κ ‖g_FL‖ / ‖Γ*g‖``, which reads only the rows of Γ*'s support.

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
  authors' code leaves them unaggregated — a defect docs/methods-seeds.md §1.3 tells us not to copy).

>>> updates = np.array([[1., 0.], [0., 1.]], np.float32)
>>> d, gamma = fedomg_direction(updates, np.array([.5, .5]), kappa=0.0)   # κ = 0: FedAvg
>>> d
array([0.5, 0.5])
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from fedtune.algorithms.server.aggregate import check_updates, combine, server_step
from fedtune.algorithms.server.blocked import gram_pass, weighted_rows
from fedtune.algorithms.declarations import OMG_KAPPA, OMG_RESCALE, OMG_SOLVER
from fedtune.algorithms.server.fedomg_solvers import OMGSolution, cosines, omg_solution
from fedtune.algorithms.server.rule import AggregateResult, ServerRule


# ============================================================================== Gram matrix
def gram_matrix(updates: np.ndarray, block_elems: int | None = None, threads: int = 1) -> np.ndarray:
    """``G[u, v] = ⟨updates[u], updates[v]⟩`` (float64 ``[U, U]``, exactly symmetric) in one pass
    over the updates: :func:`fedtune.algorithms.server.blocked.gram_pass` (float32 blocks of about
    ``block_elems`` elements, default :data:`~fedtune.algorithms.server.blocked.SCRATCH_ELEMS`, copied to float64, one ``dsyrk`` each, float64 accumulation; the same
    bits for any ``threads``). Cost: ``U² M / 2`` multiply-adds (FedAvg's weighted sum is ``U M``).

    >>> gram_matrix(np.array([[1., 2.], [3., 4.]], np.float32))
    array([[ 5., 11.],
           [11., 25.]])
    """
    updates = np.asarray(updates)
    if updates.ndim != 2:
        raise ValueError(f"updates must be [U, M], got shape {updates.shape}")
    return gram_pass(updates, threads=threads, scratch_elems=block_elems)[0]


# ============================================================================== step
@dataclass
class FedOMGStep:
    """One FedOMG server step: ``out`` (the direction ``d``, float64, or the new parameters
    ``params + global_lr · d``, float32), the Gram matrix, the solution, the time split:
    ``gram_s`` (the one pass that builds ``G`` and ``g_FL``), ``solve_s``, ``combine_s``; and
    ``direction``, ``d`` in float64 either way (the server optimiser's input)."""

    out: np.ndarray
    gram: np.ndarray
    solution: OMGSolution
    gram_s: float
    solve_s: float
    combine_s: float
    direction: np.ndarray


def fedomg_step(updates: np.ndarray, weights: np.ndarray, kappa: float, *, solver: str = "exact",
                rescale: bool = False, params: np.ndarray | None = None, global_lr: float = 1.0,
                threads: int = 1) -> FedOMGStep:
    """One read of the updates for ``G`` and ``g_FL`` (:func:`~fedtune.algorithms.server.blocked.gram_pass`)
    → solve step 2 on ``G`` → ``d = g_FL + λ Σ_{u: γ_u > 0} γ_u Δ_u``, which reads only the rows in
    Γ*'s support (often a few of the U; the authors' SGD solver gives every row a weight).

    Without ``params``, ``out = d`` (float64). With ``params``, ``out = params + global_lr · d``
    (float32). When ``λ = 0`` (``κ = 0``, or ``Γ*g = 0``) ``d = g_FL`` is computed by FedAvg's own
    kernel (:func:`~fedtune.algorithms.server.aggregate.combine` with the weights ``p``) — a second read,
    and so ``κ = 0`` is FedAvg bit for bit. ``threads`` (the coordinator's ``coordinator_cpus``)
    changes the time, never a bit.
    """
    updates, weights = check_updates(updates, weights)
    m = updates.shape[1]
    if params is not None and np.shape(params) != (m,):
        raise ValueError(f"params {np.shape(params)} and updates {updates.shape} disagree on the parameter count")
    t0 = time.perf_counter()
    G, g_fl = gram_pass(updates, weights, threads=threads)
    t1 = time.perf_counter()
    sol = omg_solution(G, weights, kappa, solver, rescale)
    t2 = time.perf_counter()
    factor = 1.0 / (1.0 + float(kappa) ** 2) if rescale else 1.0
    raw = np.empty(m, np.float64)  # g_FL + λ Σ γ_u Δ_u, before the factor
    if sol.lam == 0.0:
        combine(updates, weights, None, 1.0, raw, threads=threads)
    else:
        support = np.flatnonzero(sol.gamma > 0)
        weighted_rows(updates, sol.lam * sol.gamma[support], raw, offset=g_fl, rows=support, threads=threads)
    direction = raw if factor == 1.0 else factor * raw
    # θ + (η·factor)·raw: combine's order (scale, then base), the bits of one fused pass
    out = direction if params is None else server_step(params, raw, float(global_lr) * factor)
    t3 = time.perf_counter()
    return FedOMGStep(out, G, sol, t1 - t0, t2 - t1, t3 - t2, direction)


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
class FedOMG(ServerRule):
    """FedOMG (docs/methods-seeds.md §1): ``θ ← θ + global_lr · d`` with the invariant direction ``d``.

    Diagnostics per round: ``omg_gamma.<client id>`` (Γ*), ``omg_cos.<client id>`` = cos(Δ_u, d)
    and their spread ``omg_cos_std`` (population std over the round's clients; lower = more
    invariant, the paper's Fig. 2), ``omg_objective`` (step-2 objective at Γ*), ``omg_lambda``
    (κ‖g_FL‖/‖Γ*g‖), and the server time split ``omg_gram_s`` / ``omg_solve_s`` / ``omg_combine_s``.
    Stateless between rounds.
    """

    name = "fedomg"
    reads = {"kappa": OMG_KAPPA, "solver": OMG_SOLVER, "rescale": OMG_RESCALE}  # validated with the config

    def aggregate(self, params, updates, weights, *, extras, round, info):
        step = fedomg_step(updates, weights, self.kappa, solver=self.solver, rescale=self.rescale,
                           params=params, global_lr=self.global_lr, threads=self.threads)
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
        return AggregateResult(step.out, diag, step.direction)
