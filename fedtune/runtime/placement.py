"""Which client actor trains which client in a round: fixed owners, or *roaming* clients dealt out
afresh each round so the actors finish together.

Every client is *owned* by one worker, in runs of consecutive ids (:func:`~fedtune.runtime.pools.assign_clients`):
the owner evaluates it and keeps its per-client state. With ``client_placement: fixed`` the owner
also trains it, so a round's work per actor is whatever the sampling gives each owner: at
participation 0.2 of 100 clients over 2 actors one actor often trains 12 clients while the other
trains 8 and waits. With *roaming* placement every actor holds every client's data and each round
:func:`deal_clients` gives the round's participants to the actors by their cost (longest first,
to the least loaded actor: LPT scheduling), so the busiest actor carries at most one client more
than its share. Which actor trains a client never changes a number: a client's round depends on
(seed, client, round), the weights and the payload only, and the coordinator takes the replies in
ascending client id whoever sent them.

Roaming needs clients that keep nothing between rounds on their actor (a client method declaring
``keeps_client_state``, e.g. SCAFFOLD's control variate, stays with its owner), and memory for
every client's data on every actor. ``client_placement: auto`` (the default) roams when the run
has at least two client actors, samples clients (participation below 1, or a participation
schedule), its client method keeps no per-client state, and all clients' examples together come
to at most :data:`ROAMING_MAX_MIB` as float32; ``roaming`` roams wherever the method allows it
(refused in one line for a method that keeps client state); ``fixed`` never roams.

Written here rather than taken from Ray: Ray schedules tasks, not which of a run's pinned actors
(each holding a loaded model and data) takes which client.
"""

from __future__ import annotations

import heapq
import math
from typing import Any

from fedtune.algorithms.client.steps import effective_batch_size, local_steps
from fedtune.config import PLACEMENTS, FederatedRunConfig
from fedtune.data.base import FederatedPlan, pieces_size
from fedtune.errors import ConfigError

ROAMING_MAX_MIB = 256.0
"""``client_placement: auto`` roams only when all clients' examples (training, validation and test
splits), as float32 at the dataset's input shape, come to at most this many MiB: each actor then
holds them all."""


def client_cost(num_train: int, cfg: FederatedRunConfig) -> int:
    """A client's training work in a round, in examples through the model: its local steps times
    the examples of a step (:func:`~fedtune.algorithms.client.steps.local_steps`,
    :func:`~fedtune.algorithms.client.steps.effective_batch_size`)."""
    if num_train <= 0:
        return 0
    return local_steps(num_train, cfg) * effective_batch_size(num_train, cfg.batch_size)


def deal_clients(client_ids: list[int], costs: dict[int, int] | list[int], num_workers: int) -> dict[int, list[int]]:
    """The round's clients dealt to ``num_workers`` actors: by cost, largest first (ties: lower
    client id first), each to the actor with the least work so far (ties: lower index). Returns
    ``{worker: ascending client ids}`` for the actors that got any.

    >>> deal_clients([0, 1, 2, 3, 4], [5, 1, 4, 3, 3], 2)
    {0: [0, 4], 1: [1, 2, 3]}
    """
    if num_workers < 1:
        raise ValueError(f"num_workers must be at least 1, got {num_workers}")
    order = sorted(set(int(c) for c in client_ids), key=lambda c: (-costs[c], c))
    loads = [(0, w) for w in range(num_workers)]
    heapq.heapify(loads)
    dealt: dict[int, list[int]] = {}
    for c in order:
        load, w = heapq.heappop(loads)
        dealt.setdefault(w, []).append(c)
        heapq.heappush(loads, (load + max(0, int(costs[c])), w))
    return {w: sorted(dealt[w]) for w in sorted(dealt)}


