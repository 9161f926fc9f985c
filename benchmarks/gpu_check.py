"""One command that runs every CUDA path of fedtune on one GPU, within a time budget, and prints what it saw.

    PYTHONPATH=. python3 benchmarks/gpu_check.py [--data-root .gpu_data/PACS64] [--budget-s 420]
                       [--out FILE.md] [--models resnet18,resnet50] [--precisions fp32,bf16,fp16] [--pack 4]
    PYTHONPATH=. python3 benchmarks/gpu_check.py --smoke-cpu   # the whole harness, tiny, on the CPU
    PYTHONPATH=. python3 benchmarks/gpu_check.py --smoke-cpu --local-steps 1 --batch-size 4   # tinier still

Each run is a real fedtune run on the local backend, in a fresh process (Ray and Optuna made
unimportable, as on the GPU machine): PACS at ``--image-size`` px, fdg, target photo, 3 source
clients, ``--rounds`` x ``--local-steps`` steps of ``--batch-size`` images, random init, DomainBed's
augmentation on the GPU, channels_last, pinned double host buffers with CUDA events. The image cache
is built first (temporary folder) and timed apart. Runs, in the order of :func:`plan_jobs`: every
model x precision (fp32; bf16 autocast; fp16 autocast with GradScaler); ``--pack`` processes at once
at ``client_gpus = 1/pack`` (Ray's fractional-GPU actors without Ray; they wait for each other after
warm-up); the first model and precision again with cudnn_benchmark on, twice off, and twice off with
``torch.use_deterministic_algorithms(True)`` (fedtune never sets it). A run is skipped when the budget
left is shorter than the longest run of its model so far, and killed at the deadline.

The child (``--child``; its code is ``benchmarks/gpu_check_child.py``) wraps ``ClientContext.batch``,
``ClientMethod.local_loop`` and ``Coordinator.run_round`` in its own process (fedtune's code is
unchanged); its first client round is warm-up (CUDA set-up, cuDNN autotuning), left out of the rates
unless it is the only one.

* steps/s, images/s: local steps (training images) per second of client training time (``local_loop``).
  Pack rows: all processes' steps over the window from the barrier to the last end, then each one's own.
* alloc / reserved GiB: ``torch.cuda.max_memory_allocated`` / ``max_memory_reserved`` per process (per
  client actor), evaluation included, CUDA context not; with cudnn.benchmark, autotuning workspaces too.
* input stall: share of training time spent waiting for batches. Each step ends with its loss read
  back, so the stream is idle when ``batch()`` is called: CUDA events recorded then and after the
  batch's last kernel (copy, augmentation, normalisation) time the wait, with no added synchronisation.
  ``host``: the part before ``batch()`` returned (gather from the memory-mapped cache, pinned-buffer
  wait, launches); ``CRC``: the part of it checking images on their first read in the process, which
  ends once every image was read (these short runs read most images once: they overstate the stall of
  a long run). On the CPU all are ``perf_counter`` times.
* paths: ``prefetch`` batches staged by the background thread (the input stall is then the loop's
  wait for a staged batch plus its ``finish``), ``pin2`` both pinned buffers (the prefetch's with
  ``prefetch``) used and fenced by events, ``aug`` augmentation on the GPU, ``cl``
  channels_last batch, ``bench`` cudnn.benchmark, ``bf16``/``fp16`` autocast, ``scaler`` GradScaler,
  ``det`` deterministic algorithms.
* bit-identity: ``same``/``differs`` for the stored round rows (train_loss, every accuracy and loss
  column, from the Parquet store, exactly) and for the final global weights (SHA-256).

Repeated runs of one config differed in speed by up to 1.7x on an H100 (host-bound input); in pack
rows the GPU is time-sliced between processes, so ``host`` can exceed the event-timed share. Exit
status: 0; 0 with one line (``gpu_check: no CUDA GPU here ...``) without CUDA; 2 with one line for bad
options or data; 1 when a run failed (its log's tail follows), the harness hit an error, or SIGTERM /
Ctrl-C stopped it. What finished is printed in every case.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.gpu_check_child import MARK, child_main  # noqa: E402  (the code each run's process runs)

NO_GPU = "gpu_check: no CUDA GPU here (torch.cuda.is_available() is False); nothing to check"
PRECISIONS = ("fp32", "bf16", "fp16")
RESERVE_S = 15.0  # kept back from the budget for the tables and the clean-up
GUESS_S = {"resnet18": 45.0, "resnet50": 60.0}  # a run's wall time before one was seen (H100: 20-35 s)
SIZES = {"rounds": (2, 1), "local_steps": (30, 2), "batch_size": (32, 16)}  # option: (default, --smoke-cpu's default)


class Stop(Exception):
    """The budget ran out, or SIGTERM / Ctrl-C: stop launching, print what finished."""


# --- options ---------------------------------------------------------------------------------------
def _fail(message: str):
    print(f"gpu_check: error: {message}", file=sys.stderr)
    sys.exit(2)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not argparse's usage block
        _fail(message)


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Options, checked; ``--smoke-cpu`` replaces the models, precisions, ``--pack`` and ``--image-size``
    by its tiny ones, and takes its own defaults for the ``--rounds``, ``--local-steps`` and
    ``--batch-size`` not given."""
    p = _Parser(description=__doc__.split("\n")[0], allow_abbrev=False)
    p.add_argument("--data-root", default=".gpu_data/PACS64", help="folder holding PACS/<domain>/<class>/*.jpg")
    p.add_argument("--budget-s", type=float, default=420.0, help="wall seconds for everything (default 420)")
    p.add_argument("--out", help="also write the report (Markdown) to this file")
    p.add_argument("--models", default="resnet18,resnet50", help="comma list of torchvision models")
    p.add_argument("--precisions", default="fp32,bf16,fp16", help="comma list of fp32, bf16, fp16")
    p.add_argument("--pack", type=int, default=4, help="processes sharing the GPU at once (0: none)")
    p.add_argument("--image-size", type=int, default=224)
    for flag, (full, smoke) in SIZES.items():
        p.add_argument(f"--{flag.replace('_', '-')}", type=int, help=f"default {full} (--smoke-cpu: {smoke})")
    p.add_argument("--work-dir", help="keep cache, results and logs here (default: a temporary folder, removed)")
    p.add_argument("--smoke-cpu", action="store_true",
                   help="32 px, resnet18 fp32, 1 round of 2 steps of 16 images (unless --rounds, --local-steps, "
                        "--batch-size say otherwise), 2 packed processes, on the CPU: no GPU numbers")
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        return a
    if a.smoke_cpu:
        a.models, a.precisions, a.pack, a.image_size = "resnet18", "fp32", 2, 32
    for name, (full, smoke) in SIZES.items():
        if getattr(a, name) is None:
            setattr(a, name, smoke if a.smoke_cpu else full)
    a.models = [m.strip() for m in a.models.split(",") if m.strip()]
    a.precisions = [q.strip() for q in a.precisions.split(",") if q.strip()]
    bad = [q for q in a.precisions if q not in PRECISIONS]
    if bad or not a.precisions:
        _fail(f"--precisions {','.join(bad) or '(empty)'}: allowed: a comma list of {', '.join(PRECISIONS)}")
    for name, lo in (("budget_s", 1), ("image_size", 32), ("rounds", 1), ("local_steps", 1), ("batch_size", 1),
                     ("pack", 0)):
        value = getattr(a, name)
        if not (value >= lo and math.isfinite(value)) or (name == "pack" and value == 1):
            _fail(f"--{name.replace('_', '-')} {value}: allowed: a number >= {lo}"
                  + (", not 1" if name == "pack" else ""))
    return a


