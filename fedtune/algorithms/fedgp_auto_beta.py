"""Auto-β for FedDA/FedGP: the per-source, per-round β of Appendix A.2 (seed 002), estimated from
per-step updates (NumPy only).

``t_b`` are the FDA target client's raw per-batch steps, ``s_i`` each source's mean raw step in
the same units (what they are, and why raw gradient steps: :mod:`fedtune.algorithms.fedgp`).
:func:`auto_beta_estimates` gives ``σ̂²`` (the variance of the target's mean step), ``d̂_i²`` and
``τd̂_i²``; ``β^DA_i = σ̂²/(d̂_i² + σ̂²)`` and ``β^GP_i = σ̂²/(τd̂_i² + σ̂²)`` (:func:`beta_from`,
distances clipped at 0, ``0/0 := 0``). Sums run block by block in float64 in a fixed order (no
BLAS): bit-reproducible.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fedtune.algorithms.aggregate import BLOCK

F64 = np.float64


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
                        source_scales: Any = None) -> AutoBetaEstimates:
    """``σ̂², d̂_i², τd̂_i²`` (docs/methods.md §2, Appendix A.2 eqs. 90, 95, 105) on the whole vector.

    ``target_step_updates`` ``[B, P]``: the target's per-step displacements ``t_b`` (``B ≥ 2``);
    ``source_step_updates`` ``[N, P]`` (or ``[P]``): the sources' per-step displacements ``s_i``,
    or their round displacements with ``source_scales[i]`` turning row ``i`` into ``s_i``
    (:func:`source_step_scales`; saves a copy of the rows). With ``t̄`` the mean of the ``t_b``:

    * ``σ̂² = Σ_b ‖t_b − t̄‖² / ((B−1) B)``
    * ``d̂_i² = (1/B) Σ_b ‖s_i − t_b‖² − Σ_b ‖t_b − t̄‖² / (B−1)``
    * ``τd̂_i² = (1/B) Σ_b ‖r_b‖² − Σ_b ‖r_b − r̄‖² / (B−1)``, ``r_b = t_b − ⟨t_b, u_i⟩ u_i``,
      ``u_i = s_i/‖s_i‖`` (``u_i = 0`` when ``s_i = 0``)

    Sums run block by block in float64 in a fixed order (no BLAS): bit-reproducible.

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
    scales = np.ones(n, F64) if source_scales is None else np.broadcast_to(np.asarray(source_scales, F64), (n,))
    sq = np.zeros(b, F64)  # ‖t_b‖²
    centred = np.zeros(b, F64)  # ‖t_b − t̄‖²
    dist = np.zeros((b, n), F64)  # ‖s_i − t_b‖²
    inner = np.zeros((b, n), F64)  # ⟨t_b, s_i⟩
    snorm = np.zeros(n, F64)  # ‖s_i‖²
    for st in range(0, p, BLOCK):
        tb = t[:, st:st + BLOCK].astype(F64)
        mean = np.add.reduce(tb, axis=0) / b
        dev = tb - mean
        sq += np.add.reduce(tb * tb, axis=1)
        centred += np.add.reduce(dev * dev, axis=1)
        for i in range(n):
            si = s[i, st:st + BLOCK].astype(F64) * float(scales[i])
            snorm[i] += float(np.add.reduce(si * si))
            diff = tb - si
            dist[:, i] += np.add.reduce(diff * diff, axis=1)
            inner[:, i] += np.add.reduce(tb * si, axis=1)
    total_centred = float(np.sum(centred))
    per_batch_var = total_centred / (b - 1)  # σ̂²(D̂_T,B): the variance of one step
    sigma2 = per_batch_var / b
    d2 = np.mean(dist, axis=0) - per_batch_var
    tau_d2 = np.empty(n, F64)
    for i in range(n):
        proj = inner[:, i] / np.sqrt(snorm[i]) if snorm[i] > 0 else np.zeros(b, F64)  # ⟨t_b, u_i⟩
        resid_sq = sq - proj * proj  # ‖r_b‖²
        resid_var = (total_centred - float(np.sum((proj - proj.mean()) ** 2))) / (b - 1)  # Σ‖r_b − r̄‖²/(B−1)
        tau_d2[i] = float(np.mean(resid_sq)) - resid_var
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


__all__ = ["AutoBetaEstimates", "auto_beta", "auto_beta_estimates", "beta_from", "source_step_scales"]
