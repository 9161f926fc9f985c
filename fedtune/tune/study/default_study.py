"""The no-argument study, ``fedtune sweep`` alone: a newcomer's first command, sized to answer in
about half a minute on 2 CPU cores (docs/benchmarks.md says what it measured)."""

from __future__ import annotations

import copy
import os
from typing import Any

from fedtune.algorithms.presets import PRESETS
from fedtune.tune.study.options import SweepOptions

__all__ = ["DEFAULT_ALGORITHMS", "DEFAULT_STUDY", "apply_default_study", "is_default_study"]

DEFAULT_ALGORITHMS = ("fedavg", "fedprox", "fedomg")
"""Algorithms of the no-argument study (those registered and with a search space)."""

DEFAULT_STUDY: dict[str, Any] = {
    "dataset": "rotated-digits", "rounds": 8, "num_samples": 3, "trial_seeds": 3, "knobs": "own",
    "overrides": {"model": "mlp", "local_steps": 10, "batch_size": 32, "client_cpus": 1.0, "max_client_actors": 1},
}
"""The no-argument study, a newcomer's first command (about half a minute on 2 CPU cores):
rotated-digits (target domain "0"), the mlp, 8 rounds of 10 local steps; each algorithm's own
knobs only (``knobs: own``: FedProx's prox_mu, FedOMG's omg_kappa and server step; FedAvg has
none, so its search is its one configuration), every shared knob fixed at one value for every
method; up to 3 Optuna trials per search (the first: the space's defaults); the whole search
repeated over 3 trial seeds so the table has an error bar that includes selection variance. On
2 cores trials run one at a time (:func:`apply_default_study`). Its report says plainly which
gaps it can and cannot resolve (:meth:`fedtune.reports.report.Report.conclusions`)."""


def is_default_study(opts: SweepOptions) -> bool:
    """True when no option chooses what to run (``fedtune sweep`` alone)."""
    return not (opts.spaces or opts.algorithms or opts.dataset or opts.data_root or opts.target_domain
                or opts.rounds or opts.overrides or opts.config_fields)


def apply_default_study(opts: SweepOptions) -> SweepOptions:
    """The no-argument study: :data:`DEFAULT_STUDY` on the algorithms of :data:`DEFAULT_ALGORITHMS`
    that are registered and have a search space."""
    from fedtune.spaces.lookup import list_spaces  # lazy: keeps numpy out of this module's import

    spaces = set(list_spaces())
    algos = [a for a in DEFAULT_ALGORITHMS if a in PRESETS and a in spaces]
    out = copy.deepcopy(opts)
    out.algorithms = algos or ["fedavg"]
    out.dataset = DEFAULT_STUDY["dataset"]
    out.rounds = DEFAULT_STUDY["rounds"]
    if out.num_samples == SweepOptions.num_samples:
        out.num_samples = DEFAULT_STUDY["num_samples"]
    if out.trial_seeds == SweepOptions.trial_seeds and out.seeds == SweepOptions.seeds:
        out.trial_seeds = DEFAULT_STUDY["trial_seeds"]
    out.overrides = dict(DEFAULT_STUDY["overrides"])
    if out.knobs is None:  # --knobs all keeps every knob searched
        out.knobs = DEFAULT_STUDY["knobs"]
    if out.max_concurrent is None and (os.cpu_count() or 1) <= 2:
        # Each trial starts three processes (trainable, coordinator, client), each importing torch:
        # side by side on 2 cores they start slower than one after another, and a trial that
        # follows another (in any search of the study: one Tune fit) reuses its actors.
        out.max_concurrent = 1
    return out
