"""Server rules: how the coordinator combines client updates into the next global model.

The math is plain functions on NumPy arrays (importable and testable without Ray); a
:class:`ServerRule` wraps one with its hyperparameters and state. Conventions (METHODS.md):

* ``updates[u] = Δ_u = θ_u − θ`` is a *descent displacement* (adding it lowers client u's loss);
  rows are in ascending client-id order, so results never depend on which actor ran whom.
* ``weights[u] = p_u = n_u / Σ n`` (training examples of the round's participants).
* Only the parameter part of the flat vector (``layout.num_params``) reaches a rule; floating
  buffers (batch-norm statistics) are averaged by :func:`fedavg_buffers` for every rule.
* Sums are accumulated in float64, client by client in a fixed order (no BLAS reduction whose
  order could depend on thread counts), then cast to float32: bit-reproducible.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from fedtune.algorithms.base import HParam


def weighted_sum(updates: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """``Σ_u weights[u] · updates[u]`` accumulated in float64, row by row in order.

    >>> weighted_sum(np.array([[1., 2.], [3., 4.]], np.float32), np.array([0.25, 0.75]))
    array([2.5, 3.5])
    """
    updates = np.asarray(updates)
    weights = np.asarray(weights, dtype=np.float64)
    if updates.ndim != 2 or updates.shape[0] != weights.shape[0]:
        raise ValueError(f"updates {updates.shape} and weights {weights.shape} disagree on the client count")
    acc = np.zeros(updates.shape[1], dtype=np.float64)
    for w, row in zip(weights, updates):
        acc += w * row
    return acc


def fedavg_weights(num_examples: np.ndarray) -> np.ndarray:
    """``p_u = n_u / Σ n`` (float64).

    >>> fedavg_weights(np.array([1, 3]))
    array([0.25, 0.75])
    """
    n = np.asarray(num_examples, dtype=np.float64)
    if n.ndim != 1 or len(n) == 0 or (n < 0).any() or n.sum() <= 0:
        raise ValueError(f"num_examples must be non-negative with a positive sum, got {num_examples}")
    return n / n.sum()


def fedavg_step(params: np.ndarray, updates: np.ndarray, weights: np.ndarray, global_lr: float = 1.0) -> np.ndarray:
    """FedAvg with a server learning rate: ``θ + η_g · Σ_u p_u Δ_u`` (float32).

    ``global_lr = 1`` is McMahan et al.'s FedAvg (the weighted mean of the client models).

    >>> fedavg_step(np.zeros(2, np.float32), np.array([[2., 0.], [0., 2.]], np.float32), np.array([.5, .5]), 0.5)
    array([0.5, 0.5], dtype=float32)
    """
    direction = weighted_sum(updates, weights)
    if np.shape(params) != direction.shape:
        raise ValueError(f"params {np.shape(params)} and updates {np.shape(updates)} disagree on the parameter count")
    return (params.astype(np.float64) + global_lr * direction).astype(np.float32)


def fedavg_buffers(client_buffers: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Weighted mean of the clients' floating buffers (batch-norm running mean/var)."""
    return weighted_sum(client_buffers, weights).astype(np.float32)


@dataclass
class AggregateResult:
    params: np.ndarray  # new global parameters, float32 [num_params]
    diagnostics: dict[str, Any]  # becomes diag.<name> columns


class ServerRule:
    """Base class. Subclasses set ``name``/``hparams`` and implement :meth:`aggregate`.

    ``cfg`` is the validated :class:`~fedtune.config.RunConfig`; a rule reads its own
    hyperparameters with ``cfg.param(name)``.
    """

    name: ClassVar[str]
    description: ClassVar[str] = ""
    hparams: ClassVar[tuple[HParam, ...]] = ()
    needs_target_client: ClassVar[bool] = False  # FedDA/FedGP: only in the fda setting

    def __init__(self, cfg: Any, layout: Any):
        self.cfg = cfg
        self.layout = layout

    def payload(self, round: int) -> dict[str, np.ndarray]:
        """Arrays broadcast to clients with the weights this round (e.g. FedGaLA's reference)."""
        return {}

    def aggregate(self, params: np.ndarray, updates: np.ndarray, weights: np.ndarray, *,
                  extras: list[dict[str, np.ndarray]], round: int) -> AggregateResult:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume the rule (checkpoints)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class FedAvg(ServerRule):
    name = "fedavg"
    description = "FedAvg: θ ← θ + global_lr · Σ p_u Δ_u"

    def aggregate(self, params, updates, weights, *, extras, round):
        return AggregateResult(fedavg_step(params, updates, weights, self.cfg.global_lr), {})
