"""FedOMG's server time, split into Gram pass / step-2 solve / combine, beside FedAvg's.

A script, not a test: it prints one table measured in one run (this machine is shared and noisy:
medians over ``--repeats``, and only numbers taken side by side mean something).

    python benchmarks/fedomg_server.py                          # U = 3, 10, 100 at M = 11.7M
    python benchmarks/fedomg_server.py --params 1000000         # a smaller model first
    python benchmarks/fedomg_server.py --clients 3 10 --repeats 5 --kappa 1.0

For each number of clients ``U`` the script builds ``[U, M]`` float32 updates shaped like a
round's (a shared component plus client-specific parts of different sizes; ``M = 11.7M`` is
ResNet-18, the paper's FDG model; ``U = 100`` takes 4.7 GB), then times on the same updates:

* FedOMG (``fedomg_step``: exact solver, κ = ``--kappa``, ``global_lr`` 0.05, fedtune's default
  server step, not the paper's η_g; the step size does not change the timings): ``gram`` (one
  blockwise float64 pass, ``U² M / 2`` multiply-adds), ``solve`` (the certified exact solve from
  ``G`` alone) and ``combine`` (one weighted sum, the same kernel as FedAvg's);
* FedAvg's ``fedavg_step`` (one weighted sum);
* the authors' 20-step SGD solver on the same ``G``.

Columns: the three FedOMG parts, their total, FedAvg, the solve's share of FedOMG's server
time (target: < 5 % for M ≥ 1M), FedOMG/FedAvg, the SGD solve time, the step-2 objective
reached by the exact and the SGD solver (exact must be ≤ SGD; the script exits 1 otherwise),
and the exact solver's certified gap relative to ``‖g_FL‖ max_u ‖Δ_u‖``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time

import numpy as np

from fedtune.algorithms import fedavg_step, fedavg_weights, omg_objective, solve_omg_sgd
from fedtune.algorithms.fedomg import _norm_floor, fedomg_step, solve_omg_exact_info


def make_updates(num: int, m: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``[num, m]`` float32 updates Δ_u = a·s + b_u·n_u (shared s, own n_u), weights and θ."""
    rng = np.random.default_rng(seed)
    shared = rng.standard_normal(m, dtype=np.float32)
    shared *= np.float32(1e-3)
    updates = np.empty((num, m), dtype=np.float32)
    for u in range(num):
        rng.standard_normal(m, dtype=np.float32, out=updates[u])
        updates[u] *= np.float32(rng.uniform(0.5e-3, 2e-3))
        updates[u] += shared
    weights = fedavg_weights(rng.integers(100, 1000, num))
    theta = rng.standard_normal(m, dtype=np.float32)
    return updates, weights, theta


def bench(num: int, m: int, args: argparse.Namespace) -> dict[str, float]:
    t0 = time.perf_counter()
    updates, p, theta = make_updates(num, m, args.seed)
    print(f"  U={num}: built {updates.nbytes / 1e9:.2f} GB of updates in {time.perf_counter() - t0:.1f} s", flush=True)
    threads = None if args.blas_threads == 0 else args.blas_threads
    runs: dict[str, list[float]] = {k: [] for k in ("gram", "solve", "combine", "fedavg", "sgd")}
    G = None
    for rep in range(args.repeats):
        step = fedomg_step(updates, p, args.kappa, solver="exact", params=theta, global_lr=0.05, blas_threads=threads)
        G = step.gram
        runs["gram"].append(step.gram_s)
        runs["solve"].append(step.solve_s)
        runs["combine"].append(step.combine_s)
        t = time.perf_counter()
        fedavg_step(theta, updates, p, 0.05)
        runs["fedavg"].append(time.perf_counter() - t)
        t = time.perf_counter()
        solve_omg_sgd(G, p, args.kappa)
        runs["sgd"].append(time.perf_counter() - t)
        del step
    med = {k: statistics.median(v) for k, v in runs.items()}
    exact = solve_omg_exact_info(G, p, args.kappa)
    obj_sgd = omg_objective(solve_omg_sgd(G, p, args.kappa), G, p, args.kappa)
    obj_scale = math.sqrt(max(p @ G @ p, 0.0)) * math.sqrt(G.diagonal().max())
    noise = (1 + args.kappa) * math.sqrt(max(p @ G @ p, 0.0)) * _norm_floor(G)
    total = med["gram"] + med["solve"] + med["combine"]
    return {**med, "total": total, "share": med["solve"] / total, "ratio": total / med["fedavg"],
            "obj_exact": exact.objective / obj_scale, "obj_sgd": obj_sgd / obj_scale,
            "gap": exact.gap / obj_scale, "ok": exact.objective <= obj_sgd + noise,
            "support": int(np.count_nonzero(exact.gamma))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", type=int, default=11_700_000, help="M, parameters per update (default 11.7M)")
    ap.add_argument("--clients", type=int, nargs="+", default=[3, 10, 100], help="values of U (default 3 10 100)")
    ap.add_argument("--kappa", type=float, default=0.5, help="FedOMG's κ (default 0.5, the paper's)")
    ap.add_argument("--repeats", type=int, default=3, help="timed repeats per case; medians are printed")
    ap.add_argument("--blas-threads", type=int, default=1,
                    help="BLAS threads in the Gram pass (default 1, fedtune's default; 0 = the process default)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    print(f"FedOMG server time vs FedAvg, M = {args.params:,} parameters, κ = {args.kappa}, "
          f"medians of {args.repeats}, BLAS threads in the Gram pass: {args.blas_threads or 'default'}")
    rows = [(num, bench(num, args.params, args)) for num in args.clients]
    head = (f"{'U':>4} {'gram s':>8} {'solve s':>8} {'combine s':>9} {'FedOMG s':>9} {'FedAvg s':>9} "
            f"{'solve %':>8} {'OMG/Avg':>8} {'sgd s':>7} {'obj exact':>11} {'obj sgd':>11} {'ex<=sgd':>7} "
            f"{'gap':>8} {'|supp|':>6}")
    print()
    print(head)
    print("-" * len(head))
    for num, r in rows:
        print(f"{num:>4} {r['gram']:>8.3f} {r['solve']:>8.4f} {r['combine']:>9.3f} {r['total']:>9.3f} "
              f"{r['fedavg']:>9.3f} {100 * r['share']:>7.2f}% {r['ratio']:>8.2f} {r['sgd']:>7.4f} "
              f"{r['obj_exact']:>11.6f} {r['obj_sgd']:>11.6f} {'yes' if r['ok'] else 'NO':>7} "
              f"{r['gap']:>8.1e} {r['support']:>6}")
    print("\nobjectives and gap are relative to ‖g_FL‖·max_u‖Δ_u‖; |supp| = clients with γ_u > 0")
    return 0 if all(r["ok"] for _, r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
