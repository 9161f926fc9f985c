"""A run's client actors, each created in its placement-group bundle (at start, and again when one
dies): :class:`ActorFactory`, which also decides who owns which client
(:func:`~fedtune.runtime.pools.assign_clients`) and whether the clients roam
(:mod:`fedtune.runtime.placement`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fedtune.data.base import FederatedPlan
from fedtune.data.registry import get_dataset
from fedtune.runtime.messages import eval_shards
from fedtune.runtime.pools import assign_clients, assign_shards, warn_if_batch_exceeds_clients
from fedtune.runtime.worker import client_actor_class

if TYPE_CHECKING:
    from fedtune.config import FederatedRunConfig


def _input_shape(cfg: FederatedRunConfig) -> tuple[int, ...] | None:
    """The dataset's input shape from its labels-only handle (no pixels decoded); None if it cannot be read."""
    try:
        return tuple(get_dataset(cfg.dataset, root=cfg.data_root, image_size=cfg.image_size,
                                 data_seed=cfg.data_seed).info.input_shape)
    except Exception:  # the run's own start reports a dataset that cannot be read
        return None


class ActorFactory:
    """Creates client actor ``w`` in its placement-group bundle (at start, and again on failure)."""

    def __init__(self, cfg_dict, assignment, plan, pg, bundle_of_worker, cpus, gpus,
                 costs: list[int] | None = None):
        self.cfg_dict, self.assignment, self.plan = cfg_dict, assignment, plan
        self.shards = assign_shards(eval_shards(plan), len(assignment))
        self.pg, self.bundle_of_worker, self.cpus, self.gpus = pg, bundle_of_worker, cpus, gpus
        # roaming clients (fedtune.runtime.placement): every actor holds every client's data, and
        # each round's participants are dealt out by ``costs`` (by client id; None: owners train)
        self.costs = costs
        self.roaming = costs is not None

    @classmethod
    def of(cls, cfg_dict: dict[str, Any], plan: FederatedPlan, pg: Any, resources: Any) -> ActorFactory:
        """The factory of a run's client actors laid out as ``resources`` (a
        :class:`~fedtune.runtime.resources.ResourcePlan`) says, clients owned by :func:`assign_clients`,
        roaming or not as :func:`~fedtune.runtime.placement.roams` decides."""
        # lazy: keeps yaml out of this module's import
        from fedtune.config import FederatedRunConfig
        from fedtune.runtime.placement import client_cost, needs_input_shape, roams

        warn_if_batch_exceeds_clients(cfg_dict, plan)
        assignment = assign_clients(plan.num_clients, resources.num_workers)
        cfg = FederatedRunConfig.from_validated(cfg_dict)
        shape = _input_shape(cfg) if needs_input_shape(cfg, resources.num_workers) else None
        costs = ([client_cost(spec.num_train, cfg) for spec in plan.clients]
                 if roams(cfg, plan, resources.num_workers, shape) else None)
        return cls(cfg_dict, assignment, plan, pg, resources.worker_bundles, resources.client_cpus,
                   resources.client_gpus, costs=costs)

    def held(self, w: int) -> list[int]:
        """The clients whose data worker ``w`` holds: all of them when clients roam, else those it owns."""
        return list(range(self.plan.num_clients)) if self.roaming else list(self.assignment[w])

    def pool_spec(self, actors: list) -> dict[str, Any]:
        """The coordinator's ``pool_spec`` for a :class:`RayPool` of ``actors`` made by this factory."""
        return {"kind": "ray", "actors": actors, "factory": self, "assignment": self.assignment}

    def __call__(self, w: int):
        # lazy: keeps ray out of this module's import
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        specs = [self.plan.clients[c] for c in self.held(w)]
        strategy = PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=self.bundle_of_worker[w],
                                                    placement_group_capture_child_tasks=True)
        return client_actor_class().options(
            num_cpus=self.cpus, num_gpus=self.gpus, scheduling_strategy=strategy,
            name=None, max_concurrency=1,
        ).remote(self.cfg_dict, specs, w, self.shards[w], source_bank=self.plan.source_train_pieces(),
                  owned=self.assignment[w])
