"""The driver's own work between two rounds (``fedtune.runtime.driver.run``), part by part, without Ray.

A script, not a test (this machine is noisy: compare runs side by side)::

    python benchmarks/driver_round.py                     # workload 100p, 60 rounds, a 20 ms round
    python benchmarks/driver_round.py --wait-ms 0         # the same work with the caches warm

The driver's loop runs as ``fedtune run`` runs it (row, results store, progress bar off, ``on_round``)
against a stand-in coordinator that waits ``--wait-ms`` (as the driver waits in ``ray.get``) and
returns the metrics of a real round of the workload (one short local run first, so the rows have
the columns of a real run). Printed: the median of the driver's work a round (from the stand-in's
return to its next call) over rounds 2..R-1, and of each part: the round's row (``round_row``), the
store's write (``write_rounds``: the rows' conversion ``RoundsTable.extend``/``table``, the Parquet
encoding ``pq.write_table`` and the file's system calls, its ``os.replace`` apart).

On this 2-core VM the work after a 20 ms wait takes about twice as long as back to back (the
caches cold): that is what a driver waiting on a real round meets. To compare with an older tree,
run the script with ``PYTHONPATH`` pointing at it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from many_clients import WORKLOADS, base_config  # noqa: E402 - after the path

IDENTITY = {"study", "trial_id", "algorithm", "client_method", "server_rule", "dataset", "setting", "target_domain",
            "seed", "round", "status", "split_scheme"}


def timed(owner, name: str, key: str, acc: dict[str, list[float]]) -> None:
    """Wrap ``owner.name`` so that each call's seconds go to ``acc[key]`` (kept when it is absent)."""
    real = getattr(owner, name, None)
    if real is None:
        return

    def wrapper(*a, **k):
        t = time.perf_counter()
        try:
            return real(*a, **k)
        finally:
            acc.setdefault(key, []).append(time.perf_counter() - t)

    setattr(owner, name, wrapper)


def real_metrics(cfg_dict: dict) -> tuple[dict, dict]:
    """The metrics of a training round and of the last (evaluated) round of a 3-round local run."""
    from fedtune.runtime.driver import run

    rows = run({**cfg_dict, "rounds": 3, "eval_every": 3, "backend": "local"}, progress=False).rows
    metrics = [{k: v for k, v in r.items() if k not in IDENTITY and not k.startswith("hp.")} for r in rows]
    return metrics[1], metrics[-1]


def drive(cfg_dict: dict, rounds: int, wait_s: float, train: dict, last: dict) -> list[float]:
    """Run the driver's loop against the stand-in coordinator; the driver's work of rounds 2..R-1, seconds."""
    import fedtune.runtime.driver as drv
    from fedtune.config import FederatedRunConfig
    from fedtune.runtime.coordinator import RoundResult

    marks: list[float] = []  # the stand-in's call and return times, two a round

    def start(self) -> None:
        def call(name: str, *a):
            if name != "run_round":
                return {}
            marks.append(time.perf_counter())
            time.sleep(wait_s)
            metrics = train if a[0] < rounds else last
            result = RoundResult(a[0], {k: v * (1 + 1e-6 * a[0]) if isinstance(v, float) else v
                                        for k, v in metrics.items()}, "ok")
            marks.append(time.perf_counter())
            return result

        self._call, self.coordinator = call, object()

    real = drv.FederatedRun.start, drv.FederatedRun.close
    drv.FederatedRun.start, drv.FederatedRun.close = start, lambda self: None
    try:
        drv.run(FederatedRunConfig.from_dict({**cfg_dict, "backend": "local"}), progress=False,
                on_round=lambda row: None)
    finally:
        drv.FederatedRun.start, drv.FederatedRun.close = real
    return [marks[2 * i + 2] - marks[2 * i + 1] for i in range(rounds - 1)][1:-1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workload", default="100p", choices=sorted(WORKLOADS))
    p.add_argument("--rounds", type=int, default=60)
    p.add_argument("--wait-ms", type=float, default=20.0)
    args = p.parse_args()
    if args.rounds < 4:
        raise SystemExit("driver_round: --rounds: at least 4 (rounds 2..R-1 are timed)")

    import pyarrow.parquet as pq

    import fedtune.runtime.driver as drv
    from fedtune.results import arrow, atomic, rounds_table, store

    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as out:
        cfg_dict = base_config(args.workload, args.rounds, out)
        train, last = real_metrics({**cfg_dict, "name": "metrics"})
        work = drive({**cfg_dict, "name": "whole"}, args.rounds, args.wait_ms / 1e3, train, last)
        acc: dict[str, list[float]] = {}  # then part by part (the timers add to the whole: not counted above)
        for owner, name in ((drv, "round_row"), (store.ResultsStore, "write_rounds"), (store, "write_parquet"),
                            (rounds_table.RoundsTable, "extend"), (rounds_table.RoundsTable, "table"),
                            (pq, "write_table"), (arrow, "atomic_write_bytes"), (arrow, "atomic_write"),
                            (atomic.os, "replace")):
            timed(owner, name, f"{getattr(owner, '__name__', '').rsplit('.', 1)[-1]}.{name}".lstrip("."), acc)
        drive({**cfg_dict, "name": "parts"}, args.rounds, args.wait_ms / 1e3, train, last)
    print(f"workload {args.workload}, {args.rounds} rounds, the stand-in's round {args.wait_ms:g} ms, load average "
          f"{load0:.2f} -> {os.getloadavg()[0]:.2f}; medians over rounds 2..{args.rounds - 1}, ms a round")
    print(f"| the driver's work a round | {statistics.median(work) * 1e3:.3f} |")
    for key, v in acc.items():
        kept = v[2:-2] or v
        print(f"| {key} ({len(v)} calls) | {statistics.median(kept) * 1e3:.3f} |")


if __name__ == "__main__":
    main()
