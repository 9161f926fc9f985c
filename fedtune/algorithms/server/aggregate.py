"""Aggregation math shared by the server rules: weighted sums of client updates, FedAvg's
weights and step, the weighted mean of batch-norm buffers, and the parameter tensors' slices.

Plain functions on NumPy arrays (importable and testable without Ray or torch). Conventions
(docs/methods.md):

* ``updates[u] = Δ_u = θ_u − θ`` is a *descent displacement* (adding it lowers client u's loss);
  rows are in ascending client-id order, so results never depend on which actor ran whom.
* ``weights[u] = p_u = n_u / Σ n`` (training examples of the round's participants).
* Sums are accumulated in float64 (:func:`fedtune.algorithms.server.blocked.weighted_rows`: row after
  row, each column adding ``w_u · x_u``), then cast to float32: bit-reproducible, bit-identical
  for any number of server threads (``threads``, the coordinator's ``coordinator_cpus``), backend
  and actor count, and the bits of the same sum made as the clients' replies arrive
  (:class:`~fedtune.algorithms.server.blocked.RowSum`, docs/methods.md §0.1).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from fedtune.algorithms.server.blocked import weighted_rows
from fedtune.algorithms.declarations import WEIGHTINGS

BLOCK = 1 << 16  # elements per block of the per-tensor and per-pair loops (float64 scratch of 512 KiB)


def check_updates(updates: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(updates, weights as float64)`` after checking they agree on the client count."""
    updates = np.asarray(updates)
    weights = np.asarray(weights, dtype=np.float64)
    if updates.ndim != 2 or weights.ndim != 1 or updates.shape[0] != weights.shape[0]:
        raise ValueError(f"updates {updates.shape} and weights {weights.shape} disagree on the client count")
    return updates, weights


def combine(updates: np.ndarray, weights: np.ndarray, base: np.ndarray | None, scale: float,
            out: np.ndarray, *, threads: int = 1) -> np.ndarray:
    """``out = base + scale · Σ_u w_u updates[u]`` (``base=None``: ``out = scale · Σ_u w_u updates[u]``),
    the sum in float64, into ``out`` (float32 or float64). Every weighted sum of the server rules is
    this one (:func:`fedtune.algorithms.server.blocked.weighted_rows`, on ``threads`` threads).

    >>> combine(np.array([[1., 2.]], np.float32), np.array([2.0]), np.ones(2), 0.5, np.empty(2))
    array([2., 3.])
    """
    return weighted_rows(updates, weights, out, base=base, scale=scale, threads=threads)


def weighted_sum(updates: np.ndarray, weights: np.ndarray, *, threads: int = 1) -> np.ndarray:
    """``Σ_u weights[u] · updates[u]`` accumulated in float64 (float64 ``[M]``).

    >>> weighted_sum(np.array([[1., 2.], [3., 4.]], np.float32), np.array([0.25, 0.75]))
    array([2.5, 3.5])
    """
    updates, weights = check_updates(updates, weights)
    return combine(updates, weights, None, 1.0, np.empty(updates.shape[1], dtype=np.float64), threads=threads)


def fedavg_weights(num_examples: np.ndarray) -> np.ndarray:
    """``p_u = n_u / Σ n`` (float64).

    >>> fedavg_weights(np.array([1, 3]))
    array([0.25, 0.75])
    """
    return normalised(num_examples, "num_examples")


def normalised(values: np.ndarray, name: str = "values") -> np.ndarray:
    """``values / Σ values`` (float64): a round's weights from non-negative ``values`` with a
    positive sum (else ValueError naming ``name``)."""
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 1 or len(v) == 0 or (v < 0).any() or v.sum() <= 0:
        raise ValueError(f"{name} must be non-negative with a positive sum, got {values!r}")
    return v / v.sum()




