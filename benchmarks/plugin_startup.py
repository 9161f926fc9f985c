"""What registering a plugin adds to a study's first trial (issue 45's goal: at most 0.5 s).

A script, not a test (timings are noisy: the two arms are interleaved, and the load average is printed)::

    python benchmarks/plugin_startup.py --pairs 3

Each run is a fresh ``fedtune sweep --num-samples 1 --rounds 1`` process (a fresh Ray, as a user's
command), alternately

* **built-in**: ``--algorithm fedavg`` (client method ``sgd``), and
* **plugin**: ``--plugin <tmp>/sgd_plugin.py --algorithm sgd-plugin``, a plugin file outside the
  package whose client method is ``sgd`` itself under another name: the same training, so the
  difference is what the plugin costs (its import in the driver, the trial process, the coordinator
  and every client actor, which imports torch there; its source hash in ``study.json``; its file
  shipped with Ray's ``runtime_env``, since it is not installed);
* **light plugin**: ``--plugin sgdpkg``, the same class in ``sgdpkg/impl.py`` and its declaration
  alone registered by ``sgdpkg/__init__.py`` (``ClientMethodSpec(where="sgdpkg.impl:SgdLight")``),
  as fedtune keeps its own declarations apart from the torch code: only the client actors import
  the class.

Every run starts in the plugins' folder (so every arm's Ray workers have it on their path).

Measured per run, from the study's own records: **to the first trial**, the process start to the
first trial's ``started_at`` (imports, Ray's start, the plan, the trainable), and **first trial**,
its ``total_wall_s`` (its actors' start-up and its one round). Printed: each arm's median and the
plugin's extra seconds (median of the per-pair differences) for both.
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
from datetime import datetime
from pathlib import Path

PLUGIN = '''
import fedtune


class SgdPlugin(fedtune.SGD):
    """fedtune's own local SGD, registered from outside the package under another name."""

    spec = fedtune.ClientMethodSpec("sgd-plugin", description="local SGD, from a plugin file")


fedtune.register(SgdPlugin)
'''

# The same component with its declaration in a light module (as fedtune's own declarations.py): the
# class's module, which imports torch, is imported only by the client actors, which import torch anyway.
LIGHT_INIT = '''
import fedtune

fedtune.register(fedtune.ClientMethodSpec("sgd-light", where="sgdpkg.impl:SgdLight",
                                          description="local SGD, declared apart from its class"))
'''
LIGHT_IMPL = '''
import fedtune


class SgdLight(fedtune.SGD):
    name = "sgd-light"
'''


def one_run(out: Path, name: str, extra: list[str], cwd: Path) -> dict[str, float]:
    t0 = time.time()
    cmd = [sys.executable, "-m", "fedtune", "sweep", "--num-samples", "1", "--rounds", "1", "--no-report",
           "--output", str(out), "--name", name, *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=cwd)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    import pyarrow.parquet as pq

    row = pq.read_table(out / name / "trials.parquet").to_pylist()[0]
    started = datetime.fromisoformat(str(row["started_at"])).timestamp()
    return {"to_first_trial_s": started - t0, "first_trial_s": float(row["total_wall_s"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="fedtune-plugin-startup-") as tmp:
        root = Path(tmp)
        plugin = root / "plugins" / "sgd_plugin.py"
        plugin.parent.mkdir()
        plugin.write_text(PLUGIN)
        (plugin.parent / "sgdpkg").mkdir()
        (plugin.parent / "sgdpkg" / "__init__.py").write_text(LIGHT_INIT)
        (plugin.parent / "sgdpkg" / "impl.py").write_text(LIGHT_IMPL)
        arms = {"built-in": ["--algorithm", "fedavg"],
                "plugin": ["--plugin", str(plugin), "--algorithm", "sgd-plugin"],
                "light plugin": ["--plugin", "sgdpkg", "--algorithm", "sgd-light"]}
        load_before = os.getloadavg()[0]
        got: dict[str, list[dict[str, float]]] = {k: [] for k in arms}
        for i in range(args.pairs):
            order = list(arms) if i % 2 == 0 else list(reversed(arms))
            for arm in order:
                got[arm].append(one_run(root / "out", f"{arm.replace(' ', '-')}-{i}", arms[arm], plugin.parent))
        load_after = os.getloadavg()[0]
    print(f"{args.pairs} pairs, interleaved; load average {load_before:.2f} -> {load_after:.2f}")
    for key in ("to_first_trial_s", "first_trial_s"):
        base = statistics.median(r[key] for r in got["built-in"])
        print(f"{key}: built-in {base:.2f} s")
        for arm in ("plugin", "light plugin"):
            median = statistics.median(r[key] for r in got[arm])
            extra = statistics.median(p[key] - b[key] for p, b in zip(got[arm], got["built-in"]))
            print(f"  {arm:13s} {median:.2f} s  extra (median of the runs' differences) {extra:+.2f} s  "
                  f"ratio {median / base:.3f}")
    print(json.dumps(got))


if __name__ == "__main__":
    main()
