"""Ray round time vs. in-process sequential time for the same work, start-up cost, weight transfer.

A script, not a test: it prints ratios measured in one run (this machine is noisy, so only
ratios taken side by side mean something).

    python benchmarks/round_overhead.py                 # both parts, ~3 minutes on 2 cores
    python benchmarks/round_overhead.py --part compute  # only the rotated-digits ratio
    python benchmarks/round_overhead.py --part transfer # only the 11.7M-parameter model

Part 1 (compute): rotated-digits, 4 clients (fl split, every client takes ``--local-steps``
steps per round, enough for >= 0.3 s of local work), the fedtune CNN. The same config runs with
``backend=local`` (one process, clients one after another, 1 torch thread: the sequential
reference) and ``backend=ray`` (client actors at client_cpus=1: 2 actors on 2 cores). Reported:
steady-state round wall time (rounds 2..R) of each and their ratio; 0.5 is the 2-core limit.

Part 2 (transfer): the same 4 clients with an 11.7M-parameter model (``mlp`` sized so, or
``--big-model resnet18``, 11.2M) and 1 local step, so a round is dominated by moving weights:
the broadcast (one ``ray.put``, read zero-copy by each actor), the 4 returned states, the
aggregation. Reported per round: bytes moved, fit-phase time beyond the busiest actor's own
compute (= dispatch + serialisation + transfer), publish time, server time.

Part 3 (start-up): ``fedtune run --rounds 1`` as a subprocess; time to the end of round 1 as
printed by fedtune and the process wall time, beside Ray's own start time measured here.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

from fedtune.config import FederatedRunConfig
from fedtune.runtime.cluster import connect_ray
from fedtune.runtime.driver import run


def steady(rows, key="wall_s"):
    vals = [r[key] for r in rows[1:]] or [rows[0][key]]
    return statistics.median(vals)


def compute_part(args, out_dir: str) -> None:
    base = dict(dataset="rotated-digits", setting="fl", num_clients=4, dirichlet_alpha=100.0,
                rounds=args.rounds, local_steps=args.local_steps, batch_size=32, output=out_dir,
                name="bench-compute", client_cpus=1.0, seed=0)
    print("\n== Part 1: rotated-digits, 4 clients, fedtune CNN ==")
    ratios = []
    for rep in range(args.repeats):  # local and Ray back to back, so each ratio shares the machine's mood
        local = run(FederatedRunConfig.from_dict({**base, "backend": "local"}), progress=False)
        ray_res = run(FederatedRunConfig.from_dict({**base, "backend": "ray"}), progress=False)
        same = all(a["val_acc"] == b["val_acc"] and a["train_loss"] == b["train_loss"]
                   for a, b in zip(local.rows, ray_res.rows))
        t_local, t_ray = steady(local.rows), steady(ray_res.rows)
        ratios.append(t_ray / t_local)
        r = ray_res.rows[-1]
        print(f"[{rep + 1}/{args.repeats}] local work per client {steady(local.rows, 'client_compute_s') / 4:.2f} s "
              f"({args.local_steps} steps of 32); in-process round {t_local:.3f} s; Ray round "
              f"({ray_res.info['num_workers']} actors) {t_ray:.3f} s; ratio {t_ray / t_local:.3f}; "
              f"Ray split: fit {r['client_s']:.3f} s (busiest actor computes {r['client_critical_s']:.3f} s), "
              f"server {r['server_s']:.3f} s, eval {r['eval_s']:.3f} s; identical metrics: {same}")
    print(f"ROUND RATIO ray/in-process (steady state, median of rounds 2..{args.rounds}): median "
          f"{statistics.median(ratios):.3f}, min {min(ratios):.3f}, max {max(ratios):.3f} over {len(ratios)} "
          f"repeat(s)   (2-core limit 0.5; target <= 0.55)")


def transfer_part(args, out_dir: str) -> None:
    model = {"mlp": dict(model="mlp", mlp_hidden=[4096, 2000, 128]), "resnet18": dict(model="resnet18")}[args.big_model]
    base = dict(dataset="rotated-digits", setting="fl", num_clients=4, dirichlet_alpha=100.0, rounds=args.rounds,
                local_steps=1, batch_size=8, output=out_dir, name="bench-transfer", client_cpus=0.5,
                max_client_actors=4, backend="ray", local_momentum=0.0, eval_batch_size=512, **model)
    res = run(FederatedRunConfig.from_dict(base), progress=False)
    rows = res.rows[1:] or res.rows
    m = res.info["num_params"]
    overhead = statistics.median(r["client_s"] - r["client_critical_s"] for r in rows)
    print(f"\n== Part 2: weight transfer, {m / 1e6:.2f}M-parameter {args.big_model}, 4 clients on 4 actors ==")
    print(f"bytes moved per round: {rows[-1]['bytes_moved'] / 1e6:.1f} MB "
          f"(1 broadcast object read by 4 actors + 4 returned states of {m * 4 / 1e6:.1f} MB)")
    print(f"fit-phase time beyond the busiest actor's compute (dispatch + object-store transfer): {overhead:.3f} s")
    io = statistics.median(r["client_io_s"] for r in rows)
    print(f"copies in/out of the model inside the busiest actor (set_flat + get_flat): {io:.3f} s")
    print(f"publish (ray.put of the new global weights): {statistics.median(r['publish_s'] for r in rows):.3f} s")
    print(f"WEIGHT TRANSFER per round (dispatch+transfer + copies + publish): "
          f"{overhead + io + statistics.median(r['publish_s'] for r in rows):.3f} s  (target <= 0.2 s)")
    print(f"server aggregation of 4 x {m / 1e6:.1f}M (FedAvg, float64 accumulate): "
          f"{statistics.median(r['server_s'] for r in rows):.3f} s")


def startup_part(args, out_dir: str) -> None:
    import ray

    t0 = time.perf_counter()
    connect_ray(FederatedRunConfig.from_dict({}))
    ray_up = time.perf_counter() - t0
    ray.shutdown()
    time.sleep(2)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "fedtune.cli", "run", "--rounds", "1", "--no-progress",
                           "--output", out_dir, "--name", "bench-startup", "--set", "setting=fl",
                           "--set", "num_clients=4", "--set", f"local_steps={args.local_steps}"],
                          capture_output=True, text=True)
    wall = time.perf_counter() - t0
    match = re.search(r"time to the end of round 1: ([0-9.]+)s", proc.stdout)
    print("\n== Part 3: start-up ==")
    print(f"ray.init alone (local, 2 CPUs, dashboard off): {ray_up:.2f} s")
    print(f"`fedtune run --rounds 1`: end of round 1 at {match.group(1) if match else '?'} s after run() began; "
          f"process wall {wall:.2f} s (exit {proc.returncode})")
    print("  processes started: 1 coordinator (NumPy only, no torch import) + 2 client actors (torch)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", choices=["all", "compute", "transfer", "startup"], default="all")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--local-steps", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3, help="repeats of part 1 (this machine is noisy)")
    p.add_argument("--big-model", choices=["mlp", "resnet18"], default="mlp")
    args = p.parse_args()
    print(f"machine: {os.cpu_count()} CPUs; python {sys.version.split()[0]}")
    with tempfile.TemporaryDirectory() as out:
        if args.part in ("all", "compute"):
            compute_part(args, out)
        if args.part in ("all", "transfer"):
            transfer_part(args, out)
        if args.part in ("all", "startup"):
            startup_part(args, out)


if __name__ == "__main__":
    main()
