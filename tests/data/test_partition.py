"""Federated plans: fdg / fda / ufdg / fl partitions and participant sampling."""

from __future__ import annotations

import numpy as np
import pytest

from fedtune.data.partition import SETTINGS, make_plan, sample_participants
from fedtune.errors import DataError
from fedtune.data.base import DatasetInfo, FederatedPlan
from fedtune.data.registry import get_dataset


def _info(domains, classes=("a", "b", "c"), name="toy") -> DatasetInfo:
    return DatasetInfo(name=name, domains=tuple(domains), classes=tuple(classes),
                       input_shape=(2,), default_model="mlp", default_setting="fdg")


# 3 domains with hand-countable sizes; labels cycle 0,1,2
TOY = _info(["A", "B", "C"])
TOY_LABELS = {d: np.arange(n, dtype=np.int64) % 3 for d, n in {"A": 30, "B": 40, "C": 50}.items()}


def _all_pieces(plan: FederatedPlan) -> list[dict]:
    out = []
    for c in plan.clients:
        out += [c.train, c.val, c.test]
    return out + [plan.target_test, plan.target_probe, plan.target_oracle]


def _assert_disjoint_complete(plan: FederatedPlan, labels: dict) -> None:
    seen = {d: [] for d in labels}
    for pieces in _all_pieces(plan):
        for d, idx in pieces.items():
            assert idx.dtype == np.int64
            assert np.all(np.diff(idx) > 0), "indices sorted and unique inside a piece"
            seen[d].append(idx)
    for d, y in labels.items():
        allidx = np.concatenate(seen[d]) if seen[d] else np.zeros(0, np.int64)
        assert len(allidx) == len(np.unique(allidx)), f"overlap in domain {d}"
        np.testing.assert_array_equal(np.sort(allidx), np.arange(len(y)))


def _n(pieces) -> int:
    return int(sum(len(v) for v in pieces.values()))


# ----------------------------------------------------------------------------- fdg
def test_settings_constant():
    assert SETTINGS == ("fdg", "fl", "fda", "ufdg")


def test_fdg_lodo_default_target_and_sizes():
    plan = make_plan(TOY, TOY_LABELS, setting="fdg", target_domain=None, oracle_fraction=0.0)
    assert plan.setting == "fdg"
    assert plan.target_domains == ("A",) and plan.source_domains == ("B", "C")
    assert [c.name for c in plan.clients] == ["B#0", "C#0"]
    assert [c.client_id for c in plan.clients] == [0, 1]
    assert all(c.role == "source" and c.domain == c.name.split("#")[0] for c in plan.clients)
    # val = round(0.2 * n): 8 of 40, 10 of 50
    assert [(_n(c.train), _n(c.val)) for c in plan.clients] == [(32, 8), (40, 10)]
    assert all(set(c.train) == {c.domain} for c in plan.clients)
    np.testing.assert_array_equal(plan.target_test["A"], np.arange(30))
    assert plan.target_probe == {} and plan.participation == 1.0
    _assert_disjoint_complete(plan, TOY_LABELS)


def test_fdg_target_never_in_clients():
    for target in TOY.domains:
        plan = make_plan(TOY, TOY_LABELS, setting="fdg", target_domain=target)
        for c in plan.clients:
            assert target not in c.train and target not in c.val and target not in c.test
        assert set(plan.target_test) == {target}
        _assert_disjoint_complete(plan, TOY_LABELS)


def test_fdg_several_clients_per_domain():
    plan = make_plan(TOY, TOY_LABELS, setting="fdg", target_domain="C", clients_per_domain=3)
    assert [c.name for c in plan.clients] == ["A#0", "A#1", "A#2", "B#0", "B#1", "B#2"]
    sizes = [_n(c.train) + _n(c.val) for c in plan.clients]
    assert sizes == [10, 10, 10, 14, 13, 13]
    assert [_n(c.val) for c in plan.clients] == [2, 2, 2, 3, 3, 3]  # round(0.2 * n)
    _assert_disjoint_complete(plan, TOY_LABELS)


def test_val_fraction_zero_and_minimum_one():
    plan = make_plan(TOY, TOY_LABELS, setting="fdg", target_domain="A", val_fraction=0.0)
    assert all(c.val == {} for c in plan.clients)
    plan = make_plan(TOY, TOY_LABELS, setting="fdg", target_domain="A", val_fraction=0.001)
    assert all(_n(c.val) == 1 for c in plan.clients)  # at least 1 when val_fraction > 0


