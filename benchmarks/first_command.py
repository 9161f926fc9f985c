"""The first command, ``fedtune sweep`` alone: its wall time and where it goes, over a few runs.

A script, not a test (this machine is noisy: compare phases within one run)::

    python benchmarks/first_command.py               # 3 runs of the no-argument study (~2.5 min each on 2 cores)
    python benchmarks/first_command.py --runs 1 -- --rounds 2   # extra arguments go to `fedtune sweep`

Each run is a fresh ``python -m fedtune.cli sweep --output <tmp>`` process (a fresh Ray, as a new
user's first command). From the study's own records (``trials`` rows: started_at/ended_at to the
microsecond) the wall time is split into:

* **to the first trial**: the process start to the first trial's start (imports, Ray's start, the
  study's plan, the first search's Tune fit and its actors);
* **between searches**: from a search's last trial to the next search's first trial (when the
  searches ran as fits of their own, before 2026-11-27: Tune's fit ending and the next one
  starting, a trainable actor, the client actors and the coordinator, each a new process
  importing Ray Tune, torch or NumPy; in one fit, the actors are reused);
* **trials**: the trials' own time (rounds, evaluation);
* **inside searches**: between consecutive trials of one search (actors kept: Tune's actor reuse);
* **after the last trial**: the report and Ray's shutdown.

Printed per phase: min / median / max seconds over the runs, the load average before and after.
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
from datetime import datetime, timezone
from pathlib import Path


def phases(study_dir: Path, t_start: float, t_end: float) -> dict[str, float]:
    """The run's phases in seconds (see the module docstring)."""
    from fedtune.results.store import load

    study = json.loads((study_dir / "study.json").read_text())
    rows = load(study_dir, "trials").to_pylist()
    ts = lambda d: d.replace(tzinfo=d.tzinfo or timezone.utc).timestamp()  # noqa: E731
    # a trial's search: the Optuna study that holds its fedtune trial id
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = f"sqlite:///{study_dir / 'optuna.db'}"
    search_of = {}
    for key, st in study["searches"].items():
        if "optuna_study" in st:
            for t in optuna.load_study(study_name=st["optuna_study"], storage=storage).get_trials(deepcopy=False):
                search_of.setdefault(t.user_attrs.get("fedtune_trial_id"), key)
    search_of = {r["trial_id"]: search_of.get(r["trial_id"], "?") for r in rows}
    rows.sort(key=lambda r: r["started_at"])
    out = {"wall": t_end - t_start, "to the first trial": ts(rows[0]["started_at"]) - t_start,
           "between searches": 0.0, "trials": 0.0, "inside searches": 0.0,
           "after the last trial": t_end - ts(rows[-1]["ended_at"])}
    for prev, r in zip([None] + rows[:-1], rows):
        out["trials"] += ts(r["ended_at"]) - ts(r["started_at"])
        if prev is not None:
            gap = ts(r["started_at"]) - ts(prev["ended_at"])
            out["inside searches" if search_of[r["trial_id"]] == search_of[prev["trial_id"]] else
                "between searches"] += gap
    out["searches"] = float(len(set(search_of[r["trial_id"]] for r in rows)))
    out["trial count"] = float(len(rows))
    return out


def one_run(extra: list[str]) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.time()
        proc = subprocess.run([sys.executable, "-m", "fedtune.cli", "sweep", "--output", tmp, *extra],
                              cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        t1 = time.time()
        if proc.returncode != 0:
            raise SystemExit(f"first_command: fedtune sweep exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
        (study_dir,) = [p.parent for p in Path(tmp).glob("*/study.json")]
        return phases(study_dir, t0, t1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("extra", nargs="*", help="arguments after -- go to `fedtune sweep`")
    args = p.parse_args()
    if args.runs < 1:
        raise SystemExit(f"first_command: --runs must be >= 1, got {args.runs}")
    load0 = os.getloadavg()
    runs = []
    for i in range(args.runs):
        runs.append(one_run(args.extra))
        print(f"run {i + 1}: " + ", ".join(f"{k} {v:.1f}" for k, v in runs[-1].items()), flush=True)
    load1 = os.getloadavg()
    print(f"\n{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; load average before {load0[0]:.2f}, after "
          f"{load1[0]:.2f}; {args.runs} runs of `fedtune sweep {' '.join(args.extra)}`, seconds, min / median / max")
    print("| phase | seconds |\n|---|---|")
    for k in runs[0]:
        v = [r[k] for r in runs]
        print(f"| {k} | {min(v):.1f} / {statistics.median(v):.1f} / {max(v):.1f} |")


if __name__ == "__main__":
    main()
