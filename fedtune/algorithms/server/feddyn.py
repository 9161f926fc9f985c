"""FedDyn's server side (Acar et al., ICLR 2021, Algorithm 1; docs/methods-baselines.md §12) and its hyperparameters (NumPy only;
the client, :mod:`fedtune.algorithms.client.feddyn`, is torch).

The server keeps ``h`` (zero at the start) and, after the round's participants ``P_t`` trained
from ``θ^(t−1)`` (their models ``θ_k^t``):

    h^t = h^(t−1) − α (1/m) Σ_{k∈P_t} (θ_k^t − θ^(t−1))          (m = the run's number of clients)
    θ^t = (1/|P_t|) Σ_{k∈P_t} θ_k^t − h^t/α

(:func:`feddyn_h_update`, :func:`feddyn_correct`). In fedtune the mean is the server rule's
result (``feddyn_mean: rule``, the default: FedAvg's example-weighted mean with ``global_lr``,
or any other rule's step, so FedDyn's clients compose with FedOMG), or the paper's unweighted mean
of the participants' models (``feddyn_mean: uniform``, FedAvg only, with ``global_lr`` as
``θ^(t−1) + η_g (1/|P_t|) Σ Δ_k``: ``η_g = 1`` is the paper's line). Either mean is the step the
run's ``server_optimizer`` takes (:meth:`FedDynServer.proposal`: the uniform mean replaces the
rule's before the optimiser, with its direction ``(1/|P_t|) Σ Δ_k``), and ``−h/α`` corrects the
optimiser's result. The two differ only when the
participants hold different numbers of examples. ``α = 0`` skips ``h`` altogether (``h/α`` is
taken as 0): with ``feddyn_mean: rule`` the round is exactly the server rule's. The sum over
``P_t`` in ``h`` is unweighted in the paper and the authors' code alike. ``h`` is float64.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedtune.algorithms.server.aggregate import server_step, weighted_sum
from fedtune.algorithms.base import RunConfig
from fedtune.algorithms.declarations import FEDDYN_ALPHA, FEDDYN_MEAN
from fedtune.algorithms.server.rule import AggregateResult
from fedtune.algorithms.server.side import ServerSide, StreamedSum



def feddyn_h_update(h: np.ndarray, updates: np.ndarray, alpha: float, num_clients: int, *,
                    threads: int = 1) -> np.ndarray:
    """Algorithm 1's ``h − α (1/m) Σ_{k∈P} (θ_k − θ)`` (float64), ``updates`` the ``[|P|, M]`` rows
    ``θ_k − θ`` of the round's participants, ``m = num_clients``.

    >>> feddyn_h_update(np.zeros(2), np.array([[1.0, 2.0], [3.0, 0.0]]), 0.5, 4)
    array([-0.5 , -0.25])
    """
    updates = np.asarray(updates)
    total = weighted_sum(updates, np.ones(updates.shape[0]), threads=threads)
    return feddyn_h_from_sum(h, total, alpha, num_clients)


def feddyn_h_from_sum(h: np.ndarray, total: np.ndarray, alpha: float, num_clients: int) -> np.ndarray:
    """:func:`feddyn_h_update` from ``total = Σ_{k∈P} (θ_k − θ)`` (float64, summed as the updates arrive)."""
    return np.asarray(h, dtype=np.float64) - (float(alpha) / int(num_clients)) * total


def feddyn_correct(params: np.ndarray, h: np.ndarray, alpha: float) -> np.ndarray:
    """The round's model ``params − h/α`` (float32, computed in float64); ``α = 0``: ``params``
    unchanged.

    >>> feddyn_correct(np.array([1.0, 1.0], np.float32), np.array([-0.5, 0.25]), 0.5)
    array([2. , 0.5], dtype=float32)
    """
    if float(alpha) == 0.0:
        return params
    return (np.asarray(params, dtype=np.float64) - np.asarray(h, dtype=np.float64) / float(alpha)).astype(np.float32)


class FedDynServer(ServerSide):
    """FedDyn's ``h`` (:func:`feddyn_h_update`) and the round's model ``mean − h/α``
    (:func:`feddyn_correct`), the mean chosen by ``feddyn_mean``; ``h`` is checkpointed."""

    name = "feddyn"

    def __init__(self, cfg: RunConfig, layout: Any, num_clients: int):
        super().__init__(cfg, layout, num_clients)
        self.alpha = float(FEDDYN_ALPHA.of(cfg))
        self.mean = FEDDYN_MEAN.of(cfg)
        self.h = np.zeros(layout.num_params, dtype=np.float64)

    @property
    def threads(self) -> int:
        return max(1, int(getattr(self.cfg, "coordinator_cpus", 0) or 0))

    def proposal(self, old, result, updates, *, info):
        if self.mean != "uniform":
            return result
        # the paper's (1/|P|) Σ θ_k at FedAvg's server step: fedavg_step's bits with uniform weights
        rows = updates.shape[0]
        return self._uniform(old, result, weighted_sum(updates, np.full(rows, 1.0 / rows), threads=self.threads))

    def _uniform(self, old, result, d):
        return AggregateResult(server_step(old, d, self.cfg.effective_global_lr), result.diagnostics, d)

    def update(self, old, new, updates, weights, *, extras, round, info):
        if self.alpha == 0.0:
            return new, {}
        return self._corrected(new, feddyn_h_update(self.h, updates, self.alpha, self.num_clients,
                                                    threads=self.threads))

    def _corrected(self, new, h):
        self.h = h
        return feddyn_correct(new, self.h, self.alpha), {"feddyn_h_norm": float(np.linalg.norm(self.h))}

    def streamed_sums(self):
        sums = {"total": StreamedSum("update")} if self.alpha != 0.0 else {}
        if self.mean == "uniform":
            sums["mean"] = StreamedSum("update", mean=True)
        return sums

    def streamed_proposal(self, old, result, sums, *, info):
        return self._uniform(old, result, sums["mean"]) if self.mean == "uniform" else result

    def streamed_update(self, old, new, sums, *, round, info):
        if self.alpha == 0.0:
            return new, {}
        return self._corrected(new, feddyn_h_from_sum(self.h, sums["total"], self.alpha, self.num_clients))

    def state_dict(self) -> dict[str, Any]:
        return {"h": self.h.copy()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        h = np.array(state["h"], dtype=np.float64)
        if h.shape != self.h.shape:
            raise ValueError(f"feddyn: checkpoint h has shape {h.shape}, this model {self.h.shape}")
        self.h = h


__all__ = ["FedDynServer", "feddyn_correct", "feddyn_h_from_sum", "feddyn_h_update"]
