"""Population-based training (Ray Tune's PBT and PB2) over federated runs: the member trainable and
the Optuna record of each member.

**A member** is one Tune trial of a ``--scheduler pbt|pb2`` search. At each perturbation interval
Tune's scheduler lets a member in the bottom quantile *exploit* one in the top quantile: the member
is re-configured with the donor's hyperparameters, perturbed (*explore*), and restored from the
donor's last checkpoint, which holds the whole federated state (global weights, server rule,
server optimiser, the client method's server side, every client's state, an in-run tuner's:
:meth:`fedtune.runtime.driver.FederatedRun.get_state`). :class:`PopulationTrainable` keeps one
fedtune trial id per member (``<algorithm>-<Tune trial id>``: its configuration changes along the
run, so the configuration's hash would not name it) and reports each exploit once, as
``pbt_event`` of the next round row (the round it restarted from, the donor, the new
hyperparameters); the Arrow callback folds the events into the member's ``pbt_history``
(:func:`fold_history`), which every later round row and the trial row carry.

**Optuna.** PBT takes no searcher (Ray Tune refuses one), so :class:`PopulationRecorder` writes
each member into the search's Optuna study when it ends, once (a resumed driver skips members
already there): its first configuration's searched values as the parameters, the objective over
its rounds as the value (COMPLETE; FAIL for an error), its fedtune trial id, Tune trial id, final
configuration and mutation history as user attributes; Optuna and the Arrow records then agree as
for every other search.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ray import tune
from ray.tune import Callback

from fedtune.results import selection
from fedtune.results.store import load
from fedtune.results.study_dir import ROUNDS_DIR
from fedtune.spaces.model import OMITTED
from fedtune.tune.trial.trainable import FedtuneTrainable, resources_for, with_plugins

__all__ = ["PopulationRecorder", "PopulationTrainable", "fold_history", "population_trainable"]

EVENT, HISTORY = "pbt_event", "pbt_history"


class PopulationTrainable(FedtuneTrainable):
    """:class:`FedtuneTrainable` for a PBT/PB2 member: one fedtune trial id per member, each exploit
    reported as the next round row's ``pbt_event``."""

    _event: dict[str, Any] | None = None

    def _begin(self, config: Mapping[str, Any], *, reuse: bool) -> None:
        super()._begin(config, reuse=reuse)
        self.fedtune_trial_id = f"{self.cfg.algorithm}-{self.trial_id}"
        self._searched = sorted(k for k in config if k in self.cfg.hyperparameters())

    def load_checkpoint(self, checkpoint: str | dict) -> None:
        super().load_checkpoint(checkpoint)
        donor = self.restored_meta.get("trial_id")
        if donor is not None and donor != self.fedtune_trial_id:  # an exploit: another member's state
            hps = self.cfg.hyperparameters()
            self._event = {"round": int(self.run.round), "from": str(donor),
                           "config": {k: hps[k] for k in self._searched}}

    def step(self) -> dict[str, Any]:
        out = super().step()
        if self._event is not None:
            out["fedtune_row"] = {**out["fedtune_row"], EVENT: json.dumps(self._event, sort_keys=True, default=str)}
            self._event = None
        return out


def population_trainable():
    """:class:`PopulationTrainable` with its per-trial resources (as :func:`fedtune_trainable`)."""
    return tune.with_resources(with_plugins(PopulationTrainable), resources_for)


def fold_history(row: Mapping[str, Any], earlier: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """``row`` with its member's ``pbt_history``: the history of the latest earlier row before its
    round, plus the row's own ``pbt_event`` (removed); unchanged when neither exists.

    >>> fold_history({"round": 3, "pbt_event": '{"round": 2}'}, {2: {"pbt_history": '[{"round": 1}]'}})["pbt_history"]
    '[{"round": 1}, {"round": 2}]'
    """
    out = dict(row)
    event = out.pop(EVENT, None)
    before = [k for k, r in earlier.items() if k < int(row["round"]) and r.get(HISTORY)]
    history = json.loads(earlier[max(before)][HISTORY]) if before else []
    if event is not None:
        history.append(json.loads(event))
    if history:
        out[HISTORY] = json.dumps(history, sort_keys=True)
    return out


class PopulationRecorder(Callback):
    """Writes each PBT/PB2 member into the search's Optuna study when it ends (see the module
    docstring). ``space`` gives the parameters' distributions; ``metric``/``mode`` the objective."""

    def __init__(self, storage: Any, study_name: str, space: Any, metric: str, mode: str, study_dir: str):
        self.storage, self.study_name, self.space = storage, study_name, space
        self.metric, self.mode, self.study_dir = metric, mode, study_dir
        self._first: dict[str, dict[str, Any]] = {}  # Tune trial id -> its first configuration

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._first.setdefault(trial.trial_id, dict(trial.config))

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._record(trial, failed=False)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._record(trial, failed=True)

    def _record(self, trial: Any, failed: bool) -> None:
        # lazy: keeps optuna out of this module's import
        import optuna
        from optuna.trial import TrialState

        study = optuna.load_study(study_name=self.study_name, storage=self.storage)
        fedtune_id = f"{trial.config.get('algorithm', 'fedavg')}-{trial.trial_id}"
        if any(t.user_attrs.get("fedtune_trial_id") == fedtune_id for t in study.get_trials(deepcopy=False)):
            return  # recorded by an earlier driver: exactly once
        path = f"{self.study_dir}/{ROUNDS_DIR}/{fedtune_id}.parquet"
        try:
            rows = sorted(load(path).to_pylist(), key=lambda r: r["round"])
        except (FileNotFoundError, OSError):
            rows = []
        values = {int(r["round"]): r.get(self.metric) for r in rows}
        value = selection.objective({k: v for k, v in values.items() if v is not None}, self.metric, self.mode)
        first = self._first.get(trial.trial_id, trial.config)
        params, dists = {}, {}
        for p in self.space.params.values():
            if p.sampled and p.name in first and first[p.name] is not OMITTED and not isinstance(first[p.name], dict):
                params[p.name], dists[p.name] = first[p.name], _distribution(p)
        attrs = {"fedtune_trial_id": fedtune_id, "tune_trial_id": trial.trial_id,
                 "config": json.loads(json.dumps(dict(trial.config), sort_keys=True, default=str)),
                 "pbt_history": json.loads(rows[-1].get(HISTORY) or "[]") if rows else [],
                 **{f"round.{k}": {self.metric: v} for k, v in values.items() if v is not None}}
        state = TrialState.FAIL if failed or value is None else TrialState.COMPLETE
        study.add_trial(optuna.trial.create_trial(
            params=params, distributions=dists, value=None if state == TrialState.FAIL else value,
            user_attrs=attrs, state=state))

    def __getstate__(self) -> dict[str, Any]:  # pickled in Tune's experiment
        return dict(self.__dict__)


def _distribution(p: Any) -> Any:
    """The Optuna distribution of a sampled search-space parameter."""
    # lazy: keeps optuna out of this module's import
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    if p.distribution in ("uniform", "loguniform"):
        return FloatDistribution(float(p.low), float(p.high), log=p.distribution == "loguniform")
    if p.distribution == "int":
        return IntDistribution(int(p.low), int(p.high), log=bool(p.log))
    return CategoricalDistribution(list(p.choices))
