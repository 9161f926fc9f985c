"""``fedtune sweep --logger csv|tensorboard|mlflow``: Ray Tune's own logger callbacks, each
(trial, round) logged once.

Each logger is a thin subclass of Ray's callback (:class:`~ray.tune.logger.CSVLoggerCallback`,
:class:`~ray.tune.logger.TBXLoggerCallback`,
:class:`~ray.air.integrations.mlflow.MLflowLoggerCallback`). The subclasses add two things:

* **Once per round.** A trial that Tune restarts (``--max-failures``, or ``--resume`` after a
  driver stop) reports some rounds again. The callback remembers which rounds of which trial it
  logged (in Tune's callback state, so it survives ``--resume``) and skips a round it has
  already logged. The CSV logger also reads back the trial's ``progress.csv`` and the MLflow
  logger the run's metric history, so what is already in the sink wins. Tune's automatic
  loggers stay off (:mod:`fedtune.tune.tune_env`), so no second CSV or TensorBoard writer runs.
* **No nested row.** The trainable's result carries the whole Arrow row as ``fedtune_row``;
  its numbers are already top-level keys, so it is dropped instead of being logged a second
  time under ``fedtune_row/...``.

Where the files go: CSV and TensorBoard write into each trial's Tune folder
(``OUTPUT/<study>/tune/<search>/trial_<id>/progress.csv`` and ``events.out.tfevents.*``).
MLflow writes to :func:`mlflow_tracking_uri`: ``$MLFLOW_TRACKING_URI`` when set (a team's
tracking server), else a local SQLite database ``OUTPUT/<study>/mlflow.db`` (offline; MLflow 3
refuses its old ``file:`` store unless ``MLFLOW_ALLOW_FILE_STORE=true``). One MLflow experiment
per study, named like the study; one run per trial, tagged with the study and the search.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ray.air.integrations.mlflow import MLflowLoggerCallback
from ray.tune.logger import CSVLoggerCallback, TBXLoggerCallback
from ray.tune.logger.logger import LoggerCallback

__all__ = ["MLFLOW_DB", "FedtuneCSVLogger", "FedtuneMLflowLogger", "FedtuneTBXLogger", "logger_callbacks",
           "mlflow_tracking_uri"]

_DROP = ("fedtune_row",)


MLFLOW_DB = "mlflow.db"


def mlflow_tracking_uri(study_dir: str | Path) -> str:
    """The MLflow tracking URI of a study: ``$MLFLOW_TRACKING_URI``, else the SQLite database
    ``<study_dir>/mlflow.db``.

    >>> os.environ.pop("MLFLOW_TRACKING_URI", None) and None
    >>> mlflow_tracking_uri("/tmp/out/s")
    'sqlite:////tmp/out/s/mlflow.db'
    """
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path(study_dir).resolve() / MLFLOW_DB}"


def _round(result: dict[str, Any]) -> int:
    return int(result.get("training_iteration") or result.get("round") or 0)


class _OncePerRound(LoggerCallback):
    """Log each (Tune trial, round) once; drop ``fedtune_row``. Subclasses may read the rounds a
    sink already holds (:meth:`_rounds_in_sink`)."""

    def _logged(self, trial: Any) -> set[int]:
        """Rounds of ``trial`` already logged: the first time this driver sees the trial, what the
        sink holds (:meth:`_rounds_in_sink`), else Tune's saved callback state; then this run's."""
        table: dict[str, set[int]] = self.__dict__.setdefault("_fedtune_logged", {})
        checked: set[str] = self.__dict__.setdefault("_fedtune_checked", set())
        if trial.trial_id not in checked:
            checked.add(trial.trial_id)
            in_sink = self._rounds_in_sink(trial)
            if in_sink is not None:
                table[trial.trial_id] = set(in_sink)
        return table.setdefault(trial.trial_id, set())

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_fedtune_checked", None)  # per driver process
        return state

    def _rounds_in_sink(self, trial: Any) -> set[int] | None:
        """The rounds the sink already holds for ``trial``; None: it cannot tell (trust the state)."""
        return None

    def log_trial_result(self, iteration: int, trial: Any, result: dict) -> None:
        rnd = _round(result)
        seen = self._logged(trial)
        if rnd in seen:
            return
        seen.add(rnd)
        super().log_trial_result(iteration, trial, {k: v for k, v in result.items() if k not in _DROP})

    def get_state(self) -> dict[str, Any] | None:
        table = self.__dict__.get("_fedtune_logged", {})
        return {"logged": {k: sorted(v) for k, v in table.items()}} if table else None

    def set_state(self, state: dict[str, Any]) -> None:
        table: dict[str, set[int]] = self.__dict__.setdefault("_fedtune_logged", {})
        for k, v in (state.get("logged") or {}).items():
            table.setdefault(k, set()).update(int(r) for r in v)


class FedtuneCSVLogger(_OncePerRound, CSVLoggerCallback):
    """Tune's ``progress.csv`` per trial, each round once. The file is the truth: Tune copies it
    back from the storage path only for a trial restored from a checkpoint (a trial restarted
    from round 1 starts a new file, which replaces the old one at the storage path)."""

    def _rounds_in_sink(self, trial: Any) -> set[int] | None:
        if trial not in self._trial_files:
            self._setup_trial(trial)  # Tune's own restore of progress.csv from the storage path
        path = Path(trial.local_path, "progress.csv")
        if not path.is_file():
            return set()
        with path.open(newline="") as f:
            return {int(float(r["training_iteration"])) for r in csv.DictReader(f) if r.get("training_iteration")}


class FedtuneTBXLogger(_OncePerRound, TBXLoggerCallback):
    """Tune's TensorBoard event files per trial (needs ``tensorboardX``), each round once. A
    restarted trial writes a new event file next to the old one; the rounds logged before are
    known from Tune's callback state (so the rounds of the last
    :data:`~fedtune.tune.tune_env.EXPERIMENT_SNAPSHOT_S` seconds before a killed driver may show
    twice)."""


class FedtuneMLflowLogger(_OncePerRound, MLflowLoggerCallback):
    """One MLflow run per trial, each round once; a trial resumed after a driver stop continues
    its MLflow run."""

    def log_trial_start(self, trial: Any) -> None:
        run_ids: dict[str, str] = self.__dict__.setdefault("_fedtune_runs", {})
        if trial not in self._trial_runs and trial.trial_id in run_ids:
            self._trial_runs[trial] = run_ids[trial.trial_id]
        super().log_trial_start(trial)
        run_ids[trial.trial_id] = self._trial_runs[trial]

    def log_trial_result(self, iteration: int, trial: Any, result: dict) -> None:
        if trial not in self._trial_runs:
            self.log_trial_start(trial)
        super().log_trial_result(iteration, trial, result)

    def _rounds_in_sink(self, trial: Any) -> set[int] | None:
        run_id = self._trial_runs.get(trial)
        if run_id is None:
            return None
        client = self.mlflow_util._get_client()
        return {int(m.step) for m in client.get_metric_history(run_id, "training_iteration")}

    def get_state(self) -> dict[str, Any] | None:
        state = super().get_state() or {}
        runs = self.__dict__.get("_fedtune_runs")
        if runs:
            state["runs"] = dict(runs)
        return state or None

    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)
        self.__dict__.setdefault("_fedtune_runs", {}).update(state.get("runs") or {})


def logger_callbacks(loggers: Sequence[str], study_dir: str | Path, study: str, search: str) -> list[Any]:
    """Tune callbacks of ``--logger`` names (already validated by
    :meth:`fedtune.tune.plan.SweepOptions.validate`), in the order given."""
    out: list[Any] = []
    for name in loggers:
        if name == "csv":
            out.append(FedtuneCSVLogger())
        elif name == "tensorboard":
            out.append(FedtuneTBXLogger())
        elif name == "mlflow":
            out.append(FedtuneMLflowLogger(tracking_uri=mlflow_tracking_uri(study_dir), experiment_name=study,
                                           tags={"fedtune_study": study, "fedtune_search": search}))
        else:
            raise ValueError(f"unknown logger {name!r}")
    return out
