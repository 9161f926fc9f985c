"""The paper-scale input path: the decoded-image cache, batches fetched from it, DomainBed's
augmentation, the client optimisers and precisions (fedtune.data.cache, fedtune.runtime.examples,
fedtune.runtime.augment, fedtune.algorithms.client.optim / precision).

The slow tier (the tests/slow/ folder: every test here is marked slow by tests/conftest.py);
the quick tests of the same subject are in tests/data/test_image_pipeline.py."""

from __future__ import annotations

import json

import pytest

from fedtune.data.cache import build_log
from fedtune.results.store import load
from fedtune.runtime.driver import run

from tests.data.test_image_pipeline import METRICS, folder_cfg, image_tree


# ----------------------------------------------------------------- determinism on Ray, decode once
@pytest.mark.ray
@pytest.mark.parametrize("actors", [1, 3])
def test_domainbed_augment_metrics_match_across_backends_and_actor_counts(ray_session, tmp_path, actors):
    root = image_tree(tmp_path / "ds", per_class=6)
    kw = {"clients_per_domain": 2, "client_cpus": 0.5}
    local = run(folder_cfg(tmp_path, root, name="local", **kw), progress=False)
    on_ray = run(folder_cfg(tmp_path, root, name=f"ray{actors}", backend="ray", max_client_actors=actors, **kw),
                 progress=False)
    a = [tuple(r[m] for m in METRICS) for r in load(tmp_path / "out" / "local", "rounds").to_pylist()]
    b = [tuple(r[m] for m in METRICS) for r in load(tmp_path / "out" / f"ray{actors}", "rounds").to_pylist()]
    assert local.status == on_ray.status == "completed" and len(a) == 2
    assert a == b


@pytest.mark.ray
def test_a_sweep_of_several_trials_decodes_every_image_once(ray_session, tmp_path):
    from fedtune.tune.study.options import SweepOptions
    from fedtune.tune.study.sweep import run_sweep

    root = image_tree(tmp_path / "ds", per_class=5)
    cache = tmp_path / "cache"
    # two trials at once, one client actor each (each reads every domain: its clients' and the target's)
    o = SweepOptions(algorithms=["fedavg"], dataset="folder", data_root=str(root), rounds=1, num_samples=3,
                     max_concurrent=2, output=str(tmp_path / "out"), name="once", report=False,
                     overrides={"local_steps": 1, "image_size": 16, "cache_dir": str(cache), "client_cpus": 0.5,
                                "max_client_actors": 1})
    run_sweep(o)
    trials = load(tmp_path / "out" / "once", "trials").to_pylist()
    assert len(trials) == 3 and {t["status"] for t in trials} == {"completed"}
    builds = build_log(cache)
    # every domain's images decoded exactly once, though three trials (and their actors) read them
    assert sorted(b["stem"].split("-")[1] for b in builds) == ["a", "b", "c"]
    assert sum(b["images"] for b in builds) == 3 * 2 * 5
    assert all(json.loads(p.read_text())["shape"][0] == 10 for p in cache.glob("*.json"))
