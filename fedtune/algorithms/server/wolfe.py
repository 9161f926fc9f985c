"""Wolfe's (1976) minimum-norm-point algorithm on a Gram matrix (NumPy only).

``argmin_{λ ∈ simplex} λᵀKλ`` for the Gram matrix ``K`` of a finite set of points: the point of
least norm in their convex hull, found on ``U``-sized arrays only (the points themselves are never
touched). FedOMG's exact step-2 solver (:mod:`fedtune.algorithms.server.fedomg_solvers`) calls it once
per value of its root search, warm-started from the previous corral.

>>> support, lam = min_norm_point(np.array([[1., 0.], [0., 1.]]), [0], np.ones(1))
>>> sorted(support), lam.round(6).tolist()     # two orthonormal points: the midpoint
([0, 1], [0.5, 0.5])
"""

from __future__ import annotations

import numpy as np


def affine_minimizer(K: np.ndarray) -> np.ndarray | None:
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


def min_norm_point(K: np.ndarray, support: list[int], lam: np.ndarray,
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
            alpha = affine_minimizer(K[np.ix_(S, S)])
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


__all__ = ["affine_minimizer", "min_norm_point"]
