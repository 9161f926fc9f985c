"""Folded fit rounds (issue 47 item 5): the workers carry the round's float64 sums from one to the
next and one reply of sums per worker crosses Ray instead of a state per client. The sums are the
coordinator's streamed sums bit for bit: the same multiplications and additions in the same order
(ascending client id), however the clients are cut into runs and whichever path takes them."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fedtune.runtime.fit_round import FitRound, fold_width
from fedtune.runtime.messages import FitReply
from fedtune.runtime.placement import deal_contiguous
from fedtune.runtime.pools import RayPool, assign_clients

P, S = 3000, 7  # parameters and floating buffers of a small flat state


def _round(seed: int = 0, k: int = 9):
    """A round's theta, k clients' states and extras, and feeds like a FedDyn-style round: the
    weighted update, the buffers, and a uniform sum of an extra."""
    rng = np.random.default_rng(seed)
    theta = rng.standard_normal(P).astype(np.float32)
    ids = sorted(rng.choice(40, size=k, replace=False).tolist())
    states = (theta[None, :].repeat(k, 0) + 1e-3 * rng.standard_normal((k, P)).astype(np.float32))
    states = np.concatenate([states, rng.standard_normal((k, S)).astype(np.float32)], axis=1)
    counts = rng.integers(1, 50, size=k)
    w = dict(zip(ids, (counts / counts.sum()).tolist()))
    extras = [{"grad": rng.standard_normal(P).astype(np.float32), "note": np.array([float(i)])} for i in range(k)]
    feeds = {"rule.update": ("update", w, True), "rule.buffers": ("buffers", w, True),
             "side.grad": ("grad", dict.fromkeys(ids, 1.0 / k), True)}
    return theta, ids, states, extras, feeds


def _reply(ids, states, extras, rows):
    rows = list(rows)
    return FitReply([ids[i] for i in rows], states[rows], [10 + i for i in rows], [0.5 + i for i in rows],
                    [3] * len(rows), [0.01] * len(rows), 0.0, [dict(extras[i]) for i in rows],
                    [{"m": float(i)} for i in rows], 0)


def _reference_sums(theta, ids, states, extras, feeds):
    """The coordinator's fold written out: each sum, client after client in ascending id,
    ``total += float64(weight) * float64(value)`` with the update taken in float32."""
    out = {}
    for name, (source, weights, _) in feeds.items():
        total = np.zeros(P if source != "buffers" else S)
        for i, cid in enumerate(ids):
            if source == "update":
                value = (states[i, :P] - theta).astype(np.float32)
            elif source == "buffers":
                value = states[i, P:]
            else:
                value = extras[i][source]
            total += value.astype(np.float64) * np.float64(weights[cid])
        out[name] = total
    return out


def test_one_reply_of_many_clients_is_the_one_client_adds_bit_for_bit():
    theta, ids, states, extras, feeds = _round()
    one_by_one = FitRound(theta, P + S, ids, None, feeds)
    for i in range(len(ids)):
        one_by_one.add(_reply(ids, states, extras, [i]))
    at_once = FitRound(theta, P + S, ids, None, feeds)
    at_once.add(_reply(ids, states, extras, range(len(ids))))
    reference = _reference_sums(theta, ids, states, extras, feeds)
    for name in feeds:
        assert one_by_one._sums[name].total.tobytes() == at_once._sums[name].total.tobytes()
        assert one_by_one._sums[name].total.tobytes() == reference[name].tobytes()
    assert at_once.order == ids and at_once.num_examples == one_by_one.num_examples
    assert [sorted(e) for e in at_once.extras] == [["note"]] * len(ids)  # the summed extra is not kept


@pytest.mark.parametrize("cuts", [[9], [1, 8], [4, 5], [3, 3, 3], [2, 0, 6, 1]])
def test_a_chain_of_workers_gives_the_coordinators_sums_bit_for_bit(cuts):
    """Runs of consecutive clients, the first added as trained, the others held then added once the
    sums before them arrive: the coordinator's one fold, whatever the cut."""
    theta, ids, states, extras, feeds = _round(seed=sum(cuts) + len(cuts))
    coordinator = FitRound(theta, P + S, ids, None, feeds)
    for i in range(len(ids)):
        coordinator.add(_reply(ids, states, extras, [i]))
    before, start, taken = None, 0, FitRound(theta, P + S, ids, None, feeds)
    for n in cuts:
        rows = list(range(start, start + n))
        start += n
        if not rows:
            continue
        worker = FitRound(theta, P + S, [ids[i] for i in rows], None, feeds)
        if before is None:
            for i in rows:
                worker.add(_reply(ids, states, extras, [i]))
        else:
            held = {name: np.full(shape, np.nan) for name, shape in worker.held_shapes().items()}
            for i in rows:
                worker.hold(_reply(ids, states, extras, [i]), held)
            worker.continue_from(before)
            worker.add_held(held)
        before = worker.fold_reply(0)
        taken.take_fold(before)
    taken.end_fold(before)
    assert before.rows == len(ids) and taken.order == ids
    for name in feeds:
        assert taken.totals()[name].tobytes() == coordinator.totals()[name].tobytes()
    assert taken.losses == coordinator.losses and taken.metrics == coordinator.metrics
    assert [sorted(e) for e in taken.extras] == [sorted(e) for e in coordinator.extras]


