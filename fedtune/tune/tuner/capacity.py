"""How many trials of a sweep fit on the cluster at once: the capacity check behind
``--max-concurrent`` (each trial reserves its placement group's bundles; see
:func:`fedtune.tune.trial.trainable.resources_for`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from fedtune.errors import ConfigError, ResourceError

__all__ = ["concurrency_cap"]


def concurrency_cap(configs: Sequence[Mapping[str, Any]], requested: int | None,
                    cluster: Mapping[str, float], nodes: list[dict[str, float]] | None = None) -> tuple[int, str | None]:
    """How many trials of ``configs`` can run at once on a cluster with ``cluster`` resources in
    total (``ray.cluster_resources()``), and a warning when ``requested`` is more than that.
    Each trial reserves the sum of its :func:`~fedtune.tune.trial.trainable.resources_for` bundles
    (planned on ``nodes``, default: the connected cluster's); the cap divides the cluster's
    totals by the largest such reservation, an upper bound on a cluster of several nodes.
    Raises ConfigError when not even one trial fits.

    >>> concurrency_cap([{"dataset": "rect4", "client_cpus": 0.5, "max_client_actors": 1}], 8, {"CPU": 2.0},
    ...                 nodes=[{"CPU": 2.0}])[1]
    'option --max-concurrent: 8 concurrent trials need 4 CPU (each trial reserves 0.5 CPU), but the cluster has 2 CPU; running at most 4 trials at a time'
    """
    # lazy: keeps ray, pyarrow out of this module's import
    from fedtune.tune.trial.trainable import resources_for

    need: dict[str, float] = {}
    for cfg in configs:
        try:
            pgf = resources_for(dict(cfg), nodes)
        except ResourceError as exc:
            raise ConfigError(str(exc)) from None
        total: dict[str, float] = {}
        for b in pgf.bundles:
            for k, v in b.items():
                total[k] = total.get(k, 0.0) + float(v)
        for k, v in total.items():
            need[k] = max(need.get(k, 0.0), v)
    fit = math.inf
    for k, v in need.items():
        if v > 0:
            fit = min(fit, math.floor(float(cluster.get(k, 0.0)) / v + 1e-9))
    fit = int(fit) if fit != math.inf else (requested or 1)
    if fit < 1:
        raise ConfigError(f"a trial reserves {_res_text(need)} but the cluster has {_res_text(cluster, need)}; "
                          "lower client_cpus/client_gpus or max_client_actors")
    if requested is None:
        return fit, None
    if requested > fit:
        want = {k: v * requested for k, v in need.items()}
        return fit, (f"option --max-concurrent: {requested} concurrent trials need {_res_text(want)} (each trial "
                     f"reserves {_res_text(need)}), but the cluster has {_res_text(cluster, need)}; running at most "
                     f"{fit} trial{'s' if fit != 1 else ''} at a time")
    return requested, None


def _res_text(res: Mapping[str, float], keys: Mapping[str, float] | None = None) -> str:
    names = [k for k in (keys or res) if (keys or res)[k] > 0] or ["CPU"]
    return ", ".join(f"{float(res.get(k, 0.0)):g} {k}" for k in names)
