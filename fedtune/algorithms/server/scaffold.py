"""SCAFFOLD's server side (Karimireddy et al., ICML 2020, Algorithm 1; docs/methods-baselines.md §11): the server control
variate ``c`` (NumPy only; the client, :mod:`fedtune.algorithms.client.scaffold`, is torch).

Every round the server sends ``c`` with the weights (payload key :data:`SCAFFOLD_C`); each
participant ``i ∈ S`` returns ``Δc_i = c_i⁺ − c_i`` (extra :data:`SCAFFOLD_DELTA_C`) and, after
the server rule moved the model (FedAvg: ``x ← x + η_g Σ p_i Δy_i``, ``η_g`` = ``global_lr``),
Algorithm 1's last line updates the control variate with the *unweighted* mean of the
participants' ``Δc_i`` scaled by the participating fraction:

    c ← c + (|S|/N) · (1/|S|) Σ_{i∈S} Δc_i            (N = the run's number of clients)

(:func:`scaffold_control_update`). ``c`` starts at zero and is kept in float64 (sent as float32).
The model the round ends with is the server rule's, unchanged.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedtune.algorithms.server.aggregate import weighted_sum
from fedtune.algorithms.base import RunConfig
from fedtune.algorithms.server.side import ServerSide, StreamedSum

SCAFFOLD_C = "scaffold_c"  # payload: the server control variate c, float32 [num_params]
SCAFFOLD_DELTA_C = "scaffold_delta_c"  # extra: the client's Δc_i = c_i⁺ − c_i, float32 [num_params]


def scaffold_control_update(c: np.ndarray, delta_cs: np.ndarray, num_clients: int, *, threads: int = 1) -> np.ndarray:
    """Algorithm 1's ``c + (|S|/N) · mean_{i∈S} Δc_i`` (float64), ``delta_cs`` the ``[|S|, M]``
    rows ``Δc_i`` of the round's participants, ``N = num_clients``.

    >>> scaffold_control_update(np.zeros(2), np.array([[1.0, 2.0], [3.0, 0.0]]), 4)
    array([1. , 0.5])
    """
    delta_cs = np.asarray(delta_cs)
    participants = delta_cs.shape[0]
    if participants == 0 or num_clients < participants:
        raise ValueError(f"{participants} participants' control variates for a run of {num_clients} clients")
    mean = weighted_sum(delta_cs, np.full(participants, 1.0 / participants), threads=threads)
    return scaffold_c_from_mean(c, mean, participants, num_clients)


def scaffold_c_from_mean(c: np.ndarray, mean: np.ndarray, participants: int, num_clients: int) -> np.ndarray:
    """:func:`scaffold_control_update` from ``mean = mean_{i∈S} Δc_i`` (float64, summed as the
    extras arrive)."""
    return np.asarray(c, dtype=np.float64) + (participants / num_clients) * mean


class ScaffoldServer(ServerSide):
    """The server control variate ``c`` of the client method ``scaffold``: sent every round,
    updated from the participants' ``Δc_i`` (:func:`scaffold_control_update`), checkpointed."""

    name = "scaffold"

    def __init__(self, cfg: RunConfig, layout: Any, num_clients: int):
        super().__init__(cfg, layout, num_clients)
        self.c = np.zeros(layout.num_params, dtype=np.float64)

    @property
    def threads(self) -> int:
        return max(1, int(getattr(self.cfg, "coordinator_cpus", 0) or 0))

    def payload(self, round: int) -> dict[str, np.ndarray]:
        return {SCAFFOLD_C: self.c.astype(np.float32)}

    def update(self, old, new, updates, weights, *, extras, round, info):
        rows = []
        for cid, extra in zip(info.client_ids, extras):
            delta = None if extra is None else extra.get(SCAFFOLD_DELTA_C)
            if delta is None or np.shape(delta) != self.c.shape:
                raise ValueError(f"scaffold: client {cid} sent no '{SCAFFOLD_DELTA_C}' of {self.c.size} values "
                                 f"(got {None if delta is None else np.shape(delta)})")
            rows.append(np.asarray(delta, dtype=np.float32))
        self.c = scaffold_control_update(self.c, np.stack(rows), self.num_clients, threads=self.threads)
        return new, {"scaffold_c_norm": float(np.linalg.norm(self.c))}

    def streamed_sums(self):
        return {"mean": StreamedSum(SCAFFOLD_DELTA_C, mean=True)}

    def streamed_update(self, old, new, sums, *, round, info):
        self.c = scaffold_c_from_mean(self.c, sums["mean"], len(info.client_ids), self.num_clients)
        return new, {"scaffold_c_norm": float(np.linalg.norm(self.c))}

    def state_dict(self) -> dict[str, Any]:
        return {"c": self.c.copy()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        c = np.array(state["c"], dtype=np.float64)
        if c.shape != self.c.shape:
            raise ValueError(f"scaffold: checkpoint control variate has shape {c.shape}, this model "
                             f"{self.c.shape}")
        self.c = c


__all__ = ["SCAFFOLD_C", "SCAFFOLD_DELTA_C", "ScaffoldServer", "scaffold_c_from_mean", "scaffold_control_update"]
