"""Optuna inside Ray Tune for a sweep: fedtune's searcher, the study's Optuna storage (SQLite
``optuna.db``, or the ``--optuna-storage`` URL: :mod:`fedtune.results.optuna_url`), the samplers and
schedulers, and closing trials a killed driver left open.

:mod:`fedtune.tune.study.sweep` imports this module only when a study runs (it imports Ray Tune and
Optuna); pickles of Tune's experiment refer to its classes by name.

**Defaults first.** Each search's first trial is the search space's defaults (the papers'
settings, ``default:`` in the YAML): the Optuna study is seeded with
``SearchSpace.default_point()`` (``enqueue_trial``) when it has no trial yet, so a resumed or
restarted search never enqueues it twice.

**Optuna bookkeeping** (:class:`FedtuneOptunaSearch`, a subclass of Ray's OptunaSearch):
every round's metric is an Optuna intermediate value (``step`` = round; single objective
only, Optuna has no intermediate values for several objectives), and each round's objective
values are kept as user attributes ``round.<r>``. When a trial ends it is told to Optuna as

* COMPLETE — it ran its last round; values: the objective(s) (:func:`fedtune.results.selection.objective_values`);
* PRUNED — it was stopped before its last round (ASHA) without diverging; Optuna then takes
  its last intermediate value (Ray's own adapter would tell COMPLETE with a truncated score);
* FAIL — it diverged (NaN/Inf; ``fedtune_status: diverged``, and ``diverged`` in
  trials.parquet), raised (``failed``), or has no finite metric. FAIL rather than PRUNED for
  divergence: a NaN run has no objective value, and TPE must not treat its last finite
  accuracy as a result.

User attributes: ``tune_trial_id``, ``fedtune_trial_id`` (the Arrow store's id), ``config`` (the
trial's full configuration), ``fedtune_status`` and ``rounds_done``.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import os
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import optuna
from optuna.storages import JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState
from ray.tune.search import Searcher
from ray.tune.search.optuna import OptunaSearch

from fedtune.config import FederatedRunConfig
from fedtune.errors import ConfigError
from fedtune.results import status
from fedtune.results.selection import is_finite
from fedtune.tune.common.active import ACTIVE
from fedtune.results.optuna_url import journal_path, shown
from fedtune.results.selection import objective_values
from fedtune.tune.common.searches import optuna_storage_url
from fedtune.tune.tuner.schedulers import make_scheduler  # its home since 2026-11-27: schedulers.py
from fedtune.tune.tuner.samplers import constant_liar, make_sampler  # their home since 2026-11-27: samplers.py
from fedtune.spaces.model import strip_switches
from fedtune.tune.common.ray_lost import RayLost
from fedtune.tune.common.ray_lost import ray_gone
from fedtune.tune.common.state_signatures import check_cma_trials
from fedtune.tune.common.state_signatures import sign_cma_trial

__all__ = ["EXHAUSTED", "MAX_DUPLICATE_ASKS", "SQLITE_TIMEOUT_S", "STORAGE_RETRY_S", "FedtuneJournalStorage", "FedtuneOptunaSearch", "FedtuneRDBStorage",
           "check_storage_opens", "constant_liar", "ended_early", "make_sampler", "make_scheduler", "optuna_storage",
           "optuna_trials", "reconcile_optuna", "spent_trials"]

"""``fedtune_status`` of an Optuna trial asked by a driver killed before Tune's next snapshot
(:func:`reconcile_optuna`)."""

SQLITE_TIMEOUT_S = 30.0
"""How long one SQLite statement on ``optuna.db`` waits for a lock held by another connection
(e.g. optuna-dashboard reading the live study) before SQLite answers "database is locked"."""

EXHAUSTED = "search space exhausted"
"""How the note of a search that ran out of new configurations begins (:meth:`FedtuneOptunaSearch.suggest`)."""

MAX_DUPLICATE_ASKS = 50
"""How many proposals in a row :meth:`FedtuneOptunaSearch.suggest` tells FAIL as duplicates of
configurations that already ran before it takes the search space as exhausted."""

STORAGE_RETRY_S = 600.0
"""After that, how long :func:`optuna_storage` keeps retrying a locked call (backoff 0.05 s ... 2 s)
before it gives up and raises: a record is never dropped silently."""


# ------------------------------------------------------------------------------------------------
# The study's storage
def _is_locked(exc: BaseException) -> bool:
    seen = 0
    e: BaseException | None = exc
    while e is not None and seen < 8:
        text = str(e).lower()
        if "database is locked" in text or "database table is locked" in text or "database is busy" in text:
            return True
        e = e.__cause__ or e.__context__
        seen += 1
    return False


def _retrying(fn: Callable, name: str) -> Callable:
    @functools.wraps(fn)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        deadline = time.monotonic() + float(getattr(self, "fedtune_retry_s", STORAGE_RETRY_S))
        delay = 0.05
        while True:
            try:
                return fn(self, *args, **kwargs)
            except Exception as exc:
                if not _is_locked(exc) or time.monotonic() + delay > deadline:
                    raise
                logging.getLogger(__name__).info("optuna.db is locked during %s; retrying in %.2fs", name, delay)
                time.sleep(delay)
                delay = min(2.0, delay * 2)

    return call


def _retried_while_locked(cls: type) -> type:
    """Wrap every public method of ``RDBStorage`` (and ``__init__``) of ``cls`` in :func:`_retrying`
    (``cls``'s own override where it has one)."""
    for attr, fn in list(vars(RDBStorage).items()):
        if inspect.isfunction(fn) and (not attr.startswith("_") or attr == "__init__"):
            setattr(cls, attr, _retrying(vars(cls).get(attr, fn), attr))
    return cls


def _active_url() -> str | None:
    """The Optuna storage URL of the study this process is running (None outside a sweep):
    ``--optuna-storage``, else the running study directory's ``optuna.db``."""
    url = ACTIVE.get("optuna_url")
    if url:
        return str(url)
    active = ACTIVE.get("study_dir")
    return optuna_storage_url(active) if active is not None else None


def _engine_kwargs(url: str, timeout_s: float) -> dict[str, Any]:
    """SQLite's lock timeout; nothing for other databases (their drivers take no ``timeout``)."""
    return {"connect_args": {"timeout": float(timeout_s)}} if url.startswith("sqlite:") else {}


@_retried_while_locked
class FedtuneRDBStorage(RDBStorage):
    """Optuna's RDBStorage with a SQLite lock timeout, retries while the database is locked,
    and relocation: unpickled while a sweep runs (Tune restoring its experiment), it opens
    the storage of the study being run (its ``--optuna-storage`` URL, else the ``optuna.db``
    of its study directory), wherever the pickle was made."""

    def __init__(self, url: str, *, timeout_s: float = SQLITE_TIMEOUT_S, retry_s: float = STORAGE_RETRY_S):
        self.fedtune_timeout_s, self.fedtune_retry_s = float(timeout_s), float(retry_s)
        super().__init__(url, engine_kwargs=_engine_kwargs(url, timeout_s))

    def __setstate__(self, state: dict) -> None:
        active = _active_url()
        if active is not None and journal_path(active) is None:
            timeout = float(state.get("fedtune_timeout_s", SQLITE_TIMEOUT_S))
            state = {**state, "url": active, "engine_kwargs": _engine_kwargs(active, timeout)}
        self.fedtune_retry_s = float(state.get("fedtune_retry_s", STORAGE_RETRY_S))
        _retrying(RDBStorage.__setstate__, "open")(self, state)


class FedtuneJournalStorage(JournalStorage):
    """Optuna's JournalStorage on the log file of a ``journal:///PATH`` URL (``url``), relocated
    like :class:`FedtuneRDBStorage`: unpickled while a sweep runs, it opens that sweep's journal."""

    def __init__(self, url: str) -> None:
        self.url = url
        super().__init__(JournalFileBackend(str(journal_path(url))))

    def __setstate__(self, state: dict) -> None:
        active = _active_url()
        if active is not None and journal_path(active) is not None and active != state.get("url"):
            state = {**state, "url": active, "_backend": JournalFileBackend(str(journal_path(active)))}
        super().__setstate__(state)


def optuna_storage(study_dir: str | os.PathLike[str], *, url: str | None = None, timeout_s: float = SQLITE_TIMEOUT_S,
                   retry_s: float = STORAGE_RETRY_S) -> FedtuneRDBStorage | FedtuneJournalStorage:
    """The Optuna storage of a study: ``url`` (``--optuna-storage``, checked by
    :func:`fedtune.results.optuna_url.check_optuna_storage`) or by default ``optuna.db`` in
    ``study_dir``. A database is an ``RDBStorage`` whose SQLite connections wait ``timeout_s``
    for a lock and whose every call is retried with backoff while the database is locked (up to
    ``retry_s``); ``journal:///PATH`` is a ``JournalStorage`` on that file. Pickled into Tune's
    experiment, it is rebuilt on the storage of the study being resumed (not where it was
    created), so a study folder can be copied or moved and resumed there (see
    :class:`FedtuneRDBStorage`)."""
    url = url or optuna_storage_url(study_dir)
    if journal_path(url) is not None:
        return FedtuneJournalStorage(url)
    return FedtuneRDBStorage(url, timeout_s=timeout_s, retry_s=retry_s)


def check_storage_opens(url: str) -> None:
    """Open the ``--optuna-storage`` storage once (a database connects and creates Optuna's
    tables; a journal file is created): a server that cannot be reached is a ConfigError
    before Ray starts, not a traceback at the first trial."""
    try:
        storage = optuna_storage(".", url=url, retry_s=0.0)
    except Exception as exc:  # noqa: BLE001 -- any driver or file error: say which option and URL
        raise ConfigError(f"option '--optuna-storage': cannot open '{shown(url)}': {type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
    if isinstance(storage, RDBStorage):
        storage.engine.dispose()


# ------------------------------------------------------------------------------------------------
# The searcher
class FedtuneOptunaSearch(OptunaSearch):
    """Ray's OptunaSearch with fedtune's bookkeeping (see the module docstring): per-round
    intermediate values, PRUNED for trials stopped early, FAIL for diverged ones, the full
    configuration and fedtune's trial id as user attributes, ``switch.*`` keys kept in Optuna
    but out of the trial config."""

    def __init__(self, space: Callable, *, metrics: Sequence[str], modes: Sequence[str], rounds: int,
                 fixed: Mapping[str, Any], sampler: Any, study_name: str, storage: Any,
                 first_point: Mapping[str, Any] | None = None, num_samples: int | None = None) -> None:
        multi = len(metrics) > 1
        super().__init__(space=space, metric=list(metrics) if multi else metrics[0],
                         mode=list(modes) if multi else modes[0], sampler=sampler, study_name=study_name,
                         storage=storage)
        # The search space's defaults as the first trial (SearchSpace.default_point()). Not
        # Ray's points_to_evaluate: OptunaSearch would enqueue them again each time the searcher
        # is re-created on the same Optuna study (a restarted search); enqueue only into an
        # empty study.
        if first_point and not self._ot_study.get_trials(deepcopy=False):
            self._ot_study.enqueue_trial(dict(first_point))
        self.fedtune_metrics = list(metrics)
        self.fedtune_modes = list(modes)
        self.fedtune_rounds = int(rounds)
        self.fedtune_fixed = dict(fixed)
        self.fedtune_reported: dict[str, set[int]] = {}
        self.fedtune_num_samples = None if num_samples is None else int(num_samples)

    # -- asking -----------------------------------------------------------------------------------
    def suggest(self, trial_id: str) -> dict | str | None:
        """The next configuration to run, one that has not run in this search.

        A sampler may propose a configuration that already ran: NSGA-II's children of two equal
        parents, TPE on a small categorical space, or a sampler restored from an older Tune
        snapshot that replays its random draws after a killed driver. Equal configurations have
        the same fedtune trial id and the same results, so such a proposal is told FAIL
        (``fedtune_status: duplicate``, ``duplicate_of``: the id) and the sampler is asked again.
        After :data:`MAX_DUPLICATE_ASKS` duplicates in a row the search space is taken as
        exhausted and the search ends (``Searcher.FINISHED``; the Optuna study's user attribute
        ``fedtune_exhausted`` says so). The search also ends once ``num_samples`` trials of its
        Optuna study have run or are running here (:meth:`spent`), so a driver restarted from an
        older snapshot does not run more trials than were asked for."""
        self._check_cma_state()
        budget = getattr(self, "fedtune_num_samples", None)
        for _ in range(MAX_DUPLICATE_ASKS):
            spent = self.spent()
            if budget is not None and len(spent) >= budget:
                return Searcher.FINISHED
            params = super().suggest(trial_id)
            if params is None:
                return None
            ot_trial = self._ot_trials[trial_id]
            config = strip_switches(params)
            full = {**self.fedtune_fixed, **config}
            checked: FederatedRunConfig | None = None
            try:
                checked = FederatedRunConfig.from_dict(full, source="sampled configuration")
            except ConfigError as exc:  # the trial will fail on it and be told FAIL
                ot_trial.set_user_attr("config_error", str(exc))
            fedtune_id = None if checked is None else checked.trial_id()
            if fedtune_id is not None and fedtune_id in spent:
                self._tell_duplicate(trial_id, fedtune_id, spent[fedtune_id])
                continue
            ot_trial.set_user_attr("tune_trial_id", trial_id)
            if fedtune_id is not None:
                ot_trial.set_user_attr("fedtune_trial_id", fedtune_id)
            ot_trial.set_user_attr("config", json.loads(json.dumps(full, sort_keys=True, default=str)))
            return config
        message = (f"{EXHAUSTED}: the sampler proposed {MAX_DUPLICATE_ASKS} configurations in a row that "
                   f"had already run; the search ends after {len(self.spent())} distinct trials")
        logging.getLogger(__name__).warning("Optuna study %s: %s", self._ot_study.study_name, message)
        self._ot_study.set_user_attr("fedtune_exhausted", message)
        return Searcher.FINISHED

    def spent(self) -> dict[str, int]:
        """:func:`spent_trials` of this search, counting the trials running in this driver."""
        live = {t.number for tid, t in self._ot_trials.items() if tid not in self._completed_trials}
        return spent_trials(self._ot_study.get_trials(deepcopy=False), live)

    def _tell_duplicate(self, trial_id: str, fedtune_id: str, number: int) -> None:
        ot_trial = self._ot_trials.pop(trial_id)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ot_trial.set_user_attr("fedtune_status", status.DUPLICATE)
            ot_trial.set_user_attr("duplicate_of", fedtune_id)
            ot_trial.set_user_attr("duplicate_of_number", number)
            self._ot_study.tell(ot_trial, state=TrialState.FAIL, skip_if_finished=True)

    # -- results ----------------------------------------------------------------------------------
    def _record(self, trial_id: str, result: Mapping[str, Any]) -> None:
        ot_trial = self._ot_trials.get(trial_id)
        if ot_trial is None:
            return
        step = result.get("round", result.get("training_iteration"))
        if step is None:
            return
        step = int(step)
        values = {m: float(result[m]) for m in self.fedtune_metrics if is_finite(result.get(m))}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                ot_trial.set_user_attr(f"round.{step}", values)
                first = values.get(self.fedtune_metrics[0])
                reported = self.fedtune_reported.setdefault(trial_id, set())
                if len(self.fedtune_metrics) == 1 and first is not None and step not in reported:
                    ot_trial.report(first, step)
                    reported.add(step)
            except (optuna.exceptions.UpdateFinishedTrialError, RuntimeError, ValueError):
                pass  # the trial was told already (a driver restart replays it): nothing to add

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        if trial_id in self._completed_trials:
            return
        self._record(trial_id, result)

    def _check_cma_state(self) -> None:
        """Before CMA-ES is asked: the optimizer it unpickles from the study's finished trials must be
        signed by this user's driver (:func:`~fedtune.tune.common.state_signatures.check_cma_trials`),
        each trial checked once per driver (``ACTIVE["cma_checked"]``, never saved with the searcher)."""
        study_dir = ACTIVE.get("study_dir")
        if study_dir is None or not isinstance(self._ot_study.sampler, optuna.samplers.CmaEsSampler):
            return

        name = self._ot_study.study_name
        checked = ACTIVE.setdefault("cma_checked", {}).setdefault(name, set())
        finished = [t for t in self._ot_study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,
                                                                                 TrialState.PRUNED))
                    if t.number not in checked]
        if finished:
            check_cma_trials(study_dir, name, finished, trust=bool(ACTIVE.get("trust_study_files")))
            checked.update(t.number for t in finished)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        if trial_id in self._completed_trials:
            return
        ot_trial = self._ot_trials.get(trial_id)
        if ot_trial is None:
            return
        if error:
            if ray_gone():  # not the trial's fault: leave it RUNNING here and in Tune, for --resume
                raise RayLost(f"Ray went away while study '{self._ot_study.study_name}' ran: no node of the cluster "
                              "is alive (its raylet was killed, the machine ran out of memory, or the head node was "
                              "lost); the running trials are not counted as failed, and finished ones are kept")
        if result:
            self._record(trial_id, result)  # the last result reaches only on_trial_complete
        frozen = self._frozen(ot_trial)
        per_round = {int(k.split(".", 1)[1]): v for k, v in (frozen.user_attrs if frozen else {}).items()
                     if k.startswith("round.")}
        last_round = int(result.get("round", 0) or 0) if result else (max(per_round) if per_round else 0)
        diverged = bool(result) and result.get("status") == status.DIVERGED
        values = None
        if error:
            state, fedtune_status = TrialState.FAIL, status.FAILED
        elif diverged:
            state, fedtune_status = TrialState.FAIL, status.DIVERGED
        elif last_round < self.fedtune_rounds:
            state, fedtune_status = TrialState.PRUNED, status.PRUNED
        else:
            values = objective_values(per_round, self.fedtune_metrics, self.fedtune_modes)
            state, fedtune_status = ((TrialState.COMPLETE, status.COMPLETED) if values
                                     else (TrialState.FAIL, status.NO_METRIC))
        if frozen is not None and ACTIVE.get("study_dir") is not None:  # CMA-ES reads finished trials' pickles:
            sign_cma_trial(ACTIVE["study_dir"], self._ot_study.study_name, frozen.number, frozen.system_attrs)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                if frozen is None or frozen.state == TrialState.RUNNING:
                    ot_trial.set_user_attr("fedtune_status", fedtune_status)
                    ot_trial.set_user_attr("rounds_done", last_round)
                self._ot_study.tell(ot_trial, values if state == TrialState.COMPLETE else None, state=state,
                                    skip_if_finished=True)
            except Exception as exc:  # noqa: BLE001 - never let bookkeeping kill the study
                logging.getLogger(__name__).warning("Optuna: could not tell trial %s: %s", trial_id, exc)
        self._completed_trials.add(trial_id)

    def _frozen(self, ot_trial: Any) -> Any:
        for t in self._ot_study.get_trials(deepcopy=False):
            if t.number == ot_trial.number:
                return t
        return None


