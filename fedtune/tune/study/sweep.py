"""``fedtune sweep``: hyperparameter studies on Ray Tune + Optuna, with resume and seeds.

A *study* (``--name``) lives in ``OUTPUT/<study>/`` (every file name: :mod:`fedtune.results.study_dir`)::

    study.json              options, selection (val|target-val|oracle), algorithms, targets, searches, seed runs
    spaces/<algorithm>.yaml the study's own copy of its search spaces (what ``--resume`` reads)
    optuna.db               SQLite; one Optuna study per search, named "<study>/<search key>"
                            (with --optuna-storage URL: in that storage instead, same names)
    tune/_searches/         Ray Tune's experiment of the study's searches (what ``--resume`` restores;
                            tune/<search>/ for a study of one search, PBT/PB2: :mod:`~fedtune.tune.study.search_fit`)
    rounds/<trial>.parquet  every (trial, round), written by ArrowCallback (the single writer)
    trials.parquet          one row per finished trial
    report.md, plots/       ``fedtune report``'s output, refreshed at the end of the sweep

This module runs a study; the rooms it uses: :mod:`fedtune.tune.study.plan` (options, searches, the
objective, the cluster-capacity check: everything checked before Ray starts),
:mod:`fedtune.tune.tuner.optuna_search` (the searcher, its storage, samplers, schedulers),
:mod:`fedtune.tune.trial.progress` (the live view and its Tune callback), :mod:`fedtune.tune.tuner.env`
(Tune's environment and logs) and :mod:`fedtune.cli` (the ``sweep`` command line).

**Resume.** ``--resume`` reads ``study.json`` and continues: searches marked done are skipped;
a started fit is ``Tuner.restore``-d from ``tune/...`` (unfinished trials continue from
their last readable Tune checkpoint, ``--set checkpoint_every=N``, else from round 1; a trial
Optuna already holds finished is not run again; the Arrow callback keeps each (trial, round)
once; an unreadable snapshot is set aside first); one never started begins. The searcher (with its
Optuna storage) comes back from Tune's experiment snapshot, taken every
:data:`fedtune.tune.tuner.env.EXPERIMENT_SNAPSHOT_S` seconds; trials asked from Optuna after the
last snapshot of a killed driver are left RUNNING in optuna.db and are told FAIL
(``fedtune_status: orphaned``) when the search ends, so Optuna finally holds every trial in a
finished state.
Ray restores Tune's own settings (``--verbose`` included) from the first run.
Without ``--name``, a new study is named ``sweep-<UTC time>`` and ``--resume`` continues the
most recently started study in OUTPUT. A study directory that already holds a study is never
overwritten: pass ``--resume`` or another ``--name``.

**Seeds.** ``--seeds K``: :mod:`fedtune.tune.study.seed_runs`.

**Resources.** Ray is joined at ``--address`` or started like ``fedtune run`` (explicit
``num_cpus``, no dashboard). A trial reserves what :func:`fedtune.tune.trial.trainable.resources_for`
says (by default as many client actors as the cluster fits, so trials run one at a time;
``--set max_client_actors=1`` lets more run side by side). ``--max-concurrent`` above what
the cluster can place is capped, with a warning naming the numbers
(:func:`fedtune.tune.tuner.capacity.concurrency_cap`).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedtune.config import FederatedRunConfig
from fedtune.errors import ConfigError
from fedtune.results import status
from fedtune.results.atomic import ResultsWriteError
from fedtune.results.store import check_output_dir, clean_stray_temp_files
from fedtune.results.study_dir import STUDY_FILE, TUNE_DIR, check_name, check_path_text, latest_study, write_study
from fedtune.runtime.cluster import cluster_address, cluster_view, connect_ray
from fedtune.runtime.signals import sigterm_as_interrupt
from fedtune.spaces.lookup import load_space
from fedtune.spaces.model import strip_switches
from fedtune.tune.common.active import ACTIVE as _ACTIVE, SESSIONS as _SESSIONS
from fedtune.tune.common.state_signatures import state_key
from fedtune.tune.study.background import Background
from fedtune.tune.study.default_study import apply_default_study, is_default_study
from fedtune.tune.study.driver_lock import study_driver
from fedtune.tune.study.moved_modules import old_module_names
from fedtune.tune.study.options import POPULATION_SCHEDULERS, SweepOptions
from fedtune.tune.study.plan import STUDY_FIT, Search, StudyPlan, abs_path, plan_study
from fedtune.tune.study.population_search import population_space, population_tuner
from fedtune.tune.study.resume import (check_optuna_storage, check_study_experiments, rebuild_trial_rows,
                                       repair_round_files, resumed_study, set_aside_unreadable_snapshots)
from fedtune.tune.study.search_fit import (ended_early_check, finish_search, fit_groups, fit_stop, restore_tuner,
                                           search_total, searcher_of, seed_groups, study_tuner, study_write_error)
from fedtune.tune.study.seed_runs import run_seeds
from fedtune.tune.study.study_start import command_line, new_study_data, now, relative, say_knobs, snapshot_spaces
from fedtune.tune.tuner.capacity import concurrency_cap
from fedtune.tune.tuner.env import signal_handlers_kept, tune_env
from fedtune.tune.tuner.storage import restorable

__all__ = ["StudyInterrupted", "SweepResult", "run_sweep", "trial_dirname"]


class StudyInterrupted(RuntimeError):
    """The study stopped before its end (Ctrl-C: Ray Tune saved its state); ``--resume`` continues it."""


@dataclass
class SweepResult:
    """What :func:`run_sweep` did: the study, its searches' states, the report (if made)."""

    study_dir: Path
    name: str
    searches: dict[str, dict[str, Any]]
    report: Any = None
    report_path: Path | None = None
    elapsed_s: float = 0.0
    warnings: list[str] = field(default_factory=list)


