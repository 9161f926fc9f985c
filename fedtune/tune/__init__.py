"""Hyperparameter studies on Ray Tune + Optuna: the trainable, the results callback, the sweep.

``trainable`` (one run = one Tune trial) · ``callback`` (the Arrow store's single writer) ·
``plan`` (sweep options and searches, checked before Ray starts) · ``optuna_search`` (the Optuna
searcher and storage) · ``progress`` (the live view) · ``sweep`` (runs a study; ``resume``,
``tune_env``, ``active`` help it) · ``seed_runs`` (``--seeds``).

Search spaces are :mod:`fedtune.spaces`; reports (tables, report.md, plots) :mod:`fedtune.reports`.
"""

from typing import NoReturn

from fedtune.old_names import old_name_error


def __getattr__(name: str) -> NoReturn:
    """A module this package held before issue 18 (``fedtune.tune.spaces``) raises one line naming its new home."""
    raise old_name_error(__name__, name)
