"""Before/after check of a refactor: the same runs give the same rows, bit for bit.

Runs every preset in every setting it supports (plus the paper-vs-code variants and a composed
pair) for two rounds on the embedded data, on the local backend and, for a few, on Ray with two
client actors, then one small ``fedtune sweep``; writes one digest per run of every row's
values except the wall-clock and host columns. Run it on the commit before a change and on the
change, then compare::

    python benchmarks/same_rows.py --out /tmp/before.json          # on the old commit
    python benchmarks/same_rows.py --out /tmp/after.json --compare /tmp/before.json

The comparison prints each run as ``same`` or ``DIFFERENT`` (with the first differing columns) and
exits 1 when any differs. A run whose rows only gained columns (a new hyperparameter's ``hp.*``
column, at the value the old code computed with) and kept every old column's values is ``same``,
with the new columns named.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

# Columns that measure the machine, not the computation.
_SKIP_SUFFIXES = ("_s", "_ms", "_mb", "_gb", "_bytes", "_at")
_SKIP_WORDS = ("time", "host", "pid", "node", "path", "mem", "rss", "date", "started", "finished", "wall", "dir",
               "throughput", "per_s")

RUNS: list[tuple[str, dict]] = [
    ("fedavg-fdg", {"algorithm": "fedavg"}),
    ("fedavg-fl", {"algorithm": "fedavg", "setting": "fl", "num_clients": 4}),
    ("fedavg-fda", {"algorithm": "fedavg", "setting": "fda"}),
    ("fedomg-exact", {"algorithm": "fedomg", "omg_kappa": 0.3}),
    ("fedomg-sgd-rescale", {"algorithm": "fedomg", "omg_solver": "sgd", "omg_rescale": True}),
    ("fedomg-fl", {"algorithm": "fedomg", "setting": "fl", "num_clients": 4}),
    ("fedda-fixed", {"algorithm": "fedda", "setting": "fda", "gp_beta": 0.5}),
    ("fedda-auto", {"algorithm": "fedda", "setting": "fda", "gp_beta": "auto", "local_steps": 3}),
    ("fedgp-auto", {"algorithm": "fedgp", "setting": "fda", "gp_beta": "auto", "local_steps": 3}),
    ("fedgp-align", {"algorithm": "fedgp", "setting": "fda", "gp_align": True}),
    ("target-only", {"algorithm": "target-only", "setting": "fda"}),
    ("fedprox", {"algorithm": "fedprox", "prox_mu": 0.1}),
    ("fedprox-fda", {"algorithm": "fedprox", "setting": "fda"}),
    ("fedsam", {"algorithm": "fedsam", "sam_rho": 0.05}),
    ("gfm", {"algorithm": "gfm", "gfm_interval": 2}),
    ("gca-fl", {"algorithm": "gca", "setting": "fl", "num_clients": 4, "gfm_interval": 1}),
    ("simclr", {"algorithm": "simclr", "setting": "ufdg"}),
    ("fedgala", {"algorithm": "fedgala", "gala_tau": 0.1}),
    ("fedgala-literal", {"algorithm": "fedgala", "gala_gate": "literal", "gala_weights": "whole"}),
    ("fedgala-ufdg", {"algorithm": "fedgala", "setting": "ufdg"}),
    ("sam+fedomg", {"algorithm": "fedsam", "server_rule": "fedomg"}),
    ("prox+gala", {"algorithm": "fedprox", "server_rule": "gala"}),
    ("rect4-mlp", {"algorithm": "fedomg", "dataset": "rect4", "model": "mlp"}),
    ("adam-fedavg", {"algorithm": "fedavg", "local_optimizer": "adam", "local_lr": 0.001}),
    # the seeds' baselines and the server optimisers (issue 20/21 rows)
    ("fedsr", {"algorithm": "fedsr"}),
    ("fedsr-omg", {"algorithm": "fedsr-omg"}),
    ("fediir", {"algorithm": "fediir"}),
    ("fishr", {"algorithm": "fishr"}),
    ("fishr-anneal4", {"algorithm": "fishr", "fishr_anneal_iters": 4}),
    ("moon", {"algorithm": "moon"}),
    ("scaffold", {"algorithm": "scaffold"}),
    ("feddyn", {"algorithm": "feddyn"}),
    ("feddyn-uniform-adam", {"algorithm": "feddyn", "feddyn_mean": "uniform", "server_optimizer": "adam"}),
    ("fedga", {"algorithm": "fedga"}),
    ("fedga-authors", {"algorithm": "fedga", "fedga_decay": "authors", "rounds": 3}),
    ("fedavg-adam-small-lr", {"algorithm": "fedavg", "server_optimizer": "adam", "global_lr": 0.01}),
    ("fedavg-avgm", {"algorithm": "fedavg", "server_optimizer": "avgm", "global_lr": 0.5}),
    ("fedomg-yogi", {"algorithm": "fedomg", "server_optimizer": "yogi", "global_lr": 0.05}),
]
RAY_RUNS = ("fedomg-exact", "fedgp-auto", "fedgala", "gfm")
BASE = {"rounds": 2, "local_steps": 2, "batch_size": 16, "backend": "local", "seed": 3}


def digest(rows: list[dict]) -> dict[str, str]:
    """column -> sha1 of its values over the rows (the machine's columns left out)."""
    cols: dict[str, list] = {}
    for row in rows:
        for key, value in row.items():
            low = key.lower()
            if low.endswith(_SKIP_SUFFIXES) or any(w in low for w in _SKIP_WORDS):
                continue
            if isinstance(value, float) and math.isnan(value):
                value = "nan"
            if key == "config_json" and value:  # the run's fields, less where this script put its output
                value = {k: v for k, v in json.loads(value).items() if k != "output"}
            cols.setdefault(key, []).append(value)
    return {k: hashlib.sha1(json.dumps(v, sort_keys=True, default=repr).encode()).hexdigest()[:16]
            for k, v in sorted(cols.items())}


def run_all(out: Path, only: set[str] | None) -> dict[str, dict[str, str]]:
    import fedtune
    from fedtune.runtime.driver import run

    results: dict[str, dict[str, str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for key, fields in RUNS:
            for backend in ("local", "ray") if key in RAY_RUNS else ("local",):
                name = f"{key}@{backend}"
                if only and name not in only:
                    continue
                extra = {"num_cpus": 2, "client_cpus": 0.5, "max_client_actors": 2} if backend == "ray" else {}
                cfg = fedtune.FederatedRunConfig.from_dict({**BASE, **fields, **extra, "backend": backend,
                                                            "output": tmp, "name": name.replace("+", "_")})
                res = run(cfg, progress=False)
                results[name] = {"status": res.status, **digest(res.rows)}
                print(f"{name:28s} {res.status}", flush=True)
        if not only or "sweep" in only:
            cmd = [sys.executable, "-m", "fedtune", "sweep", "--algorithm", "fedavg", "--algorithm", "fedomg", "--algorithm", "fedgala",
                   "--num-samples", "3",
                   "--rounds", "2", "--output", tmp, "--name", "sw", "--no-report", "--max-concurrent", "1",
                   "--set", "backend=local", "--set", "local_steps=2", "--set", "model=mlp"]
            subprocess.run(cmd, check=True, capture_output=True, text=True)
            import pyarrow.parquet as pq

            table = pq.read_table(Path(tmp) / "sw" / "trials.parquet").to_pylist()
            table.sort(key=lambda r: (r.get("search", ""), r.get("trial_id", "")))
            results["sweep"] = digest(table)
            print("sweep done", flush=True)
    out.write_text(json.dumps(results, indent=1, sort_keys=True))
    return results


def compare(now: dict, before: dict) -> int:
    bad = 0
    for name in sorted(set(now) | set(before)):
        a, b = now.get(name), before.get(name)
        if a == b:
            print(f"same       {name}")
            continue
        bad += 1
        if a is None or b is None:
            print(f"DIFFERENT  {name}: only in {'before' if a is None else 'after'}")
            continue
        cols = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        added = [k for k in cols if k not in b]
        changed = [k for k in cols if k in b]
        if not changed:  # the same values in every column the old rows had; only new columns beside them
            bad -= 1
            print(f"same       {name} (+ new columns: {', '.join(added)})")
            continue
        print(f"DIFFERENT  {name}: columns {', '.join(changed[:6])}" + (f" (+ new: {', '.join(added)})" if added else ""))
    print(f"{len(set(now) | set(before)) - bad} same, {bad} different")
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--compare", type=Path)
    ap.add_argument("--only", nargs="*", help="run names (e.g. fedomg-exact@local sweep)")
    args = ap.parse_args()
    now = run_all(args.out, set(args.only) if args.only else None)
    if args.compare:
        return compare(now, json.loads(args.compare.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
