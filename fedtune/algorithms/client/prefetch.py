"""The local loop's input off its critical path: an epoch's batches staged ahead in a background thread.

The round's rows are drawn epoch by epoch (:func:`epochs`: one permutation of the client's
examples an epoch, drawn from ``ctx.generator`` at the moment the loop has always drawn it, so
the same rows in the same order and the same random numbers as before). Within an epoch every
batch's rows are known when its permutation is drawn, so :class:`Prefetch` reads the next
batches from the host and copies them to the device (``data.stage(rows)``: the cache map gather,
the pinned staging and the copy on a side stream on CUDA; no random number) in a thread of its
own while the loop trains on the current one. The loop's thread then finishes each batch in
order (``data.finish``: the float conversion, the augmentation drawing from ``ctx.generator``,
the normalisation, on the device), exactly as :meth:`ClientContext.batch` did it in one call: the
same bits. The first batch of each epoch is staged while the loop waits (its rows depend on the
random numbers the previous epoch's steps drew).

Memory is bounded: at most :data:`PREFETCH_DEPTH` staged batches wait in the queue, one more is
being staged and one is being trained on. The thread never outlives its epoch: leaving the
``with`` block, at the epoch's end, at an early end of the round (a non-finite loss) or on an
exception, stops and joins it. An error while staging (a damaged cache image) is raised in the
loop's thread when the loop reaches that batch, as the synchronous fetch raised it.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Iterator

import torch

PREFETCH_DEPTH = 2
"""Staged batches a client's prefetch thread keeps ready ahead of the loop (0: fetch each batch
when the loop reaches it, in the loop's thread)."""

_POLL_S = 0.05  # how often a thread waiting on a full queue looks whether it was stopped


def epochs(n: int, batch_size: int, steps: int, generator: torch.Generator) -> Iterator[list[torch.Tensor]]:
    """The round's ``steps`` index batches, an epoch at a time: each epoch's permutation of
    ``range(n)`` is drawn when the epoch is asked for, split as
    :func:`~fedtune.algorithms.client.method.batches` splits it (a trailing batch of one example
    joins the one before). The same draws at the same moments as iterating ``batches``."""
    done = 0
    while done < steps and n > 0:  # no examples: no batch (never an endless loop)
        perm = torch.randperm(n, generator=generator)
        starts = list(range(0, n, batch_size))
        if batch_size > 1 and len(starts) > 1 and n - starts[-1] == 1:
            starts.pop()  # the single trailing example joins the previous batch
        ends = starts[1:] + [n]
        take = min(len(starts), steps - done)
        yield [perm[starts[i]:ends[i]] for i in range(take)]
        done += take


class Prefetch:
    """``data.stage(rows, augmented)`` of each of ``batches`` in a background thread, at most
    ``depth`` ahead; iterate for ``(rows, staged)`` in order. ``depth`` 0: each batch is staged in
    the caller's thread when it is reached (``data`` None: ``(rows, None)``, the caller fetches).
    Use as a context manager (the thread is stopped and joined on leaving it)."""

    def __init__(self, data: Any, batches: list[torch.Tensor], depth: int = PREFETCH_DEPTH,
                 augmented: bool = False):
        self.data, self.batches, self.augmented = data, batches, augmented
        self.thread: threading.Thread | None = None
        self.stopped = threading.Event()
        if depth > 0 and len(batches) > 1:
            self.queue: queue.Queue = queue.Queue(maxsize=depth)
            self.thread = threading.Thread(target=self._stage_all, name="fedtune-prefetch", daemon=True)
            self.thread.start()

    def _stage_all(self) -> None:
        for rows in self.batches:
            if self.stopped.is_set():
                return
            try:
                item = (self.data.stage(rows, self.augmented), None)
            except BaseException as exc:  # raised in the loop's thread when it reaches this batch
                item = (None, exc)
            while not self.stopped.is_set():
                try:
                    self.queue.put(item, timeout=_POLL_S)
                    break
                except queue.Full:
                    continue
            if item[1] is not None:
                return

    def __iter__(self) -> Iterator[tuple[torch.Tensor, Any]]:
        for rows in self.batches:
            if self.thread is None:
                yield rows, None if self.data is None else self.data.stage(rows, self.augmented)
                continue
            staged, exc = self.queue.get()
            if exc is not None:
                raise exc
            yield rows, staged

    def close(self) -> None:
        """Stop the thread (it finishes the batch it is staging, if any) and wait for it."""
        self.stopped.set()
        if self.thread is not None:
            self.thread.join()
            self.thread = None

    def __enter__(self) -> "Prefetch":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
