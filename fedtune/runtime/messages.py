"""What crosses the wire between the coordinator and the client workers.

The replies of a worker's ``fit`` (:class:`FitReply`) and ``evaluate`` (:class:`EvalReply`,
with :class:`FeatureSet` for unsupervised encoders), and the fixed slices of the held-out target
data every worker evaluates (:class:`TargetShard`, cut by :func:`eval_shards`). NumPy only: the
coordinator side (:mod:`fedtune.runtime.coordinator`, :mod:`~fedtune.runtime.pools`,
:mod:`~fedtune.runtime.evaluation`) reads these without importing torch.

>>> [(s.shard_id, s.domain, len(s.indices)) for s in target_shards({"B": np.arange(3), "A": np.arange(5)}, 2)]
[(0, 'A', 2), (1, 'A', 2), (2, 'A', 1), (3, 'B', 2), (4, 'B', 1)]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedtune.runtime.common import EvalCounts


@dataclass
class FitReply:
    """A worker's trained clients of one round (``ClientWorker.fit``), one entry per client."""

    client_ids: list[int]
    states: np.ndarray  # float32 [k, M]: trained flat states, row i = client_ids[i]
    num_examples: list[int]
    losses: list[float]
    steps: list[int]
    compute_s: list[float]  # per client: the whole local round, weights in and out included
    io_s: float = 0.0  # of which: copying weights into the model and the trained state out
    extras: list[dict[str, np.ndarray]] = field(default_factory=list)
    metrics: list[dict[str, float]] = field(default_factory=list)
    worker: int = 0  # the worker that trained these clients (the round's busiest-worker timings)

    def split(self) -> list["FitReply"]:
        """One reply per client, ascending client id (views of ``states``; ``io_s`` spread evenly):
        what :meth:`ClientWorker.fit_stream <fedtune.runtime.worker.ClientWorker.fit_stream>` sends."""
        k = len(self.client_ids)
        order = sorted(range(k), key=lambda i: self.client_ids[i])
        return [FitReply([self.client_ids[i]], self.states[i:i + 1], [self.num_examples[i]], [self.losses[i]],
                         [self.steps[i]], [self.compute_s[i]], self.io_s / max(k, 1),
                         [self.extras[i]] if self.extras else [{}], [self.metrics[i]] if self.metrics else [{}],
                         self.worker) for i in order]


@dataclass
class FoldReply:
    """A worker's part of a *folded* fit round (``ClientWorker.fit_fold``): its clients' numbers,
    one entry per client in ascending client id (as :class:`FitReply`, without the states), the
    extras the round's sums did not take, and the round's float64 sums carried on through its
    clients (``sums``: name → running total, ``rows``: how many clients are in them, this worker's
    and every worker's before it in the chain)."""

    client_ids: list[int]
    num_examples: list[int]
    losses: list[float]
    steps: list[int]
    compute_s: list[float]
    io_s: float
    extras: list[dict[str, np.ndarray]]
    metrics: list[dict[str, float]]
    worker: int
    sums: dict[str, np.ndarray]
    rows: int


@dataclass
class EvalReply:
    """A worker's evaluation of the global model (``ClientWorker.evaluate``): counts per client
    and per target shard, or (unsupervised methods) encoder features."""

    client_ids: list[int]
    val: list[EvalCounts]
    test: list[EvalCounts]
    shard_ids: list[int] = field(default_factory=list)  # target-test shards evaluated here
    shards: list[EvalCounts] = field(default_factory=list)
    # Unsupervised methods (ufdg): encoder features instead of counts (val/test/shards stay empty).
    val_features: list[FeatureSet] = field(default_factory=list)  # per client_ids entry: its val split
    shard_features: list[FeatureSet] = field(default_factory=list)  # per shard_ids entry (test and probe)


@dataclass
class FeatureSet:
    """Encoder features of a set of examples and their labels (for the coordinator's linear probe)."""

    x: np.ndarray  # float32 [n, d]
    y: np.ndarray  # int64 [n]


@dataclass(frozen=True)
class TargetShard:
    """A fixed slice of the held-out target test set (no client owns it). Shards are cut
    independently of the actor count, and their results are summed in shard order, so metrics
    do not depend on how many actors evaluated them."""

    shard_id: int
    domain: str
    indices: np.ndarray
    split: str = "test"  # "test": target-test data; "probe": ufdg's labelled target-probe split;
    # "oracle": the oracle slice of the target domain (oracle_acc, never part of target_acc);
    # a split file's (fedtune.data.split_file) "ood_val", "id_val" and "id_test" splits


SHARD_SIZE = 512
SPLIT_FILE_SHARDS = ("ood_val", "id_val", "id_test")
"""The coordinator-scored splits of a split file (plan fields and shard ``split`` names)."""


def target_shards(target_test: dict[str, np.ndarray], shard_size: int = SHARD_SIZE) -> list[TargetShard]:
    shards = []
    for domain in sorted(target_test):
        idx = np.asarray(target_test[domain], dtype=np.int64)
        for start in range(0, len(idx), shard_size):
            shards.append(TargetShard(len(shards), domain, idx[start:start + shard_size]))
    return shards


def eval_shards(plan: Any, shard_size: int = SHARD_SIZE) -> list[TargetShard]:
    """Every shard the workers evaluate: the target-test shards (ids ``0..k-1``, exactly
    :func:`target_shards` of ``plan.target_test``) followed by ``plan.target_probe`` (ufdg's
    labelled probe split, empty elsewhere) cut the same way, with ``split="probe"``, then
    ``plan.target_oracle`` (the oracle slice, empty in fl) with ``split="oracle"``, then a split
    file's ``plan.ood_val``, ``plan.id_val`` and ``plan.id_test`` (empty without one) with their
    names. Every kind is spread over the workers like test shards; the coordinator reassembles them
    in shard order."""
    shards = target_shards(plan.target_test, shard_size)
    for split, pieces in (("probe", getattr(plan, "target_probe", None)),
                          ("oracle", getattr(plan, "target_oracle", None)),
                          *((name, getattr(plan, name, None)) for name in SPLIT_FILE_SHARDS)):
        for sh in target_shards(pieces or {}, shard_size):
            shards.append(TargetShard(len(shards), sh.domain, sh.indices, split))
    return shards
