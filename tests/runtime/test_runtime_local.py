"""The runtime's aggregation path, in process (no Ray): buffers, weights, participants."""

from __future__ import annotations

import re

import numpy as np
import pytest

from fedtune.algorithms.server.aggregate import fedavg_weights
from fedtune.config import FederatedRunConfig
from fedtune.runtime.driver import FederatedRun


def test_batchnorm_buffers_are_fedavg_averaged_and_parameters_follow_the_rule(tmp_path):
    cfg = FederatedRunConfig.from_dict({"dataset": "rotated-digits", "model": "resnet18", "setting": "fl", "num_clients": 3,
                               "local_steps": 1, "batch_size": 8, "rounds": 1, "backend": "local",
                               "global_lr": 0.5, "output": str(tmp_path)})
    fr = FederatedRun(cfg)
    fr.start()
    coord = fr.coordinator
    layout = coord.layout
    P = layout.num_params
    assert layout.size > P  # resnet18 has running means/vars
    theta = coord.weights.copy()
    # The same local training the round will run (it is a pure function of weights, seed, client, round).
    (reply,), _ = coord.pool.fit(coord.weights, {}, 1, [0, 1, 2])
    p = fedavg_weights(np.array(reply.num_examples))
    states = reply.states.astype(np.float64)
    expected_buffers = (p[:, None] * states[:, P:]).sum(0)
    expected_params = theta[:P] + 0.5 * (p[:, None] * (states[:, :P] - theta[:P])).sum(0)
    result = fr.step()
    assert result.status == "ok"
    np.testing.assert_allclose(coord.weights[P:], expected_buffers, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(coord.weights[:P], expected_params, rtol=1e-5, atol=1e-6)
    # Buffers are averaged, not moved by global_lr: a global_lr-scaled step would differ.
    scaled = theta[P:] + 0.5 * (expected_buffers - theta[P:])
    assert not np.allclose(coord.weights[P:], scaled, rtol=1e-5, atol=1e-6)
    fr.close()


def test_many_logical_clients_with_partial_participation(tmp_path):
    cfg = FederatedRunConfig.from_dict({"dataset": "rect4", "setting": "fl", "num_clients": 40, "participation": 0.25,
                               "local_steps": 1, "rounds": 2, "backend": "local", "output": str(tmp_path)})
    fr = FederatedRun(cfg)
    fr.start()
    rows = [fr.step().metrics for _ in range(2)]
    fr.close()
    assert [r["num_participants"] for r in rows] == [10, 10]
    assert all(0.0 <= r["target_acc"] <= 1.0 for r in rows)


def test_eval_every_skips_evaluation_but_always_evaluates_the_last_round(tmp_path):
    from fedtune.runtime.driver import run

    cfg = FederatedRunConfig.from_dict({"dataset": "rect4", "rounds": 5, "eval_every": 2, "local_steps": 2,
                               "backend": "local", "output": str(tmp_path)})
    rows = run(cfg, progress=False).rows
    assert [("val_acc" in r, "target_acc" in r) for r in rows] == [
        (False, False), (True, True), (False, False), (True, True), (True, True)]
    # Evaluation does not change training: the same run evaluated every round has the same losses.
    every = run(cfg.replace(eval_every=1, name="every"), progress=False).rows
    assert [r["train_loss"] for r in rows] == [r["train_loss"] for r in every]
    assert rows[3]["val_acc"] == every[3]["val_acc"]


def test_an_interrupted_run_keeps_its_finished_rounds_and_records_the_status(tmp_path):
    import pytest

    from fedtune.results.store import load
    from fedtune.runtime.driver import run

    cfg = FederatedRunConfig.from_dict({"dataset": "rect4", "rounds": 5, "local_steps": 1, "backend": "local",
                               "output": str(tmp_path)})

    def stop_after_two(row):
        if row["round"] == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(cfg, progress=False, on_round=stop_after_two)
    rounds = load(tmp_path / "default")
    assert rounds.column("round").to_pylist() == [1, 2]
    trials = load(tmp_path / "default", table="trials").to_pylist()
    assert [(t["trial_id"], t["status"], t["rounds_done"]) for t in trials] == [(cfg.trial_id(), "interrupted", 2)]
    # Running it again replaces the trial's rows instead of adding to them.
    run(cfg, progress=False)
    assert load(tmp_path / "default").column("round").to_pylist() == [1, 2, 3, 4, 5]
    assert [t["status"] for t in load(tmp_path / "default", table="trials").to_pylist()] == ["completed"]


def test_client_method_metrics_become_example_weighted_diag_columns(tmp_path, monkeypatch):
    from fedtune.algorithms.client.method import SGD

    original = SGD.train

    def train_with_metric(self, ctx):
        out = original(self, ctx)
        out.metrics["client_id_seen"] = float(ctx.client_id)
        return out

    monkeypatch.setattr(SGD, "train", train_with_metric)
    cfg = FederatedRunConfig.from_dict({"dataset": "rect4", "rounds": 1, "local_steps": 1, "backend": "local",
                               "output": str(tmp_path)})
    fr = FederatedRun(cfg)
    fr.start()
    metrics = fr.step().metrics
    n = np.array([s.num_train for s in fr.plan.clients], dtype=float)
    expected = float((n / n.sum()) @ np.arange(len(n)))
    assert metrics["diag.client_id_seen"] == pytest.approx(expected)
    fr.close()


def test_a_batch_size_above_every_client_warns_once_and_records_the_batch_that_ran(tmp_path, caplog):
    import logging

    from fedtune.results.store import load
    from fedtune.runtime.driver import run
    from fedtune.runtime.driver import build_plan

    cfg = FederatedRunConfig.from_dict({"dataset": "rect4", "rounds": 2, "batch_size": 100_000, "backend": "local",
                                        "output": str(tmp_path), "name": "big"})
    n = np.array([c.num_train for c in build_plan(cfg).clients], dtype=float)
    largest = int(n.max())
    with caplog.at_level(logging.WARNING, logger="fedtune"):
        big = run(cfg, progress=False)
    notes = [r.getMessage() for r in caplog.records if "batch_size" in r.getMessage()]
    assert notes == [f"batch_size 100000 exceeds the largest client's {largest} training examples; each client runs "
                     "full-batch steps of its own size (1 step per round: one per local epoch), recorded as "
                     "diag.batch_size_effective"]
    # hp.batch_size stays what was configured (what a sampler chose); the batch that ran is beside it:
    # each client's whole training set, averaged over the round's clients by their aggregation weights.
    assert [r["hp.batch_size"] for r in big.rows] == [100_000, 100_000]
    assert [r["diag.batch_size_effective"] for r in big.rows] == pytest.approx([float((n / n.sum()) @ n)] * 2)
    assert load(tmp_path / "big").column("diag.batch_size_effective").to_pylist() == pytest.approx(
        [r["diag.batch_size_effective"] for r in big.rows])
    # ... and it is exactly what batch_size = the largest client's data runs (no warning there)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fedtune"):
        same = run(cfg.replace(batch_size=largest, name="largest"), progress=False)
    assert [r["train_loss"] for r in same.rows] == [r["train_loss"] for r in big.rows]
    assert not [r for r in caplog.records if "batch_size" in r.getMessage()]
    # a batch every client fills: the effective batch is the configured one
    small = run(cfg.replace(batch_size=8, name="small"), progress=False)
    assert [r["diag.batch_size_effective"] for r in small.rows] == [8.0, 8.0]


def test_the_batch_size_warning_names_local_steps_when_set(tmp_path, caplog):
    import logging

    from fedtune.runtime.driver import FederatedRun

    cfg = FederatedRunConfig.from_dict({"dataset": "rect4", "rounds": 1, "batch_size": 100_000, "local_steps": 3,
                                        "backend": "local", "output": str(tmp_path)})
    with caplog.at_level(logging.WARNING, logger="fedtune"):
        fr = FederatedRun(cfg)
        fr.start()
        (reply,), _ = fr.coordinator.pool.fit(fr.coordinator.weights, {}, 1, [0, 1])
        fr.close()
    assert reply.steps == [3, 3]  # local_steps full-batch steps: the steps asked for, each the whole set
    assert [m["batch_size_effective"] for m in reply.metrics] == [float(n) for n in reply.num_examples]
    assert sum("(local_steps=3 steps per round)" in r.getMessage() for r in caplog.records) == 1


def test_the_ray_backend_warns_in_the_driver_when_it_lays_out_the_actors(caplog):
    """ActorFactory.of runs once per run in the driver (not in each client actor): one warning."""
    import logging
    from types import SimpleNamespace

    from fedtune.runtime.driver import build_plan
    from fedtune.runtime.actor_factory import ActorFactory

    cfg = FederatedRunConfig.from_dict({"dataset": "rect4", "batch_size": 5000})
    layout = SimpleNamespace(num_workers=2, worker_bundles=[0, 1], client_cpus=1.0, client_gpus=0.0)
    with caplog.at_level(logging.WARNING, logger="fedtune"):
        ActorFactory.of(cfg.to_dict(), build_plan(cfg), None, layout)
    assert [r.getMessage()[:36] for r in caplog.records] == ["batch_size 5000 exceeds the largest "]


def test_a_model_too_large_to_build_is_refused_before_any_image_is_decoded(tmp_path):
    from PIL import Image

    from fedtune.errors import ConfigError

    for d in ("a", "b", "c"):
        for c in ("cat", "dog"):
            (tmp_path / "ds" / d / c).mkdir(parents=True)
            for i in range(3):
                Image.new("RGB", (8, 8), (40 * i, 100, 200)).save(tmp_path / "ds" / d / c / f"{i}.png")
    base = {"dataset": "folder", "data_root": str(tmp_path / "ds"), "rounds": 1, "local_steps": 1, "backend": "local",
            "output": str(tmp_path / "out"), "cache_dir": str(tmp_path / "cache")}
    # cnn's first dense layer grows with the square of image_size: 2**31 weights at 1024 px
    for extra, shape in (({"model": "cnn", "image_size": 1024}, "(3, 1024, 1024)"),
                         ({"model": "mlp", "image_size": 224, "mlp_hidden": [65536]}, "(3, 224, 224)")):
        fr = FederatedRun(FederatedRunConfig.from_dict({**base, **extra}))
        with pytest.raises(ConfigError, match=rf"field 'model': {extra['model']} on inputs of shape "
                                              rf"{re.escape(shape)} has \d+ parameters .*allowed: at most 1073741824"):
            fr.start()
        assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").glob("*.npy"))


def test_recording_every_target_step_is_refused_before_it_fills_memory(tmp_path):
    """auto-β keeps one float32 row of every parameter per target step: local_steps=20000 on an
    84k-parameter mlp is 6.3 GiB a round, refused when the run starts, not mid-round."""
    from fedtune.errors import ConfigError

    cfg = FederatedRunConfig.from_dict({"algorithm": "fedgp", "setting": "fda", "gp_beta": "auto", "rounds": 1,
                                        "local_steps": 20_000, "backend": "local", "output": str(tmp_path)})
    fr = FederatedRun(cfg)
    with pytest.raises(ConfigError, match=r"field 'local_steps': the target client records every local step .*"
                                          r"\(20000 steps x \d+ parameters = \d+\.\d GiB a round\); allowed: at most"):
        fr.start()
    fr = FederatedRun(cfg.replace(local_steps=4))
    fr.start()  # a few steps record as before
    fr.close()


def test_auto_beta_with_a_batch_covering_the_target_is_refused_before_round_one(tmp_path):
    """batch_size >= the target's data and local_epochs=1 is one target step a round: auto-β's
    variance needs 2 (it was a ValueError traceback from the coordinator in round 1)."""
    from fedtune.errors import ConfigError

    # a tiny MLP: the refusal is about batch_size against the target's data, not the model
    cfg = FederatedRunConfig.from_dict({"algorithm": "fedgp", "setting": "fda", "gp_beta": "auto", "rounds": 1,
                                        "batch_size": 100_000, "model": "mlp", "mlp_hidden": [8], "backend": "local",
                                        "output": str(tmp_path)})
    fr = FederatedRun(cfg)
    with pytest.raises(ConfigError, match=r"field 'batch_size': .* needs at least 2 local steps per round, but "
                                          r"batch_size 100000 covers the target's \d+ training examples in 1 step"):
        fr.start()
    fr = FederatedRun(cfg.replace(local_epochs=2))  # two full-batch steps: allowed
    fr.start()
    assert fr.step().status == "ok"
    fr.close()

