"""The FDG tuning benchmark (issue 31 item 4): a grid run once, then every strategy's regret against compute.

1. **The grid** (skipped when ``--table`` exists): FedAvg (local_lr x local_momentum), FedProx
   (local_lr x prox_mu) and FedOMG (local_lr x omg_kappa) on rotated-digits (6 target domains) and
   colored-digits (3), ``--seeds`` seeds, ``--rounds`` rounds, every round evaluated, an MLP with one
   hidden layer of 128 (the grid must be affordable on two cores), written by ordinary local runs
   into fedtune studies under ``--out`` and stored as one Parquet table (``--table``).
2. **The strategies** (:data:`fedtune.tune.tabular.strategies.STRATEGIES`: random search, TPE,
   each FIFO, ASHA and HyperBand) in every cell, ``--strategy-seeds`` times each, on two kinds of
   space: each algorithm's own grid (cells: algorithm x dataset x target x seed), and one space
   over the three (the algorithm a categorical knob, each algorithm's knobs conditional on it: a
   study that tunes the method choice too; cells: dataset x target x seed).
3. **Multi-fidelity over clients** (``--client-fidelity P``, default 0.2): the same grid run once
   more along ASHA's rungs (``fidelity_participation`` P for rounds 1-2, 3P to round 6, then every
   client: what ``fedtune sweep --scheduler asha --client-fidelity P --grace-period 2
   --reduction-factor 3`` runs), and ASHA answered from those runs, each round charged the clients
   it sampled, measured against the full-participation grid's selection and compute. Regret = the grid's selected target accuracy (honest selection ``val``: the configuration
   with the best source-validation round, its target accuracy at that round) minus the strategy's
   selection at a compute budget, in points; compute = client-rounds, as a fraction of the grid's.
   Printed per strategy and budget: mean regret over cells (each cell averaged over strategy
   seeds) ± the 95% interval over cells, and the share of cells within 1 point::

    python benchmarks/tabular_hpo.py --out /tmp/fedtune-tabular            # builds the grid (minutes), then seconds
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from pathlib import Path

GRID = {"fedavg": {"local_lr": 6, "local_momentum": [0.0, 0.5, 0.9]},
        "fedprox": {"local_lr": 6, "prox_mu": 4},
        "fedomg": {"local_lr": 6, "omg_kappa": 4}}
KNOBS = sorted({k for g in GRID.values() for k in g})
CELLS = {"rotated-digits": ["0", "15", "30", "45", "60", "75"], "colored-digits": ["+90%", "+80%", "-90%"]}
BUDGETS = (0.05, 0.1, 0.2, 0.3, 0.5, 1.0)
# Multi-fidelity over clients (`fedtune sweep --scheduler asha --client-fidelity P --grace-period 2
# --reduction-factor 3`): the rungs' participation, P for rounds 1-2, 3P to round 6, then full.
SHA_GRACE, SHA_FACTOR = 2, 3


def FIDELITY(p: float) -> dict:
    return {"fidelity_participation": p, "fidelity_grace_rounds": SHA_GRACE, "fidelity_factor": float(SHA_FACTOR)}


def build(args: argparse.Namespace, name: str, path: str, extra: dict) -> None:
    """Run the grid (with the run fields ``extra``: none, or the client-fidelity schedule) into the
    studies ``OUT/<name>-w*`` and write their table to ``path``."""
    from fedtune.tune.tabular.grid import grid_configs, run_grid
    from fedtune.tune.tabular.table import build_table
    import pyarrow.parquet as pq

    base = {"model": "mlp", "mlp_hidden": [128], "rounds": args.rounds, "eval_every": 1, "setting": "fdg", **extra}
    cells = [{"dataset": d, "target_domain": t, "seed": s} for d, ts in CELLS.items() for t in ts for s in args.seeds]
    configs = [{**c, **base} for algorithm, points in GRID.items() for c in grid_configs(algorithm, points)]
    t0 = time.time()
    n = run_grid(configs, cells, args.out, name, workers=args.workers)
    studies = sorted(str(p) for p in Path(args.out).glob(f"{name}-w*"))
    table = build_table(studies, KNOBS)
    pq.write_table(table, path)
    print(f"{name}: {n} runs ({len(configs)} configurations x {len(cells)} cells), {table.num_rows} round rows, "
          f"{time.time() - t0:.0f} s with {args.workers} processes -> {path}", flush=True)


def mean_ci(values: list[float]) -> str:
    m = statistics.mean(values)
    half = 1.96 * statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else math.nan
    return f"{100 * m:5.2f} ± {100 * half:4.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="/tmp/fedtune-tabular")
    ap.add_argument("--table", default=None, help="the grid's Parquet table (default OUT/grid.parquet)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--strategy-seeds", type=int, default=5)
    ap.add_argument("--client-fidelity", type=float, default=0.2,
                    help="also run the grid along ASHA's rungs with this first-rung participation (0: not)")
    args = ap.parse_args()
    args.table = args.table or os.path.join(args.out, "grid.parquet")
    if not os.path.exists(args.table):
        build(args, "grid", args.table, {})
    fidelity_table = os.path.join(args.out, "grid-client-fidelity.parquet")
    if args.client_fidelity and not os.path.exists(fidelity_table):
        build(args, "gridcf", fidelity_table, FIDELITY(args.client_fidelity))

    from fedtune.tune.tabular.strategies import STRATEGIES, Strategy
    from fedtune.tune.tabular.table import POOL, TabularBenchmark

    t0 = time.time()
    bench = TabularBenchmark(args.table)
    print(f"load average {os.getloadavg()}; grids of " + ", ".join(f"{a} {len(bench.configs(a))}" for a in
                                                                   bench.algorithms()) + " configurations")
    print(f"regret in points (grid's val-selected target accuracy - the strategy's), mean ± 95% interval over "
          f"cells; [share of cells within 1 point]; {args.strategy_seeds} strategy seeds per cell")
    spaces = [("each algorithm's own grid", bench.algorithms()), ("one space over the three (algorithm a knob)",
                                                                  [POOL.join(bench.algorithms())])]
    strategies = [(name, strategy, bench) for name, strategy in STRATEGIES.items()]
    sha = Strategy("sha", "random", "asha", SHA_GRACE, SHA_FACTOR)
    strategies.append((f"random+asha g{SHA_GRACE} r{SHA_FACTOR}", sha, bench))
    if args.client_fidelity:  # the same ASHA on runs whose early rungs sample fewer clients
        clients = TabularBenchmark(os.path.join(args.out, "grid-client-fidelity.parquet"))
        strategies.append((f"  + clients {args.client_fidelity:g}", sha, clients))
        strategies.append(("tpe+asha clients", Strategy("tpe-sha", "tpe", "asha", SHA_GRACE, SHA_FACTOR), clients))
    for title, names in spaces:
        cells = [(a, c) for a in names for c in bench.cells(a)]
        print(f"\n{title}: {len(cells)} cells (space x dataset x target x seed)")
        print(f"{'strategy':18s}" + "".join(f"{f'{int(100 * b)}% compute':>24s}" for b in BUDGETS))
        for name, strategy, answers in strategies:
            per_budget = regrets(bench, cells, strategy, args.strategy_seeds, answers)
            cols = [f"{mean_ci(per_budget[b])} [{100 * sum(r <= 0.01 for r in per_budget[b]) / len(cells):3.0f}%]"
                    for b in BUDGETS]
            print(f"{name:18s}" + "".join(f"{c:>24s}" for c in cols), flush=True)
    print(f"({time.time() - t0:.1f} s for every strategy on every cell)")


def regrets(bench, cells, strategy, seeds: int, answers=None) -> dict[float, list[float]]:
    """Per budget, each cell's regret averaged over ``seeds`` strategy seeds (a strategy with no
    finished trial yet at a budget has selected nothing: its accuracy counts as 0). ``answers``:
    the table the strategy's trials are answered from (runs along the client-fidelity rungs),
    ``bench`` the grid it is measured against (its selection and its compute)."""
    from fedtune.tune.tabular.strategies import at_budget, simulate

    answers = bench if answers is None else answers
    out: dict[float, list[float]] = {b: [] for b in BUDGETS}
    for space, cell in cells:
        _, grid_target = bench.grid_choice(space, cell)
        cost = bench.cost(space, cell)
        per_seed: dict[float, list[float]] = {b: [] for b in BUDGETS}
        for s in range(seeds):
            points = simulate(answers, space, cell, strategy, seed=s, grid_cost=cost)
            for b in BUDGETS:
                p = at_budget(points, b * cost)
                per_seed[b].append(grid_target - (p.target_acc if p is not None and math.isfinite(p.target_acc) else 0.0))
        for b in BUDGETS:
            out[b].append(statistics.mean(per_seed[b]))
    return out


if __name__ == "__main__":
    main()
