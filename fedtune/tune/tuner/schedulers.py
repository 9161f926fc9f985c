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
resumed study prunes exactly as an unbroken one would (tests/test_asha_resume.py), where Tune's
ASHA starts its rungs empty (docs/sweep.md, Resume).

Written here because no maintained library drives an Optuna pruner from a Ray Tune scheduler:
Ray's own Optuna integration (``OptunaSearch``) leaves pruning to Tune's schedulers.
"""

from __future__ import annotations

import warnings
from typing import Any

from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

from fedtune.errors import ConfigError


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
        import optuna

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
        import optuna

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
        from optuna.trial import TrialState

        from fedtune.results.selection import is_finite

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


__all__ = ["OptunaPruning", "make_scheduler"]
