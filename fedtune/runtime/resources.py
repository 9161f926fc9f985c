"""How many client actors a run gets, the placement-group bundles, and the fail-fast check.

Pure functions on the cluster's per-node resources, so the arithmetic is tested without Ray.
A request the cluster can never satisfy raises :class:`ResourceError` *before* anything is
launched, naming what was asked and what exists; a request that only has to wait for busy
resources waits at most ``placement_timeout_s`` and then raises, never hangs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fedtune.errors import ResourceError

if TYPE_CHECKING:
    from fedtune.config import FederatedRunConfig

EPS = 1e-9


@dataclass(frozen=True)
class ResourcePlan:
    num_workers: int  # client actors
    bundles: list[dict[str, float]]  # placement-group bundles, in order
    coordinator_bundle: int  # bundle index hosting the coordinator actor
    worker_bundles: list[int]  # bundle index of each client actor
    client_cpus: float
    client_gpus: float
    coordinator_cpus: float
    coordinator_gpus: float

    @property
    def total(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for b in self.bundles:
            for k, v in b.items():
                out[k] = out.get(k, 0.0) + v
        return out


def _bundle(cpus: float, gpus: float) -> dict[str, float]:
    b = {"CPU": float(cpus)} if cpus > 0 else {}
    if gpus > 0:
        b["GPU"] = float(gpus)
    return b


def _slots(node: dict[str, float], cpus: float, gpus: float) -> int:
    """How many bundles of (cpus, gpus) one node holds (fractional GPUs pack per device)."""
    n = math.inf
    if cpus > 0:
        n = math.floor(node.get("CPU", 0.0) / cpus + EPS)
    if gpus > 0:
        total = node.get("GPU", 0.0)
        devices = math.floor(total + EPS)
        if gpus <= 1:
            # whole free devices, plus what a fractional neighbour (the coordinator) left of one device
            left = max(total - devices, 0.0)
            n = min(n, devices * math.floor(1.0 / gpus + EPS) + math.floor(left / gpus + EPS))
        else:
            n = min(n, math.floor(devices / gpus + EPS))
    return int(n) if n != math.inf else 10**9


def _fmt(res: dict[str, float]) -> str:
    return ", ".join(f"{v:g} {k}" for k, v in sorted(res.items()) if k in ("CPU", "GPU")) or "nothing"


def plan_resources(*, num_clients: int, nodes: list[dict[str, float]], client_cpus: float, client_gpus: float,
                   coordinator_cpus: float, coordinator_gpus: float,
                   max_client_actors: int | None) -> ResourcePlan:
    """Choose the client-actor count and bundles for ``nodes`` (each node's *total* resources).

    ``max_client_actors=None`` takes as many actors as the cluster holds, at most one per client.

    >>> p = plan_resources(num_clients=5, nodes=[{"CPU": 2.0}], client_cpus=1, client_gpus=0,
    ...                    coordinator_cpus=0, coordinator_gpus=0, max_client_actors=None)
    >>> p.num_workers, p.bundles
    (2, [{'CPU': 1.0}, {'CPU': 1.0}])
    """
    coord = _bundle(coordinator_cpus, coordinator_gpus)
    totals = {"CPU": sum(n.get("CPU", 0.0) for n in nodes), "GPU": sum(n.get("GPU", 0.0) for n in nodes)}
    # Room for client actors once the coordinator's bundle is placed on the best node for it.
    best = -1
    for i, node in enumerate(nodes):
        if coord and any(node.get(k, 0.0) + EPS < v for k, v in coord.items()):
            continue
        rest = [dict(n) for n in nodes]
        for k, v in coord.items():
            rest[i][k] = rest[i].get(k, 0.0) - v
        best = max(best, sum(_slots(n, client_cpus, client_gpus) for n in rest))
        if not coord:
            break
    asked_client = _bundle(client_cpus, client_gpus)
    where = f"the cluster has {_fmt(totals)} over {len(nodes)} node(s)"
    if best < 0:
        raise ResourceError(f"the coordinator asks for {_fmt(coord)} (coordinator_cpus={coordinator_cpus:g}, "
                            f"coordinator_gpus={coordinator_gpus:g}) but no node has that; {where}")
    if best == 0:
        raise ResourceError(f"one client actor asks for {_fmt(asked_client)} (client_cpus={client_cpus:g}, "
                            f"client_gpus={client_gpus:g}) but no node has room for it"
                            f"{' beside the coordinator' if coord else ''}; {where}")
    wanted = num_clients if max_client_actors is None else min(max_client_actors, num_clients)
    if max_client_actors is not None and wanted > best:
        need = {k: wanted * v + coord.get(k, 0.0) for k, v in asked_client.items()}
        for k, v in coord.items():
            need.setdefault(k, v)
        raise ResourceError(
            f"max_client_actors={wanted} client actors x {_fmt(asked_client)} "
            f"{f'(+ coordinator {_fmt(coord)}) ' if coord else ''}= {_fmt(need)}, but {where}, "
            f"room for {best} client actor(s); "
            f"lower max_client_actors, client_cpus or client_gpus, or add nodes")
    workers = min(wanted, best)
    bundles = ([coord] if coord else []) + [asked_client] * workers
    offset = 1 if coord else 0
    return ResourcePlan(workers, bundles, 0, list(range(offset, offset + workers)),
                        client_cpus, client_gpus, coordinator_cpus, coordinator_gpus)


def resource_plan_of(cfg: FederatedRunConfig, num_clients: int, nodes: list[dict[str, float]]) -> ResourcePlan:
    """:func:`plan_resources` for a run of ``cfg`` with ``num_clients`` logical clients on
    ``nodes``: the config's ``client_cpus``, ``client_gpus``, ``coordinator_cpus``,
    ``coordinator_gpus`` and ``max_client_actors``.

    >>> from fedtune.config import FederatedRunConfig
    >>> resource_plan_of(FederatedRunConfig.from_dict({"client_cpus": 0.5}), 3, [{"CPU": 2.0}]).bundles
    [{'CPU': 0.5}, {'CPU': 0.5}, {'CPU': 0.5}]
    """
    return plan_resources(num_clients=num_clients, nodes=nodes, client_cpus=cfg.client_cpus,
                          client_gpus=cfg.client_gpus, coordinator_cpus=cfg.coordinator_cpus,
                          coordinator_gpus=cfg.coordinator_gpus, max_client_actors=cfg.max_client_actors)
