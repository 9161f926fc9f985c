"""Peak host memory of evaluation batches: the pipeline before issue 29 against now, in one run.

    python benchmarks/eval_memory.py [--size 224] [--batch 256] [--images 768] [--repeats 3]

Each variant runs in a fresh process that holds the uint8 images in memory (as the decoded-image
cache's pages would be), resets its peak resident memory (``/proc/self/clear_refs``: 5), evaluates a
tiny model (pool + linear: its activations are negligible) over every image in batches, and reports
the peak above the resident memory at the reset, in MiB and in float32 copies of one batch:

* ``before``: the batch path as it was (uint8 host batch -> ``permute().float()`` ->
  ``(x - mean) / std`` -> ``.contiguous()``; the previous batch alive in the loop variable while
  the next is made), written out here as the reference;
* ``after``: :class:`fedtune.runtime.examples.CachedImages` and :func:`fedtune.runtime.common.evaluate`
  as they are (one float buffer per batch filled in 32-row chunks, normalised in place, each
  batch freed before the next; the batch capped at ``eval_batch_mib``).

Both variants' accuracy counts are checked equal. Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import json, sys
import numpy as np
import torch
from fedtune.runtime.common import evaluate
from fedtune.runtime.examples import CachedImages

variant, size, batch, images, mib = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
torch.set_num_threads(1)


class InMemoryMap:
    # the two members of fedtune.data.cache.ImageMap that CachedImages uses
    def __init__(self, array):
        self.array = array

    def read(self, where, out=None):
        if out is None:
            return self.array[where]
        np.take(self.array, where, axis=0, out=out)
        return out


class Before(CachedImages):
    def batch(self, rows, augment=None, generator=None):
        r = rows.cpu().numpy()
        host = torch.empty((len(r), *self.maps[0].array.shape[1:]), dtype=torch.uint8)
        self.gather(r, host.numpy())
        x = host.permute(0, 3, 1, 2).float().div_(255.0)
        x = (x - self.mean) / self.std
        return x.contiguous(), self.labels.index_select(0, rows.cpu())


def evaluate_before(model, examples, batch_size):
    correct = count = 0
    with torch.no_grad():
        for start in range(0, len(examples), batch_size):
            xb, yb = examples.batch(torch.arange(start, min(start + batch_size, len(examples))))
            logits = model(xb).float()
            correct += int((logits.argmax(1) == yb).sum())
            count += len(yb)
    return correct, count


rng = np.random.default_rng(0)
pixels = rng.integers(0, 256, (images, size, size, 3), dtype=np.uint8)
labels = rng.integers(0, 7, images)
cls = Before if variant == "before" else CachedImages
ex = cls([InMemoryMap(pixels)], [np.arange(images)], labels)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(3, 7)).eval()
ex.batch(torch.arange(2))  # warm the allocator and the code paths


def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))


with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # VmHWM := VmRSS now
base = status("VmRSS")
if variant == "before":
    correct, count = evaluate_before(model, ex, batch)
else:
    out = evaluate(model, ex, batch, max_mib=mib)
    correct, count = out.correct, out.count
print(json.dumps({"peak": status("VmHWM") - base, "correct": correct, "count": count}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--images", type=int, default=768)
    ap.add_argument("--mib", type=float, default=160.0, help="eval_batch_mib for 'after'")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    batch_bytes = args.batch * 3 * args.size * args.size * 4
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    for _ in range(args.repeats):  # interleaved
        for variant in runs:
            res = subprocess.run([sys.executable, "-c", CHILD, variant, str(args.size), str(args.batch),
                                  str(args.images), str(args.mib)], capture_output=True, text=True, env=env, check=True)
            runs[variant].append(json.loads(res.stdout.strip().splitlines()[-1]))
    counts = {(r["correct"], r["count"]) for v in runs.values() for r in v}
    assert len(counts) == 1, f"the variants' accuracy counts differ: {counts}"
    print(f"evaluation of {args.images} images at {args.size} px, eval_batch_size {args.batch} "
          f"(one batch's float32 inputs: {batch_bytes / 2**20:.1f} MiB); load average {os.getloadavg()[0]:.2f}")
    print("| variant | peak above the start, MiB (min / median / max) | float copies of one batch (median) |")
    print("|---|---|---|")
    for variant, rs in runs.items():
        peaks = sorted(r["peak"] / 2**20 for r in rs)
        med = peaks[len(peaks) // 2]
        print(f"| {variant} | {peaks[0]:.1f} / {med:.1f} / {peaks[-1]:.1f} | {med * 2**20 / batch_bytes:.2f} |")


if __name__ == "__main__":
    main()