def test_fdg_on_rotated_digits_complete():
    ds = get_dataset("rotated-digits")
    labels = {d: ds.labels(d) for d in ds.info.domains}
    plan = make_plan(ds.info, labels, setting="fdg", target_domain="45", clients_per_domain=2)
    assert len(plan.clients) == 10
    _assert_disjoint_complete(plan, labels)


# ----------------------------------------------------------------------------- fda / ufdg
def test_fda_target_client():
    plan = make_plan(TOY, TOY_LABELS, setting="fda", target_domain="C", target_fraction=0.1, val_fraction=0.0,
                     oracle_fraction=0.0)
    assert [c.name for c in plan.clients] == ["A#0", "B#0", "target"]
    t = plan.clients[-1]
    assert (t.role, t.domain, t.client_id) == ("target", "C", 2)
    assert _n(t.train) == 5 and t.val == {}  # round(0.1 * 50); val_fraction 0: no target-val split
    assert _n(plan.target_test) == 45
    # stratified: 50 labels cycling 0,1,2 -> counts 17,17,16 -> 5 taken as 2,2,1 (or similar)
    hist = np.bincount(TOY_LABELS["C"][t.train["C"]], minlength=3)
    assert hist.max() - hist.min() <= 1 and hist.sum() == 5
    _assert_disjoint_complete(plan, TOY_LABELS)


def test_fda_at_least_one_target_example():
    plan = make_plan(TOY, TOY_LABELS, setting="fda", target_domain="A", target_fraction=0.001, oracle_fraction=0.0)
    assert _n(plan.clients[-1].train) == 1 and _n(plan.target_test) == 29


def test_ufdg_probe_split():
    plan = make_plan(TOY, TOY_LABELS, setting="ufdg", target_domain="B", probe_fraction=0.25, oracle_fraction=0.0)
    assert [c.name for c in plan.clients] == ["A#0", "C#0"]
    assert _n(plan.target_probe) == 10 and _n(plan.target_test) == 30  # round(0.25 * 40)
    np.testing.assert_array_equal(np.bincount(TOY_LABELS["B"][plan.target_probe["B"]]), [4, 3, 3])
    _assert_disjoint_complete(plan, TOY_LABELS)


def test_fda_target_val_split_is_disjoint_from_the_target_clients_training_data():
    plan = make_plan(TOY, TOY_LABELS, setting="fda", target_domain="C", target_fraction=0.2, val_fraction=0.25)
    t = plan.clients[-1]
    train, val = t.train["C"], t.val["C"]
    assert len(train) + len(val) == 10 and len(val) == 2  # round(0.2 * 50) labelled, round(0.25 * 10) held out
    assert np.intersect1d(train, val).size == 0
    for other in (plan.target_test["C"], plan.target_oracle["C"]):  # never reported, never the oracle slice
        assert np.intersect1d(other, np.concatenate([train, val])).size == 0
    assert all(c.role == "source" for c in plan.clients[:-1])
    _assert_disjoint_complete(plan, TOY_LABELS)


@pytest.mark.parametrize("setting", ["fdg", "fda", "ufdg"])
def test_oracle_slice_is_held_out_of_the_reported_target_and_fixed_across_seeds(setting):
    labels = {"A": np.arange(200) % 3, "B": np.arange(300) % 3, "C": np.arange(250) % 3}
    plans = [make_plan(TOY, labels, setting=setting, target_domain="B", seed=s, oracle_fraction=0.2)
             for s in (0, 1, 7)]
    slices = [p.target_oracle["B"] for p in plans]
    assert len(slices[0]) == 60 and np.bincount(labels["B"][slices[0]]).tolist() == [20, 20, 20]  # stratified
    for p, sl in zip(plans, slices):
        np.testing.assert_array_equal(sl, slices[0])  # the run seed never moves the slice
        assert np.intersect1d(sl, p.target_test["B"]).size == 0
        _assert_disjoint_complete(p, labels)
    assert _n(plans[0].target_test) + 60 + sum(_n(c.train) + _n(c.val) for c in plans[0].clients
                                               if c.role == "target") + _n(plans[0].target_probe) == 300
    other = make_plan(TOY, labels, setting=setting, target_domain="B", seed=0, oracle_fraction=0.2, data_seed=1)
    assert not np.array_equal(other.target_oracle["B"], slices[0])  # data_seed chooses the slice
    none = make_plan(TOY, labels, setting=setting, target_domain="B", oracle_fraction=0.0)
    assert none.target_oracle == {}
    fl = make_plan(TOY, labels, setting="fl", target_domain=None, oracle_fraction=0.2, num_clients=4)
    assert fl.target_oracle == {}