class _Study:
    """One sweep invocation: the plan, the study file, Ray, the view; runs every phase."""

    def __init__(self, plan: StudyPlan, data: dict[str, Any], console: Any, trainable: Any = None):
        from fedtune.tune.trial.progress import LiveView  # lazy: keeps ray out of this module's import

        self.plan = plan
        self.data = data
        self.console = console
        self.opts = plan.options
        self.trainable = trainable
        self.warnings: list[str] = []
        self.view = LiveView(plan, console, live=not self.opts.verbose)
        self.cap: int | None = None
        self._storage: Any = None

    def save(self) -> None:
        self.data["updated_at"] = now()
        write_study(self.plan.study_dir, self.data)

    def storage(self) -> Any:
        """The study's Optuna storage, opened once per driver (each open costs ~0.1 s) and shared by
        every search's searcher, scheduler and bookkeeping."""
        if self._storage is None:
            # lazy: keeps ray, optuna out of this module's import
            from fedtune.tune.tuner.optuna_search import optuna_storage

            self._storage = optuna_storage(self.plan.study_dir, url=self.plan.optuna_url)
        return self._storage

    def search_state(self, key: str) -> dict[str, Any]:
        return self.data.setdefault("searches", {}).setdefault(key, {"status": status.PENDING})

    # -- phases ----------------------------------------------------------------------------------
    def run(self) -> None:
        if self.trainable is None:
            # lazy: keeps ray out of this module's import
            from fedtune.tune.trial.trainable import fedtune_trainable

            self.trainable = fedtune_trainable()
        cluster = cluster_view(fresh=True)  # alive nodes and those the autoscaler may add
        try:
            self.cap, warning = concurrency_cap(list(self._probe_configs()), self.opts.max_concurrent,
                                                cluster.total, cluster.nodes)
        except ConfigError as exc:  # no node (alive or launchable) can ever hold a trial
            if cluster.autoscaler is None:
                raise
            raise ConfigError(f"{exc} (the cluster: {cluster.describe()})") from None
        if warning:
            self.warnings.append(warning)
            self.console.print(f"[yellow]warning: {warning}[/yellow]")
        self.data["max_concurrent"] = self.cap
        # lazy: keeps optuna out of this module's import
        from fedtune.tune.tuner.samplers import constant_liar

        self.data["constant_liar"] = constant_liar(self.opts.sampler, self.cap)  # TPE with trials side by side
        self.save()
        _ACTIVE["view"] = self.view
        _ACTIVE["autoscaler"] = cluster.autoscaler is not None  # what ScaleUpWatch may speak of
        # Tune's saved experiment (tuner.pkl, searcher state) holds the Optuna storage pickled where
        # the study was created; while this study runs, it unpickles onto this study directory.
        _ACTIVE["study_dir"] = self.plan.study_dir
        _ACTIVE["optuna_url"] = self.plan.optuna_url  # and onto this study's Optuna storage
        self.view.start()
        try:
            with tune_env(self.opts.verbose):
                for group in fit_groups(self.plan, self.data.get("searches", {})):
                    if len(group) == 1:
                        self.run_search(group[0])
                    else:
                        self.run_searches(group)
                if self.opts.seeds > 1:
                    for group in seed_groups(self.plan, self.data.get("searches", {})):
                        run_seeds(self, group, trial_dirname)
        finally:
            self.view.stop()
            self.warnings.extend(_ACTIVE.pop("warnings", []))  # the trials' (fedtune.tune.trial.callback.trial_warning)
            _ACTIVE["view"] = None
            _ACTIVE.pop("autoscaler", None)
            _ACTIVE.pop("study_dir", None)
            _ACTIVE.pop("optuna_url", None)

    def _probe_configs(self) -> Iterator[dict[str, Any]]:
        for s in self.plan.searches:
            yield {**self.plan.fixed[s.key], **strip_switches(load_space(s.space).defaults())}

    def run_config(self, name: str, totals: dict[str, int]):
        """Tune's RunConfig of the fit ``name`` of the searches ``totals`` (key -> trials asked)."""
        # lazy: keeps ray out of this module's import
        from ray import tune

        from fedtune.tune.trial.callback import ArrowCallback
        from fedtune.tune.trial.progress import SweepProgress
        from fedtune.tune.trial.scale_up import ScaleUpWatch
        from fedtune.tune.trial.state_signer import StateSigner

        key = next(iter(totals))
        progress = SweepProgress(key, self.rounds(), self.plan.metrics[0], self.plan.modes[0], totals[key],
                                 totals=totals)
        return tune.RunConfig(
            name=name, storage_path=self.plan.tune_storage,
            callbacks=[ArrowCallback(str(self.plan.study_dir.parent), self.plan.name,
                                     objective=(list(self.plan.metrics), list(self.plan.modes))), progress,
                       ScaleUpWatch(key, self.opts.scale_up_timeout_s),
                       *self._loggers(key), StateSigner()],
            verbose=1 if self.opts.verbose else 0, log_to_file=False,
            failure_config=tune.FailureConfig(max_failures=self.opts.max_failures),
            checkpoint_config=tune.CheckpointConfig(checkpoint_at_end=False))

    def _loggers(self, key: str) -> list[Any]:
        """``--logger``'s Tune callbacks (:mod:`fedtune.tune.trial.loggers`)."""
        if not self.opts.loggers:
            return []
        # lazy: keeps ray out of this module's import
        from fedtune.tune.trial.loggers import logger_callbacks

        return logger_callbacks(self.opts.loggers, self.plan.study_dir, self.plan.name, key)

    def rounds(self) -> int:
        return int(next(iter(self.plan.fixed.values())).get("rounds") or FederatedRunConfig().rounds)

    def fit_searches(self, tuner: Any, tune_name: str, parts: list[tuple[str, int, Callable[[], bool] | None]]) -> None:
        """Run ``tuner``, the fit ``tune_name`` of the searches ``parts`` (key, trials asked, and
        ``complete_anyway``); it is an interruption when it left a trial unfinished or made fewer
        than a search's trials, unless only the count is short and that search's
        ``complete_anyway()`` says its searcher finished it (its budget was spent before this
        driver, or the space is exhausted)."""
        # lazy: keeps ray out of this module's import
        from fedtune.tune.trial.progress import interrupted

        rows = []
        for i, (key, total, _) in enumerate(parts):
            state = self.search_state(key)
            # relative to the study dir, unless --storage-path puts Tune elsewhere
            state.update(status=status.RUNNING, tune_dir=self.plan.tune_location(tune_name) if self.opts.storage_path
                         else f"{TUNE_DIR}/{tune_name}")
            state.setdefault("started_at", now())  # the first driver's start of this search's Tune fit
            _SESSIONS.pop(key, None)
            row = self.view.row(key, total)
            row["state"] = "starting" if i == 0 else "waiting"
            rows.append(row)
        self.save()
        hint = f"fedtune sweep --resume --name {self.plan.name} --output {self.plan.study_dir.parent}"
        error: Exception | None = None
        try:
            with signal_handlers_kept(), old_module_names():  # the searcher's saved state unpickles here
                tuner.fit()
        except Exception as exc:  # noqa: BLE001 - re-raised below unless it is a reason to stop the study
            error = exc
        stop = fit_stop(error, parts[0][0], self.plan.study_dir, hint)
        if error is not None and stop is None:
            raise error
        for key, total, complete_anyway in parts:
            session = _SESSIONS.get(key, {})
            if stop is None and interrupted(session, total) and not (
                    complete_anyway is not None and not interrupted(session, 0) and complete_anyway()):
                stop = StudyInterrupted(f"study '{self.plan.name}' was interrupted during search '{key}'; continue "
                                        f"it with: {hint}")
        if stop is not None:
            for (key, _, _), row in zip(parts, rows):
                row["state"] = self.search_state(key)["status"] = status.INTERRUPTED
            try:
                self.save()
            except ResultsWriteError:
                pass  # study.json may not fit on a full disk either
            raise stop from None
        for row in rows:
            row["state"] = status.DONE

    def _begin_search(self, search: Search) -> tuple[Any, int, str]:
        """A search about to run: its space, trials asked and Optuna study, recorded in study.json."""
        space = load_space(search.space)
        total = search_total(self.opts.num_samples, space)
        study_name = search.optuna_study(self.plan.name)
        self.search_state(search.key).update(optuna_study=study_name, algorithm=search.algorithm,
                                             target_domain=search.target,
                                             space=relative(self.plan.study_dir, search.space))
        return space, total, study_name

    def run_search(self, search: Search) -> None:
        """One search in a Tune fit of its own (restored when an earlier driver started it)."""
        from ray import tune  # lazy: keeps ray out of this module's import

        if self.search_state(search.key).get("status") == status.DONE:
            total = search_total(self.opts.num_samples, load_space(search.space))
            self.view.row(search.key, total)["state"] = "done (earlier run)"
            return
        space, total, study_name = self._begin_search(search)
        exp_dir = self.plan.tune_location(search.tune_name)
        population = self.opts.scheduler in POPULATION_SCHEDULERS
        if restorable(exp_dir):
            tuner = restore_tuner(self, exp_dir, searches=[] if population else [search],
                                  param_space=population_space(self.opts, self.plan, search, space, self.rounds())
                                  if population else dict(self.plan.fixed[search.key]))
        elif population:
            tuner = population_tuner(self.opts, self.plan, search, space, total, study_name, rounds=self.rounds(),
                                     cap=self.cap, run_config=self.run_config(search.tune_name, {search.key: total}),
                                     trial_dirname=trial_dirname)
        else:
            searcher, scheduler = searcher_of(self, search, space, total)
            tuner = tune.Tuner(
                self.trainable, param_space=dict(self.plan.fixed[search.key]),
                tune_config=tune.TuneConfig(search_alg=searcher, scheduler=scheduler, num_samples=total,
                                            max_concurrent_trials=self.cap, reuse_actors=True,
                                            trial_dirname_creator=trial_dirname),
                run_config=self.run_config(search.tune_name, {search.key: total}))
        ended: dict[str, str | None] = {"why": None}
        self.fit_searches(tuner, search.tune_name, [(search.key, total, ended_early_check(self, study_name, total, ended))])
        finish_search(self, search, study_name, ended)

    def run_searches(self, searches: list[Search]) -> None:
        """Several searches in one Tune fit (:mod:`fedtune.tune.study.search_fit`; restored when an
        earlier driver started it), each finished in the study's order after it."""
        begun = [(s, *self._begin_search(s)) for s in searches]
        exp_dir = self.plan.tune_location(STUDY_FIT)
        tuner = (restore_tuner(self, exp_dir, param_space={}, searches=searches) if restorable(exp_dir)
                 else study_tuner(self, [(s, space, total) for s, space, total, _ in begun], trial_dirname))
        ended = {s.key: {"why": None} for s in searches}
        self.fit_searches(tuner, STUDY_FIT, [(s.key, total, ended_early_check(self, name, total, ended[s.key]))
                                     for s, _, total, name in begun])
        for s, _, _, name in begun:
            finish_search(self, s, name, ended[s.key])


