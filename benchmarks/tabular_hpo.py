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
   study that tunes the method choice too; cells: dataset x target x seed). Regret = the grid's selected target accuracy (honest selection ``val``: the configuration
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


def build(args: argparse.Namespace) -> None:
    from fedtune.tune.tabular.grid import grid_configs, run_grid
    from fedtune.tune.tabular.table import build_table
    import pyarrow.parquet as pq

    base = {"model": "mlp", "mlp_hidden": [128], "rounds": args.rounds, "eval_every": 1, "setting": "fdg"}
    cells = [{"dataset": d, "target_domain": t, "seed": s} for d, ts in CELLS.items() for t in ts for s in args.seeds]
    configs = [{**c, **base} for algorithm, points in GRID.items() for c in grid_configs(algorithm, points)]
    t0 = time.time()
    n = run_grid(configs, cells, args.out, "grid", workers=args.workers)
    studies = sorted(str(p) for p in Path(args.out).glob("grid-w*"))
    table = build_table(studies, KNOBS)
    pq.write_table(table, args.table)
    print(f"grid: {n} runs ({len(configs)} configurations x {len(cells)} cells), {table.num_rows} round rows, "
          f"{time.time() - t0:.0f} s with {args.workers} processes -> {args.table}", flush=True)


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
    args = ap.parse_args()
    args.table = args.table or os.path.join(args.out, "grid.parquet")
    if not os.path.exists(args.table):
        build(args)

    from fedtune.tune.tabular.strategies import STRATEGIES
    from fedtune.tune.tabular.table import POOL, TabularBenchmark

    t0 = time.time()
    bench = TabularBenchmark(args.table)
    print(f"load average {os.getloadavg()}; grids of " + ", ".join(f"{a} {len(bench.configs(a))}" for a in
                                                                   bench.algorithms()) + " configurations")
    print(f"regret in points (grid's val-selected target accuracy - the strategy's), mean ± 95% interval over "
          f"cells; [share of cells within 1 point]; {args.strategy_seeds} strategy seeds per cell")
    spaces = [("each algorithm's own grid", bench.algorithms()), ("one space over the three (algorithm a knob)",
                                                                  [POOL.join(bench.algorithms())])]
    for title, names in spaces:
        cells = [(a, c) for a in names for c in bench.cells(a)]
        print(f"\n{title}: {len(cells)} cells (space x dataset x target x seed)")
        print(f"{'strategy':18s}" + "".join(f"{f'{int(100 * b)}% compute':>24s}" for b in BUDGETS))
        for name, strategy in STRATEGIES.items():
            per_budget = regrets(bench, cells, strategy, args.strategy_seeds)
            cols = [f"{mean_ci(per_budget[b])} [{100 * sum(r <= 0.01 for r in per_budget[b]) / len(cells):3.0f}%]"
                    for b in BUDGETS]
            print(f"{name:18s}" + "".join(f"{c:>24s}" for c in cols), flush=True)
    print(f"({time.time() - t0:.1f} s for every strategy on every cell)")


def regrets(bench, cells, strategy, seeds: int) -> dict[float, list[float]]:
    """Per budget, each cell's regret averaged over ``seeds`` strategy seeds (a strategy with no
    finished trial yet at a budget has selected nothing: its accuracy counts as 0)."""
    from fedtune.tune.tabular.strategies import at_budget, simulate

    out: dict[float, list[float]] = {b: [] for b in BUDGETS}
    for space, cell in cells:
        _, grid_target = bench.grid_choice(space, cell)
        cost = bench.cost(space, cell)
        per_seed: dict[float, list[float]] = {b: [] for b in BUDGETS}
        for s in range(seeds):
            points = simulate(bench, space, cell, strategy, seed=s)
            for b in BUDGETS:
                p = at_budget(points, b * cost)
                per_seed[b].append(grid_target - (p.target_acc if p is not None and math.isfinite(p.target_acc) else 0.0))
        for b in BUDGETS:
            out[b].append(statistics.mean(per_seed[b]))
    return out


if __name__ == "__main__":
    main()
