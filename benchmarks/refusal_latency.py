"""How fast the Ray runtime refuses what it cannot run (moved here from tests/runtime/test_runtime_ray.py,
whose wall-clock asserts ``< 5 s`` / ``< 10 s`` could fail on a loaded machine and pass on a broken one).

A script, not a test: it prints the measured seconds and their ratio to the limit that matters.

    python benchmarks/refusal_latency.py

1. A layout that can never fit (5 clients at 0.25 GPU each with room for 4 on a 1-GPU cluster):
   ``FederatedRun.start`` raises ResourceError before reserving anything. Reported: seconds to the
   error; it should be a small fraction of ``placement_timeout_s`` (the refusal does not wait).
2. A cluster whose CPUs are all held by another placement group: ``FederatedRun.start`` waits
   ``placement_timeout_s`` (1 s here) and then raises. Reported: seconds to the error and the ratio
   to ``placement_timeout_s`` (about 1; well above means the wait is not bounded by the setting).
"""

from __future__ import annotations

import tempfile
import time


def main() -> None:
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    from fedtune.config import FederatedRunConfig
    from fedtune.runtime.driver import FederatedRun
    from fedtune.errors import ResourceError

    ray.init(num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=False)
    out = tempfile.mkdtemp()
    base = {"dataset": "rect4", "rounds": 1, "local_steps": 1, "output": out, "backend": "ray",
            "client_cpus": 0.5, "placement_timeout_s": 1.0}
    try:
        cfg = FederatedRunConfig.from_dict({**base, "setting": "fl", "num_clients": 5, "client_gpus": 0.25,
                                   "client_cpus": 0.25, "max_client_actors": 5})
        t0 = time.perf_counter()
        try:
            FederatedRun(cfg).start()
        except ResourceError:
            pass
        refused = time.perf_counter() - t0
        print(f"impossible layout refused after {refused:.2f}s "
              f"({refused / cfg.placement_timeout_s:.2f} x placement_timeout_s)")

        hog = placement_group([{"CPU": 2.0}])
        hog.wait(10)
        try:
            cfg = FederatedRunConfig.from_dict(base)
            t0 = time.perf_counter()
            try:
                FederatedRun(cfg).start()
            except ResourceError:
                pass
            waited = time.perf_counter() - t0
            print(f"busy cluster: gave up after {waited:.2f}s ({waited / cfg.placement_timeout_s:.2f} x "
                  f"placement_timeout_s={cfg.placement_timeout_s:g})")
        finally:
            remove_placement_group(hog)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