def trial_dirname(trial: Any) -> str:
    """Tune's folder of a trial: its Tune id (Tune's default lists the whole config)."""
    return f"trial_{trial.trial_id}"


# ------------------------------------------------------------------------------------------------
def run_sweep(opts: SweepOptions, *, resume: bool = False, console: Any = None, trainable: Any = None,
              on_ray: Callable[[], None] | None = None, trust_study_files: bool = False) -> SweepResult:
    """Run (or, with ``resume``, continue) the study ``opts`` describes; see the module docstring.

    Validates everything before Ray starts; starts a local Ray (or joins ``opts.address``)
    unless Ray is already initialised, and shuts down only a Ray it started. ``trainable``
    replaces :func:`fedtune.tune.trial.trainable.fedtune_trainable` (tests). Raises ConfigError on bad
    input and :class:`StudyInterrupted` when the study was interrupted (``--resume`` continues it).
    ``resume`` refuses Ray Tune state this user's key did not sign unless ``trust_study_files``
    (``--trust-study-files``: :mod:`fedtune.tune.common.state_signatures`).
    """
    from rich.console import Console  # lazy: keeps rich out of this module's import

    console = console or Console()
    t0 = time.time()
    if opts.output is not None:  # NUL, a name too long: one line before any path is resolved
        check_path_text(opts.output, "option '--output'")
    output = Path(abs_path(opts.output) or "fedtune_results")

    if resume:
        name = opts.name or latest_study(output)
        if name is None:
            raise ConfigError(f"--resume: no sweep study in '{output}' (no */{STUDY_FILE}); start one without --resume")
        study_dir = output / check_name(name, "option '--name'")
        opts = copy.copy(opts)
        opts.name = name
    else:
        if is_default_study(opts):
            opts = apply_default_study(opts)
        plan = plan_study(opts)
        study_dir, name = plan.study_dir, plan.name
    check_output_dir(output, "option '--output'", study=name)  # a folder that refuses writes: before anything
    try:
        # One driver per study, refused at once otherwise; taken before study.json is read or written.
        with study_driver(study_dir, command_line(), create=not resume):
            data = None
            if resume:
                plan, data = resumed_study(opts, output)
            return _start_or_continue(opts, plan, data, output, console=console, trainable=trainable, on_ray=on_ray,
                                      t0=t0, trust=trust_study_files)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM outside Tune's graceful stop (Ray's start, between searches, report)
        if not (study_dir / STUDY_FILE).is_file():
            raise StudyInterrupted(f"study '{name}' was interrupted before it started; nothing ran") from None
        raise StudyInterrupted(f"study '{name}' was interrupted; continue it with: fedtune sweep --resume "
                               f"--name {name} --output {output}") from None
    except Exception as exc:  # a full disk under optuna.db or Tune's files between fits: one line, not theirs

        err = None if isinstance(exc, ResultsWriteError) else study_write_error(
            exc, study_dir, f"fedtune sweep --resume --name {name} --output {output}")
        if err is None:
            raise
        raise err from None


