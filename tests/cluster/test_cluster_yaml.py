"""cluster.yaml is a real Ray autoscaler config: Ray's own schema validation accepts it."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

pytest.importorskip("jsonschema")  # a dependency of ray itself
from ray.autoscaler._private.util import prepare_config, validate_config  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def _load() -> dict:
    return yaml.safe_load((REPO / "cluster.yaml").read_text())


def test_cluster_yaml_passes_rays_autoscaler_validation():
    cfg = _load()
    prepared = prepare_config(copy.deepcopy(cfg))  # merges the provider's defaults, as `ray up` does
    validate_config(prepared)
    assert prepared["provider"]["type"] == "aws"
    assert prepared["head_node_type"] in prepared["available_node_types"]


def test_cluster_yaml_has_a_gpu_worker_type_setup_and_data_mount():
    cfg = _load()
    workers = {k: v for k, v in cfg["available_node_types"].items() if k != cfg["head_node_type"]}
    gpu = [v for v in workers.values() if v["node_config"]["InstanceType"].startswith(("g", "p"))]
    assert gpu, "no GPU worker node type"
    assert any("pip install" in c and "fedtune" in c for c in cfg["setup_commands"])
    assert "~/fedtune" in cfg["file_mounts"] and any("data" in k for k in cfg["file_mounts"])
    assert any('fedtune[cluster]' in c for c in cfg["setup_commands"])  # ray[default]: Ray Jobs on the head
    # No GPU worker is kept up: the autoscaler adds them for the trials that ask for GPUs.
    assert [v["min_workers"] for v in workers.values()] == [0] * len(workers)
    assert all(v["resources"].get("GPU", 0) >= 1 for v in gpu), "fedtune plans on the node types' resources"
    # The dashboard is bound to localhost on the head (reach it through `ray dashboard cluster.yaml`).
    assert any("--dashboard-host=127.0.0.1" in c for c in cfg["head_start_ray_commands"])


@pytest.mark.parametrize("mutate", [
    lambda c: c["available_node_types"]["head"].__setitem__("bogus_field", 1),
    lambda c: c.__setitem__("head_node_type", "no_such_type"),
    lambda c: c["available_node_types"]["gpu_worker"].__setitem__("min_workers", "two"),
])
def test_the_validation_used_above_rejects_broken_variants(mutate):
    cfg = _load()
    mutate(cfg)
    with pytest.raises(Exception):  # jsonschema.ValidationError or ValueError, as `ray up` would report
        validate_config(prepare_config(cfg))
