"""One fit round's replies, taken one client at a time as they arrive: :class:`FitRound`.

The coordinator (:mod:`fedtune.runtime.coordinator`) feeds it the pool's one-client replies in
ascending client id (:meth:`~fedtune.runtime.pools.PoolBase.fit_stream`) and reads back either
streamed float64 sums (docs/methods.md §0.1) or the stacked update rows. NumPy only.
"""

from __future__ import annotations

import math

import numpy as np

from fedtune.algorithms.server.blocked import RowSum
from fedtune.runtime.messages import FitReply


class FitRound:
    """One fit round's replies, taken one client at a time in ascending client id as they arrive
    (:meth:`add`); ``order`` lists the clients whose update arrived (so what follows never
    depends on which worker trained whom). Each client's state is used and dropped at once:

    * *streamed* (``feeds`` given: the rule's :meth:`~fedtune.algorithms.server.rule.ServerRule.streamed_weights`
      and the server side's :meth:`~fedtune.algorithms.server.side.ServerSide.streamed_sums`): the
      update ``θ_u − θ``, the buffers and the extras the sums name go into float64 sums
      (:class:`~fedtune.algorithms.server.blocked.RowSum`, ``sums``), no ``[U, M]`` matrix; an
      extra that is summed is not kept;
    * otherwise the update becomes row ``u`` of ``updates`` (the coordinator's scratch) and the
      buffers row ``u`` of ``buffers``, for a rule or side that needs them all.

    ``feeds``: sum name → ``(source, weight by client id, normalised)``, source ``"update"``,
    ``"buffers"`` or an extra's key; a normalised sum's weights add up to 1 over the sampled
    participants and is rescaled to those that arrived when some were skipped (:meth:`totals`).
    """

    def __init__(self, theta: np.ndarray, state_size: int, participants: list[int], updates: np.ndarray | None,
                 feeds: dict[str, tuple[str, dict[int, float], bool]] | None):
        self.theta, self.state_size = theta, state_size
        self.feeds = feeds
        self.order: list[int] = []
        self.num_examples: list[int] = []
        self.losses: list[float] = []
        self.steps: list[int] = []
        self.extras: list[dict[str, np.ndarray]] = []
        self.metrics: list[dict[str, float]] = []
        self.skipped: list[int] = []  # sampled clients whose worker died and was skipped (on_client_failure=skip)
        self.seconds = 0.0  # wall time of the fit phase: payload, broadcast, training, states back
        self._compute: dict[int, float] = {}
        self._io: dict[int, float] = {}
        P, S = len(theta), state_size - len(theta)
        if feeds is None:
            self._updates = updates
            self._buffers = np.empty((len(participants), S), np.float32)
        else:
            self._sums = {name: RowSum(S if source == "buffers" else P) for name, (source, _, _) in feeds.items()}
            self._delta = np.empty(P, np.float32)

    @property
    def streamed(self) -> bool:
        return self.feeds is not None

    def totals(self) -> dict[str, np.ndarray]:
        """The streamed sums by name (float64); normalised ones rescaled when clients were skipped."""
        out = {}
        for name, (_, weights, normalised) in self.feeds.items():
            total = self._sums[name].total
            if self.skipped and normalised:
                total = total / math.fsum(weights[c] for c in self.order)
            out[name] = total
        return out

    def add(self, reply: FitReply) -> None:
        """A one-client reply (:meth:`~fedtune.runtime.worker.ClientWorker.fit_stream`), in ascending client id."""
        (cid,) = reply.client_ids
        state = reply.states[0]
        P = len(self.theta)
        if state.shape != (self.state_size,):
            raise RuntimeError(f"client {cid} sent a state of {state.shape}, the model has {self.state_size} weights")
        row = len(self.order)
        extra = reply.extras[0] if reply.extras else {}
        if self.feeds is None:
            np.subtract(state[:P], self.theta, out=self._updates[row])
            self._buffers[row] = state[P:]
        else:
            extra = dict(extra)
            np.subtract(state[:P], self.theta, out=self._delta)
            for name, (source, weights, _) in self.feeds.items():
                if source == "update":
                    value = self._delta
                elif source == "buffers":
                    value = state[P:]
                else:
                    value = extra.get(source)
                    if value is None or np.shape(value) != (P,):
                        raise ValueError(f"client {cid} sent no '{source}' of {P} values (got "
                                         f"{None if value is None else np.shape(value)})")
                    value = np.asarray(value, dtype=np.float32)
                self._sums[name].add(value, weights[cid])
            for source, _, _ in self.feeds.values():
                if source not in ("update", "buffers"):
                    extra.pop(source, None)  # a summed extra: not kept
        self.order.append(cid)
        self.num_examples.append(int(reply.num_examples[0]))
        self.losses.append(float(reply.losses[0]))
        self.steps.append(int(reply.steps[0]))
        self.extras.append(extra)
        self.metrics.append(reply.metrics[0] if reply.metrics else {})
        self._compute[reply.worker] = self._compute.get(reply.worker, 0.0) + float(reply.compute_s[0])
        self._io[reply.worker] = self._io.get(reply.worker, 0.0) + float(reply.io_s)

    @property
    def updates(self) -> np.ndarray:
        """``[U, P]`` float32, row ``u`` = client ``order[u]``'s ``θ_u − θ`` (not streamed)."""
        return self._updates[:len(self.order)]

    @property
    def buffers(self) -> np.ndarray:
        """``[U, S]`` float32: the clients' floating buffers (not streamed)."""
        return self._buffers[:len(self.order)]

    def timings(self) -> dict[str, float]:
        """``client_compute_s`` (all training), ``client_critical_s`` (the busiest worker's
        training time), ``client_io_s`` (the busiest worker's weight copies in and out)."""
        return {"client_compute_s": float(sum(self._compute.values())),
                "client_critical_s": float(max(self._compute.values())),
                "client_io_s": float(max(self._io.values()))}


__all__ = ["FitRound"]
