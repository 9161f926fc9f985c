"""FedIIR's server side (Guo et al., ICML 2023; docs/methods-baselines.md §8): the running mean gradient
of the classifier, kept by the coordinator for the ``fediir`` client method (NumPy only).

Each participant returns, at the global model θ it received, the sum of its per-batch gradients of
the cross-entropy with respect to the classifier (the model's last linear layer, weight then bias,
flattened) over one epoch of batches, ``extras["fediir_grad_sum"]``, and how many batches that was,
``extras["fediir_batches"]``. The server's mean gradient of the round is the mean over all those
batches (as the authors' ``mean_grad``: every batch of every sampled client counts once)::

    ĝ = Σ_u sum_u / Σ_u batches_u

and its running mean is their exponential moving average from zero (no bias correction, as the
authors' code: ``grad_mean`` starts at zeros)::

    ḡ ← fediir_ema · ḡ + (1 − fediir_ema) · ĝ

sent to the next round's participants as ``payload["fediir_grad_mean"]`` (float32). Before the first
update nothing is sent and the clients use ḡ = 0, the authors' initial value. Clients that report
nothing (``fediir_penalty = 0``) leave ḡ unchanged.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedtune.algorithms.base import RunConfig
from fedtune.algorithms.declarations import FEDIIR_EMA
from fedtune.algorithms.server.side import ServerSide


GRAD_SUM_KEY = "fediir_grad_sum"
"""Extra: the client's sum over its batches of the classifier gradient at θ (float64 [K])."""
BATCHES_KEY = "fediir_batches"
"""Extra: how many batches that sum holds (an int64 scalar array)."""
MEAN_KEY = "fediir_grad_mean"
"""Payload: the server's running mean gradient ḡ (float32 [K])."""


def round_mean_gradient(sums: list[np.ndarray], batches: list[float]) -> np.ndarray:
    """The mean batch gradient over every batch of every reporting client: ``Σ sums / Σ batches``.

    >>> round_mean_gradient([np.array([2.0, 4.0]), np.array([1.0, 0.0])], [2, 1]).tolist()
    [1.0, 1.3333333333333333]
    """
    total = np.sum(np.stack([np.asarray(s, np.float64) for s in sums]), axis=0)
    return total / float(np.sum(batches))


def ema_update(previous: np.ndarray | None, new: np.ndarray, ema: float) -> np.ndarray:
    """``ema · previous + (1 − ema) · new``, ``previous`` = 0 when None (the authors' zero start).

    >>> ema_update(None, np.array([2.0]), 0.75).tolist(), ema_update(np.array([1.0]), np.array([2.0]), 0.75).tolist()
    ([0.5], [1.25])
    """
    new = np.asarray(new, np.float64)
    if previous is None:
        return (1.0 - ema) * new
    if previous.shape != new.shape:
        raise ValueError(f"FedIIR: a client's classifier gradient has {new.size} entries, the server's mean "
                         f"{previous.size}")
    return ema * previous + (1.0 - ema) * new


class FedIIRServer(ServerSide):
    """The running mean classifier gradient ḡ (float64 on the server, float32 in the payload)."""

    name = "fediir"

    def __init__(self, cfg: RunConfig, layout: Any, num_clients: int):
        super().__init__(cfg, layout, num_clients)
        self.ema = float(FEDIIR_EMA.of(cfg))
        self.grad_mean: np.ndarray | None = None

    def payload(self, round: int) -> dict[str, np.ndarray]:
        return {} if self.grad_mean is None else {MEAN_KEY: self.grad_mean.astype(np.float32)}

    def update(self, old, new, updates, weights, *, extras, round, info):
        reports = [e for e in extras or () if e and GRAD_SUM_KEY in e]
        if not reports:
            return new, {}
        g_round = round_mean_gradient([e[GRAD_SUM_KEY] for e in reports],
                                      [float(np.asarray(e[BATCHES_KEY])) for e in reports])
        self.grad_mean = ema_update(self.grad_mean, g_round, self.ema)
        return new, {"fediir_round_grad_norm": float(np.linalg.norm(g_round)),
                     "fediir_grad_mean_norm": float(np.linalg.norm(self.grad_mean))}

    def state_dict(self) -> dict[str, Any]:
        return {"grad_mean": None if self.grad_mean is None else self.grad_mean.copy()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        mean = state.get("grad_mean")
        self.grad_mean = None if mean is None else np.array(mean, dtype=np.float64)


__all__ = ["BATCHES_KEY", "FedIIRServer", "GRAD_SUM_KEY", "MEAN_KEY", "ema_update",
           "round_mean_gradient"]
