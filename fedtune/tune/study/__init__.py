"""Defining and driving a study: what ``fedtune sweep`` does, from its options to its resume.

``options`` (every sweep flag) · ``plan`` (the study's searches, checked before Ray starts; no Ray
or Optuna imports) · ``default_study`` (the no-argument study) · ``study_start`` (what a new study
writes first) · ``sweep`` (runs the searches and seed runs of a study) · ``search_fit`` (which searches share one
Tune fit, and its Tuner) · ``background`` (the report drawn while Ray shuts down) · ``seed_runs`` (``--seeds``)
· ``resume`` (reading a study back; ``--resume``'s rules) · ``moved_modules`` (old module paths
while an old study is unpickled) · ``driver_lock`` (one driver per study). The vocabulary it shares
with the rooms inside Ray Tune is :mod:`fedtune.tune.common`.
"""

from typing import NoReturn

from fedtune.old_names import old_name_error


def __getattr__(name: str) -> NoReturn:
    """A module this package held before issue 46 (``fedtune.tune.study.active``) raises one line naming its new home."""
    raise old_name_error(__name__, name)
