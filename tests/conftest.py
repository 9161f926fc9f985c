import os

import pytest

# Keep Ray quiet and local in tests.
os.environ.setdefault("RAY_DEDUP_LOGS", "0")


@pytest.fixture(scope="session")
def ray_session():
    """One real local Ray for the whole session: 2 CPUs and a *fake* GPU (for packing tests)."""
    import ray

    ray.init(num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()
