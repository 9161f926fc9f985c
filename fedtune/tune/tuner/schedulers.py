"""The trial schedulers of a sweep (``--scheduler``): Ray Tune's FIFO and ASHA, and Optuna's
HyperBand pruner driving Tune (:class:`OptunaPruning`).

``hyperband`` is Li et al.'s HyperBand as Optuna implements it (``optuna.pruners.HyperbandPruner``:
several successive-halving brackets with different first rungs, each trial assigned to one by
its number). Optuna's pruner works one trial at a time (a trial is compared with the earlier
trials of its bracket at each rung it reaches), which suits a study that runs its trials one or
two at a time, unlike Ray Tune's synchronous ``HyperBandScheduler``, which pauses a bracket's
trials until all of them reach the rung and so stops nothing when trials run one at a time. With
the TPE sampler it is Optuna's BOHB-like recipe (model-based proposals in HyperBand's budgets).
Its state is the Optuna study itself (rung values are trial attributes in the storage), so a
resumed study prunes exactly as an unbroken one would (tests/slow/tune/test_asha_resume.py), where Tune's
ASHA starts its rungs empty (docs/sweep.md, Resume).

Written here because no maintained library drives an Optuna pruner from a Ray Tune scheduler:
Ray's own Optuna integration (``OptunaSearch``) leaves pruning to Tune's schedulers.
"""

from __future__ import annotations

import random
import warnings
from typing import Any

from ray.tune.experiment import Trial
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, PopulationBasedTraining, TrialScheduler

from fedtune.errors import ConfigError
from fedtune.results.selection import is_finite
from fedtune.tune.trial.callback import trial_warning


def make_scheduler(name: str, metric: str, mode: str, rounds: int, grace_period: int = 1,
                   reduction_factor: float = 2.0, *, storage: Any = None, study_name: str | None = None):
    """Tune's trial scheduler: ``fifo`` (every trial runs all its rounds), ``asha``
    (AsyncHyperBand on the round, rungs at ``grace_period * reduction_factor**k``) or
    ``hyperband`` (:class:`OptunaPruning` with Optuna's ``HyperbandPruner``: its smallest
    budget ``grace_period`` rounds, its largest ``rounds``, ``reduction_factor`` an integer ≥ 2;
    needs the search's Optuna ``storage`` and ``study_name``)."""
    if name == "fifo":
        return FIFOScheduler()
    if name == "hyperband":
        import optuna  # lazy: keeps optuna out of this module's import

        if float(reduction_factor) != int(reduction_factor) or int(reduction_factor) < 2:
            raise ConfigError(f"option '--reduction-factor': {reduction_factor} with --scheduler hyperband; allowed: "
                              "an integer >= 2 (Optuna's HyperbandPruner)")
        pruner = optuna.pruners.HyperbandPruner(min_resource=min(int(grace_period), int(rounds)),
                                                max_resource=int(rounds), reduction_factor=int(reduction_factor))
        return OptunaPruning(pruner, metric=metric, mode=mode, storage=storage, study_name=study_name)
    return ASHAScheduler(time_attr="training_iteration", metric=metric, mode=mode, max_t=rounds,
                         grace_period=min(grace_period, rounds), reduction_factor=reduction_factor)


