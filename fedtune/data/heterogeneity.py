"""How many examples of each source domain each client holds, for a domain homogeneity lambda.

Bai, Bagchi & Inouye, "Benchmarking Algorithms for Federated Domain Generalization" (ICLR 2024),
spread ``D`` source domains of sizes ``n_d`` over ``N`` clients with lambda in [0, 1], Figure 1:
"homogeneous (lambda = 1), heterogeneous (lambda = 0.1), and extreme heterogeneous (lambda = 0)";
their code's (``src/splitter.py``, ``NonIIDSplitter``) ``iid`` is lambda. The client counts are the
convex mix

    F = (1 - lambda) * H + lambda * U,     U[s, d] = n_d / N   (every client: the domain proportions)

of a *domain-separated* split ``H`` and the homogeneous split ``U``:

* ``N >= D``: every domain gets main clients ``m_d`` (1 each, then one at a time to the domain
  of largest ``n_d / m_d``; ties: the earlier domain, as their ``np.argmax``), clients in domain
  order, and ``H[s, d] = n_d / m_d`` when ``d`` is client ``s``'s main domain, else 0;
* ``N < D``: whole domains in the order of their reversed ascending ``argsort`` (largest first;
  equal sizes: the *later* domain first), each to the client with the fewest examples so far
  (ties: the lower client), ``H[s, d] = n_d`` for that client. The sort is numpy's stable one:
  the authors' default ``argsort`` is stable for up to 16 domains in the numpy they pinned
  (1.24, an insertion sort below 17 items), while numpy >= 1.25's SIMD ``argsort`` orders ties
  by the machine's instruction set; a stable order keeps one plan per config on every machine.

Rounding (``rounding``, :data:`ROUNDINGS`):

* ``"authors"``: their float64 arithmetic, count for count - truncate every entry and give each
  domain's leftover examples to the *first* clients (so at lambda = 0 a client can get a few
  examples of a domain that is not its own);
* ``"largest-remainder"``: each domain's column rounded by largest remainder, computed exactly
  with rationals (lambda read as the exact binary fraction of the float), ties to the lower
  client: lambda = 0 with ``N >= D`` is then exactly one domain per client.

Both give columns summing to ``n_d`` and, at lambda = 1, ``floor(n_d / N)`` examples of domain
``d`` per client, the first ``n_d mod N`` clients one more.
"""

from __future__ import annotations

import heapq
from fractions import Fraction
from typing import Sequence

import numpy as np

from fedtune.errors import ConfigError, shown

ROUNDINGS: tuple[str, ...] = ("authors", "largest-remainder")


def main_clients_per_domain(sizes: Sequence[int], num_clients: int) -> list[int]:
    """``m_d``: clients whose main domain is ``d`` (``num_clients >= len(sizes)``), summing to
    ``num_clients``; the extra clients go one at a time to the domain of largest ``n_d / m_d``
    (a heap of the exact ratios: O(num_clients log D))."""
    m = [1] * len(sizes)
    heap = [(-Fraction(int(n)), d) for d, n in enumerate(sizes)]  # largest ratio first, ties: the earlier d
    heapq.heapify(heap)
    for _ in range(num_clients - len(sizes)):
        _, best = heapq.heappop(heap)
        m[best] += 1
        heapq.heappush(heap, (-Fraction(int(sizes[best]), m[best]), best))
    return m


def packing_order(sizes: Sequence[int]) -> list[int]:
    """``N < D``: the order whole domains are packed in - the authors' ``argsort(sizes)[::-1]``
    with a stable sort (largest first, equal sizes the later domain first)."""
    return [int(d) for d in np.argsort(np.asarray(sizes, dtype=np.int64), kind="stable")[::-1]]


def separated_owner(sizes: Sequence[int], num_clients: int) -> list[int]:
    """``N < D``: the client holding each whole domain in ``H`` (each to the client with the fewest
    examples so far, ties: the lower client; a heap of ``(total, client)``)."""
    heap = [(0, s) for s in range(num_clients)]
    owner = [0] * len(sizes)
    for d in packing_order(sizes):
        total, s = heapq.heappop(heap)
        owner[d] = s
        heapq.heappush(heap, (total + int(sizes[d]), s))
    return owner


def _separated(sizes: list[int], num_clients: int) -> list[list[Fraction]]:
    """``H`` (rows: clients, columns: domains) as exact fractions."""
    D = len(sizes)
    H = [[Fraction(0)] * D for _ in range(num_clients)]
    if num_clients >= D:
        s = 0
        for d, m_d in enumerate(main_clients_per_domain(sizes, num_clients)):
            for _ in range(m_d):
                H[s][d] = Fraction(sizes[d], m_d)
                s += 1
        return H
    for d, s in enumerate(separated_owner(sizes, num_clients)):
        H[s][d] = Fraction(sizes[d])
    return H


def _largest_remainder(sizes: list[int], num_clients: int, homogeneity: float) -> np.ndarray:
    lam = Fraction(float(homogeneity))
    H = _separated(sizes, num_clients)
    out = np.zeros((num_clients, len(sizes)), dtype=np.int64)
    for d, n in enumerate(sizes):
        exact = [(1 - lam) * H[s][d] + lam * Fraction(n, num_clients) for s in range(num_clients)]
        floors = [f.numerator // f.denominator for f in exact]
        left = n - sum(floors)  # 0 <= left < num_clients: the column's fractional parts sum to it
        order = sorted(range(num_clients), key=lambda s: (-(exact[s] - floors[s]), s))
        for s in order[:left]:
            floors[s] += 1
        out[:, d] = floors
    return out


def _authors(sizes: list[int], num_clients: int, homogeneity: float) -> np.ndarray:
    """``NonIIDSplitter``'s counts: the same float64 operations in the same order."""
    n = np.asarray(sizes, dtype=np.int64)
    iid = float(homogeneity)
    D = len(sizes)
    if num_clients >= D:
        m = main_clients_per_domain(sizes, num_clients)
        main = np.repeat(np.arange(D), m)
        onehot = (main[:, None] == np.arange(D)[None, :]).astype(np.float64)
        ratio = np.array([1 / u for u in m])
        floating = n * (ratio * onehot * (1 - iid) + (1 / num_clients) * iid)
        counts = floating.astype(np.int64)
        leftover = np.rint(np.sum(floating - counts, axis=0)).astype(np.int64)
    else:
        separated = np.zeros((num_clients, D))
        separated[separated_owner(sizes, num_clients), np.arange(D)] = n
        floating = (np.zeros((num_clients, D)) + n / num_clients) * iid + separated * (1 - iid)
        counts = np.floor(floating).astype(np.int64)
        leftover = n - counts.sum(axis=0)
    counts += np.arange(num_clients)[:, None] < leftover[None, :]
    return counts


def homogeneity_counts(sizes: Sequence[int], num_clients: int, homogeneity: float,
                       rounding: str = "authors") -> np.ndarray:
    """int64 ``(num_clients, len(sizes))``: examples of domain ``d`` held by client ``s``;
    column ``d`` sums to ``sizes[d]``. See the module docstring."""
    sizes = [int(n) for n in sizes]
    if rounding == "authors":
        return _authors(sizes, num_clients, homogeneity)
    if rounding == "largest-remainder":
        return _largest_remainder(sizes, num_clients, homogeneity)
    raise ConfigError(f"field 'domain_homogeneity_rounding': {shown(rounding, 40)} is not allowed; allowed: {', '.join(ROUNDINGS)}")
