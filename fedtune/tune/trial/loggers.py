"""``fedtune sweep --logger csv|tensorboard|mlflow|wandb``: Ray Tune's own logger callbacks, each
(trial, round) logged once.

Each logger is a thin subclass of Ray's callback (:class:`~ray.tune.logger.CSVLoggerCallback`,
:class:`~ray.tune.logger.TBXLoggerCallback`,
:class:`~ray.air.integrations.mlflow.MLflowLoggerCallback`,
:class:`~ray.air.integrations.wandb.WandbLoggerCallback`). The subclasses add two things:

* **Once per round.** A trial that Tune restarts (``--max-failures``, or ``--resume`` after a
  driver stop) reports some rounds again. The callback remembers which rounds of which trial it
  logged (in Tune's callback state, so it survives ``--resume``) and skips a round it has
  already logged. The CSV logger also reads back the trial's ``progress.csv`` and the MLflow
  logger the run's metric history, so what is already in the sink wins. Tune's automatic
  loggers stay off (:mod:`fedtune.tune.tuner.env`), so no second CSV or TensorBoard writer runs.
* **No nested row.** The trainable's result carries the whole Arrow row as ``fedtune_row``;
  its numbers are already top-level keys, so it is dropped instead of being logged a second
  time under ``fedtune_row/...``.

Where the files go: CSV and TensorBoard write into each trial's Tune folder
(``OUTPUT/<study>/tune/<search>/trial_<id>/progress.csv`` and ``events.out.tfevents.*``).
MLflow writes to :func:`mlflow_tracking_uri`: ``$MLFLOW_TRACKING_URI`` when set (a team's
tracking server), else a local SQLite database ``OUTPUT/<study>/mlflow.db`` (offline; MLflow 3
refuses its old ``file:`` store unless ``MLFLOW_ALLOW_FILE_STORE=true``). One MLflow experiment
per study, named like the study; one run per trial, tagged with the study and the search.

**Weights & Biases** (``--logger wandb``, ``pip install 'fedtune[wandb]'``): one W&B project per
study, named like the study; one W&B run per trial (run id = Tune's trial id, name = the trial,
config = the trial's hyperparameters), grouped by the search key (``fedavg`` or
``fedavg/<target>``); every round at ``step`` = round. Ray logs each trial from a small actor on
the driver's node; the once-per-round rule and the dropped ``fedtune_row`` apply on the driver,
before a result is queued to it. Where it goes (:func:`wandb_mode`), decided by the driver's
environment each time a sweep starts or resumes:

* nothing set: **offline**, nothing leaves the machine and no login is needed. The runs land in
  ``OUTPUT/<study>/wandb/offline-run-<time>-<trial id>/``; upload them later with
  ``wandb sync OUTPUT/<study>/wandb/offline-run-*``. A ``wandb login`` alone does not switch
  uploading on (a sweep never sends a study anywhere unless the environment says so).
* ``WANDB_API_KEY`` set: **online**, to W&B's server (``WANDB_BASE_URL`` for another one).
* ``WANDB_MODE`` set (``online``, ``offline`` or ``disabled``) wins over the above; with
  ``WANDB_MODE=online`` the credentials may also be those of ``wandb login``.
* ``WANDB_DIR`` set: the ``wandb/`` folder goes there instead of into the study.

fedtune only looks whether ``WANDB_API_KEY`` is set; it never stores or passes a key itself:
Ray hands the driver's key to the logging actor, and fedtune sets the driver's other ``WANDB_*``
variables (``WANDB_ENTITY``, ``WANDB_BASE_URL``, ...) in that actor too (a Ray worker otherwise
sees the environment of the process that started Ray). Online without credentials, an unknown
``WANDB_MODE`` or a study name W&B refuses as a project name (``/ \\ # ? % :``, over 128
characters) is one :class:`~fedtune.errors.ConfigError` line before any trial starts
(:func:`check_wandb`), not a logging actor failing where nobody sees it. A ``--resume``
continues each trial's W&B run (``resume="allow"``) and skips the rounds it logged before (from
Tune's callback state, as TensorBoard; offline, each driver writes its own run folder of the same
run id, and ``wandb sync`` uploads both into that one run).
"""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ray.air.integrations.mlflow import MLflowLoggerCallback
from ray.air.integrations.wandb import WandbLoggerCallback, _WandbLoggingActor
from ray.tune.logger import CSVLoggerCallback, TBXLoggerCallback
from ray.tune.logger.logger import LoggerCallback

