"""FedADG's server side: the federated generator (docs/methods-benchmark.md §24; the client is
:mod:`fedtune.algorithms.client.fedadg`).

The FedADG authors' ``FedAvg`` (``models/Fed.py``) averages the feature extractor, the classifier and
the generator uniformly over the clients; Bai et al.'s ``FedADGServer`` with the models' coefficients
(``len(client) / selected_total_size``). Here each participant returns its generator's parameters
as one float32 vector (extras :data:`GENERATOR_KEY`); the side keeps their mean with the weights of
the rule's ``client_weighting`` (``uniform``, the preset ``fedadg``'s default: ``1/U``; ``examples``:
``p_u``; ``examples`` under a rule without it), accumulated in float64 in ascending client id, then
float32, and broadcasts it with the next round's weights. Round 1 broadcasts none: every client
builds the run's initial generator from its own seed, the same everywhere. The generator is in the
coordinator's checkpoint. Whatever the server rule does with the model, the generator is averaged
(it is the method's state, not the model's). Diagnostic ``fedadg_generator_norm``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedtune.algorithms.base import RunConfig
from fedtune.algorithms.declarations import CLIENT_WEIGHTING
from fedtune.algorithms.server.aggregate import mean_weights
from fedtune.algorithms.server.side import ServerSide

GENERATOR_KEY = "fedadg.generator"
"""Payload and extras: the generator's parameters, one float32 vector."""


def mean_generator(rows: list[np.ndarray], weights: np.ndarray) -> np.ndarray:
    """``Σ_u weights[u] · rows[u]`` in float64, in the given order, as float32.

    >>> mean_generator([np.array([1., 2.], np.float32), np.array([3., 4.], np.float32)], np.array([.25, .75]))
    array([2.5, 3.5], dtype=float32)
    """
    if not rows:
        raise ValueError("FedADG: no generator arrived this round")
    acc = np.zeros(np.asarray(rows[0]).shape, np.float64)
    for w, row in zip(np.asarray(weights, np.float64), rows):
        acc += w * np.asarray(row, np.float64)
    return acc.astype(np.float32)


class FedADGServer(ServerSide):
    """The mean of the participants' generators (the rule's ``client_weighting``), broadcast each round."""

    name = "fedadg"

    def __init__(self, cfg: RunConfig, layout: Any, num_clients: int):
        super().__init__(cfg, layout, num_clients)
        self.generator: np.ndarray | None = None
        self.weighting = CLIENT_WEIGHTING.of(cfg)  # the rule's mean: the generator is averaged as the model

    def payload(self, round: int) -> dict[str, np.ndarray]:
        return {} if self.generator is None else {GENERATOR_KEY: self.generator}

    def update(self, old, new, updates, weights, *, extras, round, info):
        self.generator = mean_generator([e[GENERATOR_KEY] for e in extras], mean_weights(weights, self.weighting))
        return new, {"fedadg_generator_norm": float(np.linalg.norm(self.generator.astype(np.float64)))}

    def state_dict(self) -> dict[str, Any]:
        return {"generator": np.zeros(0, np.float32) if self.generator is None else self.generator.copy()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        g = np.asarray(state["generator"], np.float32)
        self.generator = None if g.size == 0 else g.copy()


__all__ = ["FedADGServer", "GENERATOR_KEY", "mean_generator"]
