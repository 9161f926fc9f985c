"""Roaming clients (fedtune.runtime.placement): each round's participants dealt to the client actors
by cost, who roams and who stays with its owner, and the worker's side of it. That roaming changes
no number is the contract test ``test_both_backends_and_any_actor_count_give_the_same_rounds``
(every preset, local = Ray with 1 and 2 actors, the 2-actor runs roaming where the method allows);
that each method's ``keeps_client_state`` is exact is ``test_a_client_method_keeps_client_state_exactly_when_it_declares_it``."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pytest

from fedtune.config import FederatedRunConfig
from fedtune.errors import ConfigError
from fedtune.runtime import placement
from fedtune.runtime.driver import build_plan
from fedtune.runtime.placement import check_placement, client_cost, deal_clients, roams

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_deal_clients_gives_each_client_once_and_balances_to_within_one_client():
    rng = np.random.default_rng(0)
    for trial in range(300):
        n, workers = int(rng.integers(1, 40)), int(rng.integers(1, 6))
        costs = [int(c) for c in rng.integers(0, 50, size=60)]
        ids = sorted(rng.choice(60, size=n, replace=False).tolist())
        dealt = deal_clients(ids, costs, workers)
        assert sorted(c for part in dealt.values() for c in part) == ids
        assert all(part == sorted(part) and part for part in dealt.values())
        assert set(dealt) <= set(range(workers))
        loads = [sum(costs[c] for c in dealt.get(w, [])) for w in range(workers)]
        # LPT: the busiest actor's last client found it the least loaded, so no actor exceeds the
        # least loaded by more than the largest cost
        assert max(loads) - min(loads) <= max(costs[c] for c in ids), (ids, dealt)
        assert dealt == deal_clients(list(reversed(ids)), costs, workers)  # the order given does not matter


def test_deal_clients_on_equal_costs_is_an_even_split_and_beats_fixed_owners():
    # 100 clients, participation 0.2, 2 actors: by owner (clients 0-49 and 50-99) the split is
    # whatever the draw gives; dealt it is 10 and 10
    from fedtune.data.partition import sample_participants

    worst_fixed = 0
    for rnd in range(1, 21):
        ids = sample_participants(100, 0.2, 0, rnd).tolist()
        dealt = deal_clients(ids, [1] * 100, 2)
        assert sorted(len(v) for v in dealt.values()) == [10, 10]
        worst_fixed = max(worst_fixed, max(sum(1 for c in ids if c // 50 == w) for w in (0, 1)))
    assert worst_fixed >= 12  # what roaming saves: an actor training 12+ while the other trains 8-


def test_deal_clients_refuses_no_workers():
    with pytest.raises(ValueError, match="num_workers"):
        deal_clients([0], [1], 0)


def test_client_cost_is_steps_times_the_examples_of_a_step():
    cfg = FederatedRunConfig.from_dict({"local_steps": 5, "batch_size": 32})
    assert client_cost(10, cfg) == 50 and client_cost(100, cfg) == 160 and client_cost(0, cfg) == 0
    cfg = FederatedRunConfig.from_dict({"local_steps": None, "local_epochs": 2, "batch_size": 32})
    assert client_cost(100, cfg) == 2 * 4 * 32  # 2 epochs of 4 batches (batches_per_epoch), 32 examples a step


def _cfg(**kw) -> FederatedRunConfig:
    return FederatedRunConfig.from_dict({"dataset": "rotated-digits", "setting": "fl", "num_clients": 8,
                                         "participation": 0.5, "model": "mlp", "backend": "ray", **kw})


@pytest.mark.parametrize("kw,workers,expected", [
    ({}, 2, True),                                                 # auto: sampled, stateless, small data
    ({}, 1, False),                                                # one actor: nothing to deal
    ({"participation": 1.0}, 2, False),                            # auto: every client every round
    ({"participation": 1.0, "client_placement": "roaming"}, 2, True),
    ({"client_placement": "fixed"}, 2, False),
    ({"algorithm": "scaffold"}, 2, False),                         # keeps a control variate per client
    ({"algorithm": "fedsr"}, 2, True),                             # federated prior: no client state
    ({"algorithm": "fedsr", "fedsr_prior": "local"}, 2, False),   # a prior per client
])
def test_who_roams(kw, workers, expected):
    cfg = _cfg(**kw)
    plan = build_plan(cfg)
    assert roams(cfg, plan, workers, (1, 28, 28)) is expected


def test_auto_does_not_roam_when_every_actor_cannot_hold_every_client(monkeypatch):
    cfg = _cfg()
    plan = build_plan(cfg)
    mib = placement.examples_mib(plan, (1, 28, 28))
    assert 5.0 < mib < 6.0  # 1,797 digits as float32 28x28
    monkeypatch.setattr(placement, "ROAMING_MAX_MIB", mib * 0.99)
    assert not roams(cfg, plan, 2, (1, 28, 28))
    assert roams(_cfg(client_placement="roaming"), plan, 2, (1, 28, 28))  # asked for: it roams anyway
    assert not roams(cfg, plan, 2, None)  # the input shape unknown: auto stays fixed


def test_roaming_with_a_method_that_keeps_client_state_is_one_line_naming_the_field():
    for kw in ({"algorithm": "scaffold"}, {"algorithm": "feddyn"}, {"algorithm": "fedsr", "fedsr_prior": "local"}):
        cfg = _cfg(client_placement="roaming", **kw)
        with pytest.raises(ConfigError) as err:
            build_plan(cfg)  # before anything starts
        text = str(err.value)
        assert "\n" not in text and text.startswith("field 'client_placement': ") and "allowed here: auto, fixed" in text
    check_placement(_cfg(client_placement="roaming"))  # a stateless method may
    with pytest.raises(ConfigError, match="client_placement"):
        FederatedRunConfig.from_dict({"client_placement": "sometimes"})


def test_a_ray_pool_deals_roaming_clients_and_keeps_owners_otherwise():
    from fedtune.runtime.pools import RayPool, assign_clients

    cfg = _cfg(local_steps=2, batch_size=4)
    plan = build_plan(cfg)
    assignment = assign_clients(plan.num_clients, 2)
    costs = [client_cost(s.num_train, cfg) for s in plan.clients]
    for roaming in (False, True):
        factory = SimpleNamespace(costs=costs if roaming else None)
        pool = RayPool([None, None], factory, assignment, "retry")
        for ids in itertools.combinations(range(8), 4):
            split = pool.trainers(list(ids))
            assert sorted(c for part in split.values() for c in part) == list(ids)
            if roaming:
                assert split == deal_clients(list(ids), costs, 2)
            else:
                assert all(c in assignment[w] for w, part in split.items() for c in part)
    assert assignment == [[0, 1, 2, 3], [4, 5, 6, 7]]  # owners hold runs of consecutive clients


def _worker(tmp_path, algorithm: str, owned: list[int]):
    from fedtune.runtime.worker import ClientWorker

    cfg = FederatedRunConfig.from_dict({"dataset": "rect4", "setting": "fl", "num_clients": 4, "participation": 0.5,
                                        "model": "mlp", "mlp_hidden": [8], "local_steps": 2, "batch_size": 8,
                                        "backend": "local", "algorithm": algorithm, "output": str(tmp_path)})
    plan = build_plan(cfg)
    return ClientWorker(cfg.to_dict(), list(plan.clients), 1, [], manage_threads=False, owned=owned)


def test_a_roaming_worker_evaluates_only_the_clients_it_owns(tmp_path):
    worker = _worker(tmp_path, "fedavg", owned=[1, 3])
    assert worker.roams and worker.owned == [1, 3]
    weights, _, _ = worker.initial_state()
    assert worker.evaluate(weights).client_ids == [1, 3]
    reply = worker.fit(weights, {}, 1, [0, 2])  # it trains clients it does not own
    assert reply.client_ids == [0, 2] and np.isfinite(reply.states).all()
    assert set(worker.get_client_state()) == {1, 3}


def test_a_roaming_worker_whose_client_method_writes_client_state_stops_in_one_error(tmp_path):
    """The backstop behind the declarations: MOON keeps each client's previous model; placed on a
    roaming worker anyway (as an undeclared method would be), its first client stops the run."""
    worker = _worker(tmp_path, "moon", owned=[1, 3])
    weights, _, _ = worker.initial_state()
    with pytest.raises(RuntimeError, match="client method moon kept per-client state .* keeps_client_state"):
        worker.fit(weights, {}, 1, [0])
    owner = _worker(tmp_path, "moon", owned=[0, 1, 2, 3])  # not roaming: its clients' state stays with it
    assert not owner.roams
    owner.fit(weights, {}, 1, [0])
    assert owner.get_client_state()[0]
