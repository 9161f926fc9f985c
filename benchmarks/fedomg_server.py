"""Server time of FedAvg, FedOMG and auto-β against this machine's floors, measured in one run.

A script, not a test. It prints tables and the issue-11 goal lines, every number measured in
the same run (this machine is shared and noisy: medians over rounds; only numbers taken side by
side mean something). Exit status 1 when the exact step-2 solver ends above the authors' SGD
solver's objective, or when results differ in a single bit between thread counts (or κ = 0 is
not FedAvg bit for bit); a goal MISS is printed, never hidden, but does not change the status.

    python benchmarks/fedomg_server.py                  # the full run (a few minutes on 2 cores)
    python benchmarks/fedomg_server.py --quick          # smoke run: M = 1M, U = 10 and 100 (~10 s)
    python benchmarks/fedomg_server.py --params cnn --clients 10 100 --threads 1 2 4

Flags: ``--params`` (model sizes M: integers, ``cnn`` or ``resnet18``; default ``cnn resnet18``),
``--clients`` (values of U, default ``10 100 1000``), ``--threads`` (server threads compared at
the goal case, default ``1 2``), ``--repeats`` (rounds per case, default 3) and ``--big-repeats``
(rounds for cases whose Gram needs more than 10¹¹ multiply-adds, default 1), ``--kappa`` (0.5),
``--beta-params`` / ``--beta-steps`` / ``--beta-sources`` (the auto-β case: M = 11.7M, 20
target steps, 3 sources), ``--mem-fraction`` (0.6), ``--seed`` (0), ``--quick``.

Models: ``cnn`` is fedtune's ``build_model("cnn")`` on the embedded default dataset
(rotated-digits, 1×28×28, 10 classes: 1,663,370 parameters); ``resnet18`` is M = 11.7M (the
paper's FDG model). Rounds: each case has 10·U logical clients with example counts drawn from
100..1000 and a client-specific update scale; each round samples U of them without replacement
(rows in client-id order), ``p`` are their example weights (``fedavg_weights``) and
``Δ_u = s + b_u n_u`` (a shared component ``s`` plus the client's own noise). A case whose
``[U, M]`` float32 updates plus working memory need more than ``--mem-fraction`` of MemAvailable
is printed as "not run: needs X GB", never dropped.

Floors, measured first:

* ``floor``: one read of the case's ``[U, M]`` float32 updates, ``np.dot(ones(U), updates)``
  with one BLAS thread (the memory-bandwidth floor of any server rule that reads every update);
* GEMM rate: a 1536² matrix product with one BLAS thread, float64 and float32, in multiply-adds
  per second; the Gram's arithmetic floor is ``U² M / 2`` multiply-adds at that rate (the least
  time any exact Gram pass can take on this core).

Table 1 (seconds, medians over the rounds; one server thread): ``GB`` the updates' size,
``rounds``, ``floor``, ``FedAvg`` (``fedavg_step``), FedOMG's parts (``fedomg_step``, exact
solver, κ = ``--kappa``, global_lr 0.05): ``gram`` (the one pass building G and g_FL),
``solve`` (step 2 from G), ``combine`` (g_FL plus Γ*'s support rows), ``FedOMG`` (the call's
wall time), ``sgd`` (the authors' 20-step solver on the same G), ``solve %`` (solve's share of
FedOMG) and ``OMG/Avg``. Table 2: the same times as multiples of ``floor``. Table 3 (the last
round's G): step-2 objective of the exact and SGD solvers and the exact solver's certified
``gap`` (relative to ‖g_FL‖·max_u‖Δ_u‖), ``ex<=sgd`` (exact not above SGD up to rounding) and
``|supp|`` (clients with γ_u > 0). Threads table (goal case, every round): ``θ_u−θ`` (the
coordinator building the ``[U, M]`` updates from the clients' states, ``subtract_rows``), FedAvg, FedOMG
(gram, combine), FedOMG/FedAvg and auto-β with ``threads=t`` (what ``coordinator_cpus`` buys),
the speed-ups ``x`` over one thread, and whether the outputs (FedAvg's θ, FedOMG's θ and G,
auto-β's estimates) are bit-identical to one thread's; then whether FedOMG with κ = 0 is FedAvg
bit for bit.

The goal case is U = 100, M = 11.7M (if the run does not include it: the largest M at the U
nearest 100, flagged on the goal lines). For it the script prints the Gram's arithmetic floor
(seconds, × floor, × FedAvg) at the float64 and float32 rates, and "best possible FedOMG/FedAvg
at one thread" = (max(Gram floor, read floor) + measured solve + combine) / FedAvg: whether the
2.5× goal is reachable on this core. Goal lines (one thread, PASS/MISS): FedOMG/FedAvg ≤ 2.5,
FedAvg/floor ≤ 2, and auto-β (``auto_beta_estimates`` on ``[20, M]`` target and ``[3, M]``
source steps) / one read of the target's steps (``np.dot(ones(20), target)``) ≤ 10.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable from a checkout

from fedtune.algorithms.server.aggregate import fedavg_step, fedavg_weights  # noqa: E402
from fedtune.algorithms.server.blocked import one_blas_thread, subtract_rows  # noqa: E402
from fedtune.algorithms.server.fedgp_auto_beta import auto_beta_estimates  # noqa: E402
from fedtune.algorithms.server.fedomg import fedomg_step  # noqa: E402
from fedtune.algorithms.server.fedomg_solvers import _norm_floor, omg_objective, solve_omg_exact_info, solve_omg_sgd  # noqa: E402

RESNET18 = 11_700_000
CNN_FALLBACK = 1_663_370  # build_model("cnn") on rotated-digits (1×28×28, 10 classes), if torch fails
GOAL_U, GOAL_M = 100, RESNET18
GOAL_OMG, GOAL_AVG, GOAL_BETA = 2.5, 2.0, 10.0
BIG_GRAM = 1e11  # multiply-adds above which a case runs --big-repeats rounds
LR = 0.05


def cnn_params() -> tuple[int, str]:
    """Parameters of fedtune's ``cnn`` on the embedded default dataset, built as fedtune builds it."""
    try:
        from fedtune.data.registry import dataset_info
        from fedtune.layout import FlatLayout
        from fedtune.models import build_model

        info = dataset_info("rotated-digits")
        model = build_model("cnn", input_shape=info.input_shape, num_classes=len(info.classes))
        return FlatLayout.of(model).num_params, f"build_model('cnn') on {info.name} {info.input_shape}"
    except Exception as exc:  # pragma: no cover - torch missing or broken
        return CNN_FALLBACK, f"fallback constant ({type(exc).__name__}: {exc})"


