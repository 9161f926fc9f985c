"""One fit round's replies, taken one client at a time as they arrive: :class:`FitRound`.

The coordinator (:mod:`fedtune.runtime.coordinator`) feeds it the pool's one-client replies in
ascending client id (:meth:`~fedtune.runtime.pools.PoolBase.fit_stream`) and reads back either
streamed float64 sums (docs/methods.md §0.1) or the stacked update rows. NumPy only.
"""

from __future__ import annotations

import math

import numpy as np

from fedtune.algorithms.server.blocked import RowSum, accumulate_row

FOLD_BLOCK_ELEMS = RowSum.BLOCK
"""About this many float32 elements of clients' rows per column block of :meth:`FitRound.add`."""


def fold_width(size: int, rows: int) -> int:
    """Columns per block when ``rows`` clients' rows of ``size`` are summed at once: about
    :data:`FOLD_BLOCK_ELEMS` elements of rows a block, at least 16,384 columns (fewer NumPy calls)
    and at most :attr:`RowSum.BLOCK <fedtune.algorithms.server.blocked.RowSum.BLOCK>` (one client:
    the whole row, as :class:`~fedtune.algorithms.server.blocked.RowSum` takes it).

    >>> fold_width(85_002, 1), fold_width(85_002, 50), fold_width(25_000_000, 2)
    (85002, 41943, 1048576)
    """
    return max(1, min(int(size), RowSum.BLOCK, max(1 << 14, FOLD_BLOCK_ELEMS // max(int(rows), 1))))
from fedtune.runtime.messages import FitReply, FoldReply


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
        self.started = math.inf  # time.perf_counter() when the fit phase was sent (the coordinator's)
        self._compute: dict[int, float] = {}
        self._client_compute: list[float] = []  # per client, in order (a folded round's reply)
        self._rows_before = 0  # clients in the sums before this worker's (a folded round's chain)
        self._participants = list(participants)
        self._io: dict[int, float] = {}
        P, S = len(theta), state_size - len(theta)
        if feeds is None:
            self._updates = updates
            self._buffers = np.empty((len(participants), S), np.float32)
        else:
            self._sums = {name: RowSum(S if source == "buffers" else P) for name, (source, _, _) in feeds.items()}
            self._delta, self._tmp = np.empty(0, np.float32), np.empty(0, np.float64)  # scratch of _sum_rows

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
        """:meth:`_take` into the sums."""
        self._take(reply, None)

    def hold(self, reply: FitReply, held: dict[str, np.ndarray]) -> None:
        """:meth:`_take` without the sums: each sum's term of each client, ``w_u · value`` in
        float64, goes to row ``u`` of ``held[name]`` (a worker's ``[clients, size]`` scratch, ``u``
        counted from this round's first client), to be added by :meth:`add_held` once the sums
        before them are known (a folded round's worker after the first, while its clients train)."""
        self._take(reply, held)

    def add_held(self, held: dict[str, np.ndarray]) -> None:
        """Add the terms :meth:`hold` kept, in order: each sum's ``total += term``, the very
        addition :meth:`add` makes after its multiply."""
        for name, acc in self._sums.items():
            for row in held[name][:len(self.order)]:
                acc.total += row
            acc.rows += len(self.order)

    def _take(self, reply: FitReply, held: dict[str, np.ndarray] | None) -> None:
        """A reply of one client or more (:meth:`~fedtune.runtime.worker.ClientWorker.fit_stream`,
        :meth:`~fedtune.runtime.worker.ClientWorker.fit`), its clients in ascending client id, each
        after every client taken before. Streamed, each sum takes the clients one after another in
        column blocks (:func:`fold_width`: a block's float64 sum and scratch stay in the core's
        cache while the clients' rows stream through); elementwise, so the same bits as one client
        at a time."""
        P, k = len(self.theta), len(reply.client_ids)
        for i, cid in enumerate(reply.client_ids):
            if reply.states[i].shape != (self.state_size,):
                raise RuntimeError(f"client {cid} sent a state of {reply.states[i].shape}, the model has "
                                   f"{self.state_size} weights")
        kept: list[dict[str, np.ndarray]] = []
        if self.feeds is None:
            for i in range(k):
                row = len(self.order) + i
                np.subtract(reply.states[i, :P], self.theta, out=self._updates[row])
                self._buffers[row] = reply.states[i, P:]
                kept.append(reply.extras[i] if reply.extras else {})
        else:
            values: list[dict[str, np.ndarray]] = []
            for i, cid in enumerate(reply.client_ids):
                extra = dict(reply.extras[i]) if reply.extras else {}
                summed = {}
                for name, (source, _, _) in self.feeds.items():
                    if source not in ("update", "buffers"):
                        value = extra.get(source)
                        if value is None or np.shape(value) != (P,):
                            raise ValueError(f"client {cid} sent no '{source}' of {P} values (got "
                                             f"{None if value is None else np.shape(value)})")
                        summed[name] = np.asarray(value, dtype=np.float32)
                for source, _, _ in self.feeds.values():
                    if source not in ("update", "buffers"):
                        extra.pop(source, None)  # a summed extra: not kept
                values.append(summed)
                kept.append(extra)
            self._sum_rows(reply, values, held)
        for i, cid in enumerate(reply.client_ids):
            self.order.append(cid)
            self.num_examples.append(int(reply.num_examples[i]))
            self.losses.append(float(reply.losses[i]))
            self.steps.append(int(reply.steps[i]))
            self.extras.append(kept[i])
            self.metrics.append(reply.metrics[i] if reply.metrics else {})
            self._compute[reply.worker] = self._compute.get(reply.worker, 0.0) + float(reply.compute_s[i])
            self._client_compute.append(float(reply.compute_s[i]))
        self._io[reply.worker] = self._io.get(reply.worker, 0.0) + float(reply.io_s)

    def _sum_rows(self, reply: FitReply, values: list[dict[str, np.ndarray]],
                  held: dict[str, np.ndarray] | None) -> None:
        """Every streamed sum takes ``reply``'s clients in order, block of columns by block: the
        update ``θ_u − θ`` (float32, as the coordinator's), the buffers or a summed extra; with
        ``held`` the terms go to its rows instead (:meth:`hold`)."""
        P, k, first = len(self.theta), len(reply.client_ids), len(self.order)
        for name, (source, weights, _) in self.feeds.items():
            acc = self._sums[name]
            size = len(acc.total)
            width = fold_width(size, k)
            if self._delta.shape[0] < width or self._tmp.shape[0] < width:
                self._delta, self._tmp = np.empty(width, np.float32), np.empty(width, np.float64)
            for s in range(0, size, width):
                e = min(s + width, size)
                total, tmp = acc.total[s:e], self._tmp[:e - s]
                for i, cid in enumerate(reply.client_ids):
                    if source == "update":
                        value = np.subtract(reply.states[i, s:e], self.theta[s:e], out=self._delta[:e - s])
                    elif source == "buffers":
                        value = reply.states[i, P + s:P + e]
                    else:
                        value = values[i][name][s:e]
                    if held is None:
                        accumulate_row(total, value, weights[cid], tmp)
                    else:
                        np.multiply(value, np.float64(weights[cid]), out=held[name][first + i, s:e])
            if held is None:
                acc.rows += k

    # --- a folded round (docs/methods.md §0.1): the sums carried from worker to worker -------------
    def held_shapes(self) -> dict[str, tuple[int, int]]:
        """The shapes of :meth:`hold`'s scratch for this round's clients: ``[clients, size]`` a sum."""
        return {name: (len(self._participants), len(acc.total)) for name, acc in self._sums.items()}

    def continue_from(self, before: FoldReply) -> None:
        """Start every sum from the totals of the workers before this one in the chain (their
        :meth:`fold_reply`): the rows added next continue the very fold the coordinator would make."""
        if set(before.sums) != set(self._sums):
            raise RuntimeError(f"the chain's sums {sorted(before.sums)} are not this round's {sorted(self._sums)}")
        for name, acc in self._sums.items():
            acc.total = np.array(before.sums[name], dtype=np.float64)  # own, writable copy
        self._rows_before = int(before.rows)

    def fold_reply(self, worker: int) -> FoldReply:
        """This worker's part of a folded round: its clients' numbers and the sums carried on
        through them (:class:`~fedtune.runtime.messages.FoldReply`)."""
        return FoldReply(list(self.order), list(self.num_examples), list(self.losses), list(self.steps),
                         list(self._client_compute), float(sum(self._io.values())), list(self.extras),
                         list(self.metrics), worker, {name: acc.total for name, acc in self._sums.items()},
                         self._rows_before + len(self.order))

    def take_fold(self, reply: FoldReply) -> None:
        """One worker's part of a folded round (the chain's workers in order): its clients' numbers;
        the last part's sums are the round's (:meth:`end_fold`)."""
        self.order.extend(reply.client_ids)
        self.num_examples.extend(int(n) for n in reply.num_examples)
        self.losses.extend(float(x) for x in reply.losses)
        self.steps.extend(int(x) for x in reply.steps)
        self.extras.extend(reply.extras)
        self.metrics.extend(reply.metrics)
        self._compute[reply.worker] = self._compute.get(reply.worker, 0.0) + float(sum(reply.compute_s))
        self._io[reply.worker] = self._io.get(reply.worker, 0.0) + float(reply.io_s)

    def end_fold(self, last: FoldReply) -> None:
        """The round's sums: the chain's last totals, which hold every client taken (:meth:`take_fold`)."""
        if last.rows != len(self.order) or set(last.sums) != set(self._sums):
            raise RuntimeError(f"the chain's sums hold {last.rows} clients of {sorted(last.sums)}, the round took "
                               f"{len(self.order)} of {sorted(self._sums)}")
        for name, acc in self._sums.items():
            acc.total = last.sums[name]

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
