"""Domain homogeneity lambda (Bai, Bagchi & Inouye, ICLR 2024; their code's ``iid``): source domains over
num_clients clients. lambda = 1 homogeneous, 0 one domain per client (their Figure 1)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

import fedtune.data.partition as partition
import fedtune.runtime.coordinator as coordinator
from fedtune.config import FederatedRunConfig
from fedtune.data.base import FederatedPlan
from fedtune.data.heterogeneity import homogeneity_counts
from fedtune.data.partition import make_plan
from fedtune.data.registry import get_dataset
from fedtune.errors import ConfigError, shown
from fedtune.runtime.driver import build_plan


def _data(name):
    ds = get_dataset(name)
    return ds.info, {d: ds.labels(d) for d in ds.info.domains}


DIGITS = _data("rotated-digits")  # 6 domains: 300, 300, 300, 299, 299, 299
RECT4 = _data("rect4")  # 4 domains of 500


def _plan(data, lam, num_clients, setting="fdg", target="0", **kw) -> FederatedPlan:
    info, labels = data
    return make_plan(info, labels, setting=setting, target_domain=target, num_clients=num_clients,
                     domain_homogeneity=lam, **kw)


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


def _noniid_splitter_counts(sizes, num_shards, iid):
    """The authors' ``NonIIDSplitter.split`` (inouye-lab/FedDG_Benchmark, src/splitter.py), its counts
    part restated line for line in float64, ``iid`` = lambda. One change: ``argsort(kind="stable")``,
    the order their pinned numpy 1.24 gives for up to 16 domains (see the module under test)."""
    num_examples_per_domain = np.asarray(sizes, dtype=np.int64)
    num_domains = len(num_examples_per_domain)
    if num_domains <= num_shards:
        main_shards_per_domain = np.ones(num_domains, dtype=np.int64)
        while np.sum(main_shards_per_domain) < num_shards:
            ratio = num_examples_per_domain.astype(float) / main_shards_per_domain.astype(float)
            main_shards_per_domain[np.argmax(ratio)] += 1
        main_domain_per_shards = []
        for i, num_shard in enumerate(main_shards_per_domain):
            main_domain_per_shards += [i] * int(num_shard)
        main_ratio = np.array([1 / u for u in main_shards_per_domain])
        rows = []
        for main_domain in main_domain_per_shards:
            onehot = np.zeros(num_domains)
            onehot[main_domain] = 1
            rows.append(num_examples_per_domain * (main_ratio * onehot * (1 - iid) + 1 / num_shards * iid))
        floating = np.array(rows)
        truncated = floating.astype(int)
        diff = np.rint(np.sum(floating - truncated, axis=0)).astype(int)
        mask = np.zeros((num_shards, num_domains))
        for col in range(num_domains):
            mask[0:diff[col], col] = 1
        return np.rint(truncated + mask).astype(int)
    shards_0 = np.zeros((num_shards, num_domains))
    for idx in np.argsort(num_examples_per_domain, kind="stable")[::-1]:
        amin = np.argmin(np.sum(shards_0, axis=1))
        shards_0[amin, idx] = num_examples_per_domain[idx]
    shards_1 = np.zeros((num_shards, num_domains))
    for shard in shards_1:
        shard += num_examples_per_domain / num_shards
    final = np.floor(shards_1 * iid + shards_0 * (1 - iid)).astype(int)
    for i, diff in enumerate((num_examples_per_domain - np.sum(final, axis=0)).astype(int)):
        for d in range(diff):
            final[d, i] += 1
    return final


# ----------------------------------------------------------------------------- the authors' counts
@pytest.mark.parametrize("lam", [0.0, 0.1, 0.5, 1.0])
def test_tied_domain_sizes_pack_as_the_authors_reversed_argsort(lam):
    # the case: sizes (40, 60, 60, 80, 40), 3 clients; reversed stable argsort 3, 2, 1, 4, 0:
    # 3 -> client 0, 2 -> 1, 1 -> 2, 4 -> 1 (60 < 80), 0 -> 2 (60 < 80, 100): {3}, {2, 4}, {0, 1}
    sizes = [40, 60, 60, 80, 40]
    counts = homogeneity_counts(sizes, 3, lam)
    np.testing.assert_array_equal(counts, _noniid_splitter_counts(sizes, 3, lam))
    if lam == 0.0:
        np.testing.assert_array_equal(counts, [[0, 0, 0, 80, 0], [0, 0, 60, 0, 40], [40, 60, 0, 0, 0]])


def _random_cases(count, seed):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        d = int(rng.integers(1, 8))
        sizes = rng.integers(1, 60, size=d)
        if d > 1:  # force ties
            sizes[rng.integers(0, d)] = sizes[rng.integers(0, d)]
        yield sizes.tolist(), int(rng.integers(1, 10)), float(rng.choice([0.0, 0.1, 0.25, 1 / 3, 0.5, 0.7, 0.9, 1.0]))


def test_authors_rounding_equals_the_authors_counts_on_random_tied_cases():
    for sizes, n, lam in _random_cases(600, 11):
        np.testing.assert_array_equal(homogeneity_counts(sizes, n, lam, "authors"),
                                      _noniid_splitter_counts(sizes, n, lam), err_msg=f"{sizes} {n} {lam}")


def test_authors_rounding_gives_leftovers_to_the_first_clients_largest_remainder_does_not():
    # 300 and 299 examples, 4 clients, lambda 0: main clients 0, 1 (domain 0) and 2, 3 (domain 1);
    # 299 / 2 truncates to 149 twice, the one left over goes to client 0, whose domain is the other
    authors = homogeneity_counts([300, 299], 4, 0.0, "authors")
    np.testing.assert_array_equal(authors, [[150, 1], [150, 0], [0, 149], [0, 149]])
    exact = homogeneity_counts([300, 299], 4, 0.0, "largest-remainder")
    np.testing.assert_array_equal(exact, [[150, 0], [150, 0], [0, 150], [0, 149]])


@pytest.mark.parametrize("rounding", ["authors", "largest-remainder"])
def test_plan_holds_the_counts(rounding):
    info, labels = DIGITS
    plan = _plan(DIGITS, 0.1, 7, domain_homogeneity_rounding=rounding)
    sizes = [len(labels[d]) for d in plan.source_domains]
    np.testing.assert_array_equal(_held(plan), homogeneity_counts(sizes, 7, 0.1, rounding))
    if rounding == "authors":
        np.testing.assert_array_equal(_held(plan), _noniid_splitter_counts(sizes, 7, 0.1))


# ----------------------------------------------------------------------------- the two ends
@pytest.mark.parametrize("data,target,n", [(DIGITS, "0", 5), (DIGITS, "0", 7), (DIGITS, "30", 12), (RECT4, "d2", 3),
                                           (RECT4, "d0", 8)])
def test_lambda_zero_gives_each_client_one_domain_spread_evenly(data, target, n):
    plan = _plan(data, 0.0, n, target=target, domain_homogeneity_rounding="largest-remainder")
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


@pytest.mark.parametrize("rounding", ["authors", "largest-remainder"])
def test_lambda_zero_hand_counted_on_rotated_digits(rounding):
    plan = _plan(DIGITS, 0.0, 7, domain_homogeneity_rounding=rounding)  # sources 15, 30 (300), 45, 60, 75 (299)
    assert plan.source_domains == ("15", "30", "45", "60", "75")
    expected = np.array([[150, 0, 0, 0, 0], [150, 0, 0, 0, 0], [0, 150, 0, 0, 0], [0, 150, 0, 0, 0],
                         [0, 0, 299, 0, 0], [0, 0, 0, 299, 0], [0, 0, 0, 0, 299]])
    np.testing.assert_array_equal(_held(plan), expected)
    assert [c.domain for c in plan.clients] == ["15", "15", "30", "30", "45", "60", "75"]


@pytest.mark.parametrize("rounding", ["authors", "largest-remainder"])
@pytest.mark.parametrize("data,target,n", [(DIGITS, "0", 5), (DIGITS, "45", 7), (DIGITS, "0", 13), (RECT4, "d0", 3),
                                           (RECT4, "d1", 7), (RECT4, "d3", 2)])
def test_lambda_one_gives_every_client_the_domain_proportions(data, target, n, rounding):
    plan = _plan(data, 1.0, n, target=target, domain_homogeneity_rounding=rounding)
    held = _held(plan)
    sizes = np.array([len(data[1][d]) for d in plan.source_domains])
    # exact counts: floor(n_d / N) each, the first n_d mod N clients one more
    expected = sizes[None, :] // n + (np.arange(n)[:, None] < (sizes % n)[None, :])
    np.testing.assert_array_equal(held, expected)
    props = held / held.sum(axis=1, keepdims=True)
    assert np.abs(props - sizes / sizes.sum()).max() < 1.0 / held.sum(axis=1).min() + 1e-12
    assert all(c.domain is None for c in plan.clients)


def test_fewer_clients_than_domains_packs_whole_domains_at_lambda_zero():
    info, labels = DIGITS
    plan = make_plan(info, labels, setting="fdg", target_domain="0", num_clients=2, domain_homogeneity=0.0)
    held = _held(plan)
    # reversed stable argsort of (300, 300, 299, 299, 299): 30, 15, 75, 60, 45; each to the emptiest
    # client (ties: the lower): 30 -> 0, 15 -> 1, 75 -> 0, 60 -> 1, 45 -> 0
    np.testing.assert_array_equal(held, [[0, 300, 299, 0, 299], [300, 0, 0, 299, 0]])
    assert [c.domain for c in plan.clients] == [None, None]


def test_the_papers_heterogeneous_lambda_keeps_clients_mostly_on_one_domain():
    # Figure 1: lambda = 0.1 is "heterogeneous": a main client holds 0.9 n_d / m_d + 0.1 n_d / N of
    # its domain, so at least 90 % of a client's examples come from its main domain here
    held = _held(_plan(DIGITS, 0.1, 5))
    assert (held.max(axis=1) / held.sum(axis=1) > 0.9).all(), held


# ----------------------------------------------------------------------------- in between
def _reference_float_counts(sizes, n, lam):
    m = _main_clients_reference(sizes, n)
    main = np.repeat(np.arange(len(sizes)), m)
    onehot = (main[:, None] == np.arange(len(sizes))[None, :]).astype(np.float64)
    sizes = np.asarray(sizes, np.float64)
    return sizes * ((1 - lam) * onehot / np.asarray(m, np.float64) + lam / n)


@pytest.mark.parametrize("rounding", ["authors", "largest-remainder"])
@pytest.mark.parametrize("lam", [0.001, 0.2, 0.5, 0.75, 0.9])
def test_intermediate_counts_are_the_authors_mix_rounded_per_domain(lam, rounding):
    sizes = [300, 300, 299, 299, 299]
    counts = homogeneity_counts(sizes, 7, lam, rounding)
    exact = _reference_float_counts(sizes, 7, lam)
    assert np.abs(counts - exact).max() < 1 + (rounding == "authors")  # authors: a leftover on a truncated entry
    np.testing.assert_array_equal(counts.sum(axis=0), sizes)


def _mixing(plan) -> float:
    """Mean total-variation distance of a client's domain mix from the sources' mix."""
    held = _held(plan).astype(np.float64)
    q = held.sum(axis=0) / held.sum()
    p = held / held.sum(axis=1, keepdims=True)
    return float(0.5 * np.abs(p - q).sum(axis=1).mean())


@pytest.mark.parametrize("data,n", [(DIGITS, 7), (DIGITS, 3), (RECT4, 6)])
def test_heterogeneity_measure_falls_monotonically_with_lambda(data, n):
    lams = [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    tv = [_mixing(_plan(data, lam, n, target=data[0].domains[0])) for lam in lams]
    assert tv[-1] < 0.01
    assert all(a > b for a, b in zip(tv, tv[1:])), tv


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


def test_null_homogeneity_keeps_the_clients_per_domain_split():
    info, labels = DIGITS
    old = make_plan(info, labels, setting="fdg", target_domain="0", clients_per_domain=2, num_clients=3)
    assert [c.name for c in old.clients] == [f"{d}#{k}" for d in old.source_domains for k in (0, 1)]
    cfg = FederatedRunConfig.from_dict({"dataset": "rect4"})
    assert cfg.domain_homogeneity is None
    assert cfg.trial_id() != FederatedRunConfig.from_dict({"dataset": "rect4", "domain_homogeneity": 1.0}).trial_id()


# ----------------------------------------------------------------------------- errors
@pytest.mark.parametrize("kw,match", [
    ({"domain_homogeneity": 1.5}, r"field 'domain_homogeneity': 1.5 is out of range; allowed: >= 0 and <= 1"),
    ({"domain_homogeneity": -0.1}, r"field 'domain_homogeneity': -0.1 is out of range"),
    ({"domain_homogeneity": math.nan}, r"field 'domain_homogeneity': nan"),
    ({"domain_homogeneity": True}, r"field 'domain_homogeneity': True is out of range"),
    ({"domain_homogeneity": 0.5, "clients_per_domain": 2},
     r"fields 'domain_homogeneity' and 'clients_per_domain': .* set clients_per_domain to 1, not 2"),
    ({"domain_homogeneity": 0.5, "setting": "fl"}, r"field 'domain_homogeneity': setting 'fl' pools every domain"),
    # 3 sources of 500, 300 clients at lambda 1: floor(500 / 300) = 1 of each domain, the first 200 clients
    # one more, so client 200 holds 3 (1500 examples would allow 375 clients of 4)
    ({"domain_homogeneity": 1.0, "num_clients": 300, "domain_homogeneity_rounding": "largest-remainder"},
     r"field 'num_clients': 300 clients with domain_homogeneity=1.0 leave client 200 3 examples .* at least 4"),
    # 400 clients need 1600 examples: refused before any count is computed
    ({"domain_homogeneity": 0.0, "num_clients": 400, "domain_homogeneity_rounding": "largest-remainder"},
     r"^field 'num_clients': 400 clients with domain_homogeneity=0.0 need at least 4 examples each, but the 3 source "
     r"domain\(s\) hold only 1500; allowed: at most 375 \(lower num_clients\)$"),
    ({"domain_homogeneity": 0.5, "domain_homogeneity_rounding": "nearest"},
     r"field 'domain_homogeneity_rounding': 'nearest' is not allowed; allowed: authors, largest-remainder"),
])
def test_bad_values_are_one_line_config_errors(kw, match):
    info, labels = RECT4
    kw = {"setting": "fdg", "target_domain": None, **kw}
    with pytest.raises(ConfigError, match=match) as e:
        make_plan(info, labels, **kw)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("setting", ["fdg", "fda", "ufdg"])
@pytest.mark.parametrize("rounding", ["authors", "largest-remainder"])
@pytest.mark.parametrize("num_clients", [376, 10**9, 2**63 - 1])
def test_too_many_clients_are_refused_before_any_per_client_work(monkeypatch, setting, rounding, num_clients):
    # 10**9 clients at lambda 0.1 used to run the greedy split client by client (minutes, then memory)
    def computed(*args):
        raise AssertionError("homogeneity_counts ran")

    monkeypatch.setattr(partition, "homogeneity_counts", computed)
    info, labels = RECT4  # target d0: 3 sources of 500, at most 1500 // 4 = 375 clients
    with pytest.raises(ConfigError) as e:
        make_plan(info, labels, setting=setting, target_domain=None, num_clients=num_clients, domain_homogeneity=0.1,
                  domain_homogeneity_rounding=rounding)
    assert str(e.value) == (f"field 'num_clients': {num_clients} clients with domain_homogeneity=0.1 need at least 4 "
                            "examples each, but the 3 source domain(s) hold only 1500; allowed: at most 375 (lower "
                            "num_clients)")


@pytest.mark.parametrize("rounding", ["authors", "largest-remainder"])
def test_the_most_clients_allowed_still_get_a_plan(rounding):
    info, labels = RECT4
    plan = make_plan(info, labels, setting="fdg", target_domain=None, num_clients=375, domain_homogeneity=0.0,
                     domain_homogeneity_rounding=rounding)
    assert plan.num_clients == 375 and (_held(plan).sum(axis=1) == 4).all()


def _separated_owner_reference(sizes, n):
    """The authors' packing restated: whole domains, largest first (equal sizes: the later domain),
    each to the client holding the fewest examples so far (ties: the lower client)."""
    totals, owner = [0] * n, [0] * len(sizes)
    for d in sorted(range(len(sizes)), key=lambda d: (-sizes[d], -d)):
        s = min(range(n), key=lambda i: (totals[i], i))
        owner[d], totals[s] = s, totals[s] + sizes[d]
    return owner


def test_the_split_of_many_clients_over_many_domains_equals_the_greedy_one_step_at_a_time():
    from fedtune.data.heterogeneity import main_clients_per_domain, separated_owner

    rng = np.random.default_rng(5)
    for _ in range(60):
        d = int(rng.integers(1, 40))
        sizes = rng.integers(1, 400, size=d)
        sizes[rng.integers(0, d, size=d // 3)] = sizes[0]  # ties
        sizes = sizes.tolist()
        many = int(rng.integers(d, 300))
        assert main_clients_per_domain(sizes, many) == _main_clients_reference(sizes, many)
        few = int(rng.integers(1, d + 1))
        assert separated_owner(sizes, few) == _separated_owner_reference(sizes, few)


@pytest.mark.parametrize("value,flipped", [(0.1, " = 0.9"), (1, " = 0"), (2.5, ""), ("x", "")])
def test_the_old_name_is_refused_in_one_line_saying_what_changed(value, flipped):
    with pytest.raises(ConfigError) as e:
        FederatedRunConfig.from_dict({"dataset": "rect4", "domain_heterogeneity": value}, source="my.yaml")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("my.yaml: field 'domain_heterogeneity' was renamed domain_homogeneity")
    assert "direction flipped" in msg and msg.endswith(f"set domain_homogeneity = 1 - {shown(value, 40)}{flipped}")


def test_the_old_name_with_null_still_reads_and_keeps_trial_ids():
    # studies saved before the rename hold domain_heterogeneity: null in every trial's config
    old = FederatedRunConfig.from_dict({"dataset": "rect4", "domain_heterogeneity": None})
    new = FederatedRunConfig.from_dict({"dataset": "rect4"})
    assert old == new and old.domain_homogeneity is None
    payload = {k: v for k, v in new.to_dict().items() if not k.startswith("domain_homogeneity")}
    assert new.trial_id() == FederatedRunConfig.from_dict(payload).trial_id()


def test_old_name_in_a_yaml_config_and_set_is_refused(tmp_path, capsys):
    from fedtune.cli import main

    path = tmp_path / "c.yaml"
    path.write_text("dataset: rect4\ndomain_heterogeneity: 0.25\n")
    with pytest.raises(ConfigError, match=rf"{path}: field 'domain_heterogeneity' was renamed .* = 0.75$"):
        FederatedRunConfig.from_yaml(path)
    assert main(["partition", "--set", "domain_heterogeneity=0.1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "command line: field 'domain_heterogeneity' was renamed" in err


def test_config_bounds_and_build_plan_errors():
    with pytest.raises(ConfigError, match=r"field 'domain_homogeneity': 2.0 is out of range; allowed: >= 0 and <= 1"):
        FederatedRunConfig.from_dict({"dataset": "rect4", "domain_homogeneity": 2})
    cfg = FederatedRunConfig.from_dict({"dataset": "rect4", "domain_homogeneity": 0.5, "clients_per_domain": 3})
    with pytest.raises(ConfigError, match="clients_per_domain to 1, not 3"):
        build_plan(cfg)
    plan = build_plan(FederatedRunConfig.from_dict({"dataset": "rect4", "domain_homogeneity": 0.5, "num_clients": 5}))
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

    monkeypatch.setattr(coordinator, "sample_participants", spy)  # where the coordinator looks it up
    base = {"dataset": "rotated-digits", "setting": "fdg", "rounds": 2, "local_steps": 2, "batch_size": 16,
            "model": "mlp", "mlp_hidden": [16], "backend": "local", "num_clients": 8, "participation": 0.5}
    result = run(FederatedRunConfig.from_dict({**base, "domain_homogeneity": 0.5, "output": str(tmp_path / "a"),
                                               "name": "het"}), progress=False)
    assert result.status == "completed" and len(result.rows) == 2
    assert [c[:2] for c in calls] == [(8, 0.5), (8, 0.5)], "participation samples among the 8 new clients"
    assert all(len(ids) == 4 and set(ids) <= set(range(8)) for _, _, ids in calls)
    for row in result.rows:
        assert row["num_participants"] == 4
        for key in ("train_loss", "val_acc", "target_acc"):
            assert math.isfinite(row[key]), key
    # the partition matters: the same run with lambda = 0 (one domain per client) trains differently
    other = run(FederatedRunConfig.from_dict({**base, "domain_homogeneity": 0.0, "output": str(tmp_path / "b"),
                                              "name": "sep"}), progress=False)
    assert other.rows[-1]["train_loss"] != result.rows[-1]["train_loss"]


def test_old_name_in_a_search_space_is_refused_in_one_line(tmp_path):
    from fedtune.spaces.lookup import load_space

    path = tmp_path / "space.yaml"
    path.write_text("algorithm: fedavg\nparams:\n  domain_heterogeneity: {distribution: fixed, value: 0.1}\n")
    with pytest.raises(ConfigError, match=r"params.domain_heterogeneity: field 'domain_heterogeneity' was renamed "
                                          r"domain_homogeneity and its direction flipped") as e:
        load_space(path)
    assert "\n" not in str(e.value)
