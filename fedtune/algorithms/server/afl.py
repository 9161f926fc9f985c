"""AFL's server side: the mixture weights ``λ`` over the training domains (Mohri, Sivek, Suresh,
"Agnostic Federated Learning", ICML 2019; in Bai, Bagchi, Inouye's FedDG benchmark, ICLR 2024,
``src/server.py`` ``AFLServer``; docs/methods-benchmark.md §22). The client method is
:mod:`fedtune.algorithms.client.afl`; the server rule aggregates the models as it always does
(FedAvg in the preset).

Each round the side broadcasts ``λ`` (float64 over every domain id of the dataset, 0 outside the
training domains: payload :data:`LAMBDA_KEY`); every participant returns, besides its model, the
summed cross-entropy and the example count of each domain of its training data at the model it
*received* (:data:`LOSS_KEY`, :data:`COUNT_KEY`); the side then takes one projected gradient-ascent
step on the domain losses::

    L_d = Σ_u loss_u,d / Σ_u count_u,d        (0 for a domain no participant holds)
    λ ← Proj_simplex(λ + afl_lambda_lr · L)

over the training domains (:func:`project_to_simplex`, Duchi et al.'s sort-based projection, as
Bai et al.'s ``euclidean_proj_simplex``). ``λ`` starts uniform over the training domains (Bai et
al.'s ``group_weights`` over the groups of the train split) and is in the coordinator's checkpoint.
Diagnostics: ``afl_lambda.<domain>`` after the step and ``afl_lambda_max``.

Where the losses are taken (``afl_lambda_at``): ``start`` (default) at the round's starting model
``w_t``, as in the paper's Stochastic-AFL (both gradients at ``(w_t, λ_t)``), in the clients' one
call of the round; ``aggregated`` at the aggregated model ``w_{t+1}``, as Bai et al.'s code: the
side asks the coordinator to call the round's participants again after aggregation
(:meth:`AFLServer.wants_probe`) and steps in :meth:`AFLServer.after_probe`. Either way the new ``λ``
weights the next round's training.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedtune.algorithms.base import RunConfig
from fedtune.algorithms.declarations import AFL_LAMBDA_AT, AFL_LAMBDA_LR
from fedtune.algorithms.server.side import ServerSide

LAMBDA_KEY = "afl.lambda"
"""Payload: ``λ`` (float64 ``[number of dataset domains]``, indexed by domain id)."""
LOSS_KEY = "afl.loss_sum"
"""Extras: a client's summed cross-entropy per domain id at the received model (float64)."""
COUNT_KEY = "afl.count"
"""Extras: a client's training examples per domain id (float64)."""


def project_to_simplex(v: np.ndarray) -> np.ndarray:
    """The Euclidean projection of ``v`` (float64 ``[K]``) onto the probability simplex
    ``{w ≥ 0, Σ w = 1}``: ``max(v − θ, 0)`` with ``θ`` from the sorted cumulative sums (Duchi,
    Shalev-Shwartz, Singer, Chandra, ICML 2008).

    >>> project_to_simplex(np.array([0.5, 0.3, 0.2]))
    array([0.5, 0.3, 0.2])
    >>> project_to_simplex(np.array([1.0, 0.4, 0.0]))
    array([0.8, 0.2, 0. ])
    """
    v = np.asarray(v, dtype=np.float64)
    if v.ndim != 1 or v.size == 0:
        raise ValueError(f"project_to_simplex needs a non-empty vector, got shape {v.shape}")
    u = np.sort(v)[::-1]
    css = np.cumsum(u)
    k = np.arange(1, v.size + 1)
    rho = int(np.nonzero(u * k > css - 1.0)[0][-1])
    theta = (css[rho] - 1.0) / (rho + 1.0)
    return np.maximum(v - theta, 0.0)


def domain_losses(extras: list[dict[str, np.ndarray]], size: int) -> np.ndarray:
    """``L_d = Σ_u loss_u,d / Σ_u count_u,d`` over the participants' extras (float64 ``[size]``; 0
    where no participant holds domain ``d``)."""
    loss = np.zeros(size, np.float64)
    count = np.zeros(size, np.float64)
    for e in extras:
        loss += np.asarray(e[LOSS_KEY], np.float64)
        count += np.asarray(e[COUNT_KEY], np.float64)
    return np.divide(loss, count, out=np.zeros(size, np.float64), where=count > 0)


class AFLServer(ServerSide):
    """``λ`` over the training domains, one projected ascent step per round (module docstring)."""

    name = "afl"

    def __init__(self, cfg: RunConfig, layout: Any, num_clients: int):
        super().__init__(cfg, layout, num_clients)
        self.step = float(AFL_LAMBDA_LR.of(cfg))
        self.at = AFL_LAMBDA_AT.of(cfg)
        self.weights: np.ndarray | None = None  # λ over the training domains (in train_domains' order)

    def _lambda(self) -> np.ndarray:
        if self.weights is None:
            if not self.train_domains:
                raise ValueError("AFL: the run's plan names no training domain (server_side_of got no train_domains)")
            self.weights = np.full(len(self.train_domains), 1.0 / len(self.train_domains))
        return self.weights

    def _full(self) -> np.ndarray:
        full = np.zeros(max(len(self.domains), max(self.train_domains, default=-1) + 1), np.float64)
        full[list(self.train_domains)] = self._lambda()
        return full

    def payload(self, round: int) -> dict[str, np.ndarray]:
        return {LAMBDA_KEY: self._full()}

    def wants_probe(self) -> bool:
        return self.at == "aggregated"

    def _step(self, extras: list[dict[str, np.ndarray]]) -> dict[str, Any]:
        size = len(self._full())
        losses = domain_losses(extras, size)[list(self.train_domains)]
        self.weights = project_to_simplex(self._lambda() + self.step * losses)
        names = self.domains or tuple(str(k) for k in range(size))
        diag: dict[str, Any] = {f"afl_lambda.{names[k]}": float(w) for k, w in zip(self.train_domains, self.weights)}
        diag["afl_lambda_max"] = float(self.weights.max())
        return diag

    def update(self, old, new, updates, weights, *, extras, round, info):
        return new, ({} if self.wants_probe() else self._step(extras))

    def after_probe(self, extras: list[dict[str, np.ndarray]], round: int) -> dict[str, Any]:
        return self._step(extras)

    def state_dict(self) -> dict[str, Any]:
        return {"lambda": self._lambda().copy()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        weights = np.asarray(state["lambda"], np.float64)
        if self.train_domains and weights.shape != (len(self.train_domains),):
            raise ValueError(f"AFL: the checkpoint holds {weights.shape[0]} mixture weights, this run trains on "
                             f"{len(self.train_domains)} domains")
        self.weights = weights.copy()


__all__ = ["AFLServer", "COUNT_KEY", "LAMBDA_KEY", "LOSS_KEY", "domain_losses", "project_to_simplex"]
