"""Several searches of one study in one Ray Tune fit: :class:`StudySearcher` and :class:`PerSearchScheduler`.

Each search of a study keeps its own searcher (its Optuna study, sampler, budget and
bookkeeping: :class:`~fedtune.tune.tuner.optuna_search.FedtuneOptunaSearch`) and its own
scheduler; what changes is that they share one Tune fit, so Tune's actor reuse carries the
trainable actor, the coordinator and the client actors from the last trial of one search to the
first trial of the next (the same resources: Tune hands a finished trial's actor only to a trial
that asks for equal bundles). Before this, every search was its own fit and started those
processes again: about 3 s per search on 2 cores, 25 of the first command's 55 s.

Ray Tune takes one searcher and one scheduler per fit and has no composite of either, hence
these two small routers. A trial's search is written into its config under
:data:`~fedtune.tune.common.searches.SEARCH_FIELD` (``fedtune_search``: the search key), so every
callback, the scheduler and a restored experiment find it from the trial alone; the trainable
drops it (:func:`fedtune.tune.trial.trainable.trial_run_config`).

Order: the searches are asked in the study's order. A search is asked until it says it is
finished (its budget of trials asked, or its space exhausted), then the next; a search that
cannot propose now (``None``) holds the ones after it back, so with one trial at a time the
trials run exactly in the order separate fits ran them, each search asked and told exactly what
it was before. With several trials side by side the next search starts while the last trials
of the one before still run (its sampler never sees the other search's trials).
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping, Sequence
from typing import Any

from ray.tune.schedulers import FIFOScheduler, TrialScheduler
from ray.tune.search import Searcher

from fedtune.tune.common.searches import SEARCH_FIELD, search_of

__all__ = ["ListedConfigs", "PerSearchScheduler", "StudySearcher"]


class StudySearcher(Searcher):
    """Ray Tune searcher over several searches (key -> searcher, in the study's order); see the
    module docstring. ``fixed``: each search's constant trial configuration (what a fit of one
    search takes as its ``param_space``), merged under the search's proposal."""

    def __init__(self, searches: Sequence[tuple[str, Searcher]], fixed: Mapping[str, Mapping[str, Any]],
                 metric: str | list[str], mode: str | list[str]):
        if not searches:
            raise ValueError("StudySearcher needs at least one search")
        super().__init__(metric=metric, mode=mode)
        self.fedtune_searches: dict[str, Searcher] = dict(searches)
        self.fedtune_fixed = {k: dict(fixed[k]) for k in self.fedtune_searches}
        self.fedtune_owner: dict[str, str] = {}  # Tune trial id -> search key
        self.fedtune_finished: list[str] = []

    @property
    def keys(self) -> list[str]:
        return list(self.fedtune_searches)

    def set_search_properties(self, metric: str | None, mode: str | None, config: dict, **spec: Any) -> bool:
        return True  # every search's space, metric and mode are its own, given at construction

    def suggest(self, trial_id: str) -> dict | str | None:
        for key, searcher in self.fedtune_searches.items():
            if key in self.fedtune_finished:
                continue
            proposal = searcher.suggest(trial_id)
            if proposal == Searcher.FINISHED:
                self.fedtune_finished.append(key)
                continue
            if proposal is None:
                return None  # this search waits; the ones after it wait with it (module docstring)
            self.fedtune_owner[trial_id] = key
            return {**self.fedtune_fixed[key], **proposal, SEARCH_FIELD: key}
        return Searcher.FINISHED

    def _searcher(self, trial_id: str) -> Searcher | None:
        key = self.fedtune_owner.get(trial_id)
        return None if key is None else self.fedtune_searches[key]

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        searcher = self._searcher(trial_id)
        if searcher is not None:
            searcher.on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        searcher = self._searcher(trial_id)
        if searcher is not None:
            searcher.on_trial_complete(trial_id, result=result, error=error)

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "wb") as f:
            pickle.dump(self.__dict__.copy(), f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            self.__dict__.update(pickle.load(f))


class ListedConfigs(Searcher):
    """The given configurations, in order, then ``FINISHED``: a search's ``--seeds`` re-runs of its
    selected configuration, one per seed (what a fit of one search's seed runs takes as a grid).

    >>> s = ListedConfigs([{"seed": 1}, {"seed": 2}])
    >>> s.suggest("a"), s.suggest("b"), s.suggest("c")
    ({'seed': 1}, {'seed': 2}, 'FINISHED')
    """

    def __init__(self, configs: Sequence[Mapping[str, Any]]):
        super().__init__()
        self.fedtune_configs = [dict(c) for c in configs]
        self.fedtune_next = 0

    def suggest(self, trial_id: str) -> dict | str | None:
        if self.fedtune_next >= len(self.fedtune_configs):
            return Searcher.FINISHED
        self.fedtune_next += 1
        return dict(self.fedtune_configs[self.fedtune_next - 1])

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        pass


class PerSearchScheduler(FIFOScheduler):
    """One Tune scheduler per search (key -> scheduler), each told only of its own search's trials
    (an ASHA rung or a HyperBand bracket compares a search's trials with each other, never with
    another algorithm's). Trials start first come, first served, as under every non-population
    scheduler fedtune offers."""

    def __init__(self, schedulers: Mapping[str, TrialScheduler]):
        super().__init__()
        self.fedtune_schedulers = dict(schedulers)

    def _of(self, trial: Any) -> TrialScheduler | None:
        return self.fedtune_schedulers.get(search_of(trial))

    def set_search_properties(self, metric: str | None, mode: str | None, **spec: Any) -> bool:
        return all(s.set_search_properties(metric, mode, **spec) for s in self.fedtune_schedulers.values())

    def on_trial_add(self, tune_controller: Any, trial: Any) -> None:
        s = self._of(trial)
        if s is not None:
            s.on_trial_add(tune_controller, trial)

    def on_trial_error(self, tune_controller: Any, trial: Any) -> None:
        s = self._of(trial)
        if s is not None:
            s.on_trial_error(tune_controller, trial)

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict) -> str:
        s = self._of(trial)
        return TrialScheduler.CONTINUE if s is None else s.on_trial_result(tune_controller, trial, result)

    def on_trial_complete(self, tune_controller: Any, trial: Any, result: dict) -> None:
        s = self._of(trial)
        if s is not None:
            s.on_trial_complete(tune_controller, trial, result)

    def on_trial_remove(self, tune_controller: Any, trial: Any) -> None:
        s = self._of(trial)
        if s is not None:
            s.on_trial_remove(tune_controller, trial)

    def debug_string(self) -> str:
        return "; ".join(f"{k}: {s.debug_string()}" for k, s in self.fedtune_schedulers.items())