class OptunaPruning(FIFOScheduler):
    """A Ray Tune scheduler that stops a trial when the Optuna study's ``pruner`` says so.

    At every result of a trial it finds the trial's Optuna trial (user attribute
    ``tune_trial_id``, set by :class:`~fedtune.tune.tuner.optuna_search.FedtuneOptunaSearch`), gives
    the pruner that trial with this round's value of ``metric`` as its latest intermediate value
    (the searcher records the same value), and answers STOP when it would prune, else CONTINUE.
    The searcher then tells Optuna PRUNED, as for ASHA's stops. Trials are otherwise run FIFO."""

    def __init__(self, pruner: Any, *, metric: str, mode: str, storage: Any, study_name: str | None):
        super().__init__()
        self.pruner, self.pruned_metric, self.pruned_mode = pruner, metric, mode
        self.storage, self.study_name = storage, study_name
        self._study: Any = None
        self._numbers: dict[str, int] = {}

    def set_search_properties(self, metric: str | None, mode: str | None, **spec: Any) -> bool:
        return True  # the metric and mode are the search's own, given at construction

    def _trial_of(self, tune_trial_id: str) -> Any:
        import optuna  # lazy: keeps optuna out of this module's import

        if self._study is None:
            self._study = optuna.load_study(study_name=self.study_name, storage=self.storage)
        number = self._numbers.get(tune_trial_id)
        if number is None:
            for t in self._study.get_trials(deepcopy=False):
                if t.user_attrs.get("tune_trial_id") == tune_trial_id:
                    number = self._numbers[tune_trial_id] = t.number
        return None if number is None else self._study._storage.get_trial(
            self._study._storage.get_trial_id_from_study_id_trial_number(self._study._study_id, number))

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict) -> str:
        from optuna.trial import TrialState  # lazy: keeps optuna out of this module's import

        value, step = result.get(self.pruned_metric), result.get("round", result.get("training_iteration"))
        if not is_finite(value) or step is None:
            return self.CONTINUE
        frozen = self._trial_of(trial.trial_id)
        if frozen is None or frozen.state != TrialState.RUNNING:
            return self.CONTINUE
        frozen.intermediate_values = {**frozen.intermediate_values, int(step): float(value)}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            prune = self.pruner.prune(self._study, frozen)
        return self.STOP if prune else self.CONTINUE

    def __getstate__(self) -> dict[str, Any]:  # pickled in Tune's experiment: no open study
        return {**self.__dict__, "_study": None}


class EndedStayEnded(TrialScheduler):
    """The scheduler of a restored fit (``scheduler``; None: FIFO) that never runs again a trial its
    searcher already ended: ``ended`` maps such Tune trial ids to what Optuna recorded.

    Tune's experiment snapshot is taken every few seconds, the searcher's record (Optuna) at once:
    a driver killed between the two leaves a trial that Optuna holds finished (PRUNED by HyperBand
    or ASHA at a rung, COMPLETE, FAIL) while the snapshot still holds it running. ``Tuner.restore``
    would run it again, to its last round, and the two stores would disagree (Optuna: pruned at round
    2; ``trials.parquet``: completed after 4). A pruned trial stays pruned, as in a study that was
    never broken: before each scheduling decision, such a trial still pending is stopped without
    running (Tune's ``stop_trial``: the searcher, already told, ignores it; the Arrow callback
    writes nothing for a trial with no new round, so its row and rounds stay what they were), and
    a warning names it. Every other call goes to ``scheduler``."""

    def __init__(self, scheduler: Any, ended: dict[str, str]):
        super().__init__()
        self.inner = scheduler if scheduler is not None else FIFOScheduler()
        self.ended = dict(ended)

    @property
    def metric(self) -> Any:
        return self.inner.metric

    @property
    def supports_buffered_results(self) -> bool:
        return self.inner.supports_buffered_results

    def set_search_properties(self, metric: str | None, mode: str | None, **spec: Any) -> bool:
        return self.inner.set_search_properties(metric, mode, **spec)

    def on_trial_add(self, tune_controller: Any, trial: Any) -> None:
        self.inner.on_trial_add(tune_controller, trial)

    def on_trial_error(self, tune_controller: Any, trial: Any) -> None:
        self.inner.on_trial_error(tune_controller, trial)

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict) -> str:
        return self.inner.on_trial_result(tune_controller, trial, result)

    def on_trial_complete(self, tune_controller: Any, trial: Any, result: dict) -> None:
        self.inner.on_trial_complete(tune_controller, trial, result)

    def on_trial_remove(self, tune_controller: Any, trial: Any) -> None:
        self.inner.on_trial_remove(tune_controller, trial)

    def choose_trial_to_run(self, tune_controller: Any) -> Any:
        if self.ended:
            for trial in list(tune_controller.get_trials()):
                said = self.ended.pop(trial.trial_id, None) if trial.status == Trial.PENDING else None
                if said is not None:
                    tune_controller.stop_trial(trial)
                    trial_warning(f"Tune trial {trial.trial_id} ({said}) ended before the last driver stopped, "
                                  "after Tune's last snapshot: it is not run again (its rounds and row stay as "
                                  "they were)")
        return self.inner.choose_trial_to_run(tune_controller)

    def debug_string(self) -> str:
        return self.inner.debug_string()

    def save(self, checkpoint_path: str) -> None:
        self.inner.save(checkpoint_path)

    def restore(self, checkpoint_path: str) -> None:
        self.inner.restore(checkpoint_path)


