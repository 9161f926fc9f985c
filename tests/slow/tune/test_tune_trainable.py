"""The Ray Tune trial layer: FedtuneTrainable (placement, checkpoints, actor reuse), ArrowCallback
(the single writer of the store) and the Tuner example that puts them together.

The slow tier (the tests/slow/ folder: every test here is marked slow by tests/conftest.py);
the quick tests of the same subject are in tests/tune/test_tune_trainable.py."""

from __future__ import annotations

import importlib.util
import math
import time

import numpy as np

from fedtune.config import FederatedRunConfig
from fedtune.results.store import load
from fedtune.runtime.driver import run
from fedtune.runtime.checkpoint import read_checkpoint
from fedtune.spaces.model import strip_switches
from fedtune.tune.trial.trainable import FedtuneTrainable, trial_run_config

from tests.tune.test_tune_trainable import BASE, EXAMPLE, METRICS, _RAY_DRIVER_CHILD


def key(row) -> tuple:
    """The metrics of a round (NaN and missing alike as None, so diverged rounds compare too)."""
    values = (row.get(m) for m in METRICS)
    return tuple(None if v is None or (isinstance(v, float) and math.isnan(v)) else v for v in values)


def test_trainable_reuse_and_restore_match_an_uninterrupted_trial(ray_session, tmp_path, monkeypatch):
    import ray.tune.trainable.trainable as tune_trainable

    # Outside Tune a Trainable makes its log folders under ~/ray_results: keep them in tmp_path.
    monkeypatch.setattr(tune_trainable, "DEFAULT_STORAGE_PATH", str(tmp_path / "logs"))
    a = FedtuneTrainable(dict(BASE))
    try:
        # Outside Tune there is no trial placement group: the run reserves its own.
        assert a.startup["actors_reused"] is False and a.startup["actors_in_trial_pg"] is False
        assert a.run._own_pg and a.run.describe()["placement_group_id"] == a.run._pg.id.hex()
        straight = [a.train() for _ in range(4)]
        assert [r["training_iteration"] for r in straight] == [1, 2, 3, 4]
        assert [r["done"] for r in straight] == [False, False, False, True]
        assert [r.get("should_checkpoint", False) for r in straight] == [False, True, False, False]
        assert {r["fedtune_trial_id"] for r in straight} == {trial_run_config(BASE).trial_id()}
        assert straight[0]["fedtune_row"]["hp.local_lr"] == 0.05 and straight[0]["algorithm"] == "fedavg"
        pids = sorted(i["pid"] for i in ray_session.get([h.info.remote() for h in a.run.client_handles()]))

        # Another trial on the same actors, then the first config again: a fresh trial's numbers.
        assert a.reset(dict(BASE, local_lr=0.2, seed=3)) is True
        other = a.train()
        assert a.reset(dict(BASE)) is True
        assert a.startup["actors_reused"] is True
        assert sorted(i["pid"] for i in ray_session.get([h.info.remote() for h in a.run.client_handles()])) == pids
        again = [a.train() for _ in range(2)]
        assert [key(r) for r in again] == [key(r) for r in straight[:2]]
        assert key(other) != key(straight[0])
        a.save(str(tmp_path / "ckpt"))

        # Another resource shape cannot keep the actors: they start again, with the same numbers.
        assert a.reset(dict(BASE, client_cpus=0.5)) is True
        assert a.startup["actors_reused"] is False
        assert ray_session.get(a.run.client_handles()[0].info.remote())["pid"] not in pids
        assert key(a.train()) == key(straight[0])
    finally:
        a.stop()
    assert np.load(tmp_path / "ckpt" / "weights.npy").dtype == np.float32

    # Restore into a fresh trainable: rounds 3-4 as in the uninterrupted trial.
    b = FedtuneTrainable(dict(BASE))
    try:
        b.restore(str(tmp_path / "ckpt"))
        resumed = [b.train() for _ in range(2)]
    finally:
        b.stop()
    assert [r["training_iteration"] for r in resumed] == [3, 4] and resumed[-1]["done"]
    assert [key(r) for r in resumed] == [key(r) for r in straight[2:]]


