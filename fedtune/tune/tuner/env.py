"""Tune's driver loop, set up for a sweep: how often Tune snapshots its experiment, no per-trial
log files, and (without ``--verbose``) Tune's and Optuna's own output muted while the live view
shows progress.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from fedtune.tune.common.ray_lost import TrialLogFilter

__all__ = ["EXPERIMENT_SNAPSHOT_S", "signal_handlers_kept", "tune_env"]

EXPERIMENT_SNAPSHOT_S = 2.0
"""Seconds between Tune's experiment snapshots (``TUNE_GLOBAL_CHECKPOINT_S``; Ray's default is
adaptive and at least 10 s). A driver killed between two snapshots redoes at most this much
bookkeeping on ``--resume``; set the environment variable to override."""


@contextlib.contextmanager
def tune_env(verbose: bool) -> Iterator[None]:
    """Environment and loggers of Tune's driver loop: experiment snapshots every
    :data:`EXPERIMENT_SNAPSHOT_S`, none of Tune's automatic per-trial CSV/JSON/TensorBoard files
    (``TUNE_DISABLE_AUTO_CALLBACK_LOGGERS=1``: the Arrow store has every result; ``--logger``
    adds its callbacks explicitly, so no file is written twice), and without ``--verbose`` no
    Tune tables or INFO logs of Tune, Optuna or MLflow (the live view shows progress). Restored
    afterwards."""
    env = {"TUNE_GLOBAL_CHECKPOINT_S": str(EXPERIMENT_SNAPSHOT_S), "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1"}
    if not verbose:
        env["RAY_AIR_NEW_OUTPUT"] = "0"  # the legacy engine honours verbose=0; the new one prints a header
        env["MLFLOW_LOGGING_LEVEL"] = "WARNING"  # --logger mlflow: read when mlflow is first imported
    saved = {k: os.environ.get(k) for k in env}
    for k, v in env.items():
        if k == "TUNE_GLOBAL_CHECKPOINT_S" and os.environ.get(k):
            continue
        os.environ[k] = v
    loggers = [logging.getLogger(n) for n in ("ray.tune", "ray.train", "ray.air", "optuna", "mlflow")]
    levels = [lg.level for lg in loggers]
    import optuna  # lazy: keeps optuna, numpy out of this module's import

    optuna_level = optuna.logging.get_verbosity()
    if not verbose:
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        optuna.logging.set_verbosity(optuna.logging.WARNING)

    controller_log = logging.getLogger("ray.tune.execution.tune_controller")
    lost_filter = TrialLogFilter()
    controller_log.addFilter(lost_filter)  # no stack trace of a trial whose node died with Ray
    try:
        with warnings.catch_warnings():
            if not verbose:
                warnings.simplefilter("ignore")
            yield
    finally:
        controller_log.removeFilter(lost_filter)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        for lg, lvl in zip(loggers, levels):
            lg.setLevel(lvl)
        optuna.logging.set_verbosity(optuna_level)


@contextmanager
def signal_handlers_kept() -> Iterator[None]:
    """Put back the SIGINT and SIGUSR1 handlers after a ``Tuner.fit``: Ray Tune installs its own
    graceful-stop handler for the fit and leaves it in place after the fit ends, where it would
    swallow a Ctrl-C or SIGTERM (:func:`~fedtune.runtime.signals.sigterm_as_interrupt` calls the
    SIGINT handler) between searches or while the report is built."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    names = [n for n in ("SIGINT", "SIGUSR1") if hasattr(signal, n)]
    saved = {n: signal.getsignal(getattr(signal, n)) for n in names}
    try:
        yield
    finally:
        for n, handler in saved.items():
            if handler is not None:
                signal.signal(getattr(signal, n), handler)
