"""Auto-β for FedDA/FedGP: the per-source, per-round β of Appendix A.2 (seed 002), estimated from
per-step updates (NumPy only).

``t_b`` are the FDA target client's raw per-batch steps, ``s_i`` each source's mean raw step in
the same units (what they are, and why raw gradient steps: :mod:`fedtune.algorithms.server.fedgp`).
:func:`auto_beta_estimates` gives ``σ̂²`` (the variance of the target's mean step), ``d̂_i²`` and
``τd̂_i²``; ``β^DA_i = σ̂²/(d̂_i² + σ̂²)`` and ``β^GP_i = σ̂²/(τd̂_i² + σ̂²)`` (:func:`beta_from`,
distances clipped at 0, ``0/0 := 0``). One blocked float64 pass over the steps
(:mod:`fedtune.algorithms.server.blocked`): bit-reproducible for any number of server threads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fedtune.algorithms.server.blocked import cross_pass

F64 = np.float64
# Float64 elements of the estimators' block scratch: 1 MiB keeps a block of the B + N + 1 rows in
# L2 through its six elementwise passes (measured 7× one read at B = 20, M = 11.7M, against 9× with
# the 8 MiB default of the Gram pass).
SCRATCH_ELEMS = 1 << 17


def source_step_scales(steps_source: Any, lr_source: float = 1.0, lr_target: float = 1.0) -> np.ndarray:
    """Factors turning a source's round displacement ``Δ_i`` into its per-step displacement at
    the target's learning rate: ``s_i = (lr_T/lr_S) · Δ_i / steps_i``.

    >>> source_step_scales([4, 2])
    array([0.25, 0.5 ])
    """
    steps_s = np.asarray(steps_source, dtype=F64)
    if (steps_s < 1).any() or lr_source <= 0 or lr_target <= 0:
        raise ValueError(f"steps must be >= 1 and learning rates > 0, got {steps_source}, {lr_source}, {lr_target}")
    return (float(lr_target) / float(lr_source)) / steps_s


def beta_from(sigma2: float, dist2: float) -> float:
    """``σ² / (max(D, 0) + σ²)``, the β minimising ``(1−β)²σ² + β²D`` (Section 4.2);
    ``0/0 := 0`` (keep the target step).

    >>> beta_from(1.0, 3.0), beta_from(1.0, -0.5), beta_from(0.0, 0.0)
    (0.25, 1.0, 0.0)
    """
    d = max(float(dist2), 0.0)
    s = max(float(sigma2), 0.0)
    return s / (d + s) if d + s > 0.0 else 0.0


@dataclass
class AutoBetaEstimates:
    """The unbiased (unclipped) estimates of Appendix A.2 for one round.

    ``sigma2``: ``σ̂²`` of the target's mean step; ``d2[i]``: ``d̂_i²``; ``tau_d2[i]``: ``τd̂_i²``,
    the squared norm of the target mean's component orthogonal to ``s_i``.
    """

    sigma2: float
    d2: np.ndarray  # float64 [N]
    tau_d2: np.ndarray  # float64 [N]

    @property
    def beta_da(self) -> np.ndarray:
        """``σ̂² / (max(d̂_i², 0) + σ̂²)`` per source."""
        return np.array([beta_from(self.sigma2, d) for d in self.d2], dtype=F64)

    @property
    def beta_gp(self) -> np.ndarray:
        """``σ̂² / (max(τd̂_i², 0) + σ̂²)`` per source."""
        return np.array([beta_from(self.sigma2, d) for d in self.tau_d2], dtype=F64)


def auto_beta_estimates(target_step_updates: np.ndarray, source_step_updates: np.ndarray,
                        source_scales: Any = None, *, threads: int = 1) -> AutoBetaEstimates:
    """``σ̂², d̂_i², τd̂_i²`` (docs/methods-seeds.md §2, Appendix A.2 eqs. 90, 95, 105) on the whole vector.

    ``target_step_updates`` ``[B, P]``: the target's per-step displacements ``t_b`` (``B ≥ 2``);
    ``source_step_updates`` ``[N, P]`` (or ``[P]``): the sources' per-step displacements ``s_i``,
    or their round displacements with ``source_scales[i]`` turning row ``i`` into ``s_i``
    (:func:`source_step_scales`; saves a copy of the rows). With ``t̄`` the mean of the ``t_b``:

    * ``σ̂² = Σ_b ‖t_b − t̄‖² / ((B−1) B)``
    * ``d̂_i² = (1/B) Σ_b ‖s_i − t_b‖² − Σ_b ‖t_b − t̄‖² / (B−1)``
    * ``τd̂_i² = (1/B) Σ_b ‖r_b‖² − Σ_b ‖r_b − r̄‖² / (B−1)``, ``r_b = t_b − ⟨t_b, u_i⟩ u_i``,
      ``u_i = s_i/‖s_i‖`` (``u_i = 0`` when ``s_i = 0``)

    How (one read of the ``B + N`` rows, :func:`fedtune.algorithms.server.blocked.cross_pass`): each
    column block is copied to float64 and *centred* on the block of ``t̄`` (``c_b = t_b − t̄``,
    ``e_i = s_i − t̄``, exact per coordinate), then one BLAS product gives the inner products of
    ``[c; e; t̄]`` with ``[e; t̄]`` and one ``ddot`` the sum ``Σ_b ‖c_b‖²``. Every estimator is a
    function of those (:func:`estimates_from_products`) with no difference of large sums: the
    variance never comes out of ``Σ‖t_b‖² − B‖t̄‖²``. Float64, fixed blocks: bit-reproducible, and
    the same bits for any ``threads``.

    >>> t = np.array([[1., 0.], [3., 0.]]); s = np.array([[2., 1.]])
    >>> e = auto_beta_estimates(t, s)
    >>> float(e.sigma2), e.d2.tolist(), round(float(e.tau_d2[0]), 12)  # by hand: 2/(1·2), 2 − 2/1, 1.0 − 0.4/1
    (1.0, [0.0], 0.6)
    """
    t = np.asarray(target_step_updates)
    s = np.asarray(source_step_updates)
    if s.ndim == 1:
        s = s[None, :]
    if t.ndim != 2 or s.ndim != 2 or t.shape[1] != s.shape[1]:
        raise ValueError(f"target_step_updates [B, P] and source step updates [N, P] disagree: {t.shape} vs {s.shape}")
    b, p = t.shape
    n = s.shape[0]
    if b < 2:
        raise ValueError(f"auto-β needs at least 2 target steps per round to estimate the target variance, got {b}")
    if p == 0:
        raise ValueError("auto-β needs at least one parameter")
    scales = np.ones(n, F64) if source_scales is None else np.broadcast_to(np.asarray(source_scales, F64), (n,))
    inv_b = 1.0 / b

    def block_products(blocks: list[np.ndarray], z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        # z: [B + N + 1, w] float64; rows c_1..c_B, e_1..e_N, then the block of t̄
        np.copyto(z[:b], blocks[0])
        np.copyto(z[b:b + n], blocks[1])
        mean = z[b + n]
        np.add.reduce(z[:b], axis=0, out=mean)
        mean *= inv_b
        z[:b] -= mean  # c_b
        if source_scales is not None:
            z[b:b + n] *= scales[:, None]
        z[b:b + n] -= mean  # e_i
        centred = z[:b].reshape(-1)
        return np.array([float(np.dot(centred, centred))]), z @ z[b:].T

    trace, cross = cross_pass([t, s], block_products, extra_rows=1, threads=threads, scratch_elems=SCRATCH_ELEMS)
    return estimates_from_products(float(trace[0]), cross, b)


def estimates_from_products(trace: float, cross: np.ndarray, b: int) -> AutoBetaEstimates:
    """``σ̂², d̂_i², τd̂_i²`` from the centred products of :func:`auto_beta_estimates`:
    ``trace = Σ_b ‖c_b‖²`` and ``cross`` ``[B + N + 1, N + 1]`` = the inner products of
    ``[c_1..c_B, e_1..e_N, t̄]`` with ``[e_1..e_N, t̄]`` (``c_b = t_b − t̄``, ``e_i = s_i − t̄``).

    With ``σ̂² = trace / (B (B−1))``, ``S_i = ‖s_i‖² = ‖e_i‖² + 2⟨e_i, t̄⟩ + ‖t̄‖²`` and
    ``q_bi = ⟨c_b, s_i⟩ = ⟨c_b, e_i⟩ + ⟨c_b, t̄⟩``:

    * ``d̂_i² = ‖s_i − t̄‖² − σ̂²`` (= the definition, since ``(1/B) Σ_b ‖s_i − t_b‖² = ‖s_i − t̄‖² + trace/B``);
    * ``τd̂_i² = ‖r̄‖² − Σ_b ‖r_b − r̄‖² / (B (B−1))`` with ``Σ_b ‖r_b − r̄‖² = trace − Σ_b q_bi² / S_i``
      (the same identity for the ``r_b``) and ``‖r̄‖²`` from the residual form below.

    ``‖r̄‖²`` without cancellation. ``r̄ = t̄ − ⟨t̄, u_i⟩ u_i``, so ``‖r̄‖² = ‖t̄‖² − ⟨t̄, s_i⟩²/S_i``.
    Written so, it is the difference of two numbers of size ``‖t̄‖²``: with a common part of the
    steps a million times their spread, ``‖t̄‖²`` is 1e12 times ``‖r̄‖²`` and float64 keeps ~4
    digits of the result. Put it over one denominator, ``(‖t̄‖² S_i − ⟨t̄, s_i⟩²)/S_i``, and use
    ``s_i = t̄ + e_i`` (``S_i = ‖e_i‖² + 2⟨e_i, t̄⟩ + ‖t̄‖²``, ``⟨t̄, s_i⟩ = ⟨e_i, t̄⟩ + ‖t̄‖²``):
    the terms ``‖t̄‖⁴`` and ``2‖t̄‖²⟨e_i, t̄⟩`` cancel *algebraically*, leaving

        ``‖r̄‖² = (‖t̄‖² ‖e_i‖² − ⟨t̄, e_i⟩²) / S_i``,

    the Gram determinant of ``(t̄, e_i)`` (= ``‖t̄‖² ‖e_i⊥‖²``, ``e_i⊥`` the part of ``e_i``
    orthogonal to ``t̄``) over ``S_i``. Its two terms are of size ``‖t̄‖² ‖e_i‖²`` and their
    difference is ``‖t̄‖² ‖e_i⊥‖²``: they cancel only as far as ``e_i`` itself is parallel to
    ``t̄`` (relative error ~``ε/sin²∠(t̄, e_i)``), whatever the size of the common part. The
    numerator is clipped at 0 (a Gram determinant; rounding can leave it a hair below).

    Each form is exact where the other loses digits, so the estimators pick by the angle: the
    projection form ``‖t̄‖² − ⟨t̄, s_i⟩²/S_i`` when ``cos²∠(t̄, s_i) ≤ 1/2`` (its subtraction then
    loses at most one bit), the Gram form when ``t̄`` and ``s_i`` are nearly parallel (a large
    common part). The Gram form alone fails the other way: a source step far shorter than
    ``t̄`` makes ``e_i ≈ −t̄`` parallel to ``t̄`` and ``S_i`` a difference of ``‖t̄‖²``-sized
    terms, both rounding noise (a zero source step gave τd̂² = −47.5 instead of 16.3 in
    tests/algorithms/test_server_passes.py). ``S_i`` itself is still a sum of three terms that cancel when
    ``s_i`` is far shorter than ``t̄``; the projection form then divides a square of the same
    rounding noise by it and stays within ``ε‖t̄‖²`` of ``‖t̄‖²``.
    """
    n = cross.shape[1] - 1
    per_batch_var = trace / (b - 1)  # σ̂²(D̂_T,B): the variance of one step
    sigma2 = per_batch_var / b
    e_sq = np.array([cross[b + i, i] for i in range(n)], F64)  # ‖e_i‖²
    e_mean = cross[b:b + n, n]  # ⟨e_i, t̄⟩
    mean_sq = float(cross[b + n, n])  # ‖t̄‖²
    d2 = e_sq - sigma2
    tau_d2 = np.empty(n, F64)
    for i in range(n):
        s_sq = float(e_sq[i] + 2.0 * e_mean[i] + mean_sq)
        if s_sq > 0:
            q = cross[:b, i] + cross[:b, n]  # ⟨c_b, s_i⟩
            ts = float(e_mean[i]) + mean_sq  # ⟨t̄, s_i⟩
            if ts * ts <= 0.5 * mean_sq * s_sq:  # t̄, s_i far from parallel (cos² ≤ 1/2): the projection keeps its digits
                mean_resid = mean_sq - ts * ts / s_sq
            else:  # nearly parallel (a common part much larger than the noise): the Gram form, no ‖t̄‖²-sized difference
                gram = mean_sq * float(e_sq[i]) - float(e_mean[i]) ** 2  # ‖t̄‖²‖e_i‖² − ⟨t̄, e_i⟩²
                mean_resid = max(gram, 0.0) / s_sq
            spread = trace - float(np.dot(q, q)) / s_sq
        else:  # u_i = 0: r_b = t_b
            mean_resid, spread = mean_sq, trace
        tau_d2[i] = mean_resid - spread / (b * (b - 1))
    return AutoBetaEstimates(sigma2, d2, tau_d2)


def auto_beta(target_step_updates: np.ndarray, source_step_update: np.ndarray) -> tuple[float, float]:
    """``(β^DA, β^GP)`` for one source: ``σ̂²/(d̂² + σ̂²)`` and ``σ̂²/(τd̂² + σ̂²)``, with ``d̂²``
    and ``τd̂²`` clipped at 0 (see :func:`auto_beta_estimates` for the estimators and what
    ``t_b`` and ``s_i`` are).

    >>> auto_beta(np.array([[1., 0.], [3., 0.]]), np.array([2., 1.]))  # σ̂² = 1, d̂² = 0, τd̂² = 0.6
    (1.0, 0.625)
    """
    est = auto_beta_estimates(target_step_updates, np.asarray(source_step_update)[None, :]
                              if np.ndim(source_step_update) == 1 else source_step_update)
    if len(est.d2) != 1:
        raise ValueError("auto_beta takes one source step update [P]; use auto_beta_estimates for several")
    return float(est.beta_da[0]), float(est.beta_gp[0])


__all__ = ["AutoBetaEstimates", "auto_beta", "auto_beta_estimates", "beta_from", "estimates_from_products",
           "source_step_scales"]
