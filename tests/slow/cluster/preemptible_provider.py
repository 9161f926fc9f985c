"""Ray's fake multi-node provider, plus what a cloud does to a preempted spot instance.

``test_autoscaling.py``'s preemption test kills every process of a worker node. On a cloud the
instance would then vanish from the provider's API and the autoscaler would launch a replacement
for the work still pending. Ray's ``FakeMultiNodeProvider`` has no notion of an instance
vanishing: it keeps listing the killed node, whose status stays ``uninitialized`` to the
autoscaler (node updaters are off), so the autoscaler waits for it forever and never replaces it.
:class:`PreemptibleFakeProvider` changes only that: a node whose raylet process has exited is no
longer listed (its remaining processes are killed), as a cloud stops listing a preempted instance.
The autoscaler, the scheduling and everything fedtune does are Ray's and fedtune's own.

Used through ``provider: {type: external, module: preemptible_provider.PreemptibleFakeProvider}``
with this directory on the head's ``PYTHONPATH`` (the autoscaler imports it).
"""

from __future__ import annotations

from ray._private import ray_constants
from ray.autoscaler._private.fake_multi_node.node_provider import FakeMultiNodeProvider


def _raylet_exited(entry: dict) -> bool:
    node = entry.get("node")
    if node is None:  # the head: not ours to judge
        return False
    procs = node.all_processes.get(ray_constants.PROCESS_TYPE_RAYLET) or []
    return bool(procs) and all(p.process.poll() is not None for p in procs)


class PreemptibleFakeProvider(FakeMultiNodeProvider):
    def non_terminated_nodes(self, tag_filters):
        with self.lock:
            for node_id in [n for n, entry in self._nodes.items() if _raylet_exited(entry)]:
                self._terminate_node(self._nodes.pop(node_id))  # the instance is gone
        return super().non_terminated_nodes(tag_filters)
