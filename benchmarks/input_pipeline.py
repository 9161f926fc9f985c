"""Training-input throughput and memory of fedtune's image path against DomainBed's loader.

    python benchmarks/input_pipeline.py [--data-root ../shared/data/PACS64] [--size 224]
                                        [--images 1536] [--repeats 3] [--batch-size 32]

Both sides produce normalised, augmented ``[B, 3, S, S]`` float training batches on the CPU
from PACS (``--data-root``, DomainBed's layout; default ``../shared/data/PACS64`` when present,
else a generated folder of 227 px JPEGs), with the same cores:

* **fedtune**: the decoded-image cache (built once, timed apart) -> rows gathered from the memory
  map -> DomainBed's augmentation per image on the batch (``fedtune.runtime.augment``) ->
  normalised tensor (``fedtune.runtime.examples.CachedImages.batch``), torch threads = cores.
* **reference** (DomainBed's ``datasets.py`` / ``fast_data_loader``, written here):
  ``torchvision.datasets.ImageFolder`` + DomainBed's train transform (``RandomResizedCrop(S,
  scale=(0.7, 1.0))``, ``RandomHorizontalFlip``, ``ColorJitter(0.3, 0.3, 0.3, 0.3)``,
  ``RandomGrayscale``, ``ToTensor``, ``Normalize``) + ``DataLoader`` with as many workers as
  cores, shuffled.

Each side runs ``--repeats`` times, alternating; it prints images/s min/median/max and the ratio
of the medians (goal >= 3x). Then, in a fresh process, the private (anonymous) memory a client's
examples cost per cached image after reading every image once (goal <= 10 KB at 224 px; the
float32 decode of every image that the client actors used to hold is 602,112 bytes at 224 px),
and the cache's bytes on disk per image (150,528 at 224 px plus the header). The memory per
image is the slope of a client's private memory between holding half and all of PACS (each
time reading every image once through augmented batches; freed heap returned with glibc's
``malloc_trim`` before each reading), so the fixed working set of one batch is not divided
among the images. A third line times fedtune's host part alone (cache -> batch -> normalised
tensor, no augmentation): on a GPU client that is all the CPU does, the augmentation running on
the GPU; this machine has no GPU to time that part on.

``--overlap`` (issue 47) times instead fedtune's local loop (``ClientMethod.local_loop``) on the
cached images with a simulated device step of ``--step-ms`` (a sleep: the host is free while a
device trains), the batches un-augmented (augmentation runs on the device), each read from the
cache ``--fetch-ms`` slower than it is (a sleep a batch: a slow disk; 0 by default). It prints,
per step, the fetch (``stage``: rows read from the cache map, in the prefetch thread; ``finish``:
to float and normalised, in the loop's thread, on a GPU a few launches), the step, and the loop
with fetching serial (``prefetch depth 0``: what the loop did before) and prefetched, and the
ratio loop / max(fetch, step) (goal <= 1.05; serial: fetch + step). The first batch of each
epoch is fetched before its step (its rows depend on the previous epoch's random numbers), so
``--steps`` within one epoch shows the steady state.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DEFAULT_ROOT = REPO.parent / "shared" / "data" / "PACS64"


def generated_pacs(root: Path, per_class: int = 30) -> Path:
    """A PACS-shaped folder (4 domains x 7 classes) of random 227 px JPEGs."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for d in ("art_painting", "cartoon", "photo", "sketch"):
        for c in ("dog", "elephant", "giraffe", "guitar", "horse", "house", "person"):
            (root / "PACS" / d / c).mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                img = (rng.random((227, 227, 3)) * 255).astype("uint8")
                Image.fromarray(img).save(root / "PACS" / d / c / f"{i}.jpg", quality=90)
    return root


