"""Tuning strategies run against the tabular benchmark: fedtune's samplers and schedulers, in seconds.

A strategy is a sampler and a scheduler, as ``fedtune sweep --sampler S --scheduler P`` picks
them: ``random`` draws the grid's configurations in a seeded random order without repeats (what
random search over a grid is: Optuna's ``GridSampler``, whose end-of-grid stop needs
``study.optimize``; here each is enqueued), ``tpe`` / ``gp`` / ``qmc`` are the sweep's own
samplers (:func:`fedtune.tune.tuner.samplers.make_sampler`, each knob a categorical over the grid's
values, as tabular benchmarks present them); ``hyperband`` is the sweep's scheduler (Optuna's
``HyperbandPruner`` with the sweep's ``grace_period`` and ``reduction_factor``), ``asha`` Optuna's
``SuccessiveHalvingPruner`` (the same asynchronous successive halving as the sweep's Ray Tune
``ASHAScheduler``, run one trial at a time here), ``fifo`` runs every trial to the end.

:func:`simulate` runs one strategy in one cell one trial at a time: each trial's configuration is
answered from the table round by round (each round costs its participants: the compute unit is a
client-round), its validation accuracy reported to the pruner, and after each trial the strategy's
current choice is recorded: the trial whose rounds score highest under honest selection
(:func:`fedtune.results.selection.choose_round`, ``val`` by default) and its reported target
accuracy. Written here because the libraries' tabular benchmarks (FedHPO-Bench, HPOBench) hold
their own tables and strategies; this one answers from fedtune's records with fedtune's samplers.
"""

from __future__ import annotations

import math
import numbers
import warnings
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from fedtune.bounds import Bounds
from fedtune.errors import ConfigError, shown
from fedtune.results import selection
from fedtune.tune.common.searches import SAMPLERS
from fedtune.tune.tabular.table import Cell, TabularBenchmark

__all__ = ["STRATEGIES", "Point", "Strategy", "simulate"]

SCHEDULERS = ("fifo", "asha", "hyperband")
"""The schedulers a strategy runs one trial at a time (:func:`_pruner`: Optuna's pruners)."""


def _checked(where: str, value: Any, bounds: Bounds, *, integer: bool = False) -> Any:
    """``value`` when it is a number (an integer with ``integer``) within ``bounds``, else one ConfigError line."""
    kind = numbers.Integral if integer else numbers.Real
    if isinstance(value, bool) or not isinstance(value, kind):
        raise ConfigError(f"{where}: {shown(value, 60)} is not {'an integer' if integer else 'a number'}; "
                          f"allowed: {bounds.text()}")
    return bounds.check(where, value if integer else float(value))


@dataclass(frozen=True)
class Strategy:
    """A sampler (``random``: the grid in random order; or a ``--sampler`` name) and a scheduler
    (``fifo``, ``asha``, ``hyperband``) with the sweep's ``grace_period`` and ``reduction_factor``
    (integers: Optuna's pruners'); another value is one ConfigError line."""

    name: str
    sampler: str
    scheduler: str = "fifo"
    grace_period: int = 1
    reduction_factor: int = 3

    def __post_init__(self) -> None:
        where = f"strategy {shown(self.name, 40)}"
        Bounds(choices=SAMPLERS).check(f"{where}: sampler", self.sampler)
        Bounds(choices=SCHEDULERS).check(f"{where}: scheduler", self.scheduler)
        _checked(f"{where}: grace_period", self.grace_period, Bounds(lo=1), integer=True)
        _checked(f"{where}: reduction_factor", self.reduction_factor, Bounds(lo=2), integer=True)


STRATEGIES: dict[str, Strategy] = {s.name: s for s in (
    Strategy("random", "random"),
    Strategy("random+asha", "random", "asha"),
    Strategy("random+hyperband", "random", "hyperband"),
    Strategy("tpe", "tpe"),
    Strategy("tpe+asha", "tpe", "asha"),
    Strategy("tpe+hyperband", "tpe", "hyperband"),
)}
"""The strategies ``benchmarks/tabular_hpo.py`` compares (any other :class:`Strategy` works too)."""


class Point(NamedTuple):
    """The strategy's state after a trial: compute spent so far (client-rounds), trials run, and
    its current choice's score and reported target accuracy (NaN before any finite score)."""

    compute: int
    trials: int
    score: float
    target_acc: float


def _pruner(strategy: Strategy, rounds: int) -> Any:
    import optuna  # lazy: keeps optuna out of this module's import

    if strategy.scheduler == "fifo":
        return optuna.pruners.NopPruner()
    grace = min(int(strategy.grace_period), rounds)
    if strategy.scheduler == "asha":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=grace, reduction_factor=strategy.reduction_factor)
    if strategy.scheduler == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=grace, max_resource=rounds,
                                              reduction_factor=strategy.reduction_factor)
    raise ConfigError(f"strategy {strategy.name}: scheduler {strategy.scheduler!r}; allowed: {', '.join(SCHEDULERS)}")