# ------------------------------------------------------------------------------------------------
# The Tuner example end to end: a diverging trial, then one on its reused actors.
def _example():
    spec = importlib.util.spec_from_file_location("tuner_api_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tuner_example_stores_every_round_once_with_trial_statuses(ray_session, tmp_path):
    from ray import tune

    example = _example()
    overrides = {"dataset": "rect4", "model": "mlp", "mlp_hidden": [32], "rounds": 3, "local_steps": 3,
                 "batch_size": 16, "local_lr": tune.grid_search([1e6, 0.05]), "checkpoint_every": 2,
                 # the space's other knobs fixed: Tune's random draws (unseeded) must not decide which trial diverges
                 "global_lr": 1.0, "server_optimizer": "sgd", "local_momentum": 0.9, "weight_decay": 0.0}
    grid = example.main(str(tmp_path / "out"), "study", "fedavg", num_samples=1, max_concurrent_trials=1,
                        overrides=overrides, storage_path=str(tmp_path / "tune"))
    assert len(grid) == 2 and not grid.errors
    last = {r.metrics["fedtune_trial_id"]: r.metrics for r in grid}
    assert all(m["actors_in_trial_pg"] for m in last.values())
    # The second trial ran on the first one's trainable, placement group and actors.
    assert sorted(m["actors_reused"] for m in last.values()) == [False, True]

    rounds = load(tmp_path / "out" / "study").to_pandas()
    assert not rounds.duplicated(["trial_id", "round"]).any()
    trials = load(tmp_path / "out" / "study", "trials").to_pandas().set_index("trial_id")
    assert sorted(trials.index) == sorted(last)
    lr = {t: float(r["hp.local_lr"]) for t, r in trials.iterrows()}
    assert {t: trials.loc[t, "status"] for t in trials.index} == {
        t: ("diverged" if lr[t] == 1e6 else "completed") for t in trials.index}
    for t, group in rounds.sort_values("round").groupby("trial_id"):
        status = group["status"].tolist()
        assert group["round"].tolist() == list(range(1, len(group) + 1))
        if lr[t] == 1e6:  # stops at the round that diverged (NaN loss); the study went on
            assert status[-1] == "diverged" and set(status[:-1]) <= {"ok"} and math.isnan(group["train_loss"].iloc[-1])
        else:
            assert status == ["ok"] * 3
        assert trials.loc[t, "rounds_done"] == len(group)

    # checkpoint_every=2 (and checkpoint_at_end=False): the completed trial's round-2 checkpoint only.
    done = [r for r in grid if r.metrics["status"] == "ok"]
    assert len(done) == 1 and done[0].checkpoint is not None
    assert [read_checkpoint(c.path)["round"] for c, _ in done[0].best_checkpoints] == [2]

    # Every trial, on reused actors or not, computed what a fresh in-process run computes.
    for result in grid:
        m = result.metrics
        config = strip_switches(result.config)  # Tune's config: switches, left-out parameters, the driver's key
        ref = run(FederatedRunConfig.from_dict({**config, "backend": "local", "output": str(tmp_path / "ref")}),
                  progress=False).rows
        stored = rounds[rounds["trial_id"] == m["fedtune_trial_id"]].sort_values("round").to_dict("records")
        assert [key(r) for r in stored] == [key(r) for r in ref]

    # Tune gave every trial's placement group back.
    deadline = time.time() + 20
    while time.time() < deadline and any(
            pg["state"] != "REMOVED" for pg in ray_session.util.placement_group_table().values()):
        time.sleep(0.05)
    assert all(pg["state"] == "REMOVED" for pg in ray_session.util.placement_group_table().values())


def test_the_trial_actors_process_runs_rounds_on_ray_without_importing_torch():
    """The trainable (and ``fedtune run --backend ray``'s driver) only waits on the coordinator:
    starting the run's actors and running a round must not load torch into it (2.7 CPU-s in every
    trial actor, once per search of a sweep). A batch_size above every client's data takes the
    warning path, which once imported the client methods' module."""
    import json
    import subprocess
    import sys

    config = {"dataset": "rect4", "model": "mlp", "mlp_hidden": [8], "rounds": 1, "local_steps": 1,
              "batch_size": 100000, "client_cpus": 0.5}
    out = subprocess.run([sys.executable, "-c", _RAY_DRIVER_CHILD], input=json.dumps(config), capture_output=True,
                         text=True, check=True, timeout=240).stdout
    assert json.loads(out.strip().splitlines()[-1]) == {"torch": False, "round": 1}
