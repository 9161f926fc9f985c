"""The measurement side of ``benchmarks/gpu_check.py``: what runs inside each run's process.

``gpu_check.py`` launches every run as ``python3 benchmarks/gpu_check.py --child SPEC.json`` (a fresh
process, cwd the repository root, the repository on ``PYTHONPATH``); that option calls
:func:`child_main`, which makes Ray and Optuna unimportable (:class:`_Absent`), wraps
``ClientContext.batch``, ``ClientMethod.local_loop`` (:class:`Probe`) and ``Coordinator.run_round``
(the final weights' SHA-256) in its own process only (fedtune's code is unchanged), runs fedtune once,
and prints its report as one JSON line after ``MARK``, which the parent reads from the run's log. What
the timers measure (input stall, ``host``, ``CRC``, the warm-up round, the paths) is described in
``gpu_check.py``'s docstring.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

MARK = "GPU_CHECK_RESULT "  # starts the child's one report line in its log


class _Absent:
    """A meta-path finder that makes ``ray`` and ``optuna`` absent, as on the GPU machine (fedtune's
    local backend only tries ``import ray`` to ask for Ray's GPU ids, and goes on without)."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.split(".")[0] in ("ray", "optuna"):
            raise ModuleNotFoundError(f"No module named {name!r} (gpu_check: absent on purpose)", name=name)


class _TimedCrc:
    """``fedtune.data.cache``'s ``zlib`` in a child, its ``crc32`` (the first-read image checks) timed."""

    def __init__(self, zlib):
        self.zlib, self.seconds = zlib, 0.0

    def crc32(self, *args):
        t0 = time.perf_counter()
        value = self.zlib.crc32(*args)
        self.seconds += time.perf_counter() - t0
        return value


class Probe:
    """Timers around fedtune's client loop, installed in a child process (see ``gpu_check.py``'s docstring)."""

    def __init__(self, cuda: bool, barrier: dict | None):
        import torch

        self.torch, self.cuda, self.barrier = torch, cuda, barrier
        self.loops: list[dict] = []
        self.pending: list = []  # this loop's batch waits: [start, end] CUDA events, or seconds
        self.paths: dict[str, bool] = {}
        self.device, self.go, self.images, self.host, self.crc_s, self.crc = None, None, 0, 0.0, 0.0, None
        self.ctx = None  # the context of the loop running now (its batches' paths)

    def install(self) -> None:
        """Time the loop thread's input: the synchronous fetch (``ClientContext.batch``, prefetch off
        or a context without ``stage``) and, with prefetching, the wait for each staged batch
        (``Prefetch.__iter__``) plus its ``finish`` on the loop's thread (augmentation, normalisation)."""
        from fedtune.algorithms.client import prefetch
        from fedtune.algorithms.client.method import ClientContext, ClientMethod
        from fedtune.data import cache
        from fedtune.runtime.examples import CachedImages, TensorExamples

        if hasattr(cache, "zlib"):
            self.crc = cache.zlib = _TimedCrc(cache.zlib)
        batch, loop, staged_iter = ClientContext.batch, ClientMethod.local_loop, prefetch.Prefetch.__iter__
        ClientContext.batch = lambda ctx, rows: self.seen(self.timed(batch, ctx, rows), ctx)
        ClientMethod.local_loop = lambda method, ctx, step, metrics=None: self.timed_loop(
            loop, method, ctx, step, metrics)
        prefetch.Prefetch.__iter__ = lambda pf: self.timed_iter(staged_iter(pf), pf)
        for cls in (CachedImages, TensorExamples):
            cls.finish = self.timed_finish(cls.finish)

    def timed(self, fn, *args, rows: int | None = None):
        """``fn(*args)`` with the loop thread's wait for it added to this loop's input time."""
        torch = self.torch
        events = [torch.cuda.Event(enable_timing=True) for _ in range(2)] if self.cuda else None
        if events:
            events[0].record()
        t0, crc0 = time.perf_counter(), self.crc.seconds if self.crc else 0.0
        out = fn(*args)
        self.host += time.perf_counter() - t0
        self.crc_s += (self.crc.seconds if self.crc else 0.0) - crc0
        if events:
            events[1].record()
        self.pending.append(events or time.perf_counter() - t0)
        return out

    def timed_iter(self, it, pf):
        self.paths["prefetch"] = self.paths.get("prefetch", False) or pf.thread is not None
        while True:
            try:
                item = self.timed(next, it)
            except StopIteration:
                return
            yield item

    def timed_finish(self, finish):
        def timed(data, staged, augment=None, generator=None):
            return self.seen(self.timed(finish, data, staged, augment, generator), self.ctx)
        return timed

    def seen(self, xy, ctx):
        """Count a batch's images; the first batch says where training runs and which paths it takes."""
        torch = self.torch
        x, _ = xy
        self.images += len(x)
        if self.device is None:
            on_gpu = x.device.type == "cuda"
            self.device = x.device.type
            if ctx is not None:
                self.paths.update({"aug": on_gpu and ctx.augment is not None,
                                   "scaler": ctx.scaler is not None, ctx.precision: ctx.precision != "fp32"})
            self.paths.update({"cl": on_gpu and x.is_contiguous(memory_format=torch.channels_last),
                               "bench": on_gpu and torch.backends.cudnn.benchmark,
                               "det": torch.are_deterministic_algorithms_enabled()})
        return xy

    def timed_loop(self, loop, method, ctx, step, metrics):
        if len(self.loops) == 1 and self.barrier:
            self.wait_at_barrier()
        self.pending, self.images, self.host, self.crc_s, self.ctx = [], 0, 0.0, 0.0, ctx
        t0, p0 = time.time(), time.perf_counter()
        outcome = loop(method, ctx, step, metrics)
        if self.cuda:
            self.torch.cuda.synchronize()
        wall = time.perf_counter() - p0
        waited = sum(s.elapsed_time(e) / 1e3 for s, e in self.pending) if self.cuda else sum(self.pending)
        self.loops.append({"steps": outcome.steps, "images": self.images, "wall_s": wall, "input_s": waited,
                           "host_s": self.host, "crc_s": self.crc_s, "t0": t0, "t1": t0 + wall})
        return outcome

    def wait_at_barrier(self, timeout_s: float = 120.0) -> None:
        """Say this process is warm, then wait (at most ``timeout_s``) until all are."""
        folder, count = Path(self.barrier["dir"]), self.barrier["count"]
        (folder / f"ready-{self.barrier['index']}").touch()
        end = time.time() + timeout_s
        while len(list(folder.glob("ready-*"))) < count and time.time() < end:
            time.sleep(0.005)
        self.go = time.time()


def child_main(spec_file: str) -> None:
    """One fedtune run with the probe installed; prints its report as one ``MARK`` JSON line."""
    spec = json.loads(Path(spec_file).read_text())
    sys.meta_path.insert(0, _Absent)
    if spec["det"]:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch

    if spec["det"]:
        torch.use_deterministic_algorithms(True, warn_only=True)
    from fedtune.config import FederatedRunConfig
    from fedtune.runtime import coordinator, examples
    from fedtune.runtime.driver import run

    probe = Probe(spec["cuda"], spec["barrier"])
    probe.install()
    final, run_round = {}, coordinator.Coordinator.run_round

    def hashed_round(coord, *args, **kw):
        out = run_round(coord, *args, **kw)
        final["sha"] = hashlib.sha256(coord.weights.tobytes()).hexdigest()
        return out

    coordinator.Coordinator.run_round = hashed_round
    t0 = time.perf_counter()
    result = run(FederatedRunConfig.from_dict(spec["cfg"]), progress=False)
    staging = examples._PREFETCH_STAGING if probe.paths.get("prefetch") else examples._STAGING
    probe.paths["pin2"] = all(buf is not None and ev is not None for buf, ev in staging.slots)
    cuda = probe.device == "cuda"
    report = {"status": result.status, "error": result.error, "rounds_path": str(result.rounds_path),
              "wall_s": time.perf_counter() - t0, "device": probe.device, "want": "cuda" if spec["cuda"] else "cpu",
              "loops": probe.loops, "go": probe.go, "paths": [k for k, v in probe.paths.items() if v],
              "alloc": torch.cuda.max_memory_allocated() if cuda else None,
              "reserved": torch.cuda.max_memory_reserved() if cuda else None, "weights_sha": final.get("sha"),
              "forbidden": sorted({m.split(".")[0] for m in sys.modules} & {"ray", "optuna"})}
    print(MARK + json.dumps(report), flush=True)
