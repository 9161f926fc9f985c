"""The seed papers' baseline rows (issue 20), end to end: every new preset gives the same metrics
on both backends and any actor count, and continues after a checkpoint exactly as an
uninterrupted run, its client and server state included. The methods' equations are tested
against independent references in their own files (test_fedsr, test_moon, test_fediir_fishr,
test_scaffold_feddyn, test_fedga)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedtune.algorithms import PRESETS, SERVER_SIDES
from fedtune.config import FederatedRunConfig
from fedtune.runtime.checkpoint import read_checkpoint, write_checkpoint
from fedtune.runtime.driver import FederatedRun

BASELINES = ("fedsr", "fedsr-omg", "fediir", "fediir-omg", "fishr", "moon", "scaffold", "feddyn", "fedga",
             "fedsam-omg")
# Presets whose runs carry state from round to round beyond the weights (client ctx.state, a
# server side or the server rule's state): dropping it on resume must change the run.
STATEFUL = ("fediir", "fediir-omg", "fishr", "moon", "scaffold", "feddyn", "fedga")

# 4 clients, half of them sampled each round: a client's state waits for it across rounds.
BASE = {"dataset": "rect4", "setting": "fl", "num_clients": 4, "participation": 0.5, "rounds": 4,
        "local_steps": 3, "batch_size": 16}


def cfg_of(tmp_path, algorithm: str, **kw) -> FederatedRunConfig:
    return FederatedRunConfig.from_dict({**BASE, "algorithm": algorithm, "output": str(tmp_path), **kw})


def metrics(rows: list[dict]) -> list[tuple]:
    """What a round computed: losses, accuracies and every diagnostic but timings (NaN as None)."""
    out = []
    for r in rows:
        keys = sorted(k for k in r if k in ("train_loss", "val_acc", "target_acc", "num_participants")
                      or (k.startswith("diag.") and not k.endswith("_s")))
        out.append(tuple((k, None if isinstance(r[k], float) and math.isnan(r[k]) else r[k]) for k in keys))
    return out


def rounds(fr: FederatedRun, n: int) -> list[dict]:
    return [fr.step().metrics for _ in range(n)]


def test_every_baseline_is_a_preset_of_registered_parts():
    for name in BASELINES:
        p = PRESETS[name]
        assert p.settings == ("fdg", "fl"), name
    assert (PRESETS["fedsr-omg"].client_method, PRESETS["fedsr-omg"].server_rule) == ("fedsr", "fedomg")
    assert (PRESETS["fediir-omg"].client_method, PRESETS["fediir-omg"].server_rule) == ("fediir", "fedomg")
    assert (PRESETS["fedsam-omg"].client_method, PRESETS["fedsam-omg"].server_rule) == ("sam", "fedomg")
    assert {"scaffold", "feddyn", "fediir", "fishr"} <= set(SERVER_SIDES)


@pytest.mark.parametrize("algorithm", BASELINES)
def test_a_checkpoint_continues_exactly_with_the_methods_state(tmp_path, algorithm):
    cfg = cfg_of(tmp_path, algorithm, backend="local")
    with FederatedRun(cfg) as fr:
        straight = rounds(fr, 4)
    with FederatedRun(cfg) as fr:
        first = rounds(fr, 2)
        write_checkpoint(tmp_path / "ckpt", fr.get_state())  # what a killed trial leaves on disk
    state = read_checkpoint(tmp_path / "ckpt")
    with FederatedRun(cfg) as fr:
        fr.set_state(state)
        resumed = rounds(fr, 2)
    assert all(math.isfinite(m["train_loss"]) for m in straight)
    assert metrics(first + resumed) == metrics(straight)
    if algorithm in STATEFUL:  # the state is what makes it continue: the weights alone do not
        kept = {**state, "clients": {}}
        if state.get("side") is not None:
            with FederatedRun(cfg) as fr:
                fresh_side = fr.get_state()["side"]
            kept["side"] = fresh_side
        with FederatedRun(cfg) as fr:
            if algorithm == "fedga":
                kept["rule"] = fr.get_state()["rule"]
            fr.set_state(kept)
            weights_only = rounds(fr, 2)
        assert metrics(weights_only) != metrics(straight[2:])


@pytest.mark.ray
@pytest.mark.parametrize("algorithm", BASELINES)
def test_both_backends_and_any_actor_count_give_the_same_rounds(ray_session, tmp_path, algorithm):
    local = FederatedRun(cfg_of(tmp_path, algorithm, backend="local", rounds=3, name="local"))
    with local:
        expected = rounds(local, 3)
    for actors in (1, 2):
        on_ray = FederatedRun(cfg_of(tmp_path, algorithm, backend="ray", rounds=3, client_cpus=0.5,
                                     max_client_actors=actors, name=f"ray{actors}"))
        on_ray.start()
        try:
            got = rounds(on_ray, 3)
        finally:
            on_ray.close()
        assert metrics(got) == metrics(expected), (algorithm, actors)


def test_a_checkpoint_of_another_algorithms_server_side_is_refused(tmp_path):
    with FederatedRun(cfg_of(tmp_path, "scaffold", backend="local")) as fr:
        rounds(fr, 1)
        state = fr.get_state()
    with FederatedRun(cfg_of(tmp_path, "fedavg", backend="local")) as fr:
        with pytest.raises(ValueError, match="server side"):
            fr.set_state(state)
    with FederatedRun(cfg_of(tmp_path, "scaffold", backend="local")) as fr:
        with pytest.raises(ValueError, match="server side"):
            fr.set_state({**state, "side": None})
    assert np.asarray(state["weights"]).dtype == np.float32
