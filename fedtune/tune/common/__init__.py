"""The study's vocabulary, below the code that uses it: what a study, its trials and what fedtune
hands Ray Tune's ``Tuner`` all speak of.

:mod:`fedtune.tune.study` (which drives a study) and :mod:`fedtune.tune.trial` /
:mod:`fedtune.tune.tuner` (which run inside Ray Tune) import these; the rooms inside Tune never
import :mod:`fedtune.tune.study`, and this package imports none of the three.

``searches`` (a trial's search in a shared fit, the study's Optuna URL, the samplers' names, the
view of a study the live table reads) · ``active`` (the sweep this process runs) · ``ray_lost``
(Ray gone mid-sweep) · ``state_signatures`` (Ray Tune's pickles and CMA-ES's optimizer signed,
checked before ``--resume``).
"""
