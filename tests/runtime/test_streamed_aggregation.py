"""Streamed aggregation (issue 29 item 1): a rule whose round is one weighted sum (FedAvg) adds each
client's update as it arrives, in ascending client id, and never holds the round's [U, M] updates;
its rows are the bits of the whole-matrix path, on both backends and any actor count."""

from __future__ import annotations

import numpy as np
import pytest

from fedtune.algorithms.server.rule import FedAvg
from fedtune.config import FederatedRunConfig
from fedtune.runtime.driver import FederatedRun

BASE = {"dataset": "rotated-digits", "model": "mlp", "setting": "fl", "num_clients": 5, "local_steps": 1,
        "batch_size": 8, "rounds": 2, "backend": "local", "global_lr": 0.7, "eval_every": 1000}


def _weights_after(tmp_path, name: str, **overrides) -> tuple[list[np.ndarray], object]:
    cfg = FederatedRunConfig.from_dict({**BASE, **overrides, "output": str(tmp_path), "name": name})
    fr = FederatedRun(cfg)
    fr.start()
    seen = []
    try:
        for _ in range(cfg.rounds):
            assert fr.step().status == "ok"
            seen.append(fr.coordinator.weights.copy())
        return seen, fr.coordinator
    finally:
        fr.close()


@pytest.mark.parametrize("overrides", [
    {"model": "resnet18", "num_clients": 2, "batch_size": 4}, {"participation": 0.6, "client_weighting": "uniform"},
    {"algorithm": "feddyn", "feddyn_alpha": 0.1}, {"algorithm": "feddyn", "feddyn_alpha": 0.1, "feddyn_mean": "uniform"},
    {"algorithm": "scaffold", "participation": 0.6},
], ids=["fedavg", "fedavg-uniform-partial", "feddyn", "feddyn-uniform", "scaffold-partial"])
def test_streamed_rounds_are_the_whole_matrix_path_bit_for_bit(tmp_path, monkeypatch, overrides):
    """FedAvg's sum, FedDyn's h and uniform mean, Scaffold's mean Δc: summed as the clients arrive,
    the same bits as the rule and side computing them from the stacked rows."""
    streamed, coord = _weights_after(tmp_path, "streamed", **overrides)
    if overrides.get("model") == "resnet18":
        assert coord.layout.size > coord.layout.num_params  # batch-norm buffers summed too
    assert not hasattr(coord, "_updates")  # no [U, M] scratch was ever made
    side_state = None if coord.side is None else coord.side.state_dict()
    monkeypatch.setattr(FedAvg, "streamed_weights", lambda self, weights: None)
    matrix, coord = _weights_after(tmp_path, "matrix", **overrides)
    assert hasattr(coord, "_updates")
    for a, b in zip(streamed, matrix):
        assert a.tobytes() == b.tobytes()
    if side_state is not None:  # h, c: the same bits
        for key, value in coord.side.state_dict().items():
            assert np.asarray(value).tobytes() == np.asarray(side_state[key]).tobytes()


def test_a_rule_with_its_own_aggregate_is_not_streamed():
    from fedtune.algorithms.server.fedgma import FedGMA
    from fedtune.algorithms.server.fedomg import FedOMG

    p = np.array([0.25, 0.75])
    for algorithm, cls, expected in (("fedavg", FedAvg, p), ("fedgma", FedGMA, None), ("fedomg", FedOMG, None)):
        rule = cls(FederatedRunConfig.from_dict({"algorithm": algorithm}), None)
        got = rule.streamed_weights(p)
        assert (got is None) if expected is None else np.array_equal(got, expected)


def test_a_worker_streams_its_clients_in_batches_with_the_same_states(tmp_path):
    """A client actor sends its trained clients in replies of ``batch`` clients (fewer objects through
    Ray: fedtune.runtime.pools.stream_batch); the states are those of one reply per client, bit for bit."""
    cfg = FederatedRunConfig.from_dict({**BASE, "num_clients": 7, "output": str(tmp_path), "name": "b"})
    fr = FederatedRun(cfg)
    fr.start()
    try:
        worker = fr.coordinator.pool.worker
        weights = fr.coordinator.weights
        one = list(worker.fit_stream(weights, {}, 1, [6, 0, 3, 1, 5, 2, 4]))
        three = list(worker.fit_stream(weights, {}, 1, [6, 0, 3, 1, 5, 2, 4], batch=3))
    finally:
        fr.close()
    assert [r.client_ids for r in one] == [[c] for c in range(7)]
    assert [r.client_ids for r in three] == [[0, 1, 2], [3, 4, 5], [6]]
    split = [s for r in three for s in r.split()]
    assert [s.client_ids for s in split] == [r.client_ids for r in one]
    for a, b in zip(one, split):
        assert a.states.tobytes() == b.states.tobytes() and (a.losses, a.num_examples) == (b.losses, b.num_examples)
