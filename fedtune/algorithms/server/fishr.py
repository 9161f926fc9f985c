"""Federated Fishr's server side (FedOMG paper Eq. 4; Ramé et al., ICML 2022; docs/methods-baselines.md §9):
the clients' mean gradient variance, kept by the coordinator for the ``fishr`` client method (NumPy
only).

Each participant returns ``extras["fishr_variance"]``: the variance over examples of its per-example
classifier gradients, smoothed by its own moving average as Fishr smooths each domain's
(:mod:`fedtune.algorithms.client.fishr`), at its round's last step. The server's statistic is their
unweighted mean over the round's reporting participants, Eq. 4's ``a^(r) = (1/U_S) Σ_u a_u^(r)``
(Fishr's code: the mean over domains, not weighted by their sizes)::

    v̄ = (1/U) Σ_u v_u

sent to the next round's participants as ``payload["fishr_mean_variance"]`` (float32). Nothing is
sent before the first report. A round in which no participant reports leaves v̄ unchanged.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedtune.algorithms.base import RunConfig
from fedtune.algorithms.server.side import ServerSide

VARIANCE_KEY = "fishr_variance"
"""Extra: the client's smoothed per-example gradient variance of the classifier (float64 [K])."""
MEAN_KEY = "fishr_mean_variance"
"""Payload: the server's mean variance v̄ over the last round's participants (float32 [K])."""


def mean_variance(variances: list[np.ndarray]) -> np.ndarray:
    """The unweighted mean of the clients' variances (float64).

    >>> mean_variance([np.array([1.0, 2.0]), np.array([3.0, 6.0])]).tolist()
    [2.0, 4.0]
    """
    stacked = np.stack([np.asarray(v, np.float64) for v in variances])
    return stacked.mean(axis=0)


def spread(variances: list[np.ndarray], mean: np.ndarray) -> float:
    """``(1/U) Σ_u mean_k (v_u,k − v̄_k)²``: Fishr's penalty of the reported variances (a diagnostic).

    >>> spread([np.array([1.0, 2.0]), np.array([3.0, 6.0])], np.array([2.0, 4.0]))
    2.5
    """
    return float(np.mean([np.mean((np.asarray(v, np.float64) - mean) ** 2) for v in variances]))


class FishrServer(ServerSide):
    """The participants' mean gradient variance v̄ (float64 on the server, float32 in the payload)."""

    name = "fishr"

    def __init__(self, cfg: RunConfig, layout: Any, num_clients: int):
        super().__init__(cfg, layout, num_clients)
        self.variance: np.ndarray | None = None

    def payload(self, round: int) -> dict[str, np.ndarray]:
        return {} if self.variance is None else {MEAN_KEY: self.variance.astype(np.float32)}

    def update(self, old, new, updates, weights, *, extras, round, info):
        reports = [np.asarray(e[VARIANCE_KEY], np.float64) for e in extras or () if e and VARIANCE_KEY in e]
        if not reports:
            return new, {}
        if len({r.shape for r in reports}) != 1:
            sizes = sorted({r.size for r in reports})
            raise ValueError(f"Fishr: the clients' gradient variances differ in size: {sizes}")
        self.variance = mean_variance(reports)
        return new, {"fishr_variance_spread": spread(reports, self.variance)}

    def state_dict(self) -> dict[str, Any]:
        return {"variance": None if self.variance is None else self.variance.copy()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        v = state.get("variance")
        self.variance = None if v is None else np.array(v, dtype=np.float64)


__all__ = ["FishrServer", "MEAN_KEY", "VARIANCE_KEY", "mean_variance", "spread"]
