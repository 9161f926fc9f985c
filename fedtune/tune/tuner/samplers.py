"""The Optuna samplers of a sweep (``--sampler``): :func:`make_sampler`, seeded, and TPE's constant
liar. Ray-free, so that what drives Optuna without Ray Tune (the tabular benchmark,
:mod:`fedtune.tune.tabular`) samples exactly as a sweep does."""

from __future__ import annotations

import warnings

import optuna

from fedtune.errors import ConfigError
from fedtune.tune.common.searches import SAMPLERS

__all__ = ["constant_liar", "make_sampler"]


def constant_liar(sampler: str, concurrency: int | None) -> bool:
    """Whether the ``sampler`` of a search whose trials run ``concurrency`` at a time (None: as
    many as the cluster fits, maybe more than one) uses TPE's constant liar: only TPE has one,
    and it is on exactly when trials may run side by side.

    >>> constant_liar("tpe", 4), constant_liar("tpe", None), constant_liar("tpe", 1), constant_liar("random", 4)
    (True, True, False, False)
    """
    return sampler == "tpe" and (concurrency is None or concurrency > 1)


def make_sampler(name: str, seed: int, num_samples: int, concurrency: int | None = None):
    """A seeded Optuna sampler: ``tpe`` (default), ``random``, ``cmaes``, ``nsga2``, ``gp`` (Optuna's
    Gaussian-process Bayesian optimisation, ``GPSampler``: one or several objectives; it imports
    torch in the driver) or ``qmc`` (scrambled Sobol quasi-random points, ``QMCSampler``: a
    space-filling replacement for ``random``).

    TPE and GP start modelling after ``max(1, min(10, num_samples // 3))`` random trials (Optuna's
    fixed 10 would make every small study random); NSGA-II's population is
    ``max(2, min(50, num_samples // 2))`` for the same reason. With trials running side by side
    (``concurrency`` > 1, or None: not capped), TPE uses Optuna's constant liar: a trial still
    running counts as a bad result, so the trials asked meanwhile spread out instead of all
    sampling the same region (:func:`constant_liar`); one at a time it is off (Optuna 5's
    default is on, so it is always passed).

    >>> s = make_sampler("tpe", 0, 9, concurrency=2)
    >>> type(s).__name__, s._constant_liar, make_sampler("tpe", 0, 9, concurrency=1)._constant_liar
    ('TPESampler', True, False)
    """
    if name == "tpe":
        with warnings.catch_warnings():  # multivariate/group are "experimental" (stable since Optuna 2.x)
            warnings.simplefilter("ignore", category=optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.TPESampler(seed=seed, n_startup_trials=max(1, min(10, num_samples // 3)),
                                              multivariate=True, group=True,
                                              constant_liar=constant_liar(name, concurrency))
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False,
                                            n_startup_trials=max(1, min(10, num_samples // 3)))
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=max(2, min(50, num_samples // 2)))
    # GP and QMC model the relative search space; a conditional parameter (a space's ``when``) is
    # drawn by their independent (random) sampler, as Optuna does, without a warning per trial
    if name == "gp":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", category=optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.GPSampler(seed=seed, n_startup_trials=max(1, min(10, num_samples // 3)),
                                             warn_independent_sampling=False)
    if name == "qmc":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", category=optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.QMCSampler(qmc_type="sobol", scramble=True, seed=seed,
                                              warn_independent_sampling=False, warn_asynchronous_seeding=False)
    raise ConfigError(f"option '--sampler': '{name}' is not allowed; allowed: {', '.join(SAMPLERS)}")