from fedtune.errors import ConfigError
from fedtune.tune.common.searches import SEARCH_FIELD, search_of

__all__ = ["MLFLOW_DB", "WANDB_MODES", "FedtuneCSVLogger", "FedtuneMLflowLogger", "FedtuneTBXLogger",
           "FedtuneWandbLogger", "check_wandb", "logger_callbacks", "mlflow_tracking_uri", "wandb_dir",
           "wandb_mode"]

_DROP = ("fedtune_row", "fedtune_warning")  # the whole Arrow row; a message, not a metric


MLFLOW_DB = "mlflow.db"


def mlflow_tracking_uri(study_dir: str | Path) -> str:
    """The MLflow tracking URI of a study: ``$MLFLOW_TRACKING_URI``, else the SQLite database
    ``<study_dir>/mlflow.db``.

    >>> os.environ.pop("MLFLOW_TRACKING_URI", None) and None
    >>> mlflow_tracking_uri("/tmp/out/s")
    'sqlite:////tmp/out/s/mlflow.db'
    """
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path(study_dir).resolve() / MLFLOW_DB}"


WANDB_MODES = ("online", "offline", "disabled")
"""``$WANDB_MODE`` values ``--logger wandb`` takes (W&B's aliases ``run`` = online, ``dryrun`` =
offline too)."""

_WANDB_ALIASES = {"run": "online", "dryrun": "offline"}


def wandb_mode() -> str:
    """W&B's mode for ``--logger wandb``: ``$WANDB_MODE`` when set, else ``online`` when
    ``$WANDB_API_KEY`` is set, else ``offline``; an unknown ``$WANDB_MODE`` is a ConfigError.

    >>> env = {k: os.environ.pop(k) for k in ("WANDB_MODE", "WANDB_API_KEY") if k in os.environ}
    >>> wandb_mode()
    'offline'
    >>> os.environ["WANDB_MODE"] = "sometimes"
    >>> wandb_mode()
    Traceback (most recent call last):
    ...
    fedtune.errors.ConfigError: option '--logger': wandb: WANDB_MODE 'sometimes' is not allowed; allowed: online, offline, disabled (or unset: offline unless WANDB_API_KEY is set)
    >>> del os.environ["WANDB_MODE"]; os.environ.update(env)
    """
    raw = os.environ.get("WANDB_MODE", "").strip().lower()
    if not raw:
        return "online" if os.environ.get("WANDB_API_KEY") else "offline"
    mode = _WANDB_ALIASES.get(raw, raw)
    if mode not in WANDB_MODES:
        raise ConfigError(f"option '--logger': wandb: WANDB_MODE '{os.environ['WANDB_MODE']}' is not allowed; "
                          f"allowed: {', '.join(WANDB_MODES)} (or unset: offline unless WANDB_API_KEY is set)")
    return mode


