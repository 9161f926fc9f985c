"""FedEx against random search of the same knobs at the same budget (issue 31 item 3).

For each seed and target domain of rotated-digits (fdg, the embedded data, local backend):

* **FedEx**: one run of ``--rounds`` rounds, ``fedex_configs`` configurations of ``--knobs``
  (the run's own values: the defaults; the others perturbed by ``--eps`` of the authors' ranges);
* **random search**: ``--arms`` runs of ``--rounds / --arms`` rounds each (the same rounds x
  clients), each knob drawn from the same range FedEx perturbs within (log-uniform for log-scale
  knobs), the arm with the highest validation accuracy selected (honest selection ``val``).

Both report the target accuracy at the selected round (``target_acc_at_best_val``). Prints one
line per (seed, target) and the mean ± standard deviation over them, and the difference with its
paired interval::

    python benchmarks/fedex_vs_random.py --seeds 0 1 2 --targets 0 30 --rounds 24 --arms 4
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import tempfile
import time

import numpy as np


def one_run(values: dict, out: str) -> dict:
    from fedtune.config import FederatedRunConfig
    from fedtune.results.store import load
    from fedtune.runtime.driver import run

    cfg = FederatedRunConfig.from_dict({**values, "output": out, "backend": "local"})
    result = run(cfg, progress=False)
    trials = [t for t in load(os.path.join(out, cfg.name), "trials").to_pylist() if t["trial_id"] == result.trial_id]
    return trials[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--targets", nargs="+", default=["0", "30"], help="rotated-digits target domains")
    ap.add_argument("--rounds", type=int, default=24, help="the budget: FedEx's rounds, split over the arms")
    ap.add_argument("--arms", type=int, default=4, help="random-search configurations")
    ap.add_argument("--configs", type=int, default=8, help="FedEx configurations")
    ap.add_argument("--eps", type=float, default=1.0, help="FedEx perturbation")
    ap.add_argument("--knobs", nargs="+", default=["local_lr", "local_momentum"])
    ap.add_argument("--algorithm", default="fedavg")
    args = ap.parse_args()

    from fedtune.algorithms.server.fedex import client_knob_hparams, knob_ranges
    from fedtune.config import FederatedRunConfig

    base = {"algorithm": args.algorithm, "dataset": "rotated-digits", "setting": "fdg", "eval_every": 1}
    ranges = knob_ranges(args.knobs, client_knob_hparams(FederatedRunConfig.from_dict(base)))
    per_arm = args.rounds // args.arms
    print(f"load average: {os.getloadavg()}; budget {args.rounds} rounds; FedEx k={args.configs} eps={args.eps} "
          f"knobs {args.knobs}; random search {args.arms} arms x {per_arm} rounds")
    fedex_scores, rs_scores = [], []
    with tempfile.TemporaryDirectory() as out:
        for seed in args.seeds:
            for target in args.targets:
                t0 = time.time()
                cell = {**base, "seed": seed, "target_domain": target}
                fx = one_run({**cell, "rounds": args.rounds, "name": "fedex", "fedex_configs": args.configs,
                              "fedex_eps": args.eps, "fedex_knobs": args.knobs}, out)
                rng = np.random.default_rng([seed, 31])
                arms = []
                for a in range(args.arms):
                    values = {}
                    for r in ranges:
                        if r.kind == "categorical":
                            values[r.name] = float(rng.choice(r.choices))
                        elif r.kind == "int":
                            values[r.name] = int(rng.integers(int(r.low), int(r.high) + 1))
                        elif r.log:
                            values[r.name] = float(10 ** rng.uniform(math.log10(r.low), math.log10(r.high)))
                        else:
                            values[r.name] = float(rng.uniform(r.low, r.high))
                    arms.append(one_run({**cell, **values, "rounds": per_arm, "name": f"rs{a}"}, out))
                best = max(arms, key=lambda t: -math.inf if t["best_val_acc"] is None else t["best_val_acc"])
                fedex_scores.append(fx["target_acc_at_best_val"])
                rs_scores.append(best["target_acc_at_best_val"])
                import json

                mle = json.loads(fx["fedex_json"])["mle"]
                print(f"seed {seed} target {target}: FedEx {fx['target_acc_at_best_val']:.4f} (most likely {mle}), "
                      f"random search {best['target_acc_at_best_val']:.4f} (val {best['best_val_acc']:.4f}); "
                      f"{time.time() - t0:.0f} s", flush=True)
    diff = [f - r for f, r in zip(fedex_scores, rs_scores)]
    n = len(diff)

    def ms(x):
        return f"{statistics.mean(x):.4f} ± {statistics.stdev(x) if len(x) > 1 else 0.0:.4f}"

    half = 1.96 * (statistics.stdev(diff) / math.sqrt(n)) if n > 1 else math.nan
    print(f"FedEx target accuracy {ms(fedex_scores)}; random search {ms(rs_scores)} (mean ± sd over {n} "
          f"seed x target cells)")
    print(f"FedEx - random search: {statistics.mean(diff):+.4f}, 95% interval ±{half:.4f} (paired, normal)")


if __name__ == "__main__":
    main()