def _start_or_continue(opts: SweepOptions, plan: StudyPlan, data: dict[str, Any] | None, output: Path, *,
                       console: Any, trainable: Any, on_ray: Callable[[], None] | None, t0: float,
                       trust: bool = False) -> SweepResult:

    resume = data is not None
    state_key()  # the signing key, made or refused in one line before anything runs
    if "wandb" in plan.options.loggers:  # what W&B would refuse later, in a logging actor: now, in one line
        # lazy: keeps ray out of this module's import
        from fedtune.tune.trial.loggers import check_wandb

        check_wandb(plan.name)
    set_aside: list[str] = []
    _ACTIVE["trust_study_files"] = trust  # the CMA-ES state in the Optuna storage (the searchers check it)
    _ACTIVE["cma_checked"] = {}
    if data is not None:
        # An unreadable snapshot (a full disk cut it) can run nothing: set aside first, by name only;
        # then Ray Tune's pickles are checked before anything could unpickle them (before Ray starts)
        set_aside = set_aside_unreadable_snapshots(plan, console)
        check_study_experiments(plan.tune_storage, study=plan.name, trust=trust)
        check_optuna_storage(plan, data)
        data.setdefault("resumed_at", []).append(now())
    else:
        if (plan.study_dir / STUDY_FILE).exists() or (plan.study_dir / TUNE_DIR).exists():
            raise ConfigError(f"option '--name': study '{plan.name}' already exists in '{output}'; continue it "
                              f"with --resume --name {plan.name}, or choose another --name")
        opts, plan = snapshot_spaces(opts, plan)
        data = new_study_data(opts, plan, output)
        if opts.knobs == "own":
            say_knobs(console, data["knobs"])
    return _drive(opts, plan, data, resume=resume, console=console, trainable=trainable, on_ray=on_ray, t0=t0,
                  set_aside=set_aside)