# ----------------------------------------------------------------------------- fl
def _fl_labels(n_per_class=100, classes=10):
    return {"pool": np.repeat(np.arange(classes), n_per_class).astype(np.int64)}


FL_INFO = _info(["pool"], classes=[str(i) for i in range(10)], name="pool")


def _mean_max_share(plan, labels):
    shares = []
    for c in plan.clients:
        ys = np.concatenate([labels[d][idx] for p in (c.train, c.val, c.test) for d, idx in p.items()])
        h = np.bincount(ys, minlength=10)
        shares.append(h.max() / h.sum())
    return float(np.mean(shares))


def test_fl_shape_and_completeness():
    labels = _fl_labels()
    plan = make_plan(FL_INFO, labels, setting="fl", target_domain=None, num_clients=8,
                     participation=0.5)
    assert plan.setting == "fl" and plan.participation == 0.5
    assert [c.name for c in plan.clients] == [f"client-{i}" for i in range(8)]
    assert all(c.domain is None and c.role == "source" for c in plan.clients)
    assert plan.source_domains == ("pool",) and plan.target_domains == () and plan.target_test == {}
    for c in plan.clients:
        n = _n(c.train) + _n(c.val) + _n(c.test)
        assert n >= 4
        assert _n(c.test) == max(1, round(0.2 * n))
        assert _n(c.val) == max(1, round(0.2 * n))
    _assert_disjoint_complete(plan, labels)


def test_fl_pools_several_domains():
    ds = get_dataset("rect4")
    labels = {d: ds.labels(d) for d in ds.info.domains}
    plan = make_plan(ds.info, labels, setting="fl", target_domain=None, num_clients=5,
                     dirichlet_alpha=100.0)
    assert plan.source_domains == ds.info.domains
    assert any(len(c.train) > 1 for c in plan.clients)  # clients mix domains
    _assert_disjoint_complete(plan, labels)


def test_fl_dirichlet_alpha_controls_skew():
    labels = _fl_labels()
    uniform = make_plan(FL_INFO, labels, setting="fl", target_domain=None, num_clients=10,
                        dirichlet_alpha=1000.0)
    skewed = make_plan(FL_INFO, labels, setting="fl", target_domain=None, num_clients=10,
                       dirichlet_alpha=0.05)
    u, s = _mean_max_share(uniform, labels), _mean_max_share(skewed, labels)
    assert u < 0.15  # 10 classes -> near 0.1 per class (0.105..0.108 over seeds 0..29)
    assert s > 0.45  # about half or more of a client's data is one class (0.53..0.76)
    sizes_u = [(_n(c.train) + _n(c.val) + _n(c.test)) for c in uniform.clients]
    assert min(sizes_u) > 80 and max(sizes_u) < 120  # ~100 each


def test_fl_too_extreme_errors():
    labels = {"pool": np.arange(30, dtype=np.int64) % 3}
    info = _info(["pool"], name="tiny")
    with pytest.raises(DataError, match="num_clients=10 needs at least 4 examples"):
        make_plan(info, labels, setting="fl", target_domain=None, num_clients=10)
    with pytest.raises(DataError, match="dirichlet_alpha=0.001 / num_clients=7 are too extreme"):
        make_plan(info, labels, setting="fl", target_domain=None, num_clients=7,
                  dirichlet_alpha=0.001)


# ----------------------------------------------------------------------------- determinism
def _plan_equal(a: FederatedPlan, b: FederatedPlan) -> bool:
    pa, pb = _all_pieces(a), _all_pieces(b)
    if [c.name for c in a.clients] != [c.name for c in b.clients]:
        return False
    return all(p.keys() == q.keys() and all(np.array_equal(p[k], q[k]) for k in p)
               for p, q in zip(pa, pb))


