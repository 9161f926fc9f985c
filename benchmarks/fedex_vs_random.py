"""FedEx against random search of the same knobs at the same budget (issue 31 item 3).

For each seed and target domain of rotated-digits (fdg, the embedded data, local backend):

* **FedEx**: one run of ``--rounds`` rounds, ``fedex_configs`` configurations of ``--knobs``
  (the run's own values: the defaults; the others perturbed by ``--eps`` of the authors' ranges);
* **random search**: ``--arms`` runs of ``--rounds / --arms`` rounds each (the same rounds x
  clients), each knob drawn uniformly (on the log scale for log-scale knobs) from the neighbourhood
  FedEx's configurations are drawn from (the run's value ± ``--eps`` of the knob's range, clipped),
  the arm with the highest validation accuracy selected (honest selection ``val``).

and, as a control, **no tuning**: the run's own values (FedEx's configuration 0) for all
``--rounds``. All report the target accuracy at the selected round (``target_acc_at_best_val``). Prints one
line per (seed, target) and the mean ± standard deviation over them, and the difference with its
paired interval::

    python benchmarks/fedex_vs_random.py --seeds 0 1 2 --targets 0 30 60 --rounds 24 --arms 4 --eps 0.1
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import tempfile
import time

import numpy as np


def draw(r, base: float, eps: float, rng: np.random.Generator) -> float | int:
    """A random-search value of knob range ``r`` from FedEx's neighbourhood of ``base``: uniform
    (log-uniform on a log-scale knob) within ± ``eps`` of the range's width, clipped to it."""
    if r.kind == "categorical":
        pos = int(np.argmin([abs(c - base) for c in r.choices]))
        reach = math.ceil(eps * (len(r.choices) - 1))
        return float(r.choices[int(rng.integers(max(pos - reach, 0), min(pos + reach, len(r.choices) - 1) + 1))])
    scale, unscale = (math.log10, lambda v: 10 ** v) if r.log else (float, float)
    if r.kind == "int" and r.log:
        scale, unscale = math.log2, lambda v: 2 ** v
    lo, hi, v = scale(r.low), scale(r.high), scale(max(base, r.low) if r.log else base)
    a, b = max(lo, v - eps * (hi - lo)), min(hi, v + eps * (hi - lo))
    value = unscale(rng.uniform(a, b))
    return int(round(value)) if r.kind == "int" else float(value)


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
    ap.add_argument("--eps", type=float, default=0.25, help="FedEx perturbation (and random search's neighbourhood)")
    ap.add_argument("--knobs", nargs="+", default=["local_lr", "local_momentum"])
    ap.add_argument("--algorithm", default="fedavg")
    args = ap.parse_args()

    from fedtune.algorithms.server.fedex import knob_ranges
    from fedtune.algorithms.tuner_declarations import client_knob_hparams
    from fedtune.config import FederatedRunConfig

    base = {"algorithm": args.algorithm, "dataset": "rotated-digits", "setting": "fdg", "eval_every": 1}
    base_cfg = FederatedRunConfig.from_dict(base)
    ranges = knob_ranges(args.knobs, client_knob_hparams(base_cfg))
    hparams = client_knob_hparams(base_cfg)
    defaults = {r.name: float(hparams[r.name].of(base_cfg)) if r.name in hparams else float(getattr(base_cfg, r.name))
                for r in ranges}
    per_arm = args.rounds // args.arms
    print(f"load average: {os.getloadavg()}; budget {args.rounds} rounds; FedEx k={args.configs} eps={args.eps} "
          f"knobs {args.knobs}; random search {args.arms} arms x {per_arm} rounds")
    fedex_scores, rs_scores, plain_scores = [], [], []
    with tempfile.TemporaryDirectory() as out:
        for seed in args.seeds:
            for target in args.targets:
                t0 = time.time()
                cell = {**base, "seed": seed, "target_domain": target}
                fx = one_run({**cell, "rounds": args.rounds, "name": "fedex", "fedex_configs": args.configs,
                              "fedex_eps": args.eps, "fedex_knobs": args.knobs}, out)
                plain = one_run({**cell, "rounds": args.rounds, "name": "plain"}, out)
                plain_scores.append(plain["target_acc_at_best_val"])
                rng = np.random.default_rng([seed, 31])
                arms = []
                for a in range(args.arms):
                    values = {r.name: draw(r, defaults[r.name], args.eps, rng) for r in ranges}
                    arms.append(one_run({**cell, **values, "rounds": per_arm, "name": f"rs{a}"}, out))
                best = max(arms, key=lambda t: -math.inf if t["best_val_acc"] is None else t["best_val_acc"])
                fedex_scores.append(fx["target_acc_at_best_val"])
                rs_scores.append(best["target_acc_at_best_val"])
                import json

                mle = json.loads(fx["fedex_json"])["mle"]
                diverged = sum(t["status"] == "diverged" for t in arms)
                print(f"seed {seed} target {target}: FedEx {fx['target_acc_at_best_val']:.4f} ({fx['status']} after "
                      f"{fx['rounds_done']} rounds; most likely {mle}), "
                      f"random search {best['target_acc_at_best_val']:.4f} (val {best['best_val_acc']:.4f}; "
                      f"{diverged} of {args.arms} arms diverged); no tuning {plain['target_acc_at_best_val']:.4f}; "
                      f"{time.time() - t0:.0f} s", flush=True)
    diff = [f - r for f, r in zip(fedex_scores, rs_scores)]
    n = len(diff)

    def ms(x):
        return f"{statistics.mean(x):.4f} ± {statistics.stdev(x) if len(x) > 1 else 0.0:.4f}"

    half = 1.96 * (statistics.stdev(diff) / math.sqrt(n)) if n > 1 else math.nan
    print(f"FedEx target accuracy {ms(fedex_scores)}; random search {ms(rs_scores)}; no tuning {ms(plain_scores)} "
          f"(mean ± sd over {n} seed x target cells)")
    print(f"FedEx - random search: {statistics.mean(diff):+.4f}, 95% interval ±{half:.4f} (paired, normal)")
    control = [f - p for f, p in zip(fedex_scores, plain_scores)]
    half = 1.96 * (statistics.stdev(control) / math.sqrt(n)) if n > 1 else math.nan
    print(f"FedEx - no tuning: {statistics.mean(control):+.4f}, 95% interval ±{half:.4f} (paired, normal)")


if __name__ == "__main__":
    main()
