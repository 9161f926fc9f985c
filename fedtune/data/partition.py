"""Federated plans: who holds which examples (computed from labels only, numpy only).

Settings (``SETTINGS``):

* ``fdg`` - leave-one-domain-out. Every source domain is shuffled and cut into
  ``clients_per_domain`` near-equal clients ``"<domain>#<k>"``; each client keeps
  ``round(val_fraction * n)`` examples (at least 1 when ``val_fraction > 0`` and n >= 2, at most
  n - 1) as validation, the rest as train. ``target_test`` is the target domain minus its
  oracle slice (below).
  With ``domain_homogeneity`` lambda set (not None), the source domains are instead spread over
  ``num_clients`` clients ``"client-<i>"`` by Bai et al.'s (ICLR 2024) heterogeneity split
  (:mod:`fedtune.data.heterogeneity`: lambda = 1 every client holds the source-domain proportions,
  lambda = 0 each client one domain when ``num_clients >= len(sources)``); every domain is shuffled
  (the same per-domain stream as above) and cut consecutively in client order. A client's
  ``domain`` is its one domain, None when it holds several; its validation split is
  ``_n_val(n, val_fraction)`` examples stratified by domain. ``clients_per_domain`` must stay 1,
  every client needs :data:`MIN_CLIENT_EXAMPLES`. The fda target client comes on top.
* ``fda`` - as fdg plus one client ``"target"`` (role "target", last in ``clients``) holding
  ``max(1, round(target_fraction * n_target))`` target examples (stratified by class, drawn
  from outside the oracle slice); of these, ``round(val_fraction * k)`` (at least 1 when
  ``val_fraction > 0`` and k >= 2, at most k - 1) are its validation split (the
  ``target-val`` selection protocol's ``target_val_acc``), the rest its train split. The rest
  of the target domain is ``target_test``.
* ``ufdg`` - as fdg; the target domain (minus the oracle slice) is split into ``target_probe``
  (``max(1, round(probe_fraction * n_target))``, stratified) and ``target_test`` (rest).

* ``split_scheme`` (fdg only) - the dataset's split file (:mod:`fedtune.data.split_file`; WILDS'
  and Bai et al.'s protocol) instead of leave-one-domain-out: the file's ``train`` rows are the
  source clients' training examples (cut as above: ``clients_per_domain`` per domain, or
  ``domain_homogeneity`` over ``num_clients``, each domain's train rows shuffled by the same
  per-domain stream), with no per-client validation split (``val_fraction`` unused); ``test`` rows
  are ``target_test`` (``target_domains``: their domains; no oracle slice, ``oracle_fraction``
  unused); ``val`` rows ``ood_val``, ``id_val`` rows ``id_val`` and ``id_test`` rows ``id_test``,
  all scored by the coordinator. ``target_domain`` is unused (the file says what is tested).

**Oracle slice** (fdg/fda/ufdg; DomainBed's test-domain validation): ``target_oracle`` holds
``round(oracle_fraction * n_target)`` examples of the target domain (stratified; at least 1
when ``oracle_fraction > 0``, leaving at least 2 others), drawn from a Generator of
``data_seed`` and the domain only, so the slice is the same for every ``seed`` of a dataset. It
is *always* held out of ``target_test``, whatever selection a study uses, so ``target_acc`` is
measured on the same examples under every protocol; the runtime scores it as ``oracle_acc``.
``oracle_fraction = 0`` gives no slice (and no oracle selection).
* ``fl`` - all domains pooled; Dirichlet(alpha) label skew over ``num_clients`` clients
  ``"client-<i>"`` (Hsu et al. 2019: per class c, proportions q_c ~ Dir(alpha * 1_N), class-c
  examples split by q_c), re-drawn (at most :data:`MAX_DIRICHLET_ATTEMPTS` times) until every
  client has at least :data:`MIN_CLIENT_EXAMPLES`; each client's share is split into test
  (``test_fraction``), val (``val_fraction``), train (rest).

Every random choice comes from a numpy Generator derived from ``seed`` (and the domain name /
purpose), never from the global RNG, so equal inputs give identical plans. Index arrays are
int64 and sorted inside each piece. ``client_id`` is the client's position in ``plan.clients``.
"""

from __future__ import annotations

import builtins
import math

import numpy as np

from fedtune.errors import ConfigError, DataError, shown

