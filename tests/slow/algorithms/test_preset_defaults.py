"""Every preset trains at its defaults (issue 44): on the default dataset (rotated-digits), with the
default model, clients and hyperparameters, 3 rounds finish ``ok`` with finite losses on the local
backend, and the Ray backend gives the same rows. Only ``local_steps`` is set (2, to keep the suite
fast) and, for a preset that does not run in the default setting, its first setting (fda, ufdg).
The presets are read from :data:`fedtune.algorithms.presets.PRESETS`: a new one is tested here
without touching this file.

The slow tier (the tests/slow/ folder: every test here is marked slow by tests/conftest.py);
the quick tests of the same subject are in tests/algorithms/test_preset_defaults.py."""

from __future__ import annotations

import math

import pytest

from fedtune.algorithms.presets import PRESETS
from fedtune.runtime.driver import FederatedRun

from tests.algorithms.test_preset_defaults import config, rounds
from tests.algorithms.test_preset_defaults import local_rows  # noqa: F401 - fixtures, used by name


def metrics(rows: list[dict]) -> list[tuple]:
    """What a round computed: losses, accuracies and every diagnostic but timings (NaN as None)."""
    out = []
    for r in rows:
        keys = sorted(k for k in r if k in ("train_loss", "val_acc", "target_acc", "num_participants", "status")
                      or (k.startswith("diag.") and not k.endswith("_s")))
        out.append(tuple((k, None if isinstance(r[k], float) and math.isnan(r[k]) else r[k]) for k in keys))
    return out


@pytest.fixture(scope="module")
def ray_run(ray_session):
    """One Ray run, re-configured in place for each preset (what Tune's reuse_actors does)."""
    runs: list[FederatedRun] = []
    yield runs
    for fr in runs:
        fr.close()


@pytest.mark.ray
@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_at_its_defaults_gives_the_same_rows_on_ray(local_rows, ray_run, tmp_path, name):
    expected = local_rows(name)
    cfg = config(name, tmp_path, backend="ray", client_cpus=0.5, max_client_actors=2)
    if not ray_run:
        ray_run.append(FederatedRun(cfg))
        ray_run[0].start()
    else:
        ray_run[0].reconfigure(cfg)
    got = rounds(ray_run[0])
    assert metrics(got) == metrics(expected)
