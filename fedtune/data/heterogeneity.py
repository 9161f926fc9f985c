"""How many examples of each source domain each client holds, for a domain heterogeneity lambda.

Bai, Bagchi & Inouye, "Benchmarking Algorithms for Federated Domain Generalization" (ICLR 2024),
spread ``D`` source domains of sizes ``n_d`` over ``N`` clients with a heterogeneity value
lambda in [0, 1] (their code's ``iid`` is ``1 - lambda``): the client counts are the convex mix

    F = lambda * H + (1 - lambda) * U,     U[s, d] = n_d / N   (every client: the domain proportions)

of a *domain-separated* split ``H`` and the homogeneous split ``U``:

* ``N >= D``: every domain gets main clients ``m_d`` (1 each, then one at a time to the domain
  of largest ``n_d / m_d``; ties: the earlier domain), clients in domain order, and
  ``H[s, d] = n_d / m_d`` when ``d`` is client ``s``'s main domain, else 0 - so lambda = 1 gives
  each client one domain;
* ``N < D``: whole domains, largest first (ties: the earlier domain), each to the client with
  the fewest examples so far (ties: the lower client), ``H[s, d] = n_d`` for that client.

Rounding (departure from the authors' code, which truncates and gives each domain's leftover
examples to the *first* clients, so that at lambda = 1 a client can get a few examples of a
domain that is not its own): each domain's column is rounded by largest remainder, computed
exactly with rationals (lambda is read as the exact binary fraction of the float), ties to the
lower client. Columns still sum to ``n_d``; lambda = 1 is exactly domain-separated; lambda = 0
gives every client ``floor(n_d / N)`` examples of domain ``d`` and the first ``n_d mod N``
clients one more (the authors' lambda = 0 split, count for count).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Sequence

import numpy as np


def main_clients_per_domain(sizes: Sequence[int], num_clients: int) -> list[int]:
    """``m_d``: clients whose main domain is ``d`` (``num_clients >= len(sizes)``), summing to
    ``num_clients``; the extra clients go one at a time to the domain of largest ``n_d / m_d``."""
    m = [1] * len(sizes)
    for _ in range(num_clients - len(sizes)):
        best = max(range(len(sizes)), key=lambda d: (Fraction(int(sizes[d]), m[d]), -d))
        m[best] += 1
    return m


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
    totals = [0] * num_clients
    for d in sorted(range(D), key=lambda d: (-sizes[d], d)):
        s = min(range(num_clients), key=lambda i: (totals[i], i))
        H[s][d] = Fraction(sizes[d])
        totals[s] += sizes[d]
    return H


def heterogeneity_counts(sizes: Sequence[int], num_clients: int, heterogeneity: float) -> np.ndarray:
    """int64 ``(num_clients, len(sizes))``: examples of domain ``d`` held by client ``s``;
    column ``d`` sums to ``sizes[d]``. See the module docstring."""
    sizes = [int(n) for n in sizes]
    lam = Fraction(float(heterogeneity))
    H = _separated(sizes, num_clients)
    out = np.zeros((num_clients, len(sizes)), dtype=np.int64)
    for d, n in enumerate(sizes):
        exact = [lam * H[s][d] + (1 - lam) * Fraction(n, num_clients) for s in range(num_clients)]
        floors = [f.numerator // f.denominator for f in exact]
        left = n - sum(floors)  # 0 <= left < num_clients: the column's fractional parts sum to it
        order = sorted(range(num_clients), key=lambda s: (-(exact[s] - floors[s]), s))
        for s in order[:left]:
            floors[s] += 1
        out[:, d] = floors
    return out
