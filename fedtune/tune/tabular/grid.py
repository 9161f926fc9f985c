"""The full grid of a search space, run once into a fedtune study: :func:`grid_configs` and :func:`run_grid`.

A grid names some parameters of an algorithm's search space (:func:`fedtune.spaces.lookup.load_space`)
and how many points each gets (:func:`grid_points`: log-spaced for a log-uniform range, evenly
spaced for a uniform one, every integer or evenly spaced integers, every choice of a categorical);
every other parameter takes the space's default. :func:`run_grid` runs each configuration on the
local backend, in worker processes, for every (dataset, target domain, seed) cell, into ordinary
fedtune studies (``OUTPUT/<name>-w<k>``, one per process: one writer per study), whose round rows
:func:`fedtune.tune.tabular.table.build_table` turns into the tabular benchmark.
"""

from __future__ import annotations

import itertools
import math
import multiprocessing
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np

from fedtune.errors import ConfigError

__all__ = ["grid_configs", "grid_points", "run_grid"]


def _short(value: float) -> float:
    return float(f"{value:.4g}")


def grid_points(param: Any, n: int) -> list[Any]:
    """``n`` points of a search-space parameter (:class:`~fedtune.spaces.model.ParamSpec`).

    >>> from fedtune.spaces.model import ParamSpec
    >>> grid_points(ParamSpec("local_lr", "loguniform", 0.05, 0.005, 0.5), 3)
    [0.005, 0.05, 0.5]
    >>> grid_points(ParamSpec("local_momentum", "categorical", 0.9, choices=(0.0, 0.5, 0.9)), 2)
    [0.0, 0.5, 0.9]
    """
    dist = param.distribution
    if dist == "loguniform":
        return [_short(v) for v in np.geomspace(param.low, param.high, n)]
    if dist == "uniform":
        return [_short(v) for v in np.linspace(param.low, param.high, n)]
    if dist == "int":
        lo, hi = int(param.low), int(param.high)
        if hi - lo + 1 <= n:
            return list(range(lo, hi + 1))
        return sorted({int(round(v)) for v in np.linspace(lo, hi, n)})
    if dist == "categorical":
        return list(param.choices)
    return [param.value]


def grid_configs(algorithm: str, points: Mapping[str, int | Sequence[Any]]) -> list[dict[str, Any]]:
    """Every configuration of the grid over ``algorithm``'s search space: ``points`` maps a
    parameter to its number of points (:func:`grid_points`) or to its values; the other parameters
    take the space's defaults. ConfigError for a name the space does not have."""
    from fedtune.spaces.lookup import load_space  # lazy: keeps yaml out of this module's import

    space = load_space(algorithm)
    axes: list[tuple[str, list[Any]]] = []
    for name, how in points.items():
        if name not in space.params:
            raise ConfigError(f"grid of {algorithm}: {name!r} is not a parameter of its search space; allowed: "
                              f"{', '.join(space.params)}")
        axes.append((name, grid_points(space.params[name], how) if isinstance(how, int) else list(how)))
    base = space.defaults()
    return [{**base, **dict(zip((a for a, _ in axes), values))}
            for values in itertools.product(*(v for _, v in axes))]


def _run_batch(job: tuple[list[dict[str, Any]], str, str]) -> int:
    # lazy: keeps yaml out of this module's import
    from fedtune.config import FederatedRunConfig
    from fedtune.runtime.driver import run

    configs, output, name = job
    for values in configs:
        run(FederatedRunConfig.from_dict({**values, "output": output, "name": name, "backend": "local"}),
            progress=False)
    return len(configs)


def run_grid(configs: Sequence[Mapping[str, Any]], cells: Sequence[Mapping[str, Any]], output: str, name: str,
             workers: int = 2) -> int:
    """Run every configuration in every cell (a mapping of fields: ``dataset``, ``target_domain``,
    ``seed``, ...) on the local backend, spread over ``workers`` processes, each writing its own
    study ``name-w<k>`` under ``output``. Returns the number of runs."""
    jobs = [{**c, **cell} for cell in cells for c in configs]
    per = math.ceil(len(jobs) / max(workers, 1))
    batches = [(jobs[i:i + per], output, f"{name}-w{k}") for k, i in enumerate(range(0, len(jobs), per))]
    if workers <= 1:
        return sum(_run_batch(b) for b in batches)

    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        return sum(pool.map(_run_batch, batches))
