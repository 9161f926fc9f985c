"""The single writer of a study's Arrow (Parquet) store during a Ray Tune run: :class:`ArrowCallback`.

Trials never write results themselves. The callback runs on the Tune driver and writes:

* on every result of a :class:`~fedtune.tune.trial.trainable.FedtuneTrainable`, its ``fedtune_row``
  into ``OUTPUT/<study>/rounds/<trial_id>.parquet`` (``ResultsStore.write_rounds`` rewrites the
  trial's file atomically with all its rows);
* when a trial ends, its row of ``OUTPUT/<study>/trials.parquet`` (``summarize_trial``), with
  status ``completed`` (ran all its rounds), ``diverged`` (its last round diverged), ``pruned``
  (stopped early — by a scheduler or a stopper — before its last round, last round ``ok``) or
  ``failed`` (it raised; ``error`` holds the message; ``failed`` is the store's word for an
  error, the same one ``fedtune run`` writes; given a sweep's ``objective``, also a trial that ran
  all its rounds without a finite value of it, which Optuna can only tell FAIL:
  :func:`no_objective_error`).

``trial_id`` is fedtune's (:meth:`FederatedRunConfig.trial_id`), not Tune's. Each (trial, round) is
stored once: rows are kept in memory keyed by round, so a trial restored from a checkpoint
that reports rounds again replaces them instead of adding copies, and two Tune trials of one
configuration (equal ``trial_id``) share one file. A trial restarted after a failure
(``--max-failures``: a lost node) continues from its last checkpoint; each row's ``attempt`` is
Tune's count of the trial's failures when the round ran, and ``trials.parquet`` keeps the final
count as ``restarts``. A round-1 row starts a trial's history anew: a fresh trial, or one that
starts again without a readable checkpoint, replaces the rows an earlier run left under that
``trial_id`` (in memory or on disk); a later round as the first row this callback sees of a trial
means a trial resumed after a driver restart (``Tuner.restore``), whose earlier rows are first
read back from disk. A result's ``fedtune_warning`` (a damaged checkpoint the trial fell back
from) is said on the driver (:func:`trial_warning`).
The rows' ``study`` column is the callback's ``study`` (the trial config's ``output``/``name``
are not used by Tune trials: the callback decides where results go).

A write the disk refuses (a full device, a folder made read-only) is recorded, with what is intact,
for :func:`write_failure` to hand to the sweep: a round that cannot be written raises it into Tune
(which stops the run: ``tuner.fit()`` raises, a ``TuneError`` wrapping it), a trial row that cannot
be written is only recorded (an error raised from Tune's trial-end hooks would fail the trial and
print Tune's traceback). The driver then raises :func:`write_failure`'s error, one line naming the
file; ``--resume`` continues the study (the rounds already written are kept, missing trial rows
are rebuilt).
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ray.tune import Callback
from rich.markup import escape

from fedtune.results.atomic import ResultsWriteError
from fedtune.results.selection import objective_values
from fedtune.results.status import COMPLETED, DIVERGED, FAILED, NO_METRIC, PRUNED
from fedtune.results.store import ResultsStore, load
from fedtune.results.summary import summarize_trial
from fedtune.tune.common.active import ACTIVE
from fedtune.tune.trial.population import fold_history
from fedtune.tune.trial.trainable import trial_run_config

if TYPE_CHECKING:
    from fedtune.config import FederatedRunConfig

__all__ = ["ArrowCallback", "no_objective_error", "trial_row", "trial_status", "trial_warning", "write_failure"]

ERROR_STATUS = FAILED

_WRITE_FAILURES: dict[str, ResultsWriteError] = {}  # study folder -> the first write refused (this process)


def _key(study_dir: str | os.PathLike[str]) -> str:
    return str(Path(study_dir).resolve())


_WHAT_TO_DO = "free space (or make the folder writable), then resume the study"


def write_failure(study_dir: str | os.PathLike[str], *, clear: bool = True,
                  resume_command: str | None = None) -> ResultsWriteError | None:
    """The first write of the study in ``study_dir`` that the disk refused to an
    :class:`ArrowCallback` of this process (a :class:`~fedtune.results.atomic.StorageFullError` for a full
    device), its one-line message naming the file, what is intact and what to do (``resume_command``:
    the command that resumes the study); None when every write landed. ``clear`` forgets it (it has
    been reported). The sweep checks this after ``tuner.fit()``, whether fit raised or not."""
    err = (_WRITE_FAILURES.pop if clear else _WRITE_FAILURES.get)(_key(study_dir), None)
    if err is None:
        return None
    if resume_command:
        return err.with_context(f"free space (or make the folder writable), then resume it with: {resume_command}")
    return err.with_context(_WHAT_TO_DO)


def no_objective_error(metrics: list[str] | None = None) -> str:
    """``error`` of a trial that ran all its rounds without a finite value of the study's objective:
    Optuna can only tell it FAIL (``fedtune_status: no_metric``), and ``trials.parquet`` says
    ``failed`` with this, not ``completed``, so the two agree.

    >>> no_objective_error(["val_acc"])
    "no round has a finite val_acc: the trial has no value of the study's objective (Optuna: FAIL, no_metric)"
    """
    what = f"no round has a finite {', '.join(metrics)}" if metrics else "no value of the objective"
    return f"{what}: the trial has no value of the study's objective (Optuna: FAIL, {NO_METRIC})"


def trial_warning(text: str) -> None:
    """Say a trial's warning (sent with its result: a trial actor's own output is not shown) on the
    driver: on the sweep's live view, and kept for the sweep's warnings (``ACTIVE["warnings"]``);
    logged outside a sweep."""
    view = ACTIVE.get("view")
    if view is None:
        logging.getLogger(__name__).warning(text)
        return

    ACTIVE.setdefault("warnings", []).append(text)
    view.console.print(f"[yellow]warning: {escape(text)}[/yellow]", soft_wrap=True)


def trial_status(last_row: Mapping[str, Any] | None, rounds: int, error: str | None, short: str = PRUNED) -> str:
    """The ``trials.parquet`` status of a trial that ended after ``last_row``; ``short``: that of one
    that stopped before its last round without diverging (``pruned``; ``interrupted`` for a trial a
    killed driver left unfinished and nothing continued).

    >>> trial_status({"round": 5, "status": "ok"}, 5, None)
    'completed'
    >>> trial_status({"round": 2, "status": "ok"}, 5, None)
    'pruned'
    >>> trial_status({"round": 2, "status": "diverged"}, 5, None)
    'diverged'
    >>> trial_status({"round": 2, "status": "ok"}, 5, "ValueError: boom")
    'failed'
    >>> trial_status({"round": 2, "status": "ok"}, 5, None, short="interrupted")
    'interrupted'
    """
    if error is not None:
        return ERROR_STATUS
    if last_row is None:
        return short  # stopped before its first round
    if last_row.get("status") == DIVERGED:
        return DIVERGED
    return COMPLETED if int(last_row["round"]) >= rounds else short


def trial_row(rows: list[Mapping[str, Any]], cfg: FederatedRunConfig, *, study: str, trial_id: str, error: str | None,
              started_at: Any, ended_at: Any, restarts: int, last_row: Mapping[str, Any] | None = None,
              short: str = PRUNED) -> dict[str, Any]:
    """The ``trials.parquet`` row of a trial that ended after its round ``rows`` (in round order):
    its status (:func:`trial_status` of ``last_row``, the last row it reported, default the last
    of ``rows``; ``short`` for one that stopped early), the summary of :func:`fedtune.results.summary.summarize_trial`, and its identity from
    ``cfg`` (its :class:`~fedtune.config.FederatedRunConfig`, or None when the trial's
    configuration was refused)."""
    config_dict = json.loads(json.dumps(cfg.to_dict(), sort_keys=True, default=str)) if cfg is not None else {}
    last = last_row if last_row is not None else (rows[-1] if rows else None)
    status = trial_status(last, cfg.rounds if cfg is not None else 0, error, short)
    summary = summarize_trial(rows, config=config_dict, status=status, error=error, started_at=started_at,
                              ended_at=ended_at)
    summary.update({"study": study, "trial_id": trial_id, "restarts": int(restarts)})
    if cfg is not None:
        summary.update({"algorithm": cfg.algorithm, "dataset": cfg.dataset, "seed": cfg.seed})
    return summary


def _now() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc)


def _error_text(trial: Any) -> str:
    """The last line of a failed trial's error (``SomeError: message``), else a pointer to it."""
    text = None
    try:
        text = trial.get_error()
    except Exception:  # noqa: BLE001, S110 - the text file is the fallback below
        pass
    if not text and getattr(trial, "error_file", None):
        try:
            with open(trial.error_file) as f:
                text = f.read()
        except OSError:
            pass
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip() and not ln.startswith("Failure #")]
    return lines[-1][:2000] if lines else "the trial failed (see Tune's error.txt of the trial)"