def check_inputs(a: argparse.Namespace) -> None:
    """One line and exit status 2 for a model torchvision lacks, a ``--data-root`` without PACS (this
    only lists files) or an ``--out`` in no folder. After the GPU check: torchvision loads in seconds."""
    from fedtune.data.registry import get_dataset
    from fedtune.errors import ConfigError, DataError
    from fedtune.models import BUILTIN_MODELS, check_model_name

    for m in a.models or ["(empty)"]:
        try:
            if m in BUILTIN_MODELS or m == "(empty)":
                raise ConfigError(f"{m!r} is not a torchvision model")
            check_model_name(m)
        except ConfigError as exc:
            _fail(f"--models: {exc}")
    try:
        get_dataset("pacs", root=a.data_root, image_size=a.image_size)
    except DataError as exc:
        _fail(f"--data-root {a.data_root}: {exc}")
    if a.out and not Path(a.out).resolve().parent.is_dir():
        _fail(f"--out {a.out}: its folder does not exist")


# --- the runs --------------------------------------------------------------------------------------
@dataclass
class Job:
    """One row of the report: ``procs`` processes of one config, at once."""
    key: str
    model: str
    precision: str
    procs: int = 1
    bench: bool = True  # cudnn_benchmark
    det: bool = False  # torch.use_deterministic_algorithms(True)
    results: list[dict] = field(default_factory=list)  # each process's report
    status: str = "not run"
    wall_s: float = 0.0


