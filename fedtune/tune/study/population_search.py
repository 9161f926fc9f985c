"""The ``Tuner`` of a PBT/PB2 search (``fedtune sweep --scheduler pbt|pb2``): split from
:mod:`fedtune.tune.study.sweep`, which builds every other search's with the Optuna searcher. The
members, their records and the scheduler are :mod:`fedtune.tune.trial.population` and
:func:`fedtune.tune.tuner.schedulers.make_population_scheduler`; docs/sweep.md says what a
population search does."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["population_space", "population_tuner"]


def population_space(opts: Any, plan: Any, search: Any, space: Any, rounds: int) -> dict[str, Any]:
    """The ``param_space`` of a PBT/PB2 search's fit: its space's Tune domains, the search's fixed
    options, and a checkpoint at every perturbation interval (given again on ``--resume``)."""
    return {**space.tune_space(), **plan.fixed[search.key], "checkpoint_every": opts.population_interval(rounds)}


def population_tuner(opts: Any, plan: Any, search: Any, space: Any, total: int, study_name: str, *, rounds: int,
                     cap: int | None, run_config: Any, trial_dirname: Callable[[Any], str]) -> Any:
    """The search's ``total`` members drawn at random from ``space`` (Tune's
    ``BasicVariantGenerator``, seeded by the sweep's sampler seed and the search's trial seed), all
    running side by side where the cluster holds them (``cap``), ``opts.scheduler`` exploiting and
    exploring every ``--perturbation-interval`` rounds, each member checkpointed at that interval and
    written into the Optuna study ``study_name`` (created here if new) when it ends. ``opts``,
    ``plan``, ``search``: the sweep's :class:`~fedtune.tune.study.options.SweepOptions`,
    :class:`~fedtune.tune.study.plan.StudyPlan` and :class:`~fedtune.tune.study.plan.Search`."""
    # lazy: keeps optuna, numpy out of this module's import
    import optuna
    from ray import tune
    from ray.tune.search import BasicVariantGenerator

    from fedtune.tune.trial.population import PopulationRecorder, population_trainable
    from fedtune.tune.tuner.optuna_search import optuna_storage
    from fedtune.tune.tuner.schedulers import make_population_scheduler

    metric, mode = plan.metrics[0], plan.modes[0]
    interval, seed = opts.population_interval(rounds), opts.sampler_seed + search.trial_seed
    storage = optuna_storage(plan.study_dir, url=plan.optuna_url)
    optuna.create_study(study_name=study_name, storage=storage, load_if_exists=True,
                        direction="maximize" if mode == "max" else "minimize")
    run_config.callbacks.append(PopulationRecorder(storage, study_name, space, metric, mode, str(plan.study_dir)))
    return tune.Tuner(
        population_trainable(),
        param_space=population_space(opts, plan, search, space, rounds),
        tune_config=tune.TuneConfig(
            search_alg=BasicVariantGenerator(random_state=seed),
            scheduler=make_population_scheduler(opts.scheduler, metric, mode, interval, space, seed),
            num_samples=total, max_concurrent_trials=cap, reuse_actors=True, trial_dirname_creator=trial_dirname),
        run_config=run_config)
