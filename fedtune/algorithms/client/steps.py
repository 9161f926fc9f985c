"""How many steps a client takes in a round, and on what batch size: plain arithmetic, no torch.

The trainable and the ``fedtune run`` driver warn about a ``batch_size`` above every client's data
(:func:`batch_size_note`) before any client actor exists; keeping these counts out of
:mod:`fedtune.algorithms.client.method` (PyTorch) keeps torch out of those processes. The local loop
(:meth:`fedtune.algorithms.client.method.ClientMethod.local_loop`) draws its batches with them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from fedtune.algorithms.base import RunConfig

__all__ = ["batch_size_note", "batches_per_epoch", "effective_batch_size", "local_steps"]


def local_steps(num_examples: int, cfg: RunConfig) -> int:
    """Steps of one round: ``local_steps`` if set, else ``local_epochs`` passes over the data
    (:func:`batches_per_epoch` steps each). With ``batch_size`` at or above the client's data a
    step is the whole training set: ``local_steps`` full-batch steps, or one per local epoch."""
    if cfg.local_steps is not None:
        return int(cfg.local_steps)
    return int(cfg.local_epochs) * batches_per_epoch(num_examples, cfg.batch_size)


def effective_batch_size(num_examples: int, batch_size: int) -> int:
    """The mini-batch a client's steps use: ``batch_size``, or the client's whole training set
    when that is smaller (an epoch's last batch may hold fewer, or one more so that no batch is a
    single example; see :func:`batches`). Recorded per round as ``diag.batch_size_effective``.

    >>> effective_batch_size(240, 32), effective_batch_size(240, 100000)
    (32, 240)
    """
    return min(int(batch_size), int(num_examples))


def batch_size_note(batch_size: int, train_sizes: Sequence[int], local_steps: int | None,
                    local_epochs: int) -> str | None:
    """The one-line warning of a run whose ``batch_size`` exceeds every client's training set
    (``train_sizes``): no client ever trains on a mini-batch, so any larger value runs the same
    thing. None when some client has at least ``batch_size`` examples.

    >>> batch_size_note(100000, [120, 240], None, 1)
    "batch_size 100000 exceeds the largest client's 240 training examples; each client runs full-batch steps of its own size (1 step per round: one per local epoch), recorded as diag.batch_size_effective"
    >>> batch_size_note(64, [120, 240], None, 1) is None
    True
    """
    largest = max(train_sizes, default=0)
    if not train_sizes or batch_size <= largest:
        return None
    steps = (f"local_steps={local_steps} steps per round" if local_steps is not None else
             f"{local_epochs} step{'s' if local_epochs != 1 else ''} per round: one per local epoch")
    return (f"batch_size {batch_size} exceeds the largest client's {largest} training examples; each client runs "
            f"full-batch steps of its own size ({steps}), recorded as diag.batch_size_effective")


def batches_per_epoch(n: int, batch_size: int) -> int:
    """Batches :func:`batches` cuts from one pass over ``n`` examples: ``ceil(n / batch_size)``,
    one fewer when that would leave a last batch of a single example (it joins the batch before).

    >>> batches_per_epoch(18, 17), batches_per_epoch(34, 17), batches_per_epoch(35, 17), batches_per_epoch(1, 17)
    (1, 2, 2, 1)
    """
    full = max(1, math.ceil(n / batch_size))
    return full - 1 if batch_size > 1 and full > 1 and n % batch_size == 1 else full