from ._util import as_index, rng_for
from .base import ClientSpec, DatasetInfo, FederatedPlan, Pieces
from .heterogeneity import ROUNDINGS, homogeneity_counts

SETTINGS: tuple[str, ...] = ("fdg", "fl", "fda", "ufdg")
MIN_CLIENT_EXAMPLES = 4
MAX_DIRICHLET_ATTEMPTS = 1000


# ----------------------------------------------------------------------------- validation
def _check_int(name: str, v, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
        raise DataError(f"{name} must be an integer >= {lo}, got {v!r}")
    return int(v)


def _check_frac(name: str, v, *, allow_zero: bool = False, allow_one: bool = False) -> float:
    ok = isinstance(v, (int, float, np.floating, np.integer)) and not isinstance(v, bool)
    if ok:
        v = float(v)
        ok = math.isfinite(v) and (v >= 0 if allow_zero else v > 0) and (
            v <= 1 if allow_one else v < 1)
    if not ok:
        rng_txt = ("[0" if allow_zero else "(0") + ", 1" + ("]" if allow_one else ")")
        raise DataError(f"{name} must be a number in {rng_txt}, got {v!r}")
    return float(v)


# ----------------------------------------------------------------------------- helpers
def _sorted(idx) -> np.ndarray:
    return np.sort(as_index(idx))


def _n_val(n: int, frac: float) -> int:
    if frac <= 0 or n < 2:
        return 0
    return min(max(1, int(round(frac * n))), n - 1)


def _stratified_take(labels: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """``k`` positions of ``labels``, class proportions kept (largest-remainder quotas)."""
    n = len(labels)
    classes, inverse = np.unique(labels, return_inverse=True)
    counts = np.bincount(inverse, minlength=len(classes))
    quota = k * counts / n
    take = np.floor(quota).astype(np.int64)
    rest = k - int(take.sum())
    if rest > 0:  # give the remaining slots to the largest remainders (ties: random)
        order = np.lexsort((rng.random(len(classes)), -(quota - take)))
        take[order[:rest]] += 1
    chosen = []
    for ci in range(len(classes)):
        if take[ci]:
            members = np.flatnonzero(inverse == ci)
            chosen.append(rng.choice(members, int(take[ci]), replace=False))
    return _sorted(np.concatenate(chosen)) if chosen else np.zeros(0, np.int64)


def _check_labels(info: DatasetInfo, labels: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out = {}
    for d in info.domains:
        if d not in labels:
            raise DataError(f"labels lack domain {d!r}; expected one array per domain of "
                            f"{info.name!r}: {', '.join(info.domains)}")
        y = np.asarray(labels[d])
        if y.ndim != 1:
            raise DataError(f"labels[{d!r}] must be 1-D, got shape {y.shape}")
        out[d] = y.astype(np.int64, copy=False)
    return out


# ----------------------------------------------------------------------------- settings
def _source_clients(
    info: DatasetInfo, labels: dict[str, np.ndarray], sources: list[str],
    clients_per_domain: int, val_fraction: float, seed: int,
) -> list[ClientSpec]:
    clients: list[ClientSpec] = []
    for d in sources:
        n = len(labels[d])
        if n < clients_per_domain:
            raise DataError(f"domain {d!r} has {n} examples, fewer than clients_per_domain="
                            f"{clients_per_domain}; lower clients_per_domain")
        perm = rng_for(seed, "source", d).permutation(n)
        for k, part in enumerate(np.array_split(perm, clients_per_domain)):
            nv = _n_val(len(part), val_fraction)
            val, train = part[:nv], part[nv:]
            clients.append(ClientSpec(
                client_id=len(clients), name=f"{d}#{k}", role="source", domain=d,
                train={d: _sorted(train)}, val={d: _sorted(val)} if nv else {},
            ))
    return clients


def _check_homogeneity(value, rounding, setting: str, clients_per_domain: int) -> float | None:
    if rounding not in ROUNDINGS:
        raise ConfigError(f"field 'domain_homogeneity_rounding': {shown(rounding, 40)} is not allowed; allowed: "
                          f"{', '.join(ROUNDINGS)}")
    if value is None:
        return None
    ok = isinstance(value, (int, float, np.floating, np.integer)) and not isinstance(value, bool)
    if not (ok and math.isfinite(float(value)) and 0 <= float(value) <= 1):
        raise ConfigError(f"field 'domain_homogeneity': {shown(value, 40)} is out of range; allowed: "
                          ">= 0 and <= 1, or null (clients_per_domain clients per source domain)")
    if setting == "fl":
        raise ConfigError("field 'domain_homogeneity': setting 'fl' pools every domain (Dirichlet label skew); "
                          "allowed in fdg, fda, ufdg, or null")
    if clients_per_domain != 1:
        raise ConfigError(f"fields 'domain_homogeneity' and 'clients_per_domain': domain_homogeneity spreads the "
                          f"source domains over num_clients clients; set clients_per_domain to 1, not "
                          f"{clients_per_domain} (or domain_homogeneity to null)")
    return float(value)


def _homogeneity_clients(labels: dict[str, np.ndarray], sources: list[str], num_clients: int,
                         homogeneity: float, rounding: str, val_fraction: float, seed: int) -> list[ClientSpec]:
    sizes = [len(labels[d]) for d in sources]
    if num_clients * MIN_CLIENT_EXAMPLES > sum(sizes):  # before any per-client work: num_clients can be 10**18
        raise ConfigError(
            f"field 'num_clients': {num_clients} clients with domain_homogeneity={homogeneity} need at least "
            f"{MIN_CLIENT_EXAMPLES} examples each, but the {len(sources)} source domain(s) hold only {sum(sizes)}; "
            f"allowed: at most {sum(sizes) // MIN_CLIENT_EXAMPLES} (lower num_clients)")
    counts = homogeneity_counts(sizes, num_clients, homogeneity, rounding)  # (clients, domains)
    small = np.flatnonzero(counts.sum(axis=1) < MIN_CLIENT_EXAMPLES)
    if len(small):
        s = int(small[0])
        raise ConfigError(
            f"field 'num_clients': {num_clients} clients with domain_homogeneity={homogeneity} leave client {s} "
            f"{int(counts[s].sum())} examples of the {sum(sizes)} in source domains {', '.join(sources)}; "
            f"allowed: every client at least {MIN_CLIENT_EXAMPLES} (lower num_clients)")
    cuts = {d: np.split(rng_for(seed, "source", d).permutation(len(labels[d])),
                        np.cumsum(counts[:-1, di])) for di, d in enumerate(sources)}
    clients: list[ClientSpec] = []
    for i in range(num_clients):
        held = [(di, d) for di, d in enumerate(sources) if counts[i, di]]
        share = np.concatenate([cuts[d][i] for _, d in held])
        dom = np.concatenate([np.full(counts[i, di], di, np.int64) for di, _ in held])
        nv = _n_val(len(share), val_fraction)
        is_val = np.zeros(len(share), bool)
        if nv:  # stratified by domain: the validation split keeps the client's domain mix
            is_val[_stratified_take(dom, nv, rng_for(seed, "hetero-val", i))] = True
        train = {d: _sorted(share[(dom == di) & ~is_val]) for di, d in held}
        val = {d: _sorted(share[(dom == di) & is_val]) for di, d in held}
        clients.append(ClientSpec(
            client_id=i, name=f"client-{i}", role="source", domain=held[0][1] if len(held) == 1 else None,
            train={d: v for d, v in train.items() if len(v)}, val={d: v for d, v in val.items() if len(v)}))
    return clients


def _plan_lodo(info, labels, setting, target_domain, clients_per_domain, val_fraction,
               target_fraction, probe_fraction, participation, seed, oracle_fraction=0.0,
               data_seed=0, homogeneity=None, num_clients=0, rounding="authors") -> FederatedPlan:
    if len(info.domains) < 2:
        raise DataError(
            f"setting {setting!r} holds one domain out, but dataset {info.name!r} has only "
            f"{len(info.domains)} domain ({', '.join(info.domains)}); use setting 'fl'")
    target = info.domains[0] if target_domain is None else target_domain
    if target not in info.domains:
        raise DataError(f"target_domain {shown(target)} is not a domain of {info.name!r}; choose one "
                        f"of: {', '.join(info.domains)}")
    sources = [d for d in info.domains if d != target]
    if homogeneity is None:
        clients = _source_clients(info, labels, sources, clients_per_domain, val_fraction, seed)
    else:
        clients = _homogeneity_clients(labels, sources, num_clients, homogeneity, rounding, val_fraction, seed)
    n_t = len(labels[target])
    all_t = np.arange(n_t, dtype=np.int64)
    probe: Pieces = {}
    oracle: Pieces = {}
    if oracle_fraction > 0:
        if n_t < 3:
            raise DataError(f"target domain {target!r} has {n_t} example(s); an oracle slice "
                            f"(oracle_fraction={oracle_fraction}) needs at least 3; set "
                            "oracle_fraction: 0")
        k_o = min(max(1, int(round(oracle_fraction * n_t))), n_t - 2)
        # data_seed only: the same slice for every run seed of this dataset
        picked = _stratified_take(labels[target], k_o, rng_for(data_seed, "oracle", target))
        oracle = {target: picked}
        rest = np.setdiff1d(all_t, picked).astype(np.int64)
    else:
        rest = all_t
    n_r = len(rest)
    if setting == "fdg":
        test = rest
    else:
        if n_r < 2:
            raise DataError(f"target domain {target!r} has {n_r} example(s) outside its oracle "
                            f"slice; setting {setting!r} needs at least 2")
        frac = target_fraction if setting == "fda" else probe_fraction
        k = min(max(1, int(round(frac * n_t))), n_r - 1)
        taken = rest[_stratified_take(labels[target][rest], k, rng_for(seed, setting, target))]
        test = np.setdiff1d(rest, taken).astype(np.int64)
        if setting == "fda":
            # the target client's own validation split (selection protocol target-val)
            nv = _n_val(len(taken), val_fraction)
            order = rng_for(seed, "target-val", target).permutation(len(taken))
            val_t, train_t = taken[order[:nv]], taken[order[nv:]]
            clients.append(ClientSpec(client_id=len(clients), name="target", role="target",
                                      domain=target, train={target: _sorted(train_t)},
                                      val={target: _sorted(val_t)} if nv else {}))
        else:
            probe = {target: _sorted(taken)}
    return FederatedPlan(
        setting=setting, clients=tuple(clients), source_domains=tuple(sources),
        target_domains=(target,), target_test={target: _sorted(test)}, target_probe=probe,
        participation=participation, target_oracle=oracle, domains=tuple(info.domains),
    )


def _in_pool(clients: list[ClientSpec], pool: Pieces) -> list[ClientSpec]:
    """``clients`` cut from positions into ``pool``'s index arrays, mapped back to dataset indices."""
    def back(pieces: Pieces) -> Pieces:
        return {d: _sorted(pool[d][idx]) for d, idx in pieces.items()}

    return [ClientSpec(client_id=c.client_id, name=c.name, role=c.role, domain=c.domain,
                       train=back(c.train), val=back(c.val)) for c in clients]


def _plan_split(info, labels, split: dict[str, Pieces], scheme: str, clients_per_domain, participation, seed,
                homogeneity=None, num_clients=0, rounding="authors") -> FederatedPlan:
    train = split["train"]
    sources = [d for d in info.domains if d in train]
    pool_labels = {d: labels[d][train[d]] for d in sources}
    if homogeneity is None:
        clients = _source_clients(info, pool_labels, sources, clients_per_domain, 0.0, seed)
    else:
        clients = _homogeneity_clients(pool_labels, sources, num_clients, homogeneity, rounding, 0.0, seed)
    return FederatedPlan(
        setting="fdg", clients=tuple(_in_pool(clients, train)), source_domains=tuple(sources),
        target_domains=tuple(d for d in info.domains if d in split["test"]), target_test=dict(split["test"]),
        participation=participation, domains=tuple(info.domains), split_scheme=scheme,
        ood_val=dict(split["val"]), id_val=dict(split["id_val"]), id_test=dict(split["id_test"]),
    )


def _dirichlet_shares(y: np.ndarray, num_clients: int, alpha: float,
                      rng: np.random.Generator) -> list[np.ndarray]:
    classes, inverse = np.unique(y, return_inverse=True)
    n_c = np.bincount(inverse, minlength=len(classes))
    for _ in range(MAX_DIRICHLET_ATTEMPTS):
        q = rng.dirichlet(np.full(num_clients, alpha), size=len(classes))  # (C, N)
        cuts = np.floor(np.cumsum(q, axis=1) * n_c[:, None]).astype(np.int64)
        cuts[:, -1] = n_c
        counts = np.diff(cuts, axis=1, prepend=0)  # (C, N) examples of class c for client i
        if counts.sum(axis=0).min() >= MIN_CLIENT_EXAMPLES:
            break
    else:
        raise DataError(
            f"Dirichlet split failed: after {MAX_DIRICHLET_ATTEMPTS} draws some client still had "
            f"fewer than {MIN_CLIENT_EXAMPLES} examples; dirichlet_alpha={alpha} / "
            f"num_clients={num_clients} are too extreme for {len(y)} examples - raise "
            f"dirichlet_alpha or lower num_clients")
    shares: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for ci in range(len(classes)):
        members = rng.permutation(np.flatnonzero(inverse == ci))
        for i, part in enumerate(np.split(members, cuts[ci, :-1])):
            shares[i].append(part)
    return [np.concatenate(s) for s in shares]


def _plan_fl(info, labels, num_clients, alpha, val_fraction, test_fraction, participation,
             seed) -> FederatedPlan:
    domains = list(info.domains)
    sizes = [len(labels[d]) for d in domains]
    total = int(sum(sizes))
    if total < num_clients * MIN_CLIENT_EXAMPLES:
        raise DataError(f"num_clients={num_clients} needs at least {MIN_CLIENT_EXAMPLES} examples "
                        f"per client but dataset {info.name!r} has only {total}; lower num_clients")
    y = np.concatenate([labels[d] for d in domains]) if domains else np.zeros(0, np.int64)
    dom_of = np.repeat(np.arange(len(domains)), sizes)
    offset = np.concatenate([[0], np.cumsum(sizes)])
    rng = rng_for(seed, "fl")
    shares = _dirichlet_shares(y, num_clients, alpha, rng)

    def pieces(glob: np.ndarray) -> Pieces:
        out: Pieces = {}
        for di, d in enumerate(domains):
            sel = glob[dom_of[glob] == di]
            if len(sel):
                out[d] = _sorted(sel - offset[di])
        return out

    clients = []
    for i, share in enumerate(shares):
        share = rng.permutation(share)
        n = len(share)
        n_test = min(max(1, int(round(test_fraction * n))), n - 1)
        n_val = 0  # val_fraction of the whole share, leaving at least 1 train example
        if val_fraction > 0 and n - n_test >= 2:
            n_val = min(max(1, int(round(val_fraction * n))), n - n_test - 1)
        test, val, train = share[:n_test], share[n_test:n_test + n_val], share[n_test + n_val:]
        clients.append(ClientSpec(client_id=i, name=f"client-{i}", role="source", domain=None,
                                  train=pieces(train), val=pieces(val), test=pieces(test)))
    return FederatedPlan(setting="fl", clients=tuple(clients), source_domains=tuple(domains),
                         target_domains=(), target_test={}, participation=participation,
                         domains=tuple(info.domains))


def make_plan(
    info: DatasetInfo,
    labels: dict[str, np.ndarray],
    *,
    setting: str,
    target_domain: str | None,
    clients_per_domain: int = 1,
    num_clients: int = 10,
    dirichlet_alpha: float = 0.5,
    participation: float = 1.0,
    target_fraction: float = 0.05,
    val_fraction: float = 0.2,
    test_fraction: float = 0.2,
    probe_fraction: float = 0.1,
    seed: int = 0,
    oracle_fraction: float = 0.2,
    data_seed: int = 0,
    domain_homogeneity: float | None = None,
    domain_homogeneity_rounding: str = "authors",
    split: dict[str, Pieces] | None = None,
    split_scheme: str | None = None,
) -> FederatedPlan:
    """Partition ``labels`` (domain -> int64 labels, canonical order) for ``setting``.

    ``oracle_fraction`` / ``data_seed``: the oracle slice of the target domain (see the module
    docstring; ignored in fl). ``domain_homogeneity``: None, or lambda in [0, 1] to spread the
    source domains over ``num_clients`` clients (fdg/fda/ufdg; module docstring), counts rounded as
    ``domain_homogeneity_rounding`` says (:data:`fedtune.data.heterogeneity.ROUNDINGS`). ``split``: the
    splits :func:`fedtune.data.split_file.read_split_file` read for ``split_scheme`` (setting fdg only;
    module docstring), None for leave-one-domain-out."""
    if setting not in SETTINGS:
        raise DataError(f"setting {setting!r} is unknown; choose one of: {', '.join(SETTINGS)}")
    clients_per_domain = _check_int("clients_per_domain", clients_per_domain, 1)
    num_clients = _check_int("num_clients", num_clients, 1)
    seed = _check_int("seed", seed, 0)
    data_seed = _check_int("data_seed", data_seed, 0)
    oracle_fraction = _check_frac("oracle_fraction", oracle_fraction, allow_zero=True)
    if isinstance(dirichlet_alpha, bool) or not isinstance(
            dirichlet_alpha, (int, float, np.floating, np.integer)) or not (
            math.isfinite(float(dirichlet_alpha)) and dirichlet_alpha > 0):
        raise DataError(f"dirichlet_alpha must be a number > 0, got {dirichlet_alpha!r}")
    participation = _check_frac("participation", participation, allow_one=True)
    target_fraction = _check_frac("target_fraction", target_fraction)
    val_fraction = _check_frac("val_fraction", val_fraction, allow_zero=True)
    test_fraction = _check_frac("test_fraction", test_fraction)
    probe_fraction = _check_frac("probe_fraction", probe_fraction)
    if setting == "fl" and val_fraction + test_fraction >= 1:
        raise DataError(f"val_fraction + test_fraction must be < 1 in setting 'fl', got "
                        f"{val_fraction} + {test_fraction}")
    homogeneity = _check_homogeneity(domain_homogeneity, domain_homogeneity_rounding, setting, clients_per_domain)
    labels = _check_labels(info, labels)
    if split is not None:
        if setting != "fdg":
            raise ConfigError(f"field 'split_scheme': {split_scheme!r} gives a split file's train / OOD validation / "
                              f"OOD test splits, which setting {setting!r} does not use; allowed: setting fdg, or "
                              "split_scheme null")
        return _plan_split(info, labels, split, split_scheme or "official", clients_per_domain, participation,
                           seed, homogeneity, num_clients, domain_homogeneity_rounding)
    if setting == "fl":
        return _plan_fl(info, labels, num_clients, float(dirichlet_alpha), val_fraction,
                        test_fraction, participation, seed)
    return _plan_lodo(info, labels, setting, target_domain, clients_per_domain, val_fraction,
                      target_fraction, probe_fraction, participation, seed, oracle_fraction,
                      data_seed, homogeneity, num_clients, domain_homogeneity_rounding)


def fidelity_participation(round: int, participation: float, first: float, grace_rounds: int,  # noqa: A002
                           factor: float) -> float:
    """Multi-fidelity over clients: the participation of round ``round`` when it starts at ``first``
    and is multiplied by ``factor`` after each milestone ``grace_rounds · factor**k`` (k = 0, 1, …:
    the rungs of Ray Tune's ASHA with that grace period and reduction factor) the trial has
    passed, never above ``participation``. A trial ASHA stops at a rung was evaluated on fewer
    clients per round; one it promotes goes on with more, as FedHPO-Bench's client-sample-rate
    fidelity (Wang et al., 2022) raises the sample rate with the budget.

    >>> [fidelity_participation(r, 1.0, 0.25, 2, 2.0) for r in range(1, 10)]
    [0.25, 0.25, 0.5, 0.5, 1.0, 1.0, 1.0, 1.0, 1.0]
    """
    p, milestone = float(first), float(grace_rounds)
    while milestone < round and p < participation:
        p *= factor
        milestone *= factor
    return min(float(participation), p)


def sample_participants(num_clients: int, participation: float, seed: int,
                        round: int) -> np.ndarray:  # noqa: A002 - name fixed by the API
    """Sorted int64 ids of the clients taking part in ``round``.

    ``k = max(1, round(participation * num_clients))`` ids without replacement, from a Generator
    seeded by ``(seed, round)`` only; ``participation == 1`` gives every id.
    """
    num_clients = _check_int("num_clients", num_clients, 1)
    participation = _check_frac("participation", participation, allow_one=True)
    seed = _check_int("seed", seed, 0)
    r = _check_int("round", round, 0)
    k = max(1, int(builtins.round(participation * num_clients)))
    if k >= num_clients:
        return np.arange(num_clients, dtype=np.int64)
    ids = rng_for(seed, "participants", r).choice(num_clients, k, replace=False)
    return np.sort(ids.astype(np.int64))