def plan_jobs(a: argparse.Namespace) -> tuple[list[Job], list[tuple[str, str, str]]]:
    """The runs in launch order, and the bit-identity pairs (label, job key, job key): every model x
    precision, the packed processes, then the first model and precision again with cudnn.benchmark on,
    twice off, twice off with deterministic algorithms (CUBLAS_WORKSPACE_CONFIG=:4096:8)."""
    jobs = [Job(f"{m}-{q}", m, q) for m in a.models for q in a.precisions]
    m, q = a.models[0], a.precisions[0]
    if a.pack:
        jobs.append(Job(f"pack{a.pack}", m, q, procs=a.pack))
    jobs.append(Job(f"{m}-{q}-again", m, q))
    pairs = [(f"{m} {q}, cudnn_benchmark=True", f"{m}-{q}", f"{m}-{q}-again")]
    if not a.smoke_cpu:  # cuDNN settings change nothing on the CPU
        for tag, det, what in (("nobench", False, ""), ("det", True, " + deterministic algorithms")):
            jobs += [Job(f"{m}-{q}-{tag}", m, q, bench=False, det=det),
                     Job(f"{m}-{q}-{tag}-again", m, q, bench=False, det=det)]
            pairs.append((f"{m} {q}, cudnn_benchmark=False{what}", f"{m}-{q}-{tag}", f"{m}-{q}-{tag}-again"))
    return jobs, pairs


def run_config(a: argparse.Namespace, job: Job, proc: int, work: Path) -> dict:
    """The fedtune run config of process ``proc`` of ``job``."""
    return {"backend": "local", "dataset": "pacs", "data_root": str(Path(a.data_root).resolve()),
            "image_size": a.image_size, "model": job.model, "weights": "none", "precision": job.precision,
            "client_gpus": 0.0 if a.smoke_cpu else 1.0 / job.procs, "channels_last": True,
            "cudnn_benchmark": job.bench, "augment": "domainbed", "setting": "fdg", "target_domain": "photo",
            "clients_per_domain": 1, "rounds": a.rounds, "local_steps": a.local_steps, "batch_size": a.batch_size,
            "seed": proc, "eval_every": a.rounds if job.procs > 1 else 1, "eval_batch_size": 64 if a.smoke_cpu else 256,
            "cache_dir": str(work / "cache"), "output": str(work / "results"), "name": f"{job.key}-{proc}"}