def spent_trials(trials: Sequence[Any], live: set[int] = frozenset()) -> dict[str, int]:
    """The trials of a search that count against its budget, as fedtune trial id -> Optuna trial
    number: those that ran (COMPLETE, PRUNED, or FAIL as diverged, failed or without metric) and
    those running (``live``: Optuna numbers). A trial a killed driver left RUNNING (orphaned) or
    a duplicate never ran to the end and does not count. A trial without an id (its sampled
    configuration was invalid) counts as ``#<number>``."""
    ran = (status.DIVERGED, status.FAILED, status.NO_METRIC)
    out: dict[str, int] = {}
    for t in trials:
        if (t.state in (TrialState.COMPLETE, TrialState.PRUNED) or t.number in live
                or (t.state == TrialState.FAIL and t.user_attrs.get("fedtune_status") in ran)):
            out.setdefault(t.user_attrs.get("fedtune_trial_id") or f"#{t.number}", t.number)
    return out


def ended_early(storage_url: str | Any, study_name: str, num_samples: int) -> str | None:
    """Why the search of ``study_name`` asked Tune for fewer than ``num_samples`` trials and is
    nevertheless complete, or None: its Optuna study already holds ``num_samples`` trials that ran
    (a driver restarted from an older Tune snapshot), or its sampler found no configuration that
    had not run (``fedtune_exhausted``: :meth:`FedtuneOptunaSearch.suggest`)."""
    study = optuna.load_study(study_name=study_name, storage=storage_url)
    note = study.user_attrs.get("fedtune_exhausted")
    if note:
        return str(note)
    n = len(spent_trials(study.get_trials(deepcopy=False)))
    return f"its Optuna study holds {n} trials that ran" if n >= num_samples else None


def optuna_trials(storage_url: str | Any, study_name: str) -> list[Any]:
    """The trials of the Optuna study ``study_name`` (none when it does not exist yet)."""
    try:
        study = optuna.load_study(study_name=study_name, storage=storage_url)
    except KeyError:
        return []
    return study.get_trials(deepcopy=False)


def reconcile_optuna(storage_url: str | Any, study_name: str) -> int:
    """Tell FAIL (user attribute ``fedtune_status: orphaned``) every trial still RUNNING in the
    Optuna study: after a search ended nothing runs, so these were asked by a driver that was
    killed before Tune's next snapshot. Returns how many were closed. ``storage_url``: a URL or
    a storage (:func:`optuna_storage`: retried while the database is locked)."""
    study = optuna.load_study(study_name=study_name, storage=storage_url)
    n = 0
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        study._storage.set_trial_user_attr(t._trial_id, "fedtune_status", status.ORPHANED)
        study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)
        n += 1
    return n

