"""``--seeds K``: which configuration of a search is re-run with more seeds, the trial id of each
re-run, and the Tune fits that run them (:func:`run_seeds`).

``--seeds K``: after the searches, the configuration the report selects per
(algorithm, target) (highest metric at its best round) is evaluated with the K seeds
``s, s+1, ..., s+K-1`` (``s`` = the study's ``seed``, default 0). Its search run *is* the
seed-``s`` replicate (a run is deterministic given its seed, so re-running it would reproduce
it exactly); the K-1 others run after the searches, those of every search in one Tune experiment
``tune/_seeds`` (the actors of the first re-run serve them all;
:func:`fedtune.tune.study.search_fit.seed_groups`), or ``tune/<search>--seeds`` for a study of one
search and re-runs an earlier version started alone. The report then shows mean ± standard error
over the K seeds.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from fedtune.config import FederatedRunConfig
from fedtune.errors import ConfigError
from fedtune.results import status
from fedtune.results.selection import SCORE, check_protocol, choose_round, select
from fedtune.spaces.model import strip_switches
from fedtune.tune.study.plan import Search, seeds_for
from fedtune.tune.study.search_fit import SEEDS_FIT, restore_tuner, seeds_tuner
from fedtune.tune.study.study_start import now
from fedtune.tune.tuner.storage import restorable

__all__ = ["run_seeds", "seed_trial_id", "selected_config", "selected_trial"]


def seed_trial_id(config: Mapping[str, Any]) -> str:
    """The trial id of a re-run's configuration (switches of a search space left out)."""
    return FederatedRunConfig.from_dict(strip_switches(dict(config))).trial_id()


def _last(rows: list[Mapping[str, Any]], column: str) -> Any:
    """The last value of ``column`` that is not None in ``rows``, or None."""
    return next((r[column] for r in reversed(rows) if r.get(column) is not None), None)


def selected_trial(rounds: Iterable[Mapping[str, Any]], search: Search, seed: int, selection: str) -> str | None:
    """The trial ``fedtune report`` selects for ``search`` among its seed-``seed`` trials, from the
    study's round rows; None when none has a finite score.

    Each trial reports the round :func:`~fedtune.results.selection.choose_round` gives (its rows in
    round order); :func:`~fedtune.results.selection.select` picks the highest score there (ties:
    the first trial id). A search without a target takes its first target domain in sorted order
    (``all`` when its trials have none), as the report's table does.

    >>> s = Search("fedavg", None, "fedavg.yaml")
    >>> rows = [{"trial_id": t, "round": r, "algorithm": "fedavg", "seed": 0, "val_acc": v}
    ...         for t, r, v in (("b", 1, 0.5), ("b", 2, 0.7), ("a", 1, 0.7), ("c", 1, float("nan")))]
    >>> selected_trial(rows, s, 0, "val"), selected_trial(rows, s, 1, "val")
    ('a', None)
    """
    from fedtune.reports.stats import NO_DOMAIN  # lazy: keeps pyarrow, pandas out of this module's import

    check_protocol(selection)
    by_trial: dict[Any, list[Mapping[str, Any]]] = {}
    for row in rounds:
        if row.get("trial_id") is not None:
            by_trial.setdefault(row["trial_id"], []).append(row)
    candidates: dict[str, list[tuple[str, float]]] = {}  # target domain -> (trial id, score)
    for trial_id, rows in by_trial.items():
        rows = sorted(rows, key=lambda r: (r.get("round") is None, r.get("round") or 0))  # stable, no round last
        trial_seed, target = _last(rows, "seed"), _last(rows, "target_domain")
        if _last(rows, "algorithm") != search.algorithm or trial_seed is None or trial_seed != seed:
            continue
        domain = NO_DOMAIN if target is None else str(target)
        if search.target is not None and domain != str(search.target):
            continue
        choice = choose_round(rows, selection)
        if choice.round is not None:
            candidates.setdefault(domain, []).append((trial_id, choice.score))
    return select(candidates[min(candidates)]) if candidates else None


def selected_config(study_dir: Path, search: Search, seed: int, selection: str) -> dict[str, Any]:
    """The configuration the report selects for ``search`` among its seed-``seed`` trials
    (:func:`selected_trial`), with its trial id, from ``trials.parquet``."""
    # lazy: keeps pyarrow out of this module's import
    from fedtune.results.store import check_study_dir, load

    check_study_dir(study_dir)
    check_protocol(selection)
    columns = ["trial_id", "round", "algorithm", "target_domain", "seed", "status", "target_acc", SCORE[selection]]
    trial_id = selected_trial(load(study_dir).select(columns).to_pylist(), search, seed, selection)
    if trial_id is None:
        raise ConfigError(f"--seeds: search '{search.key}' has no trial with a finite "
                          f"{SCORE[selection]} to select; nothing to re-run")
    trial_id = str(trial_id)
    trials = load(study_dir, "trials").to_pandas()
    row = trials[trials["trial_id"] == trial_id]
    if row.empty or not isinstance(row.iloc[-1].get("config_json"), str):
        raise ConfigError(f"--seeds: selected trial {trial_id} has no configuration in trials.parquet")
    config = json.loads(row.iloc[-1]["config_json"])
    params = config.pop("params", {}) or {}
    keep = {k: v for k, v in config.items() if k not in ("output", "name")}
    keep.update(params)
    return {"trial_id": trial_id, "config": keep}