def launch(a: argparse.Namespace, job: Job, work: Path, deadline: float) -> None:
    """Run ``job``'s processes at once, each a child of this script; fill ``job.results`` and status.
    Raises :class:`Stop` (the children killed) at the deadline or on SIGTERM / Ctrl-C."""
    (work / "barrier" / job.key).mkdir(parents=True, exist_ok=True)
    (work / "logs").mkdir(exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    if a.smoke_cpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    procs, t0 = [], time.time()
    for i in range(job.procs):
        barrier = {"dir": str(work / "barrier" / job.key), "index": i, "count": job.procs}
        spec = {"cfg": run_config(a, job, i, work), "cuda": not a.smoke_cpu, "det": job.det,
                "barrier": barrier if job.procs > 1 else None}
        spec_path, log = work / "logs" / f"{job.key}-{i}.json", work / "logs" / f"{job.key}-{i}.log"
        spec_path.write_text(json.dumps(spec))
        with open(log, "w") as out:
            procs.append((subprocess.Popen([sys.executable, __file__, "--child", str(spec_path)], cwd=REPO, env=env,
                                           stdout=out, stderr=subprocess.STDOUT, start_new_session=True), log))
    try:
        for p, _ in procs:
            p.wait(timeout=max(1.0, deadline - time.time()))
    except (subprocess.TimeoutExpired, KeyboardInterrupt) as exc:
        for p, _ in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        job.status = "stopped (budget)" if isinstance(exc, subprocess.TimeoutExpired) else "interrupted"
        raise Stop(job.status) from None
    finally:
        job.wall_s = time.time() - t0
    job.results = [_result_of(log, p.returncode) for p, log in procs]
    problems = [r["problem"] for r in job.results if r.get("problem")]
    job.status = f"failed: {problems[0]}" if problems else "completed"


def _result_of(log: Path, returncode: int) -> dict:
    """The child's JSON report from its log, with ``problem`` set when the run is not usable."""
    lines = log.read_text(errors="replace").splitlines()
    reports = [json.loads(ln[len(MARK):]) for ln in lines if ln.startswith(MARK)]
    if returncode != 0 or not reports:
        last = next((ln for ln in reversed(lines) if ln.strip()), "(no output)")
        return {"problem": f"exit {returncode}: {last.strip()[:160]}", "log": str(log)}
    r = reports[-1]
    if r["status"] != "completed":
        r["problem"] = f"run {r['status']}: {r.get('error')}"
    elif r["forbidden"]:
        r["problem"] = f"imported {', '.join(r['forbidden'])}"
    elif r["device"] != r["want"]:
        r["problem"] = f"trained on {r['device']}, not {r['want']}"
    return r


def build_cache(a: argparse.Namespace, work: Path) -> tuple[int, float]:
    """Decode PACS into the image cache at ``--image-size`` (what a first run would do): (images, seconds)."""
    from fedtune.data.registry import get_dataset

    t0 = time.perf_counter()
    ds = get_dataset("pacs", root=a.data_root, image_size=a.image_size, cache_dir=work / "cache")
    n = sum(len(ds.pixels(d)) for d in ds.info.domains)
    return n, time.perf_counter() - t0


# --- the report -------------------------------------------------------------------------------------------
def steady(loops: list[dict]) -> list[dict]:
    """The loops after the warm-up one (all of them when there is only one)."""
    return loops[1:] if len(loops) > 1 else loops


def perf_row(job: Job, smoke: bool) -> dict[str, str]:
    """One row of the performance table."""
    row = {"run": job.key, "model": job.model, "precision": job.precision, "procs": str(job.procs),
           "cudnn.benchmark": "-" if smoke else ("on" if job.bench else "off"), "status": job.status,
           "wall s": f"{job.wall_s:.0f}" if job.wall_s else "-"}
    ok = [r for r in job.results if not r.get("problem")]
    if not ok or len(ok) < job.procs:
        return row
    rates = []  # per process: steps/s, images/s, input share, host share, CRC share
    for r in ok:
        loops = steady(r["loops"])
        wall = sum(lp["wall_s"] for lp in loops)
        rates.append([sum(lp[k] for lp in loops) / wall for k in ("steps", "images", "input_s", "host_s", "crc_s")])
    if job.procs == 1:
        steps, images = f"{rates[0][0]:.1f}", f"{rates[0][1]:.0f}"
    else:  # all processes over the window in which they trained together, then each one's own rate
        window = max(r["loops"][-1]["t1"] for r in ok) - min(r["go"] or r["loops"][0]["t0"] for r in ok)
        total = [sum(lp[k] for r in ok for lp in steady(r["loops"])) for k in ("steps", "images")]
        steps = f"{total[0] / window:.1f} (" + ", ".join(f"{r[0]:.1f}" for r in rates) + ")"
        images = f"{total[1] / window:.0f} (" + ", ".join(f"{r[1]:.0f}" for r in rates) + ")"
    gib = lambda key: " / ".join("-" if r[key] is None else f"{r[key] / 2**30:.2f}" for r in ok)  # noqa: E731
    row.update({"steps/s": steps, "images/s": images, "alloc GiB": gib("alloc"), "reserved GiB": gib("reserved"),
                "input stall": " / ".join(f"{r[2]:.0%} (host {r[3]:.0%}, CRC {r[4]:.0%})" for r in rates),
                "paths": " ".join(ok[0]["paths"]) or "-"})
    return row


def stored_rows(path: str) -> list[list]:
    """[round, (column, value) ...] of a run's stored rows: train_loss and every accuracy and loss column."""
    import pyarrow.parquet as pq

    rows = pq.read_table(path).to_pylist()
    keys = sorted(k for k in rows[0] if k == "train_loss" or "_acc" in k or k.endswith("_loss")) if rows else []
    return [[r["round"], *([k, r[k]] for k in keys)] for r in rows]


def identity_row(label: str, a: Job, b: Job) -> dict[str, str]:
    """One row of the bit-identity table: two runs of the same config and seed."""
    row = {"check": label, "deterministic algorithms": "on" if a.det else "off (fedtune default)"}
    if a.status != "completed" or b.status != "completed":
        row["stored rows"] = f"not compared ({a.key}: {a.status}; {b.key}: {b.status})"
        return row
    ra, rb = a.results[0], b.results[0]
    # JSON text: floats written exactly (repr), NaN equal to NaN
    same = json.dumps(stored_rows(ra["rounds_path"])) == json.dumps(stored_rows(rb["rounds_path"]))
    row["stored rows"] = "same" if same else "differs"
    row["final weights"] = "same" if ra["weights_sha"] == rb["weights_sha"] else "differs"
    return row


def table(rows: list[dict[str, str]], columns: list[str]) -> str:
    """A Markdown table, padded so that it also reads as plain text."""
    cells = [[r.get(c, "-").replace("|", "\\|") for c in columns] for r in rows]
    width = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    line = lambda vals: "| " + " | ".join(v.ljust(w) for v, w in zip(vals, width)) + " |"  # noqa: E731
    return "\n".join([line(columns), "|" + "|".join("-" * (w + 2) for w in width) + "|", *map(line, cells)])


PERF_COLUMNS = ["run", "model", "precision", "procs", "cudnn.benchmark", "steps/s", "images/s", "alloc GiB",
                "reserved GiB", "input stall", "paths", "wall s", "status"]
IDENTITY_COLUMNS = ["check", "deterministic algorithms", "stored rows", "final weights"]


def versions(smoke: bool) -> list[str]:
    """Python, torch, CUDA, cuDNN and the GPU."""
    import platform

    import torch
    import torchvision

    cudnn = torch.backends.cudnn.version() if torch.cuda.is_available() else "-"
    lines = [f"Python {platform.python_version()}, torch {torch.__version__}, torchvision {torchvision.__version__}, "
             f"CUDA {torch.version.cuda}, cuDNN {cudnn}"]
    if smoke:
        lines.append("CPU smoke run (--smoke-cpu): no GPU numbers; it only shows that the harness works")
    else:
        prop = torch.cuda.get_device_properties(0)
        lines.append(f"GPU: {prop.name}, {prop.total_memory / 2**30:.1f} GiB, {prop.multi_processor_count} SMs, "
                     f"compute capability {prop.major}.{prop.minor}; {os.cpu_count()} CPU cores")
    return lines


def report(a, header: list[str], jobs: list[Job], pairs, elapsed: float, stopped: str | None) -> str:
    """The whole Markdown report: facts, performance table, bit-identity table, failed runs' log tails."""
    by_key = {j.key: j for j in jobs}
    done = sum(j.status == "completed" for j in jobs)
    header = header + [f"budget {a.budget_s:.0f} s, used {elapsed:.0f} s; {done} of {len(jobs)} runs completed"
                       + (f"; stopped early: {stopped}" if stopped else "")]
    parts = ["## fedtune GPU check (benchmarks/gpu_check.py)", "", *(f"- {h}" for h in header), "",
             table([perf_row(j, a.smoke_cpu) for j in jobs], PERF_COLUMNS), "",
             "### Bit-identity (same config, same seed, twice)", "",
             table([identity_row(lbl, by_key[x], by_key[y]) for lbl, x, y in pairs], IDENTITY_COLUMNS)]
    for r in (r for j in jobs for r in j.results if r.get("log")):
        tail = Path(r["log"]).read_text(errors="replace").splitlines()[-15:]
        parts += ["", f"log of {Path(r['log']).name} (last lines):", "```", *tail, "```"]
    return "\n".join(parts) + "\n"


# --- main ------------------------------------------------------------------------------------------------
def run_all(a, jobs: list[Job], work: Path, header: list[str], t_start: float) -> str | None:
    """Build the cache, then launch the jobs that fit the budget; returns why it stopped early, or None."""
    deadline = t_start + a.budget_s - RESERVE_S
    try:
        images, cache_s = build_cache(a, work)
        header += [f"data: PACS, {images} images from {a.data_root} at {a.image_size} px; image cache built in "
                   f"{cache_s:.1f} s (decoded once, before the runs)",
                   f"each run: fdg, target photo, 3 source clients, {a.rounds} round(s) x {a.local_steps} local steps "
                   f"of {a.batch_size} images, random init, DomainBed augmentation, local backend, own process"]
        print(header[-2], flush=True)
        longest: dict[str, float] = {}
        for job in jobs:
            guess = longest.get(job.model, GUESS_S.get(job.model, 60.0)) * (1.5 if job.procs > 1 else 1.0)
            if time.time() + guess > deadline:
                job.status = "not run (budget)"
                continue
            launch(a, job, work, deadline)
            longest[job.model] = max(longest.get(job.model, 0.0), job.wall_s)
            shown = {k: v for k, v in perf_row(job, a.smoke_cpu).items() if k in ("steps/s", "images/s", "input stall")}
            print(f"[{time.time() - t_start:4.0f} s] {job.key}: {job.status}"
                  + "".join(f", {k} {v}" for k, v in shown.items()), flush=True)
    except Stop as exc:
        return str(exc)
    except KeyboardInterrupt:
        return "interrupted (cache build)"
    except Exception as exc:  # the harness itself (cache build, a full disk): still print the tables
        return f"error: {type(exc).__name__}: {exc}"
    return None


def main(argv: list[str] | None = None) -> int:
    a = parse_args(sys.argv[1:] if argv is None else argv)
    if a.child:
        child_main(a.child)
        return 0
    t_start = time.time()
    import torch

    if not a.smoke_cpu and not torch.cuda.is_available():
        print(NO_GPU)
        return 0
    check_inputs(a)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM raises KeyboardInterrupt, as Ctrl-C
    work = Path(a.work_dir) if a.work_dir else Path(tempfile.mkdtemp(prefix="gpu_check-"))
    work.mkdir(parents=True, exist_ok=True)
    header = versions(a.smoke_cpu)
    print("\n".join(header), flush=True)
    jobs, pairs = plan_jobs(a)
    stopped = run_all(a, jobs, work, header, t_start)
    text = report(a, header, jobs, pairs, time.time() - t_start, stopped)
    print("\n" + text, end="", flush=True)
    if a.out:
        Path(a.out).write_text(text)
    if not a.work_dir:
        shutil.rmtree(work, ignore_errors=True)
    failed = any(j.status.startswith("failed") for j in jobs) or (stopped or "").startswith(("error", "interrupted"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
