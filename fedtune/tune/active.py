"""The sweep this driver process is running: its live view, its study directory, and what each
search's Tune loop saw of its trials.

Module state on purpose: Tune pickles its callbacks (:class:`fedtune.tune.progress.SweepProgress`)
and the searcher's Optuna storage (:class:`fedtune.tune.optuna_search.FedtuneRDBStorage`) into the
experiment and unpickles them on resume; they find the view and the study directory of the
process they run in here. One Tune loop runs at a time.

>>> "view" in ACTIVE, isinstance(SESSIONS, dict)
(True, True)
"""

from __future__ import annotations

from typing import Any

__all__ = ["ACTIVE", "SESSIONS"]

ACTIVE: dict[str, Any] = {"view": None}
"""``view``: the live view (:class:`fedtune.tune.progress.LiveView`) or None; ``study_dir``: the
study directory being run (set only while a study runs)."""

SESSIONS: dict[str, dict[str, Any]] = {}
"""Per search key, what this driver session saw: trials ``started``, ``ended``, ``errored``, their
final ``statuses`` and ``num_trials`` (:func:`fedtune.tune.progress.interrupted` reads it)."""
