"""FedGMA — gradient-masked averaging (Tenison, Sreeramadas, Mugunthan, Oyallon, Rish, Belilovsky,
"Gradient Masked Averaging for Federated Learning", TMLR 2023; in Bai, Bagchi, Inouye's FedDG
benchmark, ICLR 2024, ``src/server.py`` ``FedGMA``; docs/methods-benchmark.md §21) as a server rule.

Clients run any client method; the server masks FedAvg's displacement coordinate by coordinate by
how much the round's clients agree on its sign:

1. ``g = Σ_u w_u Δ_u`` (FedAvg's displacement, its own kernel and bits; ``w`` as ``client_weighting``);
2. agreement ``A_j = |(1/U) Σ_u sign(Δ_u,j)|`` ∈ [0, 1] (every client counts once, as in both
   sources; :func:`agreement`);
3. the mask ``m`` (``gma_mask``, :func:`gma_mask`):

   * ``soft`` (default): ``m_j = 1`` where ``A_j ≥ gma_tau``, ``A_j`` elsewhere — the AND-mask
     relaxed to the agreement itself below the threshold;
   * ``bai``: what Bai et al.'s code computes, ``m_j = gma_tau · (1 + A_j)`` where ``A_j ≥ gma_tau``
     and 0 elsewhere. Their line reads ``mask + (0 − mask) · A`` with ``mask = [A ≥ τ]``, and
     their ``ParamDict.__rsub__`` evaluates ``0 − mask`` as ``mask + (−0)``, i.e. ``mask``; the
     result is multiplied by ``τ`` (their ``hparam1`` is both the threshold and the server's
     step). With ``global_lr = 1`` this runs their numbers;

4. ``θ ← θ + global_lr · m ⊙ g``.

``gma_tau = 0`` with the ``soft`` mask keeps every coordinate (``A ≥ 0``): FedAvg bit for bit.
Batch-norm buffers are FedAvg's weighted mean (Bai et al. mask them with the parameters; fedtune
never sends buffers through a server rule: docs/methods-benchmark.md §21). Diagnostics per round:
``gma_kept`` (share of coordinates with ``A ≥ gma_tau``), ``gma_mean_mask`` and
``gma_mean_agreement``. Stateless between rounds.

>>> agreement(np.array([[1., -2., 0.], [3., 4., 0.]], np.float32))
array([1., 0., 0.])
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedtune.algorithms.base import RunConfig
from fedtune.algorithms.declarations import GMA_MASK, GMA_TAU
from fedtune.algorithms.server.aggregate import BLOCK, check_updates, mean_weights, server_step, weighted_sum
from fedtune.algorithms.server.rule import AggregateResult, FedAvg


def agreement(updates: np.ndarray, block: int = BLOCK) -> np.ndarray:
    """``A_j = |Σ_u sign(updates[u, j])| / U`` (float64 ``[M]``), a column block at a time (no
    ``[U, M]`` temporary); the sign counts are exact integers, so any block size gives the same bits.

    >>> agreement(np.array([[1., 1.], [1., -1.], [1., 1.], [-1., 1.]], np.float32))
    array([0.5, 0.5])
    """
    updates = np.asarray(updates)
    if updates.ndim != 2 or updates.shape[0] == 0:
        raise ValueError(f"updates must be [U >= 1, M], got shape {updates.shape}")
    rows, m = updates.shape
    out = np.empty(m, np.float64)
    for start in range(0, m, block):
        part = updates[:, start:start + block]
        counts = np.sign(part).sum(axis=0, dtype=np.float64)  # integers below 2**53: exact
        np.abs(counts, out=counts)
        out[start:start + part.shape[1]] = counts / rows
    return out


def gma_mask(agree: np.ndarray, tau: float, mask: str) -> np.ndarray:
    """FedGMA's mask from the agreement ``agree`` (float64): ``soft`` — 1 where ``agree ≥ tau``,
    ``agree`` elsewhere; ``bai`` — ``tau · (1 + agree)`` where ``agree ≥ tau``, 0 elsewhere (see the
    module docstring).

    >>> gma_mask(np.array([0.2, 0.5, 1.0]), 0.4, "soft")
    array([0.2, 1. , 1. ])
    >>> gma_mask(np.array([0.2, 0.5, 1.0]), 0.4, "bai")
    array([0. , 0.6, 0.8])
    """
    passed = agree >= tau
    if mask == "soft":
        return np.where(passed, 1.0, agree)
    if mask == "bai":
        return np.where(passed, tau * (1.0 + agree), 0.0)
    raise ValueError(f"gma_mask must be 'soft' or 'bai', got {mask!r}")


def fedgma_direction(updates: np.ndarray, weights: np.ndarray, tau: float, mask: str = "soft",
                     *, threads: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(d, m, A)``: FedGMA's direction ``d = m ⊙ Σ_u weights[u] updates[u]`` (float64 ``[M]``, the
    sum by FedAvg's kernel: where ``m = 1`` it is FedAvg's bit for bit), its mask ``m`` and the
    agreement ``A``.

    >>> d, m, a = fedgma_direction(np.array([[1., 2.], [3., -2.]], np.float32), np.array([.5, .5]), 0.8)
    >>> d, m, a
    (array([2., 0.]), array([1., 0.]), array([1., 0.]))
    """
    updates, weights = check_updates(updates, weights)
    g = weighted_sum(updates, weights, threads=threads)
    agree = agreement(updates)
    m = gma_mask(agree, float(tau), mask)
    np.multiply(m, g, out=g)
    return g, m, agree


class FedGMA(FedAvg):
    """FedGMA (docs/methods-benchmark.md §21): ``θ ← θ + global_lr · m ⊙ Σ_u w_u Δ_u``, ``m`` from the clients'
    sign agreement (``gma_tau``, ``gma_mask``); FedAvg's weights ``w`` (``client_weighting``) and
    its buffers."""

    name = "fedgma"

    def __init__(self, cfg: RunConfig, layout: Any):
        super().__init__(cfg, layout)
        self.tau = float(GMA_TAU.of(cfg))
        self.mask = GMA_MASK.of(cfg)

    def aggregate(self, params, updates, weights, *, extras, round, info):
        d, m, agree = fedgma_direction(updates, mean_weights(weights, self.weighting), self.tau, self.mask,
                                       threads=self.threads)
        diag = {"gma_kept": float(np.mean(agree >= self.tau)), "gma_mean_mask": float(np.mean(m)),
                "gma_mean_agreement": float(np.mean(agree))}
        return AggregateResult(server_step(params, d, self.global_lr), diag, d)


__all__ = ["FedGMA", "agreement", "fedgma_direction", "gma_mask"]