def mean_weights(weights: np.ndarray, weighting: str) -> np.ndarray:
    """The weights of a rule's mean over its ``U`` participants (float64): ``examples`` keeps the
    example weights ``p_u`` (:func:`fedavg_weights`); ``uniform`` gives ``1/U`` each, the plain mean
    of FedSR's and FedIIR's authors (docs/methods-baselines.md §7.4, §8.5).

    >>> mean_weights(np.array([0.25, 0.75]), "uniform"), mean_weights(np.array([0.25, 0.75]), "examples")
    (array([0.5, 0.5]), array([0.25, 0.75]))
    """
    weights = np.asarray(weights, dtype=np.float64)
    if weighting == "examples":
        return weights
    if weighting == "uniform":
        return np.full(weights.shape, 1.0 / len(weights))
    raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")


def fedavg_step(params: np.ndarray, updates: np.ndarray, weights: np.ndarray, global_lr: float = 1.0, *,
                threads: int = 1) -> np.ndarray:
    """FedAvg with a server learning rate: ``θ + η_g · Σ_u p_u Δ_u`` (float32).

    ``global_lr = 1`` is McMahan et al.'s FedAvg (the weighted mean of the client models).

    >>> fedavg_step(np.zeros(2, np.float32), np.array([[2., 0.], [0., 2.]], np.float32), np.array([.5, .5]), 0.5)
    array([0.5, 0.5], dtype=float32)
    """
    updates, weights = check_updates(updates, weights)
    if np.shape(params) != (updates.shape[1],):
        raise ValueError(f"params {np.shape(params)} and updates {np.shape(updates)} disagree on the parameter count")
    return combine(updates, weights, np.asarray(params), float(global_lr), np.empty(updates.shape[1], np.float32),
                   threads=threads)


def server_step(params: np.ndarray, direction: np.ndarray, global_lr: float) -> np.ndarray:
    """A server rule's new parameters ``θ + η·d`` (float32) from its float64 direction ``d``, with
    the arithmetic of :func:`combine` (``η·d`` in float64, ``+ θ``, one rounding to float32): for
    ``d = Σ p_u Δ_u`` (:func:`weighted_sum`) the bits of :func:`fedavg_step`. Every rule hands
    ``d`` to the server optimiser beside these parameters (:class:`~fedtune.algorithms.server.rule.AggregateResult`).

    >>> server_step(np.ones(2, np.float32), np.array([1.0, -2.0]), 0.5)
    array([1.5, 0. ], dtype=float32)
    """
    d = np.asarray(direction, dtype=np.float64)
    # one blocked pass (combine with d as its one row): no full-size float64 temporaries, and about
    # the time of fedavg_step's fused pass (a plain NumPy expression made three temporaries: 1.6x it)
    return combine(d[None, :], np.ones(1), params, float(global_lr), np.empty(d.shape[0], np.float32))


def fedavg_buffers(client_buffers: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Weighted mean of the clients' floating buffers (batch-norm running mean/var)."""
    return weighted_sum(client_buffers, weights).astype(np.float32)


def tensor_slices(slices: Sequence[Any] | None, size: int) -> list[slice]:
    """Normalise ``slices`` (slices or ``(name, slice)`` pairs, e.g. ``layout.param_slices()``)
    to plain slices that tile ``[0, size)`` in order: the parameter tensors of a per-tensor rule;
    ``None`` = the whole vector as one tensor.

    >>> tensor_slices([("w", slice(0, 2)), ("b", slice(2, 3))], 3)
    [slice(0, 2, None), slice(2, 3, None)]
    """
    if slices is None:
        return [slice(0, size)]
    out = [s[1] if isinstance(s, tuple) else s for s in slices]
    pos = 0
    for s in out:
        if not isinstance(s, slice) or s.step not in (None, 1) or s.start != pos or s.stop <= s.start:
            raise ValueError(f"slices must tile [0, {size}) in order without gaps, got {out}")
        pos = s.stop
    if pos != size:
        raise ValueError(f"slices cover [0, {pos}) but the vectors have {size} entries")
    return out


__all__ = ["BLOCK", "check_updates", "combine", "fedavg_buffers", "fedavg_step", "fedavg_weights",
           "mean_weights", "normalised", "server_step", "tensor_slices", "weighted_sum"]
