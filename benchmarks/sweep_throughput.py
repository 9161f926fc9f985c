"""Throughput of a Ray Tune study of fedtune trials: per-trial start overhead and trials per hour.

A script, not a test: it prints ratios measured in one run (this machine is noisy, so only
ratios taken side by side mean something).

    python benchmarks/sweep_throughput.py                   # ~5 minutes on 2 cores
    python benchmarks/sweep_throughput.py --trials 12 --rounds 4 --algorithm fedomg

The study: ``--trials`` FedAvg (or ``--algorithm``) trials on rotated-digits, a grid over
``local_lr`` (the same configurations in every mode), ``--rounds`` rounds of ``--local-steps``
steps, a small MLP, one client actor of 1 CPU per trial (so two trials fit side by side on 2
cores), through the real pipeline: ``ray.tune.Tuner`` + ``fedtune_trainable()`` + ``ArrowCallback``.
It runs three times:

1. ``reuse_actors=False``, one trial at a time, the first ``--fresh-trials`` of the grid: every
   trial starts a trainable process, a placement group, a coordinator and a client actor (a
   process + torch import).
2. ``reuse_actors=True``, one trial at a time: trials after the first re-configure the previous
   trial's trainable, placement group and actors in place.
3. ``reuse_actors=True``, two trials at a time.

Modes 2 and 3 run back to back ``--repeats`` times (the median ratio is reported).

Reported per mode:

* start overhead, the trainable's own view: ``startup_s`` of each trial (from entering
  ``setup``/``reset_config`` to the coordinator and every client actor being ready); median over
  trials 2..N (the first trial of a study always starts fresh);
* start overhead, the driver's view (one trial at a time only): the time between trial k-1's
  last result and trial k's first result, minus trial k's round-1 wall time: everything a new
  trial costs beyond its rounds (Tune's scheduling, the placement group, the trainable process,
  the actors, the previous trial's stop); median over trials 2..N;
* CPU time of the Tune driver process (Tune's loop, the ArrowCallback's Parquet writes) per
  trial: the one serial part of a study;
* trials per hour, steady state: (N - 2) / (time from the 2nd to the last trial end) x 3600: a
  long study pays its first, fresh trial starts once, so they are left out of the rate (the
  same rule in both modes); the rate over the whole span is printed beside it.

Targets: start overhead <= 3 s with reuse; two trials at a time >= 1.6x the trials per hour of one.
The stored metrics of every mode are compared too: reuse and concurrency must not change them.
The machine is shared, so the script also measures its 2-process ceiling after each pair:
two in-process runs of the same rounds side by side vs one (no Ray, no Tune); on two idle cores
that is 2.0x, and a busy machine lowers it for every mode alike.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
import time
from typing import Any

from ray import tune


class Timeline(tune.Callback):
    """Driver-side timestamps of every trial: start, first and last result, the trainable's
    own start-up figures and its round-1 wall time."""

    def __init__(self) -> None:
        self.trials: dict[str, dict[str, Any]] = {}

    def on_trial_start(self, iteration, trials, trial, **info):
        self.trials.setdefault(trial.trial_id, {})["start"] = time.time()

    def on_trial_result(self, iteration, trials, trial, result, **info):
        ev = self.trials.setdefault(trial.trial_id, {})
        now = time.time()
        ev.setdefault("first", now)
        ev["last"] = now
        ev["startup_s"], ev["reused"] = result["startup_s"], result["actors_reused"]
        if result["round"] == 1:
            ev["round1_wall_s"] = result["fedtune_row"]["wall_s"]


def run_mode(args, lrs: list[float], out: str, *, reuse: bool, concurrent: int, tag: str = "") -> dict[str, Any]:
    from fedtune.results.store import load
    from fedtune.tune.trial.callback import ArrowCallback
    from fedtune.tune.trial.trainable import fedtune_trainable

    study = f"reuse{int(reuse)}-c{concurrent}{tag}"
    timeline = Timeline()
    param_space = {
        "algorithm": args.algorithm, "dataset": "rotated-digits", "model": "mlp", "mlp_hidden": [256, 256],
        "rounds": args.rounds, "local_steps": args.local_steps, "batch_size": 32, "client_cpus": 1,
        "max_client_actors": 1, "local_lr": tune.grid_search(lrs),
    }
    tuner = tune.Tuner(
        fedtune_trainable(), param_space=param_space,
        tune_config=tune.TuneConfig(max_concurrent_trials=concurrent, reuse_actors=reuse),
        run_config=tune.RunConfig(name=study, storage_path=os.path.join(out, ".tune"), verbose=0,
                                  callbacks=[timeline, ArrowCallback(out, study)]),
    )
    t0, cpu0 = time.time(), time.process_time()
    grid = tuner.fit()
    fit_s, driver_cpu_s = time.time() - t0, time.process_time() - cpu0
    if grid.errors:
        raise RuntimeError(f"{study}: {len(grid.errors)} trial(s) failed: {grid.errors[0]}")
    evs = sorted(timeline.trials.values(), key=lambda e: e["first"])
    later = evs[1:] or evs
    gaps = [b["first"] - a["last"] - b["round1_wall_s"] for a, b in itertools.pairwise(evs)] if concurrent == 1 else []
    span = max(e["last"] for e in evs) - min(e["start"] for e in evs)
    ends = sorted(e["last"] for e in evs)
    steady = (len(ends) - 2) / (ends[-1] - ends[1]) * 3600.0 if len(ends) > 2 else float("nan")
    rounds = load(os.path.join(out, study)).to_pandas().sort_values(["trial_id", "round"])
    return {
        "study": study, "reuse": reuse, "concurrent": concurrent, "fit_s": fit_s, "span_s": span,
        "trials_per_hour": steady, "trials_per_hour_span": len(evs) / span * 3600.0,
        "startup_s": statistics.median(e["startup_s"] for e in later),
        "reused": sum(bool(e["reused"]) for e in evs),
        "gap_s": statistics.median(gaps) if gaps else None,
        "round_s": statistics.median(rounds["wall_s"]),
        "metrics": {(r.trial_id, r.round): (r.train_loss, r.val_acc, r.target_acc) for r in rounds.itertuples()},
        "n": len(evs), "driver_cpu_per_trial_s": driver_cpu_s / len(evs),
    }


def _timed_rounds(cfg_dict: dict[str, Any], rounds: int, barrier, queue) -> None:
    """Child process: start an in-process run of ``cfg_dict`` (1 torch thread), wait at
    ``barrier``, then time ``rounds`` rounds and put the seconds on ``queue``."""
    from fedtune.config import FederatedRunConfig
    from fedtune.runtime.driver import FederatedRun

    fr = FederatedRun(FederatedRunConfig.from_dict(cfg_dict))
    fr.start()
    fr.step()  # warm-up round
    barrier.wait()
    t0 = time.perf_counter()
    for _ in range(rounds):
        fr.step()
    queue.put(time.perf_counter() - t0)
    fr.close()


def machine_capacity(cfg_dict: dict[str, Any], rounds: int) -> float:
    """How much faster two copies of the same rounds finish side by side than one after the
    other, right now, without Ray or Tune: the ceiling for the concurrency ratio on this
    (shared, noisy) machine. 2.0 on two idle cores."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")

    def together(n: int) -> list[float]:
        barrier, queue = ctx.Barrier(n), ctx.Queue()
        procs = [ctx.Process(target=_timed_rounds, args=(cfg_dict, rounds, barrier, queue)) for _ in range(n)]
        for p in procs:
            p.start()
        out = [queue.get() for _ in procs]
        for p in procs:
            p.join()
        return out

    alone = together(1)[0]
    pair = together(2)
    return 2.0 * alone / max(pair)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=10)
    p.add_argument("--fresh-trials", type=int, default=4, help="trials of the no-reuse mode (slow ones)")
    p.add_argument("--repeats", type=int, default=2, help="pairs of one/two-at-a-time runs (median ratio)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--local-steps", type=int, default=20)
    p.add_argument("--algorithm", default="fedavg")
    p.add_argument("--output", default=None, help="results folder (default: a temporary one)")
    args = p.parse_args()

    import ray

    print(f"machine: {os.cpu_count()} CPUs; python {sys.version.split()[0]}; ray {ray.__version__}; "
          f"load average {os.getloadavg()[0]:.1f}")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    out = args.output or tempfile.mkdtemp(prefix="fedtune-sweep-bench-")
    lrs = [round(0.01 + 0.01 * i, 4) for i in range(args.trials)]
    cap_cfg = {"algorithm": args.algorithm, "dataset": "rotated-digits", "model": "mlp", "mlp_hidden": [256, 256],
               "rounds": 100, "local_steps": args.local_steps, "batch_size": 32, "backend": "local",
               "client_cpus": 1, "local_lr": 0.05, "output": out, "name": "capacity"}

    def show(r: dict[str, Any]) -> None:
        gap = f"{r['gap_s']:.2f} s" if r["gap_s"] is not None else "-"
        print(f"{r['study']:>12}: {r['n']} trials ({r['reused']} on reused actors), round {r['round_s']:.2f} s; "
              f"start overhead trainable view {r['startup_s']:.2f} s, driver view {gap}; "
              f"{r['trials_per_hour']:.0f} trials/hour steady state, {r['trials_per_hour_span']:.0f} over the span "
              f"({r['span_s']:.1f} s; Tuner.fit {r['fit_s']:.1f} s); Tune driver CPU "
              f"{r['driver_cpu_per_trial_s']:.2f} s/trial", flush=True)

    fresh = run_mode(args, lrs[:args.fresh_trials], out, reuse=False, concurrent=1)
    show(fresh)
    pairs, same = [], True
    for rep in range(args.repeats):  # one and two at a time back to back: each ratio shares the machine's mood
        one = run_mode(args, lrs, out, reuse=True, concurrent=1, tag=f"-{rep}")
        show(one)
        two = run_mode(args, lrs, out, reuse=True, concurrent=2, tag=f"-{rep}")
        show(two)
        capacity = machine_capacity(cap_cfg, rounds=3 * args.rounds)
        ratio = two["trials_per_hour"] / one["trials_per_hour"]
        print(f"[{rep + 1}/{args.repeats}] two/one at a time {ratio:.2f}x (whole span "
              f"{two['trials_per_hour_span'] / one['trials_per_hour_span']:.2f}x); machine's 2-process ceiling "
              f"right after {capacity:.2f}x (no Ray, no Tune; 2.0 on two idle cores); load average "
              f"{os.getloadavg()[0]:.1f}", flush=True)
        pairs.append((one, two, ratio, capacity))
        same &= all(fresh["metrics"][k] == one["metrics"][k] for k in fresh["metrics"])
        same &= one["metrics"] == two["metrics"]
    print(f"stored metrics identical across every mode and repeat: {same}")
    start_reuse = statistics.median(p[0]["startup_s"] for p in pairs)
    gap_reuse = statistics.median(p[0]["gap_s"] for p in pairs)
    print(f"START OVERHEAD with reuse: {start_reuse:.2f} s (trainable view), {gap_reuse:.2f} s (driver view); "
          f"without: {fresh['startup_s']:.2f} s / {fresh['gap_s']:.2f} s; ratio without/with (driver view) "
          f"{fresh['gap_s'] / gap_reuse:.1f}x  [target <= 3 s with reuse]")
    print(f"TRIALS PER HOUR two at a time / one at a time (reuse, steady state): median "
          f"{statistics.median(p[2] for p in pairs):.2f}x over {len(pairs)} pair(s) "
          f"({', '.join(f'{p[2]:.2f}' for p in pairs)})  [target >= 1.6x]; the machine's own 2-process ceiling: "
          f"{', '.join(f'{p[3]:.2f}' for p in pairs)}")
    ray.shutdown()


if __name__ == "__main__":
    main()