def _drive(opts: SweepOptions, plan: StudyPlan, data: dict[str, Any], *, resume: bool, console: Any,
           trainable: Any, on_ray: Callable[[], None] | None, t0: float, set_aside: list[str] = ()) -> SweepResult:
    """The study's phases once its driver lock is held: Ray, the searches and seed runs, the report
    (``set_aside``: the lines of the unreadable snapshots a resume set aside, said with its warnings)."""
    import ray  # lazy: keeps ray out of this module's import

    base_cfg = FederatedRunConfig.from_dict(dict(plan.fixed[plan.searches[0].key]),
                                            source="study").replace(address=opts.address)
    if plan.options.optuna_storage:  # a shared storage that cannot be opened fails before Ray starts
        # lazy: keeps ray, optuna out of this module's import
        from fedtune.tune.tuner.optuna_search import check_storage_opens

        check_storage_opens(plan.options.optuna_storage)
    # SIGTERM (kill, a batch scheduler's stop) does what Ctrl-C does in every phase: Tune's graceful
    # stop while a search runs, else an interrupt; either way exit 130 and the --resume line.
    # ray.init installs its own SIGTERM handler (sys.exit): re-installed after it, kept through the report.
    with sigterm_as_interrupt():
        started_ray = connect_ray(base_cfg, verbose=opts.verbose)
        # a local Ray started for this study: no other job on it (fedtune.tune.trial.scale_up)
        _ACTIVE["own_ray"] = started_ray and cluster_address(base_cfg.address) is None
        with sigterm_as_interrupt():
            study = _Study(plan, data, console, trainable)
            report: Background | None = None
            try:
                if on_ray is not None:
                    on_ray()
                if resume:
                    removed = clean_stray_temp_files(plan.study_dir)
                    if removed:
                        study.warnings.append(f"removed {len(removed)} temporary file(s) a stopped driver left: "
                                              + ", ".join(p.name for p in removed))
                    study.warnings.extend(repair_round_files(plan.study_dir, console))
                    study.warnings.extend(set_aside)
                    study.warnings.extend(rebuild_trial_rows(plan, data, console))
                study.run()
                data["completed_at"] = now()
                write_study(plan.study_dir, data)
                if opts.report:  # drawn while Ray shuts down (it waits for its processes: ~1.5 s)
                    # lazy: keeps pandas out of this module's import
                    from fedtune.reports.report import make_report

                    report = Background(make_report, plan.study_dir, name="fedtune-report")
            finally:
                _ACTIVE.pop("own_ray", None)
                if started_ray:
                    ray.shutdown()
    with sigterm_as_interrupt():  # again: ray.shutdown puts SIGTERM back to the default (die at once)
        result = SweepResult(plan.study_dir, plan.name, dict(data.get("searches", {})),
                             elapsed_s=time.time() - t0, warnings=study.warnings)
        if report is not None:
            result.report = report.result()
            result.report_path = result.report.markdown_path
    return result

