"""The federated runtime: client workers/actors, the coordinator and its pools, and the run driver."""

from fedtune.runtime.coordinator import Coordinator
from fedtune.runtime.cluster import connect_ray
from fedtune.runtime.driver import FederatedRun, RunResult, build_plan, run
from fedtune.runtime.pools import ClientFailure, assign_clients
from fedtune.runtime.resources import ResourceError, ResourcePlan, plan_resources

__all__ = ["ClientFailure", "Coordinator", "FederatedRun", "ResourceError", "ResourcePlan", "RunResult",
           "assign_clients", "build_plan", "connect_ray", "plan_resources", "run"]
