"""A study's searches as the code inside Ray Tune sees them: which search a trial belongs to, where
the study's Optuna studies live, the samplers a search may use, and the view of a study the live
table reads. No Ray, no Optuna.

>>> search_of({SEARCH_FIELD: "fedprox@ts1", "prox_mu": 0.1}), search_of({"prox_mu": 0.1}, "fedavg")
('fedprox@ts1', 'fedavg')
>>> optuna_storage_url("/tmp/x/s")
'sqlite:////tmp/x/s/optuna.db'
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from fedtune.results.study_dir import StudyDir

__all__ = ["SAMPLERS", "SEARCH_FIELD", "StudyView", "optuna_storage_url", "search_of"]

SAMPLERS = ("tpe", "random", "cmaes", "nsga2", "gp", "qmc")
"""``--sampler``'s values: the Optuna sampler of each search (:func:`fedtune.tune.tuner.samplers.make_sampler`)."""

SEARCH_FIELD = "fedtune_search"
"""The key of a trial's config that names its search when several searches share one Tune fit
(:mod:`fedtune.tune.tuner.study_search`); not a field of a run (the trainable drops it)."""


def search_of(trial: Any, default: str | None = None) -> str | None:
    """The search key of a Tune trial (or of a trial's config dict) that ran in a fit of several
    searches, else ``default``."""
    config = trial if isinstance(trial, Mapping) else getattr(trial, "config", None) or {}
    return config.get(SEARCH_FIELD, default)


def optuna_storage_url(study_dir: str | os.PathLike[str]) -> str:
    """The SQLite URL of a study's ``optuna.db`` (absolute)."""
    return f"sqlite:///{StudyDir(Path(study_dir).resolve()).optuna_db}"


class SelectionOptions(Protocol):
    """What the live table reads of a study's options (:class:`fedtune.tune.study.options.SweepOptions`)."""

    def protocol(self) -> str: ...


class StudyView(Protocol):
    """What the live table (:class:`fedtune.tune.trial.progress.LiveView`) reads of a study
    (:class:`fedtune.tune.study.plan.StudyPlan`): its name, its metrics and its selection protocol."""

    @property
    def name(self) -> str: ...

    @property
    def metrics(self) -> list[str]: ...

    @property
    def options(self) -> SelectionOptions: ...
