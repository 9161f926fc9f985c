"""Resource planning (fedtune/runtime/resources.py): pure arithmetic, no Ray."""

from __future__ import annotations

import pytest

from fedtune.errors import ResourceError
from fedtune.runtime.resources import plan_resources


def plan(nodes, *, num_clients=10, client_cpus=1.0, client_gpus=0.0, coordinator_cpus=0.0, coordinator_gpus=0.0,
         max_client_actors=None):
    return plan_resources(num_clients=num_clients, nodes=nodes, client_cpus=client_cpus, client_gpus=client_gpus,
                          coordinator_cpus=coordinator_cpus, coordinator_gpus=coordinator_gpus,
                          max_client_actors=max_client_actors)


def test_two_cpu_node_one_cpu_per_client():
    p = plan([{"CPU": 2.0}], num_clients=5)
    assert p.num_workers == 2
    assert p.bundles == [{"CPU": 1.0}, {"CPU": 1.0}]
    assert p.coordinator_bundle == 0  # shares the first client bundle
    assert p.worker_bundles == [0, 1]
    assert p.total == {"CPU": 2.0}


def test_fewer_clients_than_capacity():
    p = plan([{"CPU": 16.0}], num_clients=3)
    assert p.num_workers == 3 and len(p.bundles) == 3 and p.worker_bundles == [0, 1, 2]


def test_fractional_cpus():
    p = plan([{"CPU": 2.0}], num_clients=10, client_cpus=0.5)
    assert p.num_workers == 4 and p.bundles == [{"CPU": 0.5}] * 4
    p = plan([{"CPU": 2.0}], num_clients=10, client_cpus=0.3)  # floor(2 / 0.3) = 6
    assert p.num_workers == 6


def test_quarter_gpus_pack_four_per_gpu():
    p = plan([{"CPU": 8.0, "GPU": 1.0}], num_clients=4, client_cpus=1.0, client_gpus=0.25)
    assert p.num_workers == 4
    assert p.bundles == [{"CPU": 1.0, "GPU": 0.25}] * 4
    assert p.total == {"CPU": 4.0, "GPU": 1.0}


def test_gpu_fraction_limits_before_cpus():
    # 0.3 GPU: only 3 fit on one device (0.9), the 0.1 left over is no 4th slot
    p = plan([{"CPU": 16.0, "GPU": 1.0}], num_clients=10, client_gpus=0.3)
    assert p.num_workers == 3
    # two devices: 6
    assert plan([{"CPU": 16.0, "GPU": 2.0}], num_clients=10, client_gpus=0.3).num_workers == 6


def test_cpus_limit_before_gpus():
    p = plan([{"CPU": 2.0, "GPU": 1.0}], num_clients=4, client_gpus=0.25)
    assert p.num_workers == 2


def test_whole_gpus_per_client():
    assert plan([{"CPU": 16.0, "GPU": 4.0}], num_clients=10, client_gpus=2).num_workers == 2
    assert plan([{"CPU": 16.0, "GPU": 4.0}], num_clients=10, client_gpus=1).num_workers == 4


def test_max_client_actors_too_many_for_the_gpu():
    with pytest.raises(ResourceError) as exc:
        plan([{"CPU": 8.0, "GPU": 1.0}], num_clients=10, client_gpus=0.25, max_client_actors=5)
    msg = str(exc.value)
    assert "max_client_actors=5" in msg
    assert "0.25 GPU" in msg
    assert "the cluster has 8 CPU, 1 GPU over 1 node(s)" in msg
    assert "room for 4 client actor(s)" in msg


def test_max_client_actors_within_capacity_and_capped_by_clients():
    p = plan([{"CPU": 8.0, "GPU": 1.0}], num_clients=10, client_gpus=0.25, max_client_actors=3)
    assert p.num_workers == 3
    # asking for more actors than clients is not an error: one actor per client at most
    p = plan([{"CPU": 8.0}], num_clients=2, max_client_actors=6)
    assert p.num_workers == 2


def test_gpu_request_on_gpu_less_cluster():
    with pytest.raises(ResourceError) as exc:
        plan([{"CPU": 4.0}], client_gpus=0.5)
    msg = str(exc.value)
    assert "client_gpus=0.5" in msg and "0.5 GPU" in msg
    assert "the cluster has 4 CPU, 0 GPU over 1 node(s)" in msg


def test_cpu_request_larger_than_any_node():
    with pytest.raises(ResourceError, match=r"client_cpus=4.*no node has room"):
        plan([{"CPU": 2.0}, {"CPU": 3.0}], client_cpus=4)


def test_coordinator_cpus_get_their_own_first_bundle():
    p = plan([{"CPU": 4.0}], num_clients=10, coordinator_cpus=1.0)
    assert p.num_workers == 3  # one CPU went to the coordinator
    assert p.bundles[0] == {"CPU": 1.0}
    assert p.coordinator_bundle == 0
    assert p.worker_bundles == [1, 2, 3]
    assert p.bundles[1:] == [{"CPU": 1.0}] * 3
    assert p.total == {"CPU": 4.0}


def test_coordinator_that_fits_nowhere():
    with pytest.raises(ResourceError) as exc:
        plan([{"CPU": 2.0}], coordinator_gpus=1.0)
    msg = str(exc.value)
    assert "coordinator_gpus=1" in msg and "no node has that" in msg and "2 CPU, 0 GPU" in msg


def test_coordinator_filling_the_only_node():
    with pytest.raises(ResourceError, match="beside the coordinator"):
        plan([{"CPU": 2.0}], coordinator_cpus=2.0)


def test_multi_node_packing_with_half_gpus():
    nodes = [{"CPU": 2.0, "GPU": 1.0}, {"CPU": 2.0}]
    p = plan(nodes, num_clients=8, client_gpus=0.5)
    assert p.num_workers == 2  # only the GPU node hosts clients, two halves of its GPU
    assert p.bundles == [{"CPU": 1.0, "GPU": 0.5}] * 2
    # CPU-only clients use both nodes
    assert plan(nodes, num_clients=8).num_workers == 4
    # the coordinator goes where it costs the fewest client slots (the CPU-only node)
    p = plan(nodes, num_clients=8, client_gpus=0.5, coordinator_cpus=1.0)
    assert p.num_workers == 2 and p.bundles[0] == {"CPU": 1.0} and p.worker_bundles == [1, 2]


def test_multi_node_capacity_adds_up():
    nodes = [{"CPU": 3.0, "GPU": 1.0}, {"CPU": 5.0, "GPU": 2.0}]
    assert plan(nodes, num_clients=100, client_gpus=0.25).num_workers == 3 + 5
    assert plan(nodes, num_clients=100, client_cpus=0.5, client_gpus=0.25).num_workers == 4 + 8


def test_fractional_coordinator_gpu_shares_a_device_with_clients():
    # 0.25 GPU for the coordinator leaves 0.75 of the device: three 0.25-GPU clients still fit
    p = plan([{"CPU": 8.0, "GPU": 1.0}], num_clients=10, client_gpus=0.25, coordinator_cpus=1.0,
             coordinator_gpus=0.25)
    assert p.num_workers == 3
    assert p.bundles[0] == {"CPU": 1.0, "GPU": 0.25}
    assert p.total["GPU"] == pytest.approx(1.0)
    # on two devices: 0.75 + 1.0 -> 3 + 4
    p = plan([{"CPU": 16.0, "GPU": 2.0}], num_clients=10, client_gpus=0.25, coordinator_gpus=0.25)
    assert p.num_workers == 7