def ended_in_optuna(storage: Any, study_names: list[str]) -> dict[str, str]:
    """Tune trial id -> what Optuna recorded (``fedtune trial <id>: PRUNED at round 2``), for every
    trial of the Optuna studies ``study_names`` that Optuna holds finished (none for a study not
    created yet)."""
    # lazy: keeps optuna out of this module's import
    import optuna
    from optuna.trial import TrialState

    out: dict[str, str] = {}
    for name in study_names:
        try:
            study = optuna.load_study(study_name=name, storage=storage)
        except KeyError:
            continue
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)):
            tune_id = t.user_attrs.get("tune_trial_id")
            if tune_id:
                steps = f" at round {max(t.intermediate_values)}" if t.intermediate_values else ""
                out[str(tune_id)] = f"fedtune trial {t.user_attrs.get('fedtune_trial_id')}: {t.state.name}{steps}"
    return out


def _numeric(p: Any) -> bool:
    """A range, or a categorical of numbers (``local_momentum``'s choices), not of names or flags."""
    if p.distribution != "categorical":
        return True
    return all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in p.choices)


class ClipToSpace:
    """PBT's ``custom_explore_fn``: Ray's explore multiplies a number by 0.8 or 1.2, which may leave
    the space's range (a momentum above 1, a learning rate past the searched one): each numeric
    knob is clipped back into ``[low, high]`` (integers rounded). A class, so Tune pickles it."""

    def __init__(self, bounds: dict[str, tuple[float, float, bool]]):
        self.bounds = dict(bounds)

    def __call__(self, config: dict[str, Any]) -> dict[str, Any]:
        for name, (low, high, integer) in self.bounds.items():
            if name in config and isinstance(config[name], (int, float)) and not isinstance(config[name], bool):
                value = min(max(config[name], low), high)
                config[name] = int(round(value)) if integer else float(value)
        return config


def make_population_scheduler(name: str, metric: str, mode: str, interval: int, space: Any, seed: int) -> Any:
    """Ray Tune's ``PopulationBasedTraining`` (``pbt``) or ``PB2`` (``pb2``, GP-bandit explore; GPy)
    over the search space's unconditional sampled *numeric* parameters, every ``interval`` rounds
    (Tune's ``training_iteration``). A choice of structure (``server_optimizer``, a variant) is never
    mutated: an exploiting member takes the donor's with the donor's checkpoint, whose server
    optimiser state only a run of the same optimiser can load; its conditional knobs follow it. PBT mutates each as its space samples it (a categorical by shifting
    to a neighbouring choice, a range by x0.8 / x1.2 or a fresh draw, clipped: :class:`ClipToSpace`);
    PB2 explores the float ranges only (its GP models a box; the other knobs keep their first
    draw). Python's ``random``, which both draw from, is seeded with ``seed``."""
    random.seed(seed)
    mutable = [p for p in space.params.values() if p.sampled and not p.when and _numeric(p)]
    clip = ClipToSpace({p.name: (float(p.low), float(p.high), p.distribution == "int") for p in mutable
                        if p.distribution in ("uniform", "loguniform", "int")})
    if name == "pb2":
        from ray.tune.schedulers.pb2 import PB2  # lazy: keeps scipy out of this module's import

        bounds = {p.name: [float(p.low), float(p.high)] for p in mutable if p.distribution in ("uniform", "loguniform")}
        if not bounds:
            raise ConfigError(f"option '--scheduler': pb2 explores float ranges and space {space.source} samples "
                              "none; allowed: pbt")
        # PB2's GP proposes in float32: a range's end may come back as 0.20000000298 (clipped)
        return PB2(time_attr="training_iteration", metric=metric, mode=mode, perturbation_interval=interval,
                   hyperparam_bounds=bounds, custom_explore_fn=clip)
    mutations = {p.name: list(p.choices) if p.distribution == "categorical" else p.ray_domain() for p in mutable}
    if not mutations:
        raise ConfigError(f"option '--scheduler': pbt mutates sampled parameters and space {space.source} samples "
                          "none; allowed: fifo")
    return PopulationBasedTraining(time_attr="training_iteration", metric=metric, mode=mode,
                                   perturbation_interval=interval, hyperparam_mutations=mutations,
                                   custom_explore_fn=clip)


__all__ = ["ClipToSpace", "EndedStayEnded", "OptunaPruning", "ended_in_optuna", "make_population_scheduler",
           "make_scheduler"]
