"""Server rules: how the coordinator combines client updates into the next global model.

The math is plain functions on NumPy arrays (importable and testable without Ray); a
:class:`ServerRule` wraps one with its hyperparameters and state. Conventions (METHODS.md):

* ``updates[u] = Δ_u = θ_u − θ`` is a *descent displacement* (adding it lowers client u's loss);
  rows are in ascending client-id order, so results never depend on which actor ran whom.
* ``weights[u] = p_u = n_u / Σ n`` (training examples of the round's participants).
* Only the parameter part of the flat vector (``layout.num_params``) reaches
  :meth:`ServerRule.aggregate`; floating buffers (batch-norm statistics) go to
  :meth:`ServerRule.aggregate_buffers` after it (default: :func:`fedavg_buffers`, the weighted
  mean; the FDA rules follow their parameter rule, METHODS.md §2). Integer buffers
  (``num_batches_tracked``) are not in the flat vector and stay as each model has them.
* Sums are accumulated in float64, client by client in a fixed order (no BLAS reduction whose
  order could depend on thread counts), then cast to float32: bit-reproducible.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from fedtune.algorithms.base import HParam


BLOCK = 1 << 16  # elements per block: the float64 scratch stays in cache (512 KiB)


def _check(updates: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    updates = np.asarray(updates)
    weights = np.asarray(weights, dtype=np.float64)
    if updates.ndim != 2 or weights.ndim != 1 or updates.shape[0] != weights.shape[0]:
        raise ValueError(f"updates {updates.shape} and weights {weights.shape} disagree on the client count")
    return updates, weights


def _combine(updates: np.ndarray, weights: np.ndarray, base: np.ndarray | None, scale: float,
             out: np.ndarray) -> np.ndarray:
    """``out = base + scale · Σ_u w_u updates[u]`` block by block; every element sees exactly the
    float64 operations of the plain formula, in client order (so blocking changes no bit)."""
    m = updates.shape[1]
    acc_buf = np.empty(min(BLOCK, m), dtype=np.float64)
    tmp_buf = np.empty_like(acc_buf)
    for s in range(0, m, BLOCK):
        e = min(s + BLOCK, m)
        acc, tmp = acc_buf[:e - s], tmp_buf[:e - s]
        acc[:] = 0.0
        for w, row in zip(weights, updates):
            np.multiply(row[s:e], w, out=tmp)
            acc += tmp
        if base is not None:
            acc *= scale
            acc += base[s:e]
        out[s:e] = acc
    return out


def weighted_sum(updates: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """``Σ_u weights[u] · updates[u]`` accumulated in float64, client by client in order.

    >>> weighted_sum(np.array([[1., 2.], [3., 4.]], np.float32), np.array([0.25, 0.75]))
    array([2.5, 3.5])
    """
    updates, weights = _check(updates, weights)
    return _combine(updates, weights, None, 1.0, np.empty(updates.shape[1], dtype=np.float64))


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
    updates, weights = _check(updates, weights)
    if np.shape(params) != (updates.shape[1],):
        raise ValueError(f"params {np.shape(params)} and updates {np.shape(updates)} disagree on the parameter count")
    return _combine(updates, weights, np.asarray(params), float(global_lr), np.empty(updates.shape[1], np.float32))


def fedavg_buffers(client_buffers: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Weighted mean of the clients' floating buffers (batch-norm running mean/var)."""
    return weighted_sum(client_buffers, weights).astype(np.float32)


@dataclass(frozen=True)
class RoundInfo:
    """Who sent the rows of ``updates`` (row ``u`` = ``client_ids[u]``), for rules that treat
    clients differently (FedDA/FedGP: the FDA target client has role ``"target"``)."""

    client_ids: tuple[int, ...]
    roles: tuple[str, ...]  # "source" | "target"
    steps: tuple[int, ...]  # local optimiser steps each client took this round
    num_examples: tuple[int, ...]

    @classmethod
    def sources(cls, num: int, steps: int = 1, examples: int = 1) -> "RoundInfo":
        """``num`` plain source clients (tests and benchmarks)."""
        return cls(tuple(range(num)), ("source",) * num, (steps,) * num, (examples,) * num)


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
    # Auto-β: the FDA target client returns extras["step_updates"], float32 [B, num_params], its
    # raw step −local_lr·∇_b on each of its B local batches; every source returns
    # extras["mean_step_update"], float32 [num_params], the mean of its raw per-batch steps.
    wants_target_steps: ClassVar[bool] = False
    # This rule's default for the run's ``global_lr`` field when the user leaves it unset.
    default_global_lr: ClassVar[float] = 1.0

    def __init__(self, cfg: Any, layout: Any):
        self.cfg = cfg
        self.layout = layout

    @classmethod
    def wants_target_steps_for(cls, cfg: Any) -> bool:
        """Whether a run with ``cfg`` needs the clients' raw per-batch steps (the target's
        ``step_updates``, the sources' ``mean_step_update``; FedDA/FedGP: only with
        ``gp_beta = "auto"``); the default is the class attribute :attr:`wants_target_steps`."""
        return bool(cls.wants_target_steps)

    @property
    def global_lr(self) -> float:
        """``cfg.global_lr`` if set, else this rule's :attr:`default_global_lr`."""
        return float(self.cfg.global_lr) if self.cfg.global_lr is not None else float(self.default_global_lr)

    def payload(self, round: int) -> dict[str, np.ndarray]:
        """Arrays broadcast to clients with the weights this round (e.g. FedGaLA's reference)."""
        return {}

    def aggregate(self, params: np.ndarray, updates: np.ndarray, weights: np.ndarray, *,
                  extras: list[dict[str, np.ndarray]], round: int, info: RoundInfo) -> AggregateResult:
        """New global parameters from the round's updates.

        ``updates`` is ``[U, num_params]`` float32, one row per participant in ascending client id;
        it is the coordinator's scratch buffer, valid during this call only: copy what you keep.
        ``weights`` are the FedAvg weights ``p_u``; ``extras[u]`` the arrays client ``u``'s method
        returned (e.g. per-batch displacements); ``info`` who sent each row (ids, roles, steps).
        """
        raise NotImplementedError

    def aggregate_buffers(self, buffers: np.ndarray, client_buffers: np.ndarray, weights: np.ndarray, *,
                          info: RoundInfo) -> np.ndarray:
        """New floating buffers (batch-norm running statistics), float32 ``[S]``, called right after
        :meth:`aggregate` in the same round.

        ``buffers`` are the global model's (``[S]``), ``client_buffers`` the participants' after
        local training (``[U, S]``, rows as in ``aggregate``), ``weights`` the FedAvg ``p_u``. The
        default is their weighted mean :func:`fedavg_buffers`; the FDA rules override it."""
        return fedavg_buffers(client_buffers, weights)

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume the rule (checkpoints)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class FedAvg(ServerRule):
    name = "fedavg"
    description = "FedAvg: θ ← θ + global_lr · Σ p_u Δ_u"

    def aggregate(self, params, updates, weights, *, extras, round, info):
        return AggregateResult(fedavg_step(params, updates, weights, self.global_lr), {})
