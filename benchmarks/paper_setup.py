"""Local-step cost of the paper setup (PACS at 224 px, ResNet, DomainBed augmentation) per precision.

    python benchmarks/paper_setup.py [--data-root ../shared/data/PACS64] [--model resnet18]
                                     [--steps 6] [--repeats 3] [--precisions fp32,bf16]
                                     [--pack 4]

For each precision, one client of ``examples/paper-setup/pacs-resnet18.yaml``'s setup (through
fedtune's own ``ClientWorker``: cache -> batches -> augmentation -> local steps) trains
``--steps`` local steps of batch 32 after one warm-up round; it prints steps/s
min/median/max over ``--repeats`` rounds, the ratio to fp32, and on CUDA the peak GPU memory
of the client (``torch.cuda.max_memory_allocated``). fp16 is measured on CUDA only (it is
refused on CPU clients). ``--pack N`` (CUDA, Ray) then runs one federated round with N client
actors at ``client_gpus = 1/N`` on one GPU and prints the round's time and each actor's GPU
memory (``nvidia-smi``). Pretrained weights do not change the cost: the model starts from
scratch here (``--weights`` to load torchvision's file from ``$TORCH_HOME``).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_ROOT = REPO.parent / "shared" / "data" / "PACS64"


def worker_for(args, precision: str, gpus: float):
    from fedtune.config import FederatedRunConfig
    from fedtune.runtime.driver import build_plan
    from fedtune.runtime.worker import ClientWorker

    cfg = FederatedRunConfig.from_yaml(REPO / "examples" / "paper-setup" / "pacs-resnet18.yaml", {
        "data_root": str(args.data_root), "model": args.model, "weights": args.weights, "precision": precision,
        "client_gpus": gpus, "client_cpus": args.cpus, "local_steps": args.steps, "backend": "local",
        "local_optimizer": "adam", "local_lr": 5e-5})
    plan = build_plan(cfg)
    return cfg, ClientWorker(cfg.to_dict(), [plan.clients[0]])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-root", type=Path, default=DEFAULT_ROOT)
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--weights", default="none")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cpus", type=float, default=2.0)
    ap.add_argument("--precisions", default=None, help="default: fp32,bf16 (and fp16 on CUDA)")
    ap.add_argument("--pack", type=int, default=0, help="CUDA: N client actors at 1/N GPU for one round")
    args = ap.parse_args(argv)
    import torch

    cuda = torch.cuda.is_available()
    precisions = (args.precisions or ("fp32,bf16,fp16" if cuda else "fp32,bf16")).split(",")
    print(f"paper_setup: {args.model} on PACS at 224 px from {args.data_root}, batch 32, {args.steps} local steps "
          f"per round, device {'cuda: ' + torch.cuda.get_device_name() if cuda else 'cpu'}")
    rates: dict[str, float] = {}
    for precision in precisions:
        cfg, worker = worker_for(args, precision, 1.0 if cuda else 0.0)
        weights = worker.initial_state()[0]
        worker.fit(weights, {}, 1, [worker_id := sorted(worker.specs)[0]])  # warm-up (cudnn autotune, caches)
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        runs = []
        for r in range(args.repeats):
            t0 = time.perf_counter()
            reply = worker.fit(weights, {}, 2 + r, [worker_id])
            if cuda:
                torch.cuda.synchronize()
            runs.append(reply.steps[0] / (time.perf_counter() - t0))
        rates[precision] = statistics.median(runs)
        mem = f", peak GPU memory {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB" if cuda else ""
        print(f"{precision:>5}: steps/s min {min(runs):.3f} median {statistics.median(runs):.3f} max {max(runs):.3f} "
              f"(x{rates[precision] / rates[precisions[0]]:.2f} of {precisions[0]}){mem}")
        del worker
    if args.pack and cuda:
        from fedtune.config import FederatedRunConfig
        from fedtune.results.store import load
        from fedtune.runtime.driver import run

        out = Path("/tmp") / f"fedtune-pack-{time.time_ns()}"
        cfg = FederatedRunConfig.from_yaml(REPO / "examples" / "paper-setup" / "pacs-resnet18.yaml", {
            "data_root": str(args.data_root), "model": args.model, "clients_per_domain": args.pack,
            "target_domain": "sketch", "client_gpus": 1.0 / args.pack, "client_cpus": 1, "max_client_actors": args.pack,
            "local_steps": args.steps, "rounds": 1, "num_gpus": 1, "output": str(out), "local_optimizer": "adam",
            "local_lr": 5e-5})
        seen: list[str] = []

        def sample() -> None:
            q = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"],
                               capture_output=True, text=True)
            seen.append(q.stdout.strip())

        import threading

        stop = threading.Event()
        def loop() -> None:
            while not stop.is_set():
                sample()
                stop.wait(1.0)

        th = threading.Thread(target=loop, daemon=True)
        th.start()
        t0 = time.perf_counter()
        res = run(cfg, progress=False)
        stop.set()
        rows = load(out / "default", "rounds").to_pylist()
        print(f"pack: {args.pack} actors at {1.0 / args.pack:.2f} GPU, status {res.status}, round time "
              f"{rows[0]['wall_s']:.1f} s (wall {time.perf_counter() - t0:.1f} s); "
              f"nvidia-smi (pid, memory) at the busiest sample: {max(seen, key=len) if seen else 'n/a'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