@pytest.mark.parametrize("setting", SETTINGS)
def test_plans_deterministic_and_seed_dependent(setting):
    labels = {"A": np.arange(200) % 3, "B": np.arange(300) % 3, "C": np.arange(250) % 3}
    kw = dict(setting=setting, target_domain="B", num_clients=6, clients_per_domain=2)
    a = make_plan(TOY, labels, seed=11, **kw)
    b = make_plan(TOY, labels, seed=11, **kw)
    c = make_plan(TOY, labels, seed=12, **kw)
    assert _plan_equal(a, b)
    assert not _plan_equal(a, c)


def test_plan_does_not_touch_global_rng():
    np.random.seed(123)
    expected = np.random.rand()
    np.random.seed(123)
    make_plan(TOY, TOY_LABELS, setting="fl", target_domain=None, num_clients=4)
    assert np.random.rand() == expected


# ----------------------------------------------------------------------------- participants
def test_sample_participants():
    a = sample_participants(20, 0.25, seed=3, round=7)
    assert a.dtype == np.int64 and len(a) == 5 and np.all(np.diff(a) > 0)
    assert a.min() >= 0 and a.max() < 20
    np.testing.assert_array_equal(a, sample_participants(20, 0.25, seed=3, round=7))
    rounds = {tuple(sample_participants(20, 0.25, seed=3, round=r)) for r in range(10)}
    assert len(rounds) > 1  # changes with the round
    np.testing.assert_array_equal(sample_participants(6, 1.0, seed=0, round=0), np.arange(6))
    assert len(sample_participants(10, 0.01, seed=0, round=0)) == 1  # at least one
    with pytest.raises(DataError, match=r"participation must be a number in \(0, 1\]"):
        sample_participants(10, 0.0, seed=0, round=0)


# ----------------------------------------------------------------------------- errors
def test_unknown_target_domain_lists_allowed():
    with pytest.raises(DataError, match=r"target_domain 'Z' is not a domain of 'toy'; choose one of: A, B, C"):
        make_plan(TOY, TOY_LABELS, setting="fdg", target_domain="Z")


@pytest.mark.parametrize("setting", ["fdg", "fda", "ufdg"])
def test_single_domain_needs_fl(setting):
    with pytest.raises(DataError, match="has only 1 domain .*use setting 'fl'"):
        make_plan(FL_INFO, _fl_labels(), setting=setting, target_domain=None)


@pytest.mark.parametrize("field,value,pattern", [
    ("val_fraction", 1.0, r"val_fraction must be a number in \[0, 1\)"),
    ("val_fraction", -0.1, r"val_fraction must be a number in \[0, 1\)"),
    ("test_fraction", 0.0, r"test_fraction must be a number in \(0, 1\)"),
    ("target_fraction", 1.5, r"target_fraction must be a number in \(0, 1\)"),
    ("probe_fraction", 0, r"probe_fraction must be a number in \(0, 1\)"),
    ("participation", 1.2, r"participation must be a number in \(0, 1\]"),
    ("clients_per_domain", 0, r"clients_per_domain must be an integer >= 1"),
    ("num_clients", 0, r"num_clients must be an integer >= 1"),
    ("dirichlet_alpha", 0.0, r"dirichlet_alpha must be a number > 0"),
])
def test_bad_arguments_name_the_field(field, value, pattern):
    with pytest.raises(DataError, match=pattern):
        make_plan(TOY, TOY_LABELS, setting="fdg", target_domain=None, **{field: value})


def test_unknown_setting_and_missing_labels():
    with pytest.raises(DataError, match="setting 'lodo' is unknown; choose one of: fdg, fl, fda, ufdg"):
        make_plan(TOY, TOY_LABELS, setting="lodo", target_domain=None)
    with pytest.raises(DataError, match="labels lack domain 'C'"):
        make_plan(TOY, {"A": TOY_LABELS["A"], "B": TOY_LABELS["B"]}, setting="fdg",
                  target_domain=None)


def test_too_many_clients_per_domain():
    with pytest.raises(DataError, match="fewer than clients_per_domain=31"):
        make_plan(TOY, TOY_LABELS, setting="fdg", target_domain="C", clients_per_domain=31)
