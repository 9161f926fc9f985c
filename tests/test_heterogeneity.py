"""Domain heterogeneity lambda (Bai, Bagchi & Inouye, ICLR 2024): source domains over num_clients clients."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

import fedtune.data.partition as partition
from fedtune.config import FederatedRunConfig
from fedtune.data.base import FederatedPlan
from fedtune.data.heterogeneity import heterogeneity_counts
from fedtune.data.partition import make_plan
from fedtune.data.registry import get_dataset
from fedtune.errors import ConfigError
from fedtune.runtime.driver import build_plan


def _data(name):
    ds = get_dataset(name)
    return ds.info, {d: ds.labels(d) for d in ds.info.domains}


DIGITS = _data("rotated-digits")  # 6 domains: 300, 300, 300, 299, 299, 299
RECT4 = _data("rect4")  # 4 domains of 500


def _plan(data, lam, num_clients, setting="fdg", target="0", **kw) -> FederatedPlan:
    info, labels = data
    return make_plan(info, labels, setting=setting, target_domain=target, num_clients=num_clients,
                     domain_heterogeneity=lam, **kw)


def _held(plan) -> np.ndarray:
    """(source clients, source domains): examples (train + val) of each domain per client."""
    src = [c for c in plan.clients if c.role == "source"]
    return np.array([[len(c.train.get(d, ())) + len(c.val.get(d, ())) for d in plan.source_domains]
                     for c in src], dtype=np.int64)


def _main_clients_reference(sizes, n):
    """The authors' greedy (extra client to the domain of largest n_d / m_d) restated: the extra
    N - D clients are the N - D largest quotients n_d / k, k >= 1 (ties: earlier domain)."""
    quotients = sorted((-Fraction(s, k), d) for d, s in enumerate(sizes) for k in range(1, n + 1))
    m = [1] * len(sizes)
    for _, d in quotients[:n - len(sizes)]:
        m[d] += 1
    return m


def _assert_disjoint_complete(plan, labels):
    seen = {d: [] for d in labels}
    for c in plan.clients:
        for pieces in (c.train, c.val, c.test):
            for d, idx in pieces.items():
                assert len(idx) and np.all(np.diff(idx) > 0)
                seen[d].append(idx)
    for pieces in (plan.target_test, plan.target_probe, plan.target_oracle):
        for d, idx in pieces.items():
            seen[d].append(idx)
    for d, y in labels.items():
        allidx = np.concatenate(seen[d])
        assert len(allidx) == len(np.unique(allidx)), f"overlap in domain {d}"
        np.testing.assert_array_equal(np.sort(allidx), np.arange(len(y)))


# ----------------------------------------------------------------------------- the two ends
@pytest.mark.parametrize("data,target,n", [(DIGITS, "0", 5), (DIGITS, "0", 7), (DIGITS, "30", 12), (RECT4, "d2", 3),
                                           (RECT4, "d0", 8)])
def test_lambda_one_gives_each_client_one_domain_spread_evenly(data, target, n):
    plan = _plan(data, 1.0, n, target=target)
    held = _held(plan)
    sizes = [len(data[1][d]) for d in plan.source_domains]
    assert held.shape == (n, len(sizes))
    assert ((held > 0).sum(axis=1) == 1).all(), "exactly one domain per client"
    main = held.argmax(axis=1)
    assert list(main) == sorted(main), "clients in domain order"
    m = _main_clients_reference(sizes, n)
    assert np.bincount(main, minlength=len(sizes)).tolist() == m
    for d, (size, m_d) in enumerate(zip(sizes, m)):  # a domain's clients: equal shares up to one example
        shares = held[main == d, d]
        assert shares.sum() == size and shares.max() - shares.min() <= 1
    for c in plan.clients:
        assert c.domain == plan.source_domains[int(np.argmax(_held_one(c, plan)))]
        assert c.name == f"client-{c.client_id}"


def _held_one(c, plan):
    return [len(c.train.get(d, ())) + len(c.val.get(d, ())) for d in plan.source_domains]


def test_lambda_one_hand_counted_on_rotated_digits():
    plan = _plan(DIGITS, 1.0, 7)  # sources 15, 30 (300 each), 45, 60, 75 (299 each)
    assert plan.source_domains == ("15", "30", "45", "60", "75")
    expected = np.array([[150, 0, 0, 0, 0], [150, 0, 0, 0, 0], [0, 150, 0, 0, 0], [0, 150, 0, 0, 0],
                         [0, 0, 299, 0, 0], [0, 0, 0, 299, 0], [0, 0, 0, 0, 299]])
    np.testing.assert_array_equal(_held(plan), expected)
    assert [c.domain for c in plan.clients] == ["15", "15", "30", "30", "45", "60", "75"]


@pytest.mark.parametrize("data,target,n", [(DIGITS, "0", 5), (DIGITS, "45", 7), (DIGITS, "0", 13), (RECT4, "d0", 3),
                                           (RECT4, "d1", 7), (RECT4, "d3", 2)])
def test_lambda_zero_gives_every_client_the_domain_proportions(data, target, n):
    plan = _plan(data, 0.0, n, target=target)
    held = _held(plan)
    sizes = np.array([len(data[1][d]) for d in plan.source_domains])
    # exact counts: floor(n_d / N) each, the first n_d mod N clients one more
    expected = sizes[None, :] // n + (np.arange(n)[:, None] < (sizes % n)[None, :])
    np.testing.assert_array_equal(held, expected)
    props = held / held.sum(axis=1, keepdims=True)
    assert np.abs(props - sizes / sizes.sum()).max() < 1.0 / held.sum(axis=1).min() + 1e-12
    assert all(c.domain is None for c in plan.clients)


def test_fewer_clients_than_domains_packs_whole_domains_at_lambda_one():
    info, labels = DIGITS
    plan = make_plan(info, labels, setting="fdg", target_domain="0", num_clients=2, domain_heterogeneity=1.0)
    held = _held(plan)
    # largest first, each to the emptiest client: 15 -> 0, 30 -> 1, 45 -> 0, 60 -> 1, 75 -> 0
    np.testing.assert_array_equal(held, [[300, 0, 299, 0, 299], [0, 300, 0, 299, 0]])
    assert [c.domain for c in plan.clients] == [None, None]


# ----------------------------------------------------------------------------- in between
def _reference_float_counts(sizes, n, lam):
    m = _main_clients_reference(sizes, n)
    main = np.repeat(np.arange(len(sizes)), m)
    onehot = (main[:, None] == np.arange(len(sizes))[None, :]).astype(np.float64)
    sizes = np.asarray(sizes, np.float64)
    return sizes * (lam * onehot / np.asarray(m, np.float64) + (1 - lam) / n)


@pytest.mark.parametrize("lam", [0.1, 0.25, 0.5, 0.8, 0.999])
def test_intermediate_counts_are_the_authors_mix_rounded_per_domain(lam):
    sizes = [300, 300, 299, 299, 299]
    counts = heterogeneity_counts(sizes, 7, lam)
    exact = _reference_float_counts(sizes, 7, lam)
    assert np.abs(counts - exact).max() < 1
    np.testing.assert_array_equal(counts.sum(axis=0), sizes)


def _mixing(plan) -> float:
    """Mean total-variation distance of a client's domain mix from the sources' mix."""
    held = _held(plan).astype(np.float64)
    q = held.sum(axis=0) / held.sum()
    p = held / held.sum(axis=1, keepdims=True)
    return float(0.5 * np.abs(p - q).sum(axis=1).mean())


@pytest.mark.parametrize("data,n", [(DIGITS, 7), (DIGITS, 3), (RECT4, 6)])
def test_heterogeneity_measure_rises_monotonically_with_lambda(data, n):
    lams = [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    tv = [_mixing(_plan(data, lam, n, target=data[0].domains[0])) for lam in lams]
    assert tv[0] < 0.01
    assert all(a < b for a, b in zip(tv, tv[1:])), tv


# ----------------------------------------------------------------------------- bookkeeping
@pytest.mark.parametrize("setting", ["fdg", "fda", "ufdg"])
@pytest.mark.parametrize("lam", [0.0, 0.5, 1.0])
def test_every_example_once_no_overlap_with_val_test_or_target(setting, lam):
    info, labels = DIGITS
    plan = _plan(DIGITS, lam, 6, setting=setting, target="30", oracle_fraction=0.2)
    _assert_disjoint_complete(plan, labels)
    src = [c for c in plan.clients if c.role == "source"]
    assert len(src) == 6 and [c.client_id for c in plan.clients] == list(range(len(plan.clients)))
    assert all("30" not in c.train and "30" not in c.val for c in src)
    if setting == "fda":
        assert plan.clients[-1].name == "target" and plan.clients[-1].domain == "30"
    for c in src:  # validation: round(0.2 n), its domain mix that of the client (one example per domain)
        n = c.num_train + sum(len(v) for v in c.val.values())
        nv = sum(len(v) for v in c.val.values())
        assert nv == round(0.2 * n)
        for d in c.train:
            share = (len(c.train[d]) + len(c.val.get(d, ()))) / n
            assert abs(len(c.val.get(d, ())) - share * nv) < 1


def test_plan_is_deterministic_and_follows_the_seed():
    a, b = _plan(DIGITS, 0.5, 7, seed=3), _plan(DIGITS, 0.5, 7, seed=3)
    c = _plan(DIGITS, 0.5, 7, seed=4)
    for x, y in zip(a.clients, b.clients):
        assert x.train.keys() == y.train.keys() and x.val.keys() == y.val.keys()
        for d in x.train:
            np.testing.assert_array_equal(x.train[d], y.train[d])
            np.testing.assert_array_equal(x.val[d], y.val[d])
    np.testing.assert_array_equal(_held(a), _held(c))  # counts depend on sizes and lambda only
    assert any(not np.array_equal(x.train[d], y.train[d]) for x, y in zip(a.clients, c.clients) for d in x.train)


def test_null_heterogeneity_keeps_the_clients_per_domain_split():
    info, labels = DIGITS
    old = make_plan(info, labels, setting="fdg", target_domain="0", clients_per_domain=2, num_clients=3)
    assert [c.name for c in old.clients] == [f"{d}#{k}" for d in old.source_domains for k in (0, 1)]
    cfg = FederatedRunConfig.from_dict({"dataset": "rect4"})
    assert cfg.domain_heterogeneity is None
    assert cfg.trial_id() != FederatedRunConfig.from_dict({"dataset": "rect4", "domain_heterogeneity": 1.0}).trial_id()


# ----------------------------------------------------------------------------- errors
@pytest.mark.parametrize("kw,match", [
    ({"domain_heterogeneity": 1.5}, r"field 'domain_heterogeneity': 1.5 is out of range; allowed: >= 0 and <= 1"),
    ({"domain_heterogeneity": -0.1}, r"field 'domain_heterogeneity': -0.1 is out of range"),
    ({"domain_heterogeneity": math.nan}, r"field 'domain_heterogeneity': nan"),
    ({"domain_heterogeneity": True}, r"field 'domain_heterogeneity': True is out of range"),
    ({"domain_heterogeneity": 0.5, "clients_per_domain": 2},
     r"fields 'domain_heterogeneity' and 'clients_per_domain': .* set clients_per_domain to 1, not 2"),
    ({"domain_heterogeneity": 0.5, "setting": "fl"}, r"field 'domain_heterogeneity': setting 'fl' pools every domain"),
    # 3 sources of 500, 400 clients: 134 + 133 + 133 clients; 500 = 134 * 3 + 98, so client 98 gets 3
    ({"domain_heterogeneity": 1.0, "num_clients": 400},
     r"field 'num_clients': 400 clients with domain_heterogeneity=1.0 leave client 98 3 examples .* at least 4"),
])
def test_bad_values_are_one_line_config_errors(kw, match):
    info, labels = RECT4
    kw = {"setting": "fdg", "target_domain": None, **kw}
    with pytest.raises(ConfigError, match=match) as e:
        make_plan(info, labels, **kw)
    assert "\n" not in str(e.value)


def test_config_bounds_and_build_plan_errors():
    with pytest.raises(ConfigError, match=r"field 'domain_heterogeneity': 2.0 is out of range; allowed: >= 0 and <= 1"):
        FederatedRunConfig.from_dict({"dataset": "rect4", "domain_heterogeneity": 2})
    cfg = FederatedRunConfig.from_dict({"dataset": "rect4", "domain_heterogeneity": 0.5, "clients_per_domain": 3})
    with pytest.raises(ConfigError, match="clients_per_domain to 1, not 3"):
        build_plan(cfg)
    plan = build_plan(FederatedRunConfig.from_dict({"dataset": "rect4", "domain_heterogeneity": 0.5, "num_clients": 5}))
    assert plan.num_clients == 5 and plan.source_domains == ("d1", "d2", "d3")


# ----------------------------------------------------------------------------- a run
def test_two_round_local_run_with_partial_participation_samples_the_new_clients(tmp_path, monkeypatch):
    from fedtune.runtime.driver import run

    calls = []
    real = partition.sample_participants

    def spy(num_clients, participation, seed, round):  # noqa: A002 - the API's name
        ids = real(num_clients, participation, seed, round)
        calls.append((num_clients, participation, ids.tolist()))
        return ids

    monkeypatch.setattr(partition, "sample_participants", spy)
    base = {"dataset": "rotated-digits", "setting": "fdg", "rounds": 2, "local_steps": 2, "batch_size": 16,
            "model": "mlp", "mlp_hidden": [16], "backend": "local", "num_clients": 8, "participation": 0.5}
    result = run(FederatedRunConfig.from_dict({**base, "domain_heterogeneity": 0.5, "output": str(tmp_path / "a"),
                                               "name": "het"}), progress=False)
    assert result.status == "completed" and len(result.rows) == 2
    assert [c[:2] for c in calls] == [(8, 0.5), (8, 0.5)], "participation samples among the 8 new clients"
    assert all(len(ids) == 4 and set(ids) <= set(range(8)) for _, _, ids in calls)
    for row in result.rows:
        assert row["num_participants"] == 4
        for key in ("train_loss", "val_acc", "target_acc"):
            assert math.isfinite(row[key]), key
    # the partition matters: the same run with lambda = 1 (one domain per client) trains differently
    other = run(FederatedRunConfig.from_dict({**base, "domain_heterogeneity": 1.0, "output": str(tmp_path / "b"),
                                              "name": "sep"}), progress=False)
    assert other.rows[-1]["train_loss"] != result.rows[-1]["train_loss"]