def fedtune_side(data_root: Path, size: int, cache_dir: Path, images: int, batch_size: int, seed: int,
                 augment: bool = True):
    import torch

    from fedtune.data.registry import get_dataset
    from fedtune.runtime.augment import DomainBedAugment
    from fedtune.runtime.examples import client_examples

    ds = get_dataset("pacs", root=data_root, image_size=size, cache_dir=cache_dir)
    pieces = {d: np.arange(len(ds.labels(d))) for d in ds.info.domains}
    ex = client_examples(ds, pieces)
    aug = DomainBedAugment(size) if augment else None
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(ex), generator=gen)
    done, t0 = 0, time.perf_counter()
    while done < images:
        rows = order[done % len(ex):done % len(ex) + batch_size]
        x, y = ex.batch(rows, aug, gen)
        done += len(rows)
    assert x.shape[1:] == (3, size, size) and x.dtype == torch.float32
    return done / (time.perf_counter() - t0)


def reference_side(data_root: Path, size: int, images: int, batch_size: int, workers: int, seed: int):
    import torch
    from torch.utils.data import ConcatDataset, DataLoader
    from torchvision import datasets, transforms

    train = transforms.Compose([
        transforms.RandomResizedCrop(size, scale=(0.7, 1.0)),
        transforms.RandomHorizontalFlip(),
        transforms.ColorJitter(0.3, 0.3, 0.3, 0.3),
        transforms.RandomGrayscale(),
        transforms.ToTensor(),
        transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
    ])
    base = data_root / "PACS"
    sets = ConcatDataset([datasets.ImageFolder(base / d, transform=train) for d in sorted(os.listdir(base))])
    loader = DataLoader(sets, batch_size=batch_size, shuffle=True, num_workers=workers, drop_last=True,
                        generator=torch.Generator().manual_seed(seed), persistent_workers=False)
    it = iter(loader)
    next(it)  # workers started and their first batch made: not counted
    done, t0 = 0, time.perf_counter()
    while done < images:
        try:
            x, y = next(it)
        except StopIteration:
            it = iter(loader)
            x, y = next(it)
        done += len(y)
    rate = done / (time.perf_counter() - t0)
    del it
    assert x.shape[1:] == (3, size, size)
    return rate


_MEMORY_CHILD = r"""
import ctypes, gc, sys, numpy as np, torch
from pathlib import Path
def status():
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # freed batch buffers go back to the OS: count what is held
    out = {}
    for line in open("/proc/self/status"):
        k, _, v = line.partition(":")
        if k in ("RssAnon", "RssFile", "VmRSS"):
            out[k] = int(v.split()[0]) * 1024
    return out
from fedtune.data.registry import get_dataset
from fedtune.runtime.examples import client_examples
from fedtune.runtime.augment import DomainBedAugment
root, size, cache = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
ds = get_dataset("pacs", root=root, image_size=size, cache_dir=cache)
for d in ds.info.domains:
    ds.pixels(d)  # the cache is built: not counted
aug, gen = DomainBedAugment(size), torch.Generator().manual_seed(0)
def read_all(fraction):
    ex = client_examples(ds, {d: np.arange(int(len(ds.labels(d)) * fraction)) for d in ds.info.domains})
    for start in range(0, len(ex), 64):
        x, y = ex.batch(torch.arange(start, min(start + 64, len(ex))), aug, gen)
    return ex
warm = read_all(0.05)  # allocator pools and batch buffers reach their working size
base = status()
half = read_all(0.5)
mid = status()
full = read_all(1.0)
end = status()
# what grows with the number of images a client holds: (full - half) / (their difference)
slope = (end["RssAnon"] - mid["RssAnon"]) / (len(full) - len(half))
print(len(full), end["RssAnon"] - base["RssAnon"] - (mid["RssAnon"] - base["RssAnon"]), int(slope),
      end["RssFile"] - base["RssFile"])
"""