def deal_contiguous(client_ids: list[int], costs: dict[int, int] | list[int], num_workers: int) -> dict[int, list[int]]:
    """The round's clients cut into at most ``num_workers`` runs of consecutive ids (ascending), run
    ``w`` to actor ``w``, each cut where the work so far comes nearest the even share of what is
    left: a folded round (:meth:`~fedtune.runtime.pools.RayPool.fold_start`) carries its sums from
    one run to the next, so each actor's clients must follow the previous actor's. The busiest
    actor carries at most about one client more than its share. Returns ``{worker: ascending
    client ids}`` for the actors that got any.

    >>> deal_contiguous([0, 1, 2, 3, 4], [5, 1, 4, 3, 3], 2)
    {0: [0, 1, 2], 1: [3, 4]}
    >>> deal_contiguous([3, 9], [1] * 10, 4)
    {0: [3], 1: [9]}
    """
    if num_workers < 1:
        raise ValueError(f"num_workers must be at least 1, got {num_workers}")
    ids = sorted(set(int(c) for c in client_ids))
    cost = [max(0, int(costs[c])) for c in ids]
    dealt: dict[int, list[int]] = {}
    start, left = 0, float(sum(cost))
    for w in range(num_workers):
        if start >= len(ids):
            break
        if w == num_workers - 1:
            dealt[w] = ids[start:]
            break
        share, done, stop = left / (num_workers - w), 0.0, start
        # take clients while taking the next one brings the work nearer the share (at least one)
        while stop < len(ids) and (stop == start or abs(done + cost[stop] - share) <= abs(done - share)):
            done += cost[stop]
            stop += 1
        dealt[w], start, left = ids[start:stop], stop, left - done
    return dealt


def keeps_client_state(cfg: FederatedRunConfig) -> bool:
    """Whether the run's client method keeps per-client state between rounds (its declaration)."""
    spec = cfg.resolved.client_spec
    keeps = spec.keeps_client_state
    return bool(keeps(cfg) if callable(keeps) else keeps)


def examples_mib(plan: FederatedPlan, input_shape: tuple[int, ...]) -> float:
    """All clients' examples (training, validation and test) as float32 at ``input_shape``, in MiB."""
    count = sum(pieces_size(s.train) + pieces_size(s.val) + pieces_size(s.test) for s in plan.clients)
    return count * math.prod(input_shape) * 4 / 2**20


def roams(cfg: FederatedRunConfig, plan: FederatedPlan, num_workers: int, input_shape: tuple[int, ...] | None) -> bool:
    """Whether the run's clients roam (module docstring): ``client_placement`` and, for ``auto``,
    the actors, the sampling, the client method's state and the examples' size. ``input_shape``
    None: unknown, so ``auto`` does not roam."""
    if cfg.client_placement == "roaming":
        return num_workers >= 2 and not keeps_client_state(cfg)
    return (needs_input_shape(cfg, num_workers) and input_shape is not None
            and examples_mib(plan, input_shape) <= ROAMING_MAX_MIB)


def samples_clients(cfg: FederatedRunConfig) -> bool:
    """Whether a round may leave clients out: participation below 1, or a participation schedule."""
    return cfg.participation < 1.0 or getattr(cfg, "fidelity_participation", None) is not None


def needs_input_shape(cfg: FederatedRunConfig, num_workers: int) -> bool:
    """Whether ``auto`` may roam but for the data's size, so :func:`roams` reads the input shape
    (the dataset is opened for it only then): two actors or more, sampled clients, no client state."""
    return (cfg.client_placement == "auto" and num_workers > 1 and samples_clients(cfg)
            and not keeps_client_state(cfg))


def check_placement(cfg: FederatedRunConfig) -> None:
    """``client_placement: roaming`` with a client method that keeps per-client state: one ConfigError line."""
    if cfg.client_placement == "roaming" and keeps_client_state(cfg):
        name = cfg.resolved.client_method_name
        raise ConfigError(f"field 'client_placement': roaming moves clients between actors, but client method "
                          f"{name} keeps per-client state on its actor between rounds; allowed here: auto, fixed")


__all__ = ["PLACEMENTS", "ROAMING_MAX_MIB", "check_placement", "client_cost", "deal_clients", "deal_contiguous", "examples_mib",
           "keeps_client_state", "needs_input_shape", "roams", "samples_clients"]
