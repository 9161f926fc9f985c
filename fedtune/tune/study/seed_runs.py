"""``--seeds K``: which configuration of a search is re-run with more seeds, and the trial id of
each re-run (:mod:`fedtune.tune.study.sweep` runs them as one Tune experiment per search).

``--seeds K``: after the searches, the configuration the report selects per
(algorithm, target) (highest metric at its best round) is evaluated with the K seeds
``s, s+1, ..., s+K-1`` (``s`` = the study's ``seed``, default 0). Its search run *is* the
seed-``s`` replicate (a run is deterministic given its seed, so re-running it would reproduce
it exactly); the K-1 others run as one Tune experiment ``tune/<search>--seeds``. The report
then shows mean ± standard error over the K seeds.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from fedtune.config import FederatedRunConfig
from fedtune.errors import ConfigError
from fedtune.results.selection import SCORE, check_protocol, choose_round, select
from fedtune.tune.study.plan import Search

__all__ = ["seed_trial_id", "selected_config", "selected_trial"]


def seed_trial_id(config: Mapping[str, Any]) -> str:
    """The trial id of a re-run's configuration (switches of a search space left out)."""
    from fedtune.spaces.model import strip_switches

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
    from fedtune.reports.stats import NO_DOMAIN

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
