"""The runtime's aggregation path, in process (no Ray): buffers, weights, participants."""

from __future__ import annotations

import numpy as np
import pytest

from fedtune.algorithms import fedavg_weights
from fedtune.config import FederatedRunConfig
from fedtune.runtime import FederatedRun


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
    from fedtune.runtime import run

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

    from fedtune.results import load
    from fedtune.runtime import run

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
    from fedtune.algorithms.client import SGD

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
