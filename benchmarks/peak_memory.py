"""Peak host memory of a command and every process it starts (Linux ``/proc``).

    python benchmarks/peak_memory.py [--interval 0.1] -- COMMAND ...

Samples the command's process tree every ``--interval`` seconds and prints the peaks of the
tree's summed

* ``rss``: resident memory, what ``top`` shows; counts the pages of memory-mapped files a
  process has mapped (for fedtune's decoded-image cache: shared page cache, reclaimable);
* ``anon``: private anonymous memory (``RssAnon``): what the processes themselves hold;
* ``file``: resident file-backed pages (``RssFile``),

and the node's page cache growth (``Cached`` in ``/proc/meminfo``) for context. The issue's
"peak host memory of a fedtune run" is measured with it, the same command before and after:

    python benchmarks/peak_memory.py -- fedtune run --dataset pacs --data-root ../shared/data/PACS64 \\
        --backend local --rounds 1 --set image_size=224 --set model=resnet18 --set local_steps=1 \\
        --set eval_batch_size=128 --no-progress --output /tmp/mem
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time


def _status(pid: int) -> dict[str, int]:
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
                    out[key] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return out


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def tree(pid: int) -> list[int]:
    seen, todo = [], [pid]
    while todo:
        p = todo.pop()
        seen.append(p)
        todo.extend(_children(p))
    return seen


def meminfo_cached() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("Cached:"):
                return int(line.split()[1]) * 1024
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--interval", type=float, default=0.1)
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        ap.error("give the command after --")
    cached0 = meminfo_cached()
    t0 = time.time()
    proc = subprocess.Popen(cmd)
    peak = {"rss": 0, "anon": 0, "file": 0, "cache": 0}
    while proc.poll() is None:
        stats = [_status(p) for p in tree(proc.pid)]
        peak["rss"] = max(peak["rss"], sum(s.get("VmRSS", 0) for s in stats))
        peak["anon"] = max(peak["anon"], sum(s.get("RssAnon", 0) for s in stats))
        peak["file"] = max(peak["file"], sum(s.get("RssFile", 0) + s.get("RssShmem", 0) for s in stats))
        peak["cache"] = max(peak["cache"], meminfo_cached() - cached0)
        time.sleep(args.interval)
    gib = 1 << 30
    print(f"peak_memory: exit {proc.returncode} after {time.time() - t0:.1f} s; peaks over the process tree: "
          f"rss {peak['rss'] / gib:.2f} GiB, anon {peak['anon'] / gib:.2f} GiB, file {peak['file'] / gib:.2f} GiB; "
          f"page cache grew by {peak['cache'] / gib:.2f} GiB", file=sys.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
