"""The sweep this driver process is running: its live view, its study directory, and what each
search's Tune loop saw of its trials.

Module state on purpose: Tune pickles its callbacks (:class:`fedtune.tune.trial.progress.SweepProgress`)
and the searcher's Optuna storage (:class:`fedtune.tune.tuner.optuna_search.FedtuneRDBStorage` or
``FedtuneJournalStorage``) into the experiment and unpickles them on resume; they find the view,
the study directory and the study's Optuna storage URL of the process they run in here. One Tune loop runs at a time.

>>> "view" in ACTIVE, isinstance(SESSIONS, dict)
(True, True)
"""

from __future__ import annotations

from typing import Any

__all__ = ["ACTIVE", "SESSIONS"]

ACTIVE: dict[str, Any] = {"view": None}
"""``view``: the live view (:class:`fedtune.tune.trial.progress.LiveView`) or None (its state column is
also written by :class:`fedtune.tune.trial.scale_up.ScaleUpWatch`); ``study_dir``: the study directory
being run; ``optuna_url``: that study's Optuna storage URL (``--optuna-storage``, else the ``sqlite:///``
URL of its ``optuna.db``; :attr:`fedtune.tune.study.plan.StudyPlan.optuna_url`). ``study_dir`` and
``optuna_url`` are set only while a study runs: the Optuna storage unpickled from Tune's
experiment reopens on them (:func:`fedtune.tune.tuner.optuna_search.optuna_storage`); ``warnings``:
what trials said while it ran (:func:`fedtune.tune.trial.callback.trial_warning`), for the sweep's warnings."""

SESSIONS: dict[str, dict[str, Any]] = {}
"""Per search key, what this driver session saw: trials ``started``, ``ended``, ``errored``, their
final ``statuses`` and ``num_trials`` (:func:`fedtune.tune.trial.progress.interrupted` reads it)."""
