"""Hyperparameter studies on Ray Tune + Optuna, in three rooms by job.

:mod:`fedtune.tune.study` (defining and driving a study: options, plan, sweep, seed runs, resume) ·
:mod:`fedtune.tune.trial` (one trial in Tune: the trainable, the Arrow callback, loggers, the live
view) · :mod:`fedtune.tune.tuner` (what the ``Tuner`` gets besides the trainable: the Optuna
searcher and storages, Tune's storage, capacity, Tune's environment); below them
:mod:`fedtune.tune.common`, the vocabulary the three share.

Search spaces are :mod:`fedtune.spaces`; reports (tables, report.md, plots) :mod:`fedtune.reports`.
"""

from typing import NoReturn

from fedtune.old_names import old_name_error


def __getattr__(name: str) -> NoReturn:
    """A module this package held before issue 18 (``fedtune.tune.spaces``) raises one line naming its new home."""
    raise old_name_error(__name__, name)
