"""FedGaLA's global step ÷ FedAvg's step (norm ratio), before and after issue 8 (docs/methods-seeds.md §3).

A script, not a test: it prints one table. Before issue 8 the aligned step was
``a = Σ_u w_u p_u Δ_u`` with ``Σ w = 1`` (about ``1/U`` of FedAvg's step); now it is
``a = Σ_u w_u Δ_u`` with ``w_u ∝ p_u (cos(Δ_u, a) + 1)/2`` (FedAvg's scale), weights per tensor
(default) or over the whole vector.

    python benchmarks/gala_step_scale.py
    python benchmarks/gala_step_scale.py --clients 5 10 --tensors 8 --size 20000

Updates are a shared direction plus client noise (``--noise`` times its scale) and client sizes
drawn at random, cut into ``--tensors`` tensors of random sizes.
"""

from __future__ import annotations

import argparse

import numpy as np

from fedtune.algorithms.server.aggregate import fedavg_weights, weighted_sum
from fedtune.algorithms.server.gala import gala_global_weights


def old_step(updates: np.ndarray, p: np.ndarray, iters: int) -> np.ndarray:
    """The pre-issue-8 rule: a0 = (1/U) Σ p Δ; iters × (w = normalised (cos + 1)/2, a = Σ w p Δ)."""
    U = len(p)
    a = weighted_sum(updates, p / U)
    for _ in range(iters):
        cos = np.array([u @ a / (np.linalg.norm(u) * np.linalg.norm(a)) for u in updates.astype(np.float64)])
        w = (cos + 1) / 2
        w /= w.sum()
        a = weighted_sum(updates, w * p)
    return a


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[3, 5, 10, 20])
    ap.add_argument("--tensors", type=int, default=6)
    ap.add_argument("--size", type=int, default=50_000)
    ap.add_argument("--noise", type=float, default=2.0)
    ap.add_argument("--iters", type=int, default=3)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    cuts = np.sort(rng.choice(np.arange(1, args.size), args.tensors - 1, replace=False))
    bounds = [0, *cuts.tolist(), args.size]
    slices = [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]
    print(f"# M = {args.size}, {args.tensors} tensors, noise {args.noise}, iters {args.iters}")
    print(f"{'U':>4} {'before':>8} {'1/U':>7} {'after (per-tensor)':>19} {'after (whole)':>14}")
    for U in args.clients:
        common = rng.normal(size=args.size)
        updates = (common + args.noise * rng.normal(size=(U, args.size))).astype(np.float32)
        p = fedavg_weights(rng.integers(50, 500, size=U))
        fedavg = np.linalg.norm(weighted_sum(updates, p))
        before = np.linalg.norm(old_step(updates, p, args.iters)) / fedavg
        per_tensor = np.linalg.norm(gala_global_weights(updates, p, args.iters, slices)[1]) / fedavg
        whole = np.linalg.norm(gala_global_weights(updates, p, args.iters)[1]) / fedavg
        print(f"{U:4d} {before:8.4f} {1 / U:7.4f} {per_tensor:19.4f} {whole:14.4f}")


if __name__ == "__main__":
    main()