def memory_per_image(data_root: Path, size: int, cache_dir: Path) -> tuple[int, int, int, int]:
    out = subprocess.run([sys.executable, "-c", _MEMORY_CHILD, str(data_root), str(size), str(cache_dir)],
                         capture_output=True, text=True, check=True, cwd=REPO)
    n, grown, slope, file = (int(v) for v in out.stdout.split())
    return n, grown, slope, file


def overlap(ds, batch_size: int, steps: int, step_ms: float, fetch_ms: float, repeats: int) -> None:
    """The local loop with a simulated device step, serial and prefetched (see the docstring)."""
    import torch

    from fedtune.algorithms.client import prefetch
    from fedtune.algorithms.client.method import ClientContext, ClientMethod
    from fedtune.config import FederatedRunConfig
    from fedtune.runtime.examples import client_examples

    ex = client_examples(ds, {d: np.arange(len(ds.labels(d))) for d in ds.info.domains})
    if fetch_ms:  # every batch's gather (one a batch) waits fetch_ms first: a slow disk
        gather = ex.gather
        ex.gather = lambda rows, out=None: time.sleep(fetch_ms / 1e3) or gather(rows, out)
    cfg = FederatedRunConfig.from_dict({"dataset": "rect4", "backend": "local", "batch_size": batch_size,
                                        "local_steps": steps})

    class SimulatedStep(ClientMethod):
        name = "simulated-step"

        def train(self, ctx):
            return self.local_loop(ctx, lambda x, y: time.sleep(step_ms / 1e3) or 0.0)

    def loop(depth: int, seed: int) -> float:
        prefetch.PREFETCH_DEPTH = depth
        ctx = ClientContext(model=torch.nn.Identity(), data=ex, cfg=cfg, round=1, client_id=0, role="source",
                            generator=torch.Generator().manual_seed(seed), device=torch.device("cpu"))
        t0 = time.perf_counter()
        assert SimulatedStep(cfg).train(ctx).steps == steps
        return (time.perf_counter() - t0) / steps * 1e3

    gen = torch.Generator().manual_seed(0)
    stage, finish = [], []
    for _ in range(steps):
        rows = torch.randperm(len(ex), generator=gen)[:batch_size]
        t0 = time.perf_counter()
        staged = ex.stage(rows)
        t1 = time.perf_counter()
        ex.finish(staged)
        stage.append(t1 - t0)
        finish.append(time.perf_counter() - t1)
    st, fi = statistics.median(stage) * 1e3, statistics.median(finish) * 1e3
    depth = prefetch.PREFETCH_DEPTH
    serial = [loop(0, r) for r in range(repeats)]
    ahead = [loop(depth, r) for r in range(repeats)]
    prefetch.PREFETCH_DEPTH = depth
    fetch = st + fi
    per_epoch = -(-len(ex) // batch_size)
    print(f"overlap: {len(ex)} images, batch {batch_size}, {steps} steps ({per_epoch} a epoch), "
          f"{repeats} runs each; loadavg {open('/proc/loadavg').read().split()[:3]}")
    print(f"  fetch {fetch:7.2f} ms a step (stage {st:.2f} in the prefetch thread + finish {fi:.2f} in the loop's; "
          f"+{fetch_ms:g} ms simulated read latency included)   step {step_ms:g} ms (simulated)")
    for name, runs in (("serial (depth 0)", serial), (f"prefetched (depth {depth})", ahead)):
        ms = statistics.median(runs)
        ratio = ms / max(fetch, step_ms)
        print(f"  loop {name:>22}: {ms:7.2f} ms a step (min {min(runs):.2f} max {max(runs):.2f})  "
              f"loop / max(fetch, step) = {ratio:.3f}" + (f"  (goal <= 1.05: {'PASS' if ratio <= 1.05 else 'MISS'})"
                                                           if runs is ahead else
                                                           f"  (fetch + step = {(fetch + step_ms) / max(fetch, step_ms):.3f})"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-root", type=Path, default=DEFAULT_ROOT if DEFAULT_ROOT.is_dir() else None)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--images", type=int, default=1536, help="training images per timed run")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--cache-dir", type=Path, default=None, help="default: a temporary folder")
    ap.add_argument("--overlap", action="store_true", help="time the local loop's prefetch instead (issue 47)")
    ap.add_argument("--step-ms", type=float, default=20.0, help="--overlap: the simulated device step")
    ap.add_argument("--fetch-ms", type=float, default=0.0, help="--overlap: simulated latency added to each read")
    ap.add_argument("--steps", type=int, default=60, help="--overlap: local steps a run")
    args = ap.parse_args(argv)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    tmp = Path(tempfile.mkdtemp(prefix="fedtune-bench-"))
    root = args.data_root or generated_pacs(tmp / "data")
    cache = args.cache_dir or tmp / "cache"
    import torch

    torch.set_num_threads(cores)
    print(f"input_pipeline: PACS from {root} at {args.size} px, batch {args.batch_size}, {cores} cores, "
          f"{args.images} images per run, {args.repeats} runs each")

    from fedtune.data.registry import get_dataset
    from fedtune.data.cache import build_log

    t0 = time.perf_counter()
    ds = get_dataset("pacs", root=root, image_size=args.size, cache_dir=cache)
    for d in ds.info.domains:
        ds.pixels(d)
    built = sum(b["images"] for b in build_log(cache))
    print(f"cache: {time.perf_counter() - t0:.1f} s to decode {built} images once "
          f"({sum(len(ds.labels(d)) for d in ds.info.domains)} in the dataset)")
    if args.overlap:
        torch.set_num_threads(1)  # a client_cpus: 1 client: the loop's thread and the prefetch thread
        overlap(ds, args.batch_size, args.steps, args.step_ms, args.fetch_ms, args.repeats)
        return 0

    ours, host, ref = [], [], []
    for r in range(args.repeats):
        ours.append(fedtune_side(root, args.size, cache, args.images, args.batch_size, seed=r))
        host.append(fedtune_side(root, args.size, cache, args.images, args.batch_size, seed=r, augment=False))
        ref.append(reference_side(root, args.size, args.images, args.batch_size, cores, seed=r))

    def line(name, rates):
        return (f"{name:>10}: images/s min {min(rates):8.1f}  median {statistics.median(rates):8.1f}  "
                f"max {max(rates):8.1f}")

    print(line("fedtune", ours))
    print(line("reference", ref))
    ratio = statistics.median(ours) / statistics.median(ref)
    print(f"ratio fedtune / reference (medians), augmentation on these CPU cores: {ratio:.2f}x  "
          f"(goal >= 3x: {'PASS' if ratio >= 3 else 'MISS'}); per-run ratios min {min(ours) / max(ref):.2f}x "
          f"max {max(ours) / min(ref):.2f}x")
    print(line("host part", host) + "  (cache -> batch -> normalised tensor, no augmentation: what a GPU "
          "client's CPU does, its augmentation running on the GPU)")
    print(f"ratio host part / reference (medians): {statistics.median(host) / statistics.median(ref):.2f}x")

    n, grown, slope, file = memory_per_image(root, args.size, cache)
    print(f"private (anonymous) memory per cached image held by a client, every image read once through augmented "
          f"batches: {slope / 1e3:.2f} KB (slope between holding {n // 2} and {n} images; goal <= 10 KB: "
          f"{'PASS' if slope <= 10e3 else 'MISS'}); the client holding {n} instead of {n // 2} grew by {grown / 1e6:.1f} MB; "
          f"resident pages of the cache left mapped: {file / 1e6:.1f} MB; the float32 decode the client actors used to "
          f"hold is {3 * args.size ** 2 * 4:,} B per image")
    disk = sum(p.stat().st_size for p in cache.glob("*.npy"))
    print(f"cache on disk: {disk:,} bytes = {disk / n:,.0f} bytes per image ({3 * args.size ** 2:,} of pixels)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
