"""The server side of FedGaLA's local alignment: the last global move (docs/methods-seeds.md §3.2).

FedGaLA's gated clients (``gala``, and ``gala-simclr`` in the unsupervised setting;
:mod:`fedtune.algorithms.client.gala`) gate each parameter tensor's step on its agreement with
the last global move ``r = θ^t − θ^(t−1)``. The coordinator keeps ``r`` here, whatever the server
rule is, and sends it as ``payload["global_move"]`` (float32 ``[num_params]``) from the second
round on; round 1 has none, and its clients are not gated. NumPy only.

>>> side = GlobalMove(None, None, num_clients=2)
>>> side.payload(1)
{}
>>> _ = side.update(np.zeros(2, np.float32), np.array([1., -2.], np.float32), np.zeros((2, 2), np.float32),
...                 np.array([.5, .5]), extras=[{}, {}], round=1, info=None)
>>> side.payload(2)["global_move"]
array([ 1., -2.], dtype=float32)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedtune.algorithms.base import RunConfig
from fedtune.algorithms.server.side import ServerSide


class GlobalMove(ServerSide):
    """Keeps ``θ^t − θ^(t−1)`` (float32, the difference of the float32 global parameters) and
    broadcasts it; the server rule's parameters are left as they are."""

    name = "gala"

    def __init__(self, cfg: RunConfig, layout: Any, num_clients: int):
        super().__init__(cfg, layout, num_clients)
        self.move: np.ndarray | None = None

    def payload(self, round: int) -> dict[str, np.ndarray]:
        return {} if self.move is None else {"global_move": self.move}

    def update(self, old, new, updates, weights, *, extras, round, info):
        self.move = np.asarray(new, dtype=np.float32) - np.asarray(old, dtype=np.float32)
        return new, {}

    def state_dict(self) -> dict[str, Any]:
        return {"global_move": None if self.move is None else self.move.copy()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        move = state.get("global_move")
        self.move = None if move is None else np.array(move, dtype=np.float32)


class SimclrGlobalMove(GlobalMove):
    """The same for FedGaLA's unsupervised client method ``gala-simclr``."""

    name = "gala-simclr"


__all__ = ["GlobalMove", "SimclrGlobalMove"]