def wandb_dir(study_dir: str | Path) -> str:
    """The folder W&B writes its ``wandb/`` folder into: ``$WANDB_DIR``, else the study directory."""
    return os.environ.get("WANDB_DIR") or str(Path(study_dir).resolve())


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
    :data:`~fedtune.tune.tuner.env.EXPERIMENT_SNAPSHOT_S` seconds before a killed driver may show
    twice)."""


class FedtuneMLflowLogger(_OncePerRound, MLflowLoggerCallback):
    """One MLflow run per trial, each round once; a trial resumed after a driver stop continues
    its MLflow run."""

    def log_trial_start(self, trial: Any) -> None:
        run_ids: dict[str, str] = self.__dict__.setdefault("_fedtune_runs", {})
        if trial not in self._trial_runs and trial.trial_id in run_ids:
            self._trial_runs[trial] = run_ids[trial.trial_id]
        shared = self.tags
        # a fit of several searches: each run is tagged with its own trial's search
        self.tags = {**shared, "fedtune_search": search_of(trial, shared.get("fedtune_search"))}
        try:
            super().log_trial_start(trial)
        finally:
            self.tags = shared
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


class _FedtuneWandbActor(_WandbLoggingActor):
    """Ray's W&B logging actor, first given the driver's ``WANDB_*`` variables (``fedtune_env``)."""

    def __init__(self, *args: Any, fedtune_env: dict[str, str] | None = None, **kwargs: Any):
        os.environ.update(fedtune_env or {})
        super().__init__(*args, **kwargs)


def check_wandb(study: str) -> str:
    """What ``--logger wandb`` will do for ``study``: its mode (:func:`wandb_mode`), or a
    ConfigError for what W&B would refuse later, in a logging actor, where nobody sees it: an
    unknown ``WANDB_MODE``, online without credentials (neither ``WANDB_API_KEY`` nor a
    ``wandb login``), or a study name that is no W&B project name. Needs ``wandb``; starts no Ray."""
    import wandb  # lazy: an optional extra (fedtune[wandb])

    mode = wandb_mode()
    try:
        wandb.Settings(project=study)
    except Exception as exc:  # noqa: BLE001 -- W&B's own rule, in W&B's words
        reason = str(exc).splitlines()[0]
        raise ConfigError(f"option '--logger': wandb: the study name '{study}' is not a W&B project name ({reason}); "
                          "allowed: a study name (--name) without / \\ # ? % : and of at most 128 characters") from None
    if mode == "online":
        try:
            WandbLoggerCallback(project=study).setup()  # Ray's check: WANDB_API_KEY, else `wandb login`'s key
        except ValueError:
            raise ConfigError(f"option '--logger': wandb: WANDB_MODE={os.environ.get('WANDB_MODE')} needs W&B "
                              "credentials and none were found; allowed: set WANDB_API_KEY, run `wandb login`, or "
                              "unset WANDB_MODE (offline)") from None
    return mode


class FedtuneWandbLogger(_OncePerRound, WandbLoggerCallback):
    """One W&B run per trial in the project ``study``, grouped by ``search``, each round once
    (module docstring: where it goes). :meth:`setup` reads the driver's environment (mode, folder)
    each time Tune starts the callback, so a ``--resume`` follows today's environment."""

    _logger_actor_cls = _FedtuneWandbActor

    def __init__(self, study_dir: str | Path, study: str, search: str):
        super().__init__(project=study, group=search, resume="allow")  # resume: --resume continues a run
        self.fedtune_study_dir = str(Path(study_dir).resolve())

    def configure(self) -> None:
        """Mode and folder from the environment now (:func:`check_wandb`, :func:`wandb_dir`)."""
        self.kwargs.update(mode=check_wandb(self.project), dir=wandb_dir(self.fedtune_study_dir))

    def setup(self, *args: Any, **kwargs: Any) -> None:
        self.configure()

    def _start_logging_actor(self, trial: Any, exclude_results: list[str], **wandb_init_kwargs: Any) -> None:
        # The key stays with Ray's own hand-over (the actor's runtime_env), never in fedtune's kwargs.
        env = {k: v for k, v in os.environ.items() if k.startswith("WANDB_") and k != "WANDB_API_KEY"}
        # a fit of several searches: each run is grouped by its own trial's search
        wandb_init_kwargs["group"] = search_of(trial, wandb_init_kwargs.get("group"))
        wandb_init_kwargs["config"] = {k: v for k, v in (wandb_init_kwargs.get("config") or {}).items()
                                       if k != SEARCH_FIELD}
        super()._start_logging_actor(trial, exclude_results, fedtune_env=env, **wandb_init_kwargs)


def logger_callbacks(loggers: Sequence[str], study_dir: str | Path, study: str, search: str) -> list[Any]:
    """Tune callbacks of ``--logger`` names (already validated by
    :meth:`fedtune.tune.study.options.SweepOptions.validate`), in the order given. ``wandb``'s settings
    are checked here too (:func:`check_wandb`): a ConfigError line before any trial starts, not a
    logging actor failing where nobody sees it."""
    out: list[Any] = []
    for name in loggers:
        if name == "csv":
            out.append(FedtuneCSVLogger())
        elif name == "tensorboard":
            out.append(FedtuneTBXLogger())
        elif name == "mlflow":
            out.append(FedtuneMLflowLogger(tracking_uri=mlflow_tracking_uri(study_dir), experiment_name=study,
                                           tags={"fedtune_study": study, "fedtune_search": search}))
        elif name == "wandb":
            wb = FedtuneWandbLogger(study_dir, study, search)
            wb.configure()
            out.append(wb)
        else:
            raise ValueError(f"unknown logger {name!r}")
    return out