def simulate(bench: TabularBenchmark, algorithm: str, cell: Cell, strategy: Strategy, seed: int, *,
             budget: float = 1.0, protocol: str = "val", max_trials: int | None = None,
             grid_cost: float | None = None) -> list[Point]:
    """Run ``strategy`` (seeded ``seed``) on ``algorithm``'s grid in ``cell`` until it has spent
    ``budget`` times the grid's compute (a trial started below the budget runs to its end or its
    pruning), or ``max_trials`` (default: 4 x the grid; ``random`` stops when the grid is done).
    ``grid_cost``: the compute ``budget`` is a share of, when ``bench`` holds runs of another
    fidelity than the grid's (multi-fidelity over clients: the grid run at full participation
    costs more than the same configurations run along the rungs). Returns one :class:`Point` per trial.
    An algorithm or cell the table has no run of, a protocol it cannot answer, a budget, grid cost,
    trial cap or seed out of range: one ConfigError line."""
    # lazy: keeps optuna out of this module's import
    import optuna
    from optuna.trial import TrialState

    from fedtune.tune.tuner.samplers import make_sampler

    bench.check(algorithm, cell, protocol)
    _checked("simulate: budget", budget, Bounds(lo=0.0, lo_open=True, note="a share of the grid's compute"))
    if grid_cost is not None:
        _checked("simulate: grid_cost", grid_cost, Bounds(lo=0.0, lo_open=True, note="client-rounds"))
    if max_trials is not None:
        _checked("simulate: max_trials", max_trials, Bounds(lo=1), integer=True)
    _checked("simulate: seed", seed, Bounds(lo=0), integer=True)
    axes = bench.axes(algorithm)
    grid = bench.configs(algorithm)
    size = len(grid)
    rounds = bench.rounds(algorithm, cell)
    limit = budget * (bench.cost(algorithm, cell) if grid_cost is None else grid_cost)
    if strategy.sampler == "random":
        sampler = optuna.samplers.RandomSampler(seed=seed)  # never asked: every trial is enqueued below
        cap = size
    else:
        sampler = make_sampler(strategy.sampler, seed, size, concurrency=1)
        cap = 4 * size
    cap = cap if max_trials is None else min(cap, max_trials)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # GridSampler's and the pruners' experimental notices
        # a fixed name: HyperbandPruner assigns brackets by a hash of the study name and trial number
        study = optuna.create_study(study_name=f"tabular-{strategy.name}-{seed}", direction="maximize",
                                    sampler=sampler, pruner=_pruner(strategy, rounds))
    if strategy.sampler == "random":  # the grid in a seeded random order, each configuration once

        for i in np.random.default_rng([int(seed), 0x7AB]).permutation(len(grid)):
            study.enqueue_trial(_params(grid[int(i)]))
    points: list[Point] = []
    spent, best_score, best_target = 0, -math.inf, math.nan
    while spent < limit and len(points) < cap:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trial = study.ask()
            config = _suggest(trial, axes)
        ran: list[dict[str, Any]] = []
        pruned = False
        for row in bench.answer(algorithm, cell, config):
            spent += row["num_participants"]
            ran.append(row)
            val = row.get(selection.SCORE[protocol])
            if selection.is_finite(val):
                trial.report(float(val), row["round"])
                if trial.should_prune():
                    pruned = True
                    break
        choice = selection.choose_round(ran, protocol)
        if pruned or not math.isfinite(choice.score):
            study.tell(trial, state=TrialState.PRUNED)
        else:
            study.tell(trial, choice.score)
        if math.isfinite(choice.score) and choice.score > best_score:
            best_score, best_target = choice.score, choice.target_acc
        points.append(Point(spent, len(points) + 1, best_score if math.isfinite(best_score) else math.nan, best_target))
    return points


def _suggest(trial: Any, axes: dict[str, list[Any]]) -> dict[str, Any]:
    """A configuration from ``trial``: each knob a categorical over the grid's values; in a pooled
    space (:meth:`TabularBenchmark.axes`) the algorithm first, then only its own knobs."""
    if "algorithm" not in axes:
        return {k: trial.suggest_categorical(k, v) for k, v in axes.items()}
    algorithm = trial.suggest_categorical("algorithm", axes["algorithm"])
    prefix = f"{algorithm}."
    return {"algorithm": algorithm, **{k[len(prefix):]: trial.suggest_categorical(k, v)
                                       for k, v in axes.items() if k.startswith(prefix)}}


def _params(config: dict[str, Any]) -> dict[str, Any]:
    """The suggestion names of a configuration (:func:`_suggest`'s), to enqueue it."""
    if "algorithm" not in config:
        return dict(config)
    algorithm = config["algorithm"]
    return {"algorithm": algorithm, **{f"{algorithm}.{k}": v for k, v in config.items() if k != "algorithm"}}


def at_budget(points: list[Point], compute: float) -> Point | None:
    """The strategy's state with at most ``compute`` spent (None: no trial ended by then)."""
    done = [p for p in points if p.compute <= compute]
    return done[-1] if done else None