def test_a_chain_whose_sums_disagree_with_the_round_is_refused():
    theta, ids, states, extras, feeds = _round()
    first = FitRound(theta, P + S, ids[:3], None, feeds)
    first.add(_reply(ids, states, extras, range(3)))
    whole = FitRound(theta, P + S, ids, None, feeds)
    whole.take_fold(first.fold_reply(0))
    with pytest.raises(RuntimeError, match="hold 2 clients"):
        whole.end_fold(dataclasses.replace(first.fold_reply(0), rows=2))
    other = FitRound(theta, P + S, ids, None, {"rule.update": feeds["rule.update"]})
    with pytest.raises(RuntimeError, match="not this round's"):
        other.continue_from(first.fold_reply(0))


def test_fold_width_keeps_one_client_whole_and_many_in_cache_sized_blocks():
    assert fold_width(85_002, 1) == 85_002
    assert fold_width(85_002, 50) * 50 <= 1 << 21
    assert fold_width(10, 50) == 10 and fold_width(10**8, 1) == 1 << 21


def test_deal_contiguous_cuts_ascending_runs_that_cover_the_round_within_one_client():
    rng = np.random.default_rng(3)
    for _ in range(200):
        n, workers = int(rng.integers(1, 60)), int(rng.integers(1, 9))
        ids = sorted(rng.choice(200, size=n, replace=False).tolist())
        costs = rng.integers(0, 30, size=200).tolist()
        dealt = deal_contiguous(ids, costs, workers)
        runs = [dealt[w] for w in sorted(dealt)]
        assert sorted(dealt) == list(range(len(runs)))  # workers 0.. in order
        assert sum(runs, []) == ids  # consecutive runs, ascending, every client once
        loads = [sum(costs[c] for c in run) for run in runs]
        share = sum(costs[c] for c in ids) / workers
        assert max(loads) <= share + max(costs[c] for c in ids) + 1e-9
    with pytest.raises(ValueError, match="at least 1"):
        deal_contiguous([1], [1, 1], 0)


def test_owners_hold_runs_of_consecutive_clients_of_sizes_within_one():
    for n in range(0, 30):
        for w in range(1, 7):
            owned = assign_clients(n, w)
            assert sum(owned, []) == list(range(n))
            assert max(map(len, owned)) - min(map(len, owned)) <= 1


class _Factory:
    costs = None


def _pool(assignment, roaming_costs=None, state_bytes=4 << 20):
    factory = _Factory()
    factory.costs = roaming_costs
    pool = RayPool([object()] * len(assignment), factory, assignment, "retry")
    pool.state_bytes = state_bytes
    return pool


def test_a_ray_pool_folds_runs_of_owners_or_roaming_clients_and_streams_otherwise():
    pool = _pool(assign_clients(10, 3))
    assert pool.fold_runs([9, 0, 4, 5, 1]) == [(0, [0, 1]), (1, [4, 5]), (2, [9])]
    assert _pool([[0, 2, 4], [1, 3]]).fold_runs([0, 1, 2]) is None  # interleaved owners: no chain
    roaming = _pool(assign_clients(10, 2), roaming_costs=[1] * 10)
    assert roaming.fold_runs([1, 3, 5, 7]) == [(0, [1, 3]), (1, [5, 7])]
    # the workers after the first would fold more than 64 MiB of states: streamed
    big = _pool(assign_clients(40, 2), state_bytes=4 << 20)
    assert big.fold_runs(list(range(40))) is None
    assert big.fold_runs(list(range(20)) + list(range(20, 36))) == [(0, list(range(20))), (1, list(range(20, 36)))]
    # a state over 4 MiB: streamed, however few clients
    assert _pool(assign_clients(4, 2), state_bytes=(4 << 20) + 4).fold_runs([0, 3]) is None


def test_publishing_a_payload_keeps_the_state_size_the_replies_are_cut_by(monkeypatch):
    """The server rule's payload is published after the weights: it used to overwrite the state's
    size (8 bytes for a dict), so a round with a payload sent all its clients' states in one reply."""
    import ray

    monkeypatch.setattr(ray, "put", lambda value: value)
    pool = _pool(assign_clients(4, 2), state_bytes=0)
    pool.publish(np.zeros(1000, np.float32))
    pool.publish({"mu": np.zeros(3, np.float32)})
    assert pool.state_bytes == 4000
