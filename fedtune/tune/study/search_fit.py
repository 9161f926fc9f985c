"""Which searches of a study share one Ray Tune fit, and the Tuner of a fit: one search's, or
several searches' (:mod:`fedtune.tune.tuner.study_search`).

A study's searches run in one fit when there are several to run and their trials can follow each
other on the same actors: every search not finished and not started alone by an earlier driver,
unless the scheduler is PBT or PB2 (a population is one search: its members exploit each other's
checkpoints). A search an earlier driver started in a fit of its own (``tune/<search>``, before
fits were shared) continues there. The fit of several searches is ``tune/_searches``
(:data:`~fedtune.tune.study.plan.STUDY_FIT`); ``--resume`` restores it whole.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fedtune.results import status
from fedtune.results.atomic import write_error_in
from fedtune.results.optuna_url import shown
from fedtune.results.study_dir import StudyDir
from fedtune.tune.common.active import ACTIVE
from fedtune.tune.common.ray_lost import ray_lost_in
from fedtune.tune.common.state_signatures import check_experiment
from fedtune.tune.study.moved_modules import old_module_names
from fedtune.tune.study.options import POPULATION_SCHEDULERS
from fedtune.tune.study.plan import STUDY_FIT, Search, StudyPlan
from fedtune.tune.study.resume import recover_trial_rows
from fedtune.tune.study.study_start import now
from fedtune.tune.tuner.storage import restorable

__all__ = ["SEEDS_FIT", "ended_early_check", "finish_search", "fit_groups", "fit_stop", "restore_tuner",
           "search_total", "searcher_of", "seed_groups", "seeds_tuner", "study_tuner", "study_write_error"]

SEEDS_FIT = "_seeds"
"""The Tune experiment (``tune/_seeds``) of the ``--seeds`` re-runs of several searches, run in one fit."""


def search_total(num_samples: int, space: Any) -> int:
    """How many trials a search asks for: ``num_samples``, or 1 when its space samples nothing
    (FedAvg under ``--knobs own``: its one configuration, run once)."""
    if not space.switches and not any(p.sampled for p in space.params.values()):
        return 1
    return int(num_samples)


def _groups(plan: StudyPlan, alone: Callable[[Search], bool], shared_fit: str) -> list[list[Search]]:
    """The study's searches in order, as Tune fits: those ``alone`` says run alone are groups of one;
    the others share one fit (``shared_fit``) when there are at least two, or when an earlier
    driver started that fit."""
    shared = [s for s in plan.searches if not alone(s)]
    if len(shared) == 1 and not restorable(plan.tune_location(shared_fit)):
        shared = []
    groups: list[list[Search]] = [[s] for s in plan.searches if s not in shared]
    return groups + [shared] if shared else groups


def fit_groups(plan: StudyPlan, searches_state: dict[str, dict[str, Any]]) -> list[list[Search]]:
    """The study's searches grouped into Tune fits (module docstring): alone a finished search and
    one an earlier driver started alone (every search under PBT/PB2); the others share one fit."""
    if plan.options.scheduler in POPULATION_SCHEDULERS:
        return [[s] for s in plan.searches]
    return _groups(plan, lambda s: (searches_state.get(s.key, {}).get("status") == status.DONE
                                    or restorable(plan.tune_location(s.tune_name))), STUDY_FIT)


def seed_groups(plan: StudyPlan, searches_state: dict[str, dict[str, Any]]) -> list[list[Search]]:
    """The searches' ``--seeds`` re-runs grouped into Tune fits as :func:`fit_groups` groups the
    searches: alone re-runs finished or skipped, or started alone by an earlier driver
    (``tune/<search>--seeds``); the others in one fit (``tune/_seeds``)."""
    return _groups(plan, lambda s: (searches_state.get(f"{s.key} seeds", {}).get("status")
                                    in (status.DONE, status.SKIPPED)
                                    or restorable(plan.tune_location(f"{s.tune_name}--seeds"))), SEEDS_FIT)


def _shared_tuner(study: Any, searchers: list[tuple[str, Any]], fixed: dict[str, Any], scheduler: Any,
                  totals: dict[str, int], fit: str, trial_dirname: Any) -> Any:
    """The Tuner of the fit ``fit`` of several searches: their searchers (key, searcher) behind one
    :class:`~fedtune.tune.tuner.study_search.StudySearcher`, ``totals`` trials in all."""
    # lazy: keeps ray out of this module's import
    from ray import tune

    from fedtune.tune.tuner.study_search import StudySearcher

    plan = study.plan
    searcher = StudySearcher(searchers, fixed, metric=plan.metrics if len(plan.metrics) > 1 else plan.metrics[0],
                             mode=plan.modes if len(plan.modes) > 1 else plan.modes[0])
    return tune.Tuner(
        study.trainable, param_space={},
        tune_config=tune.TuneConfig(search_alg=searcher, scheduler=scheduler, num_samples=sum(totals.values()),
                                    max_concurrent_trials=study.cap, reuse_actors=True,
                                    trial_dirname_creator=trial_dirname),
        run_config=study.run_config(fit, totals))


def seeds_tuner(study: Any, parts: list[tuple[str, list[dict[str, Any]]]], trial_dirname: Any) -> Any:
    """The Tuner of the seed re-runs of several searches (key, configurations) in one fit
    (:class:`~fedtune.tune.tuner.study_search.ListedConfigs` each)."""
    # lazy: keeps ray, pyarrow out of this module's import
    from fedtune.tune.tuner.study_search import ListedConfigs

    return _shared_tuner(study, [(key, ListedConfigs(configs)) for key, configs in parts],
                         {key: {} for key, _ in parts}, None, {key: len(configs) for key, configs in parts},
                         SEEDS_FIT, trial_dirname)


def searcher_of(study: Any, search: Search, space: Any, total: int) -> tuple[Any, Any]:
    """The searcher (:class:`~fedtune.tune.tuner.optuna_search.FedtuneOptunaSearch`) and the Tune
    scheduler of one search of ``study`` (a :class:`fedtune.tune.study.sweep` study)."""
    # lazy: keeps ray, optuna out of this module's import
    from fedtune.tune.tuner.optuna_search import FedtuneOptunaSearch
    from fedtune.tune.tuner.samplers import make_sampler
    from fedtune.tune.tuner.schedulers import make_scheduler

    plan, opts = study.plan, study.opts
    study_name = search.optuna_study(plan.name)
    sampler = make_sampler(opts.sampler, opts.sampler_seed + search.trial_seed, total, concurrency=study.cap)
    searcher = FedtuneOptunaSearch(
        space.optuna_define_by_run, metrics=plan.metrics, modes=plan.modes, rounds=study.rounds(),
        fixed=plan.fixed[search.key], sampler=sampler, study_name=study_name,
        storage=study.storage(), first_point=space.default_point(),
        num_samples=total)
    scheduler = make_scheduler(opts.scheduler, plan.metrics[0], plan.modes[0], study.rounds(), opts.grace_period,
                               opts.reduction_factor, storage=study.storage(),
                               study_name=study_name)
    return searcher, scheduler


def study_tuner(study: Any, searches: list[tuple[Search, Any, int]], trial_dirname: Any) -> Any:
    """The Tuner of a fit of several searches of ``study``: (search, space, trials asked) each, in
    the study's order; their own searchers and, unless FIFO, their own schedulers behind one
    :class:`~fedtune.tune.tuner.study_search.PerSearchScheduler`."""
    # lazy: keeps ray, pyarrow out of this module's import
    from fedtune.tune.tuner.study_search import PerSearchScheduler

    parts = {s.key: searcher_of(study, s, space, total) for s, space, total in searches}
    scheduler = None if study.opts.scheduler == "fifo" else PerSearchScheduler({k: p[1] for k, p in parts.items()})
    return _shared_tuner(study, [(k, p[0]) for k, p in parts.items()], study.plan.fixed, scheduler,
                         {s.key: total for s, _, total in searches}, STUDY_FIT, trial_dirname)


def ended_early_check(study: Any, study_name: str, total: int,
                      ended: dict[str, str | None]) -> Callable[[], bool]:
    """Whether a search whose fit made fewer than ``total`` trials is complete anyway (its searcher
    ended it: :func:`~fedtune.tune.tuner.optuna_search.ended_early`); the reason goes to ``ended["why"]``."""
    # lazy: keeps ray, optuna out of this module's import
    from fedtune.tune.tuner.optuna_search import ended_early

    def complete_anyway() -> bool:
        ended["why"] = ended_early(study.storage(), study_name, total)
        return ended["why"] is not None

    return complete_anyway


def finish_search(study: Any, search: Search, study_name: str, ended: dict[str, str | None]) -> None:
    """After its fit: tell FAIL what a killed driver left open in Optuna, give a trial row to a round
    file no driver finished, mark the search done in study.json (and say why it ended early)."""
    # lazy: keeps ray, optuna out of this module's import
    from fedtune.tune.tuner.optuna_search import EXHAUSTED, optuna_trials, reconcile_optuna

    plan = study.plan
    state = study.search_state(search.key)
    storage = study.storage()
    orphans = reconcile_optuna(storage, study_name)
    study.warnings.extend(recover_trial_rows(plan.study_dir, optuna_trials(storage, study_name), study.console))
    state.update(status=status.DONE, ended_at=now(), orphaned_trials=orphans)
    if ended["why"] and ended["why"].startswith(EXHAUSTED):  # not when earlier drivers ran the rest
        state["ended_early"] = ended["why"]
        study.warnings.append(f"search '{search.key}': {ended['why']}")
        study.console.print(f"[yellow]warning: search '{search.key}': {ended['why']}[/yellow]")
    study.save()


def restore_tuner(study: Any, exp_dir: str, *, param_space: dict[str, Any] | None = None,
                  searches: list[Search] = ()) -> Any:
    """``Tuner.restore`` of ``exp_dir`` for ``study`` (in its study directory, wherever the study was
    created), once every pickle in it is found signed by this user
    (:mod:`~fedtune.tune.common.state_signatures`): Tune takes the experiment's location from
    ``exp_dir``; the Optuna storage unpickles onto this study (``ACTIVE["study_dir"]``); the Arrow
    callback pickled in ``tuner.pkl`` is pointed at this study directory too, so a copied or moved
    study writes only here; a :class:`~fedtune.tune.trial.state_signer.StateSigner` signs what it writes.

    ``param_space``: the fit's first ``param_space`` again (Tune does not keep it: should its restore
    fail, it starts the experiment anew from this, never from an empty one, whose trials would run
    without the study's fixed options). ``searches``: the fit's Optuna searches; a trial their
    searchers already ended (Optuna holds it finished) that Tune's snapshot, older, still holds
    running is not run again (:class:`~fedtune.tune.tuner.schedulers.EndedStayEnded`)."""
    # lazy: keeps ray out of this module's import
    from ray import tune

    from fedtune.results.store import ResultsStore
    # lazy: keeps ray, pyarrow out of this module's import
    from fedtune.tune.trial.callback import ArrowCallback
    from fedtune.tune.trial.population import PopulationRecorder, population_trainable
    from fedtune.tune.tuner.schedulers import EndedStayEnded, ended_in_optuna
    from fedtune.tune.trial.state_signer import StateSigner

    plan = study.plan
    trainable = population_trainable() if study.opts.scheduler in POPULATION_SCHEDULERS else study.trainable
    check_experiment(exp_dir, study=plan.name)  # every pickle signed by this user (or trusted, so signed, at start)
    with old_module_names():  # a study started before a module moved (fedtune.tune.study.moved_modules)
        try:
            tuner = tune.Tuner.restore(str(exp_dir), trainable=trainable, resume_unfinished=True,
                                       resume_errored=False, param_space=param_space)
        except ValueError as exc:  # a study of an older fedtune whose fixed options had other keys
            if param_space is None or "param_space" not in str(exc):
                raise
            tuner = tune.Tuner.restore(str(exp_dir), trainable=trainable, resume_unfinished=True,
                                       resume_errored=False)
    run_config = tuner._local_tuner.get_run_config()  # Ray keeps the callbacks of the first run
    # a study from before fedtune signed its state has no signer among them
    run_config.callbacks = [cb for cb in run_config.callbacks or [] if not isinstance(cb, StateSigner)]
    run_config.callbacks.append(StateSigner())
    for cb in run_config.callbacks or []:
        if isinstance(cb, ArrowCallback):
            cb.store = ResultsStore(plan.study_dir.parent, plan.name)
            cb.study = cb.store.study
        elif isinstance(cb, PopulationRecorder):
            cb.study_dir = str(plan.study_dir)
    ended = ended_in_optuna(study.storage(), [s.optuna_study(plan.name) for s in searches])
    if ended:  # restored with tuner.pkl's scheduler (Tune keeps no newer one), told what Optuna ended since
        tune_config = tuner._local_tuner._tune_config
        tune_config.scheduler = EndedStayEnded(tune_config.scheduler, ended)
    return tuner


def fit_stop(error: BaseException | None, key: str, study_dir: Any, hint: str) -> Exception | None:
    """Why a search's ``Tuner.fit`` (which raised ``error``, or returned: None) stops the study, as
    the one-line error to raise: Ray went away (:class:`~fedtune.tune.common.ray_lost.RayLost`, with
    the search and ``hint``, the resume command), or the Arrow store could not write (a full disk:
    :func:`fedtune.tune.trial.callback.write_failure`, recorded even when the fit returned); else None."""
    lost = ray_lost_in(error) if error is not None else None
    if lost is not None:
        return type(lost)(f"search '{key}': {lost}; continue with: {hint}")
    # lazy: keeps ray, pyarrow out of this module's import
    from fedtune.tune.trial.callback import write_failure

    recorded = write_failure(study_dir, resume_command=hint)
    if recorded is not None or error is None:
        return recorded
    return study_write_error(error, study_dir, hint)  # optuna.db or Tune's own files on a full disk


def study_write_error(error: BaseException, study_dir: Any, hint: str) -> Exception | None:
    """``error`` as the one line of a write the disk refused while a study ran outside the Arrow
    store (:func:`fedtune.results.atomic.write_error_in`: the Optuna database, which SQLite reports
    as "database or disk is full", or a file of Tune's experiment), with what is intact and the
    resume command ``hint``; None for any other error."""
    url = str(ACTIVE.get("optuna_url") or "")
    database = url[len("sqlite:///"):] if url.startswith("sqlite:///") else (shown(url) if url
                                                                            else StudyDir(study_dir).optuna_db)
    err = write_error_in(error, database)
    if err is None:
        return None
    return err.with_context(f"the study stopped; the finished rounds and trials are intact in '{study_dir}'; "
                            f"free space (or make the folder writable), then resume it with: {hint}")