def parse_params(text: str) -> int:
    if text == "resnet18":
        return RESNET18
    if text == "cnn":
        return -1  # resolved in main (building the model imports torch)
    try:
        value = int(float(text))
    except (ValueError, OverflowError):
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"--params: {text} is out of range; allowed: cnn, resnet18 or an integer >= 1")
    return value


def median_time(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def read_floor(x: np.ndarray, repeats: int = 3) -> float:
    """Seconds for one read of ``x`` [rows, M] float32: ``np.dot(ones, x)`` with one BLAS thread
    (median of ``repeats``)."""
    ones = np.ones(x.shape[0], np.float32)
    with one_blas_thread():
        return median_time(lambda: np.dot(ones, x), repeats)


def gemm_rates(n: int = 1536) -> dict[str, float]:
    """Multiply-adds per second of an ``n × n`` matrix product on one BLAS thread (best of 3)."""
    rng = np.random.default_rng(0)
    rates = {}
    with one_blas_thread():
        for dt in (np.float64, np.float32):
            a, b = rng.standard_normal((n, n)).astype(dt), rng.standard_normal((n, n)).astype(dt)
            a @ b
            best = min(median_time(lambda: a @ b, 1) for _ in range(3))
            rates[np.dtype(dt).name] = n ** 3 / best
    return rates


def mem_available() -> float:
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    return float("nan")  # pragma: no cover


def mem_needed(num: int, m: int) -> float:
    """The updates plus θ, s, g_FL, the outputs kept for the bit checks and per-thread scratch."""
    return 4.0 * num * m + 48.0 * m + 256 * 2 ** 20


# ============================================================================== rounds
class Rounds:
    """10·U logical clients; each round U participants sampled without replacement, and their
    ``[U, M]`` updates ``Δ_u = s + b_u n_u`` (rows in client-id order)."""

    def __init__(self, num: int, m: int, seed: int):
        self.rng = np.random.default_rng([seed, num, m])
        self.sizes = self.rng.integers(100, 1001, 10 * num)
        self.scales = self.rng.uniform(0.5e-3, 2e-3, 10 * num).astype(np.float32)
        self.num = num
        self.shared = self.rng.standard_normal(m, dtype=np.float32)
        self.shared *= np.float32(1e-3)
        self.theta = self.rng.standard_normal(m, dtype=np.float32)
        self.ids = self.sample()
        self.updates = np.empty((num, m), np.float32)
        for u, c in enumerate(self.ids):
            row = self.updates[u]
            self.rng.standard_normal(m, dtype=np.float32, out=row)
            row *= self.scales[c]
            row += self.shared

    def sample(self) -> np.ndarray:
        return np.sort(self.rng.choice(10 * self.num, self.num, replace=False))

    @property
    def weights(self) -> np.ndarray:
        return fedavg_weights(self.sizes[self.ids])

    def next_round(self) -> None:
        """New participants: each row's own part rescaled to its new client's ``b`` (cache-sized
        blocks; the noise is reused, which changes nothing the timings see)."""
        old, self.ids = self.ids, self.sample()
        step = 1 << 16
        for u in range(self.num):
            ratio = self.scales[self.ids[u]] / self.scales[old[u]]
            row = self.updates[u]
            for s in range(0, row.shape[0], step):
                blk, sh = row[s:s + step], self.shared[s:s + step]
                blk -= sh
                blk *= ratio
                blk += sh


# ============================================================================== one case
def run_case(num: int, m: int, rounds: int, threads: list[int], args: argparse.Namespace,
             goal: bool) -> dict[str, Any]:
    t0 = time.perf_counter()
    data = Rounds(num, m, args.seed)
    x = data.updates
    print(f"  U={num}, M={m:,}: built {x.nbytes / 1e9:.2f} GB of updates in {time.perf_counter() - t0:.1f} s",
          flush=True)
    keys = ["floor", "sgd"] + [f"{k}{t}" for t in threads for k in ("avg", "omg", "gram", "solve", "combine")]
    keys += [f"sub{t}" for t in threads] if goal else []
    states, deltas = (list(x), np.empty_like(x)) if goal else (None, None)  # the coordinator's Δ_u = θ_u − θ
    if deltas is not None:
        deltas.fill(0.0)  # the coordinator keeps this buffer across rounds: no first-touch page faults in the timing
    runs: dict[str, list[float]] = {k: [] for k in keys}
    identical, kappa0 = True, None
    G = p = None
    for r in range(rounds):
        if r:
            data.next_round()
        p = data.weights
        runs["floor"].append(read_floor(x))
        ref: tuple[bytes, bytes, bytes] | None = None
        for t in threads:
            if goal:  # building the updates from the clients' states (every rule's first step)
                t1 = time.perf_counter()
                subtract_rows(states, data.theta, deltas, threads=t)
                runs[f"sub{t}"].append(time.perf_counter() - t1)
            t1 = time.perf_counter()
            avg = fedavg_step(data.theta, x, p, LR, threads=t)
            runs[f"avg{t}"].append(time.perf_counter() - t1)
            t1 = time.perf_counter()
            step = fedomg_step(x, p, args.kappa, solver="exact", params=data.theta, global_lr=LR, threads=t)
            runs[f"omg{t}"].append(time.perf_counter() - t1)
            runs[f"gram{t}"].append(step.gram_s)
            runs[f"solve{t}"].append(step.solve_s)
            runs[f"combine{t}"].append(step.combine_s)
            bits = (avg.tobytes(), step.out.tobytes(), step.gram.tobytes())
            if ref is None:
                ref, G = bits, step.gram
            else:
                identical &= bits == ref
            del step, bits
        t1 = time.perf_counter()
        solve_omg_sgd(G, p, args.kappa)
        runs["sgd"].append(time.perf_counter() - t1)
        if goal and r == rounds - 1:  # κ = 0 must be FedAvg bit for bit
            zero = fedomg_step(x, p, 0.0, solver="exact", params=data.theta, global_lr=LR, threads=threads[-1])
            kappa0 = zero.out.tobytes() == ref[0]
            del zero
        del avg, ref
    med = {k: statistics.median(v) for k, v in runs.items()}
    exact = solve_omg_exact_info(G, p, args.kappa)
    obj_sgd = omg_objective(solve_omg_sgd(G, p, args.kappa), G, p, args.kappa)
    obj_scale = math.sqrt(max(p @ G @ p, 0.0)) * math.sqrt(G.diagonal().max())
    noise = (1 + args.kappa) * math.sqrt(max(p @ G @ p, 0.0)) * _norm_floor(G)
    del data, x, states, deltas
    return {"U": num, "M": m, "gb": 4.0 * num * m / 1e9, "rounds": rounds, "med": med, "threads": threads,
            "identical": identical, "kappa0": kappa0,
            "obj_exact": exact.objective / obj_scale, "obj_sgd": obj_sgd / obj_scale, "gap": exact.gap / obj_scale,
            "ok": exact.objective <= obj_sgd + noise, "support": int(np.count_nonzero(exact.gamma))}


def run_beta(m: int, steps: int, sources: int, threads: list[int], repeats: int, seed: int) -> dict[str, Any]:
    """Auto-β estimation (``auto_beta_estimates``) on ``[steps, M]`` target steps and ``[sources, M]``
    source steps, beside one read of the target's steps."""
    rng = np.random.default_rng([seed, steps, m])
    t0 = time.perf_counter()
    drift = rng.standard_normal(m, dtype=np.float32)
    drift *= np.float32(1e-4)
    target = np.empty((steps, m), np.float32)
    source = np.empty((sources, m), np.float32)
    for mat, level in ((target, 1e-4), (source, 3e-4)):
        for row in mat:
            rng.standard_normal(m, dtype=np.float32, out=row)
            row *= np.float32(level)
            row += drift
    print(f"  auto-β: built {(target.nbytes + source.nbytes) / 1e9:.2f} GB of steps in "
          f"{time.perf_counter() - t0:.1f} s", flush=True)
    runs: dict[str, list[float]] = {k: [] for k in ["floor", "floor_all"] + [f"beta{t}" for t in threads]}
    identical = True
    for _ in range(repeats):
        runs["floor"].append(read_floor(target))
        runs["floor_all"].append(read_floor(target) + read_floor(source))
        ref = None
        for t in threads:
            t1 = time.perf_counter()
            est = auto_beta_estimates(target, source, threads=t)
            runs[f"beta{t}"].append(time.perf_counter() - t1)
            bits = b"".join(np.asarray(v, np.float64).tobytes() for v in (est.sigma2, est.d2, est.tau_d2))
            if ref is None:
                ref = bits
            else:
                identical &= bits == ref
    return {"M": m, "med": {k: statistics.median(v) for k, v in runs.items()}, "identical": identical}


# ============================================================================== printing
def table(title: str, head: list[tuple[str, int]], rows: list[list[str] | str]) -> None:
    line = " ".join(f"{h:>{w}}" for h, w in head)
    print(f"\n{title}\n{line}\n{'-' * len(line)}")
    for row in rows:
        print(row if isinstance(row, str) else " ".join(f"{c:>{w}}" for c, (_, w) in zip(row, head)))


def verdict(value: float, goal: float) -> str:
    return "PASS" if value <= goal else "MISS"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", type=parse_params, nargs="+", default=None,
                    help="model sizes M: integers, cnn or resnet18 (default: cnn resnet18)")
    ap.add_argument("--clients", type=int, nargs="+", default=None, help="values of U (default 10 100 1000)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="server threads compared (default 1 2)")
    ap.add_argument("--kappa", type=float, default=0.5, help="FedOMG's κ (default 0.5, the paper's)")
    ap.add_argument("--repeats", type=int, default=None, help="rounds per case; medians are printed (default 3)")
    ap.add_argument("--big-repeats", type=int, default=1, help=f"rounds when U²M/2 > {BIG_GRAM:.0e} (default 1)")
    ap.add_argument("--beta-params", type=parse_params, default=None, help="M of the auto-β case (default 11.7M)")
    ap.add_argument("--beta-steps", type=int, default=20, help="target steps B of the auto-β case (default 20)")
    ap.add_argument("--beta-sources", type=int, default=3, help="sources of the auto-β case (default 3)")
    ap.add_argument("--mem-fraction", type=float, default=0.6, help="largest share of MemAvailable a case may need")
    ap.add_argument("--quick", action="store_true", help="smoke run: M = 1M, U = 10 100, 2 rounds (~10 s)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if any(t < 1 for t in args.threads) or (args.repeats is not None and args.repeats < 1) or args.big_repeats < 1:
        ap.error("--threads, --repeats and --big-repeats must be >= 1")
    if not 0 < args.mem_fraction <= 1:
        ap.error(f"--mem-fraction: {args.mem_fraction} is out of range; allowed: 0 < f <= 1")
    if args.beta_steps < 2 or args.beta_sources < 1:
        ap.error("--beta-steps must be >= 2 and --beta-sources >= 1")
    if args.quick:
        args.params = args.params or [1_000_000]
        args.clients = args.clients or [10, 100]
        args.repeats = args.repeats or 2
        args.beta_params = args.beta_params or 1_000_000
    params = args.params or [-1, RESNET18]
    clients = sorted(set(args.clients or [10, 100, 1000]))
    repeats = args.repeats or 3
    beta_m = args.beta_params or RESNET18
    threads = sorted(set([1] + args.threads))
    cnn_note = ""
    if -1 in params or beta_m == -1:
        cnn, how = cnn_params()
        cnn_note = f"cnn = {cnn:,} parameters ({how})"
        params = [cnn if m == -1 else m for m in params]
        beta_m = cnn if beta_m == -1 else beta_m
    params = sorted(set(params))
    cases = [(m, u) for m in params for u in clients]
    goal_case = (GOAL_M, GOAL_U) if (GOAL_M, GOAL_U) in cases else \
        max(cases, key=lambda c: (c[1] == GOAL_U, c[0], -abs(c[1] - GOAL_U)))

    print(f"Server time vs this machine's floors: κ = {args.kappa}, one server thread unless stated, "
          f"threads compared {threads}, {repeats} rounds per case ({args.big_repeats} when U²M/2 > {BIG_GRAM:.0e})")
    if cnn_note:
        print(cnn_note)
    rates = gemm_rates()
    print(f"one-thread GEMM rate (1536² product): float64 {rates['float64'] / 1e9:.1f} G multiply-adds/s, "
          f"float32 {rates['float32'] / 1e9:.1f} G multiply-adds/s")
    results: list[dict[str, Any]] = []
    for m, u in cases:
        need, avail = mem_needed(u, m), mem_available()
        if need > args.mem_fraction * avail:
            results.append({"U": u, "M": m, "skip": f"not run: needs {need / 1e9:.1f} GB, "
                            f"{args.mem_fraction:.0%} of MemAvailable {avail / 1e9:.1f} GB = "
                            f"{args.mem_fraction * avail / 1e9:.1f} GB"})
            print(f"  U={u}, M={m:,}: {results[-1]['skip']}", flush=True)
            continue
        rounds = args.big_repeats if u * u * m / 2 > BIG_GRAM else repeats
        is_goal = (m, u) == goal_case
        results.append(run_case(u, m, rounds, threads if is_goal else [1], args, is_goal))
    beta = run_beta(beta_m, args.beta_steps, args.beta_sources, threads, repeats, args.seed)

    def skip_row(r: dict[str, Any]) -> str:
        return f"{r['M']:>11,} {r['U']:>5}   {r['skip']}"

    rows1: list[list[str] | str] = []
    rows2: list[list[str] | str] = []
    rows3: list[list[str] | str] = []
    for r in results:
        if "skip" in r:
            for rows in (rows1, rows2, rows3):
                rows.append(skip_row(r))
            continue
        d, f = r["med"], r["med"]["floor"]
        key = f"{r['M']:,}", str(r["U"])
        rows1.append([*key, f"{r['gb']:.2f}", str(r["rounds"]), f"{f:.3f}", f"{d['avg1']:.3f}", f"{d['gram1']:.3f}",
                      f"{d['solve1']:.4f}", f"{d['combine1']:.3f}", f"{d['omg1']:.3f}", f"{d['sgd']:.4f}",
                      f"{100 * d['solve1'] / d['omg1']:.2f}%", f"{d['omg1'] / d['avg1']:.2f}"])
        rows2.append([*key, *(f"{d[k] / f:.2f}" for k in ("avg1", "gram1", "solve1", "combine1", "omg1", "sgd"))])
        rows3.append([*key, f"{r['obj_exact']:.6f}", f"{r['obj_sgd']:.6f}", "yes" if r["ok"] else "NO",
                      f"{r['gap']:.1e}", str(r["support"])])
    km = [("M", 11), ("U", 5)]
    table("Table 1: server time, seconds (medians; one server thread)",
          km + [(h, 8) for h in ("GB", "rounds", "floor", "FedAvg", "gram", "solve", "combine", "FedOMG", "sgd",
                                 "solve %", "OMG/Avg")], rows1)
    table("Table 2: the same, as multiples of the floor (one read of the [U, M] float32 updates)",
          km + [(h, 8) for h in ("FedAvg", "gram", "solve", "combine", "FedOMG", "sgd")], rows2)
    table("Table 3: step 2 on the last round's G (objectives and gap relative to ‖g_FL‖·max_u‖Δ_u‖)",
          km + [("obj exact", 11), ("obj sgd", 11), ("ex<=sgd", 7), ("gap", 8), ("|supp|", 6)], rows3)

    g = next(r for r in results if (r["M"], r["U"]) == goal_case)
    gm = f"U={goal_case[1]}, M={goal_case[0]:,}"
    if "skip" in g:
        print(f"\ngoal case {gm}: {g['skip']}")
        return 1
    d, bm = g["med"], beta["med"]
    rows_t = []
    for t in threads:
        rows_t.append([str(t), f"{d[f'sub{t}']:.3f}", f"{d['sub1'] / d[f'sub{t}']:.2f}", f"{d[f'avg{t}']:.3f}", f"{d['avg1'] / d[f'avg{t}']:.2f}", f"{d[f'omg{t}']:.3f}",
                       f"{d['omg1'] / d[f'omg{t}']:.2f}", f"{d[f'gram{t}']:.3f}", f"{d[f'combine{t}']:.3f}",
                       f"{d[f'omg{t}'] / d[f'avg{t}']:.2f}", f"{bm[f'beta{t}']:.3f}",
                       f"{bm['beta1'] / bm[f'beta{t}']:.2f}"])
    table(f"Threads (threads= / coordinator_cpus), {gm}; auto-β at M={beta['M']:,}, seconds and speed-up over 1",
          [("threads", 7), ("θ_u−θ", 8), ("x", 5), ("FedAvg", 8), ("x", 5), ("FedOMG", 8), ("x", 5), ("gram", 8), ("combine", 8),
           ("OMG/Avg", 8), ("auto-β", 8), ("x", 5)], rows_t)
    same = g["identical"] and beta["identical"]
    print(f"bit-identical across threads {threads} in every round (FedAvg θ, FedOMG θ and G, auto-β estimates): "
          f"{'yes' if same else 'NO'}")
    print(f"κ = 0 FedOMG == FedAvg bit for bit ({gm}): {'yes' if g['kappa0'] else 'NO'}")

    u, m, avg, floor = goal_case[1], goal_case[0], d["avg1"], d["floor"]
    madds = u * u * m / 2
    f64, f32 = madds / rates["float64"], madds / rates["float32"]
    rest = d["solve1"] + d["combine1"]
    best64, best32 = (max(f64, floor) + rest) / avg, (max(f32, floor) + rest) / avg
    print(f"\nGram arithmetic floor, {gm}: U²M/2 = {madds:.3g} multiply-adds = {f64:.3f} s at the float64 rate "
          f"({f64 / floor:.1f}× floor, {f64 / avg:.2f}× FedAvg), {f32:.3f} s at the float32 rate "
          f"({f32 / floor:.1f}× floor, {f32 / avg:.2f}× FedAvg); measured gram pass {d['gram1']:.3f} s = "
          f"{d['gram1'] / f64:.2f}× its float64 floor")
    print(f"best possible FedOMG/FedAvg at one thread (Gram at the GEMM floor + measured solve and combine): "
          f"float64 {best64:.2f}, float32 {best32:.2f} -> the {GOAL_OMG}× goal is "
          f"{'reachable' if best64 <= GOAL_OMG else 'NOT reachable'} with a float64 Gram, "
          f"{'reachable' if best32 <= GOAL_OMG else 'NOT reachable'} with a float32 one")

    where = "" if goal_case == (GOAL_M, GOAL_U) else f"   [measured at {gm}: not the goal's U=100, M=11.7M]"
    bwhere = "" if (beta["M"], args.beta_steps) == (RESNET18, 20) else \
        f"   [measured at M={beta['M']:,}, {args.beta_steps} steps: not the goal's 20 steps of 11.7M]"
    omg_ratio, avg_ratio = d["omg1"] / avg, avg / floor
    beta_ratio = bm["beta1"] / bm["floor"]
    print("\nGoals (one server thread, measured in this run):")
    print(f"  GOAL FedOMG / FedAvg             {omg_ratio:6.2f}  (goal <= {GOAL_OMG})  "
          f"{verdict(omg_ratio, GOAL_OMG)}{where}")
    print(f"  GOAL FedAvg / memory floor       {avg_ratio:6.2f}  (goal <= {GOAL_AVG})  "
          f"{verdict(avg_ratio, GOAL_AVG)}{where}")
    print(f"  GOAL auto-β / one read of target {beta_ratio:6.2f}  (goal <= {GOAL_BETA}) "
          f"{verdict(beta_ratio, GOAL_BETA)}{bwhere}")
    print(f"       auto-β {bm['beta1']:.3f} s; read of the {args.beta_steps} target steps {bm['floor']:.3f} s; "
          f"of targets + {args.beta_sources} sources {bm['floor_all']:.3f} s "
          f"(auto-β = {bm['beta1'] / bm['floor_all']:.2f}× that)")
    ok = all(r.get("ok", True) for r in results) and same and bool(g["kappa0"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
