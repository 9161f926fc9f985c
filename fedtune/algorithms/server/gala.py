"""FedGaLA's global alignment, the server rule ``gala`` (docs/methods-seeds.md §3; Pourpanah et al., Alg. 1).

FedGaLA has two independent parts, usable apart:

* **Global alignment** (this module, NumPy only): clients whose update agrees with the round's
  consensus direction get more aggregation weight (:func:`gala_global_weights`, :class:`Gala`).
* **Local alignment** (client method ``gala``, torch: :mod:`fedtune.algorithms.client.gala`):
  inside local training a parameter tensor takes its optimiser step only if its batch gradient
  agrees with the last global move ``r = θ^t − θ^(t−1)``.

What the paper does, exactly (Alg. 1 and §3 of seed 003), and where fedtune differs
-------------------------------------------------------------------------------------
Server (Alg. 1 lines 5–12): ``g_i = Θ_i − Θ`` (the raw client update, our ``Δ_i``); the initial
global update is ``FedAvg(g_i)``; then ``iter`` times: ``w_i = (cos(g_i, g) + 1)/2``, normalised,
``g ← Σ_i w_i g_i``; finally ``Θ ← Θ + g``. The authors' code computes the weights per parameter
tensor and forms each new tensor as a convex combination ``Σ w_i θ_i``, i.e. the aligned step is
at FedAvg's scale (the paper's extra ``1/K`` is not in their code).

fedtune (docs/methods-seeds.md §3, as corrected): start ``a = Σ p_i Δ_i``; ``gala_iters`` times:
``w_i ∝ p_i (cos(Δ_i, a) + 1)/2`` normalised to sum 1, ``a = Σ w_i Δ_i``; then
``θ ← θ + global_lr (gala_mix · a + (1 − gala_mix) Σ p_i Δ_i)``. The ``p_i`` factor keeps the
example weighting of FedAvg (with equal client sizes it is the paper's rule), so equal
alignments give exactly FedAvg. ``gala_weights``: ``per-tensor`` (default, the authors' code)
or ``whole`` (one weight per client over the whole parameter vector).

Edge case (a documented choice): a zero vector has cosine 0 with anything (factor ``1/2`` before
normalising; a client with ``p_i = 0`` gets weight 0). A non-finite cosine is left to surface as
a diverged round. The client's gate and its edge cases: :mod:`fedtune.algorithms.client.gala`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fedtune.algorithms.server.aggregate import BLOCK, check_updates, combine, server_step, tensor_slices, weighted_sum
from fedtune.algorithms.base import RunConfig
from fedtune.algorithms.declarations import GALA_ITERS, GALA_MIX, GALA_WEIGHTS
from fedtune.algorithms.server.rule import AggregateResult, ServerRule



def _dot64(x: np.ndarray, y: np.ndarray) -> float:
    """``⟨x, y⟩`` in float64, block by block with NumPy's own (thread-independent) summation.

    Both the products and their sum are float64: each block of ``x`` is widened to float64 before
    it is multiplied (``np.multiply`` of two float32 blocks into a float64 ``out`` would multiply
    in float32 and only then widen, losing up to half an ulp of float32, ~6e-8 relative, per
    square)."""
    m = x.shape[0]
    tmp = np.empty(min(BLOCK, m), dtype=np.float64)
    total = 0.0
    for s in range(0, m, BLOCK):
        e = min(s + BLOCK, m)
        t = tmp[:e - s]
        np.copyto(t, x[s:e])  # widen first: the product is taken in float64
        np.multiply(t, y[s:e], out=t)
        total += float(t.sum())
    return total


def _cosines(updates: np.ndarray, sq_norms: np.ndarray, a: np.ndarray) -> np.ndarray:
    """``cos(updates[u], a)`` per row (0 where either vector is zero), clipped to [−1, 1]."""
    a_norm = math.sqrt(_dot64(a, a))
    out = np.zeros(updates.shape[0], dtype=np.float64)
    for u in range(updates.shape[0]):
        denom = math.sqrt(sq_norms[u]) * a_norm
        if denom > 0.0:
            out[u] = _dot64(updates[u], a) / denom
        elif not math.isfinite(denom):
            out[u] = math.nan
    return np.clip(out, -1.0, 1.0)


def _check_inputs(updates: np.ndarray, weights: np.ndarray, iters: int) -> tuple[np.ndarray, np.ndarray]:
    updates, weights = check_updates(updates, weights)
    if updates.shape[0] == 0:
        raise ValueError(f"updates {updates.shape} and weights {weights.shape} disagree on the client count")
    if (weights < 0).any():
        raise ValueError(f"weights must be non-negative, got {weights}")
    if int(iters) != iters or iters < 1:
        raise ValueError(f"iters must be an integer >= 1, got {iters!r}")
    return updates, weights


def _alignment_weights(updates: np.ndarray, weights: np.ndarray, iters: int) -> tuple[np.ndarray, np.ndarray]:
    """The normalised weights ``w`` of the last iteration and the cosines they came from, for the
    columns ``updates`` holds (the whole vector or one parameter tensor's slice).

    ``a = Σ p_u Δ_u``; ``iters`` times: ``w_u ∝ p_u (cos(Δ_u, a) + 1)/2``, ``Σ w = 1``,
    ``a = Σ w_u Δ_u``. When every client's factor ``(cos + 1)/2`` is the same (equal alignments)
    the reweighting is the identity and ``w = p`` exactly (no renormalisation rounding), so the
    rule is bit for bit FedAvg."""
    U = updates.shape[0]
    sq_norms = np.array([_dot64(updates[u], updates[u]) for u in range(U)])
    live = weights > 0
    a = weighted_sum(updates, weights)  # FedAvg's displacement Σ p_u Δ_u
    w, cos = weights.copy(), np.zeros(U)
    for it in range(int(iters)):
        cos = _cosines(updates, sq_norms, a)
        f = (cos + 1.0) / 2.0
        raw = weights * f
        if np.all(f[live] == f[live][0]) or not raw.sum() > 0.0:
            w = weights.copy()  # equal alignments (or nothing to weigh): FedAvg's weights, exactly
        else:
            w = raw / raw.sum()
        if it + 1 < iters:
            a = weighted_sum(updates, w)  # a = Σ w_u Δ_u
    return w, cos


def gala_global_weights(updates: np.ndarray, weights: np.ndarray, iters: int = 3,
                        slices: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """FedGaLA's global alignment (docs/methods-seeds.md §3): the normalised client weights ``w`` and the
    aligned displacement ``a`` [P] (both float64).

    ``updates[u] = Δ_u`` (descent displacements), ``weights[u] = p_u`` (summing to 1). Start
    ``a = Σ_u p_u Δ_u`` (FedAvg's step); ``iters`` times: ``w_u ∝ p_u (cos(Δ_u, a) + 1)/2``
    normalised to ``Σ w = 1``, ``a = Σ_u w_u Δ_u``. ``a`` is at FedAvg's scale (a convex
    combination of the updates, as in the authors' code); equal alignments give ``w = p``, i.e.
    FedAvg exactly.

    ``slices`` (``layout.param_slices()`` or plain slices tiling the vector): the weights are
    computed per parameter tensor (the authors' code), ``w`` is ``[K, U]`` for K tensors;
    ``None``: one weight per client over the whole vector, ``w`` is ``[U]``.

    Two orthogonal clients of equal size are equally aligned: the step is FedAvg's mean:

    >>> w, a = gala_global_weights(np.array([[2., 0.], [0., 2.]], np.float32), np.array([.5, .5]), iters=1)
    >>> w.tolist(), a.tolist()
    ([0.5, 0.5], [1.0, 1.0])
    """
    updates, weights = _check_inputs(updates, weights, iters)
    if slices is None:
        w, _ = _alignment_weights(updates, weights, iters)
        return w, weighted_sum(updates, w)
    ws, parts = [], []
    for sl in tensor_slices(slices, updates.shape[1]):
        w, _ = _alignment_weights(updates[:, sl], weights, iters)
        ws.append(w)
        parts.append(weighted_sum(updates[:, sl], w))
    return np.stack(ws), np.concatenate(parts)


def gala_direction(updates: np.ndarray, weights: np.ndarray, *, iters: int = 3, mix: float = 1.0,
                   slices: Any = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ``gala`` server direction ``d = Σ_u c_u Δ_u`` per tensor, ``c_u = mix · w_u + (1 − mix) · p_u``:
    ``(d float64 [P], w, cos)`` (see :func:`gala_step`, which steps ``θ + global_lr · d``).

    >>> d, w, cos = gala_direction(np.array([[2., 0.], [0., 2.]], np.float32), np.array([.5, .5]), iters=1)
    >>> d.tolist(), w.tolist()
    ([1.0, 1.0], [0.5, 0.5])
    """
    updates, weights = _check_inputs(updates, weights, iters)
    if not 0.0 <= mix <= 1.0:
        raise ValueError(f"mix must be in [0, 1], got {mix!r}")

    def coefficients(w: np.ndarray) -> np.ndarray:
        return weights if np.array_equal(w, weights) else weights * (1.0 - mix) + mix * w

    if slices is None:
        w, cos = _alignment_weights(updates, weights, iters)
        return weighted_sum(updates, coefficients(w)), w, cos
    d = np.empty(updates.shape[1], np.float64)
    ws, coss = [], []
    for sl in tensor_slices(slices, updates.shape[1]):
        w, cos = _alignment_weights(updates[:, sl], weights, iters)
        combine(updates[:, sl], coefficients(w), None, 1.0, d[sl])
        ws.append(w)
        coss.append(cos)
    return d, np.stack(ws), np.stack(coss)


def gala_step(params: np.ndarray, updates: np.ndarray, weights: np.ndarray, *, iters: int = 3, mix: float = 1.0,
              global_lr: float = 1.0, slices: Any = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ``gala`` server update: ``(new params float32 [P], w, cos)`` (``w``/``cos`` ``[U]``
    with ``slices=None``, ``[K, U]`` per tensor otherwise; see :func:`gala_global_weights`).

    ``θ ← θ + η (mix · a + (1 − mix) · Σ p_u Δ_u) = θ + η Σ_u c_u Δ_u`` per tensor, with
    ``c_u = mix · w_u + (1 − mix) · p_u`` and ``η = global_lr``: both parts are at FedAvg's scale
    and share one server learning rate. ``mix = 0``, or equal alignments (then ``w = p``), give
    exactly (bit for bit) :func:`fedavg_step` at ``η``; ``mix = 1`` is ``θ + η a`` (the paper's
    ``Θ + g`` at ``η = 1``). The paper's Eq. 41 mixes with the unweighted client mean; fedtune
    mixes with its FedAvg (example-weighted). The direction is :func:`gala_direction`'s, the step
    :func:`~fedtune.algorithms.server.aggregate.server_step`'s (fedavg_step's arithmetic).

    >>> new, w, cos = gala_step(np.zeros(2, np.float32), np.array([[2., 0.], [0., 2.]], np.float32),
    ...                         np.array([.5, .5]), iters=1, mix=0.5)
    >>> new.tolist(), w.tolist()   # equal alignments: FedAvg's (1, 1) whatever the mix
    ([1.0, 1.0], [0.5, 0.5])
    """
    params = np.asarray(params)
    if params.shape != (np.shape(updates)[-1],):
        raise ValueError(f"params {params.shape} and updates {np.shape(updates)} disagree on the parameter count")
    d, w, cos = gala_direction(updates, weights, iters=iters, mix=mix, slices=slices)
    return server_step(params, d, global_lr), w, cos


class Gala(ServerRule):
    """FedGaLA's global alignment as a server rule (``gala_iters``, ``gala_mix``,
    ``gala_weights``; see :func:`gala_step`).

    ``gala_weights = "per-tensor"`` (default, the authors' code): one weight per client and
    parameter tensor of the layout; ``"whole"``: one weight per client over the whole parameter
    vector. Stateless across rounds (the last global move the gated clients need is kept and sent
    by the runtime). Diagnostics: ``gala_w.<client id>`` = the client's final normalised weight
    (``whole``), or its parameter-count-weighted mean over tensors ``Σ_l (M_l/M) w_l,u``
    (``per-tensor``); either way they sum to 1 over the round's participants and equal ``p_u``
    when the round is exactly FedAvg.
    """

    name = "gala"

    def __init__(self, cfg: RunConfig, layout: Any):
        super().__init__(cfg, layout)
        self.iters = GALA_ITERS.of(cfg)
        self.mix = GALA_MIX.of(cfg)
        self.per_tensor = GALA_WEIGHTS.of(cfg) == "per-tensor"

    def aggregate(self, params, updates, weights, *, extras, round, info):
        per_tensor = self.per_tensor
        slices = None
        if per_tensor:
            slices = self.layout.param_slices() if hasattr(self.layout, "param_slices") else []
            if not slices:
                raise ValueError("gala_weights='per-tensor' needs the model's layout (its parameter tensors); "
                                 "use gala_weights='whole' for a bare vector")
        d, w, _ = gala_direction(updates, weights, iters=self.iters, mix=self.mix, slices=slices)
        if per_tensor:
            sizes = np.array([sl.stop - sl.start for _, sl in slices], np.float64)
            w = (sizes / sizes.sum()) @ w
        return AggregateResult(server_step(params, d, self.global_lr),
                               {f"gala_w.{cid}": float(x) for cid, x in zip(info.client_ids, w)}, d)


__all__ = ["Gala", "gala_direction", "gala_global_weights", "gala_step"]