class ArrowCallback(Callback):
    """Write every round and every trial summary of a Tune run to ``ResultsStore(output, study)``.

    Pass one to ``ray.tune.RunConfig(callbacks=[ArrowCallback(output, study)])``; see the
    module docstring for what it writes and when.
    """

    def __init__(self, output: str, study: str, objective: tuple[list[str], list[str]] | None = None):
        self.objective = objective  # (metrics, modes) of a sweep: a completed trial without a value is failed
        self.store = ResultsStore(output, study)
        self.study = self.store.study
        self._rows: dict[str, dict[int, dict[str, Any]]] = {}  # fedtune trial id -> round -> row
        self._last: dict[str, dict[str, Any]] = {}  # Tune trial id -> its last row
        self._started: dict[str, _dt.datetime] = {}  # Tune trial id -> first start
        self._ended: set[str] = set()  # Tune trial ids whose trials.parquet row is written
        self._restarts: dict[str, int] = {}  # Tune trial id -> Tune's num_failures at its last result

    # --- Tune hooks ---------------------------------------------------------------------------
    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._started.setdefault(trial.trial_id, _now())

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        if result.get("fedtune_warning"):  # a damaged checkpoint the trial fell back from
            trial_warning(str(result["fedtune_warning"]))
        row = result.get("fedtune_row")
        if isinstance(row, Mapping):
            self._restarts[trial.trial_id] = int(getattr(trial, "num_failures", 0) or 0)
            self.add_row(trial.trial_id, {**row, "attempt": self._restarts[trial.trial_id]})

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.finish(trial.trial_id, trial.config, error=None)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._restarts[trial.trial_id] = int(getattr(trial, "num_failures", 0) or 0)
        self.finish(trial.trial_id, trial.config, error=_error_text(trial))

    def __setstate__(self, state: dict[str, Any]) -> None:  # callbacks pickled by an older fedtune lack _restarts
        self.__dict__.update(state)
        self.__dict__.setdefault("_restarts", {})
        self.__dict__.setdefault("objective", None)

    def get_state(self) -> dict[str, Any]:
        # Rows are not part of the state: a resumed trial reads them back from disk.
        return {"started": dict(self._started), "ended": set(self._ended)}

    def set_state(self, state: dict[str, Any]) -> None:
        self._started.update(state.get("started", {}))
        self._ended |= set(state.get("ended", ()))

    # --- the writes -----------------------------------------------------------------------------
    def _refused(self, exc: ResultsWriteError, what: str) -> ResultsWriteError:
        """Record ``exc`` (the first refused write of the study is the one reported) and return it with
        what is intact and what to do."""
        err = exc.with_context(f"{what} was not written; the rounds and trial rows written before are intact in "
                               f"'{self.store.study_dir}'; the study stopped")
        _WRITE_FAILURES.setdefault(_key(self.store.study_dir), err)
        return err.with_context(_WHAT_TO_DO)

    def add_row(self, tune_trial_id: str, row: Mapping[str, Any]) -> None:
        """Store one round row of a trial (replacing that trial's earlier row of the same round).
        A refused write is recorded (:func:`write_failure`) and raised: Tune then stops the run."""
        row = {**row, "study": self.study}
        trial_id, rnd = str(row["trial_id"]), int(row["round"])
        rows = self._rows.get(trial_id)
        if rnd <= 1:  # the trial (again) from its start: its earlier rows, in memory or on disk, are replaced
            rows = self._rows[trial_id] = {}
        elif rows is None:
            rows = self._rows[trial_id] = self._rows_on_disk(trial_id)
        if "pbt_event" in row or any("pbt_history" in r for r in rows.values()):  # a PBT/PB2 member

            row = fold_history(row, rows)
        rows[rnd] = row
        try:
            self.store.write_rounds(trial_id, [rows[r] for r in sorted(rows)])
        except ResultsWriteError as exc:
            raise self._refused(exc, f"round {rnd} of trial {trial_id}") from None
        self._last[tune_trial_id] = row
        self._started.setdefault(tune_trial_id, _now())
        self._ended.discard(tune_trial_id)

    def finish(self, tune_trial_id: str, config: Mapping[str, Any], error: str | None) -> None:
        """Write the ``trials.parquet`` row of a trial that ended (once per end). A refused write is
        recorded (:func:`write_failure`), not raised: Tune would fail the trial and log a traceback;
        ``--resume`` rebuilds the row from the trial's rounds."""
        if tune_trial_id in self._ended:
            return
        last = self._last.get(tune_trial_id)
        if last is None and error is None:
            return  # stopped before it ran a round (e.g. still pending at the end): nothing to record
        try:
            cfg = trial_run_config(config)
        except Exception as exc:  # noqa: BLE001 - a config the trial itself refused: record that error
            cfg = None
            error = error or f"{type(exc).__name__}: {exc}"
        trial_id = str(last["trial_id"]) if last is not None else (cfg.trial_id() if cfg is not None else None)
        if trial_id is None:
            return
        rows = self._rows.get(trial_id, {})
        error = error or self._no_objective([rows[r] for r in sorted(rows)], cfg, last)
        try:
            self.store.write_trial(trial_row([rows[r] for r in sorted(rows)], cfg, study=self.study,
                                             trial_id=trial_id, error=error,
                                             started_at=self._started.get(tune_trial_id), ended_at=_now(),
                                             restarts=self._restarts.get(tune_trial_id, 0), last_row=last))
        except ResultsWriteError as exc:
            self._refused(exc, f"the {self.store.trials_path.name} row of trial {trial_id}")
            return
        self._ended.add(tune_trial_id)

    def _no_objective(self, rows: list[Mapping[str, Any]], cfg: FederatedRunConfig,
                      last: Mapping[str, Any] | None) -> str | None:
        """:func:`no_objective_error` for a trial that ran all its rounds (as Optuna's searcher reads
        it: :func:`fedtune.results.selection.objective_values` of its rounds) and has no objective value."""
        if not self.objective or cfg is None or trial_status(last, cfg.rounds, None) != COMPLETED:
            return None

        metrics, modes = self.objective
        per_round = {int(r["round"]): {m: r.get(m, float("nan")) for m in metrics} for r in rows}
        return None if objective_values(per_round, metrics, modes) is not None else no_objective_error(metrics)

    def _rows_on_disk(self, trial_id: str) -> dict[int, dict[str, Any]]:
        path = self.store.rounds_path(trial_id)
        if not path.is_file():
            return {}
        out: dict[int, dict[str, Any]] = {}
        for r in load(path).to_pylist():
            if r.get("round") is not None:
                out[int(r["round"])] = {k: v for k, v in r.items() if v is not None}
        return out