# ------------------------------------------------------------------------------------------------
# Running the re-runs (a study's driver: fedtune.tune.study.sweep)
def run_seeds(study: Any, group: list[Search], trial_dirname: Any) -> None:
    """The ``--seeds`` re-runs of a group of :func:`~fedtune.tune.study.search_fit.seed_groups`: one
    search's in a fit of its own, several searches' in one fit; each search's entry
    ``"<search> seeds"`` in study.json is marked done with its trial ids."""
    if len(group) == 1:
        _run_alone(study, group[0], trial_dirname)
    else:
        _run_shared(study, group, trial_dirname)


def _seed_configs(study: Any, search: Search) -> list[dict[str, Any]] | None:
    """The ``--seeds`` re-runs of ``search``'s selected configuration (recorded in study.json), or
    None when it has none (every trial failed: skipped with a warning, the others go on)."""
    key = f"{search.key} seeds"
    state = study.search_state(key)
    seeds = seeds_for(study.plan.base_seed, study.opts.seeds)
    try:
        chosen = selected_config(study.plan.study_dir, search, study.plan.base_seed, study.opts.protocol())
    except ConfigError as exc:
        state.update(status=status.SKIPPED, reason=str(exc))
        study.warnings.append(str(exc))
        study.view.row(key, len(seeds) - 1)["state"] = "skipped"
        study.console.print(f"[yellow]warning: {exc}[/yellow]")
        study.save()
        return None
    state.update(selected_trial=chosen["trial_id"], seeds=seeds, config=chosen["config"],
                 algorithm=search.algorithm, target_domain=search.target)
    return [{**chosen["config"], "output": study.plan.fixed[search.key]["output"], "name": study.plan.name,
             "seed": s} for s in seeds[1:]]


def _seeds_done(study: Any, search: Search) -> None:
    state = study.search_state(f"{search.key} seeds")
    state.update(status=status.DONE, ended_at=now(),
                 trial_ids=[state.get("selected_trial")] + [seed_trial_id({**state["config"], "seed": s})
                                                           for s in state["seeds"][1:]])
    study.save()


def _run_alone(study: Any, search: Search, trial_dirname: Any) -> None:
    """One search's ``--seeds`` re-runs in a Tune fit of their own (``tune/<search>--seeds``)."""
    from ray import tune  # lazy: keeps ray out of this module's import

    key, total = f"{search.key} seeds", study.opts.seeds - 1
    state = study.search_state(key)
    if state.get("status") in (status.DONE, status.SKIPPED):
        study.view.row(key, total)["state"] = f"{state['status']} (earlier run)"
        return
    name = f"{search.tune_name}--seeds"
    exp_dir = study.plan.tune_location(name)
    if restorable(exp_dir):
        space = None  # the fit's first param_space, as built below (Tune keeps only its keys)
        if isinstance(state.get("config"), dict) and state.get("seeds"):
            space = {**state["config"], "output": study.plan.fixed[search.key]["output"], "name": study.plan.name,
                     "seed": tune.grid_search(list(state["seeds"][1:]))}
        tuner = restore_tuner(study, exp_dir, param_space=space)
    else:
        configs = _seed_configs(study, search)
        if configs is None:
            return
        config = {**configs[0], "seed": tune.grid_search([c["seed"] for c in configs])}
        tuner = tune.Tuner(
            study.trainable, param_space=config,
            tune_config=tune.TuneConfig(num_samples=1, max_concurrent_trials=study.cap, reuse_actors=True,
                                        trial_dirname_creator=trial_dirname),
            run_config=study.run_config(name, {key: total}))
    study.fit_searches(tuner, name, [(key, total, None)])
    _seeds_done(study, search)


def _run_shared(study: Any, searches: list[Search], trial_dirname: Any) -> None:
    """Several searches' ``--seeds`` re-runs in one Tune fit (``tune/_seeds``; restored when an
    earlier driver started it): the actors of the first re-run serve them all."""
    exp_dir = study.plan.tune_location(SEEDS_FIT)
    if restorable(exp_dir):
        tuner, ran = restore_tuner(study, exp_dir, param_space={}), searches
    else:
        parts = [(s, _seed_configs(study, s)) for s in searches]
        ran = [s for s, configs in parts if configs is not None]
        if not ran:
            return
        tuner = seeds_tuner(study, [(f"{s.key} seeds", configs) for s, configs in parts if configs is not None],
                            trial_dirname)
    study.fit_searches(tuner, SEEDS_FIT, [(f"{s.key} seeds", study.opts.seeds - 1, None) for s in ran])
    for s in ran:
        _seeds_done(study, s)

