"""``fedtune sweep --logger csv|tensorboard|mlflow|wandb``: early errors, each (trial, round) once
in every sink (Ray Tune's own logger callbacks, :mod:`fedtune.tune.trial.loggers`), and a tiny real sweep
read back from the CSV files, the TensorBoard event files, the MLflow database and W&B's offline
run files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from fedtune.errors import ConfigError
from fedtune.tune.study.options import SweepOptions


def test_bad_or_missing_loggers_fail_early_naming_the_option_and_the_extra(monkeypatch, tmp_path):
    for loggers, words in ((("neptune",), ["'--logger'", "'neptune'", "allowed: csv, tensorboard, mlflow, wandb"]),
                           (("csv", "csv"), ["'--logger'", "twice"])):
        with pytest.raises(ConfigError) as err:
            SweepOptions(loggers=loggers).validate()
        for w in words:
            assert w in str(err.value)
    SweepOptions(loggers=("wandb",)).validate()  # installed here (the test extra): accepted
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in ("mlflow", "tensorboardX", "wandb")
                        else real(name, *a))
    for name, extra in (("mlflow", "fedtune[mlflow]"), ("tensorboard", "fedtune[tensorboard]"),
                        ("wandb", "fedtune[wandb]")):
        with pytest.raises(ConfigError, match=r"option '--logger'.*pip install '" + extra.replace("[", r"\[")):
            SweepOptions(loggers=(name,)).validate()
    SweepOptions(loggers=("csv",)).validate()  # csv needs nothing beyond Ray Tune
    res = subprocess.run([sys.executable, "-m", "fedtune.cli", "sweep", "--logger", "neptune", "--output",
                          str(tmp_path)], capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 2 and "allowed: csv, tensorboard, mlflow, wandb" in res.stderr
    assert "Traceback" not in res.stderr


def test_tune_auto_loggers_never_add_a_second_csv_writer(monkeypatch):
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback, TBXLoggerCallback
    from ray.tune.utils.callback import _create_default_callbacks

    from fedtune.tune.trial.loggers import FedtuneCSVLogger, FedtuneTBXLogger
    from fedtune.tune.tuner.env import tune_env

    def count(callbacks, cls):
        return sum(isinstance(c, cls) for c in callbacks)

    # Even with Tune's automatic loggers on, ours are Tune's classes, so Tune adds no second one.
    monkeypatch.setenv("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "0")
    auto_on = _create_default_callbacks([FedtuneCSVLogger(), FedtuneTBXLogger()], air_verbosity=None)
    assert count(auto_on, CSVLoggerCallback) == 1 and count(auto_on, TBXLoggerCallback) == 1
    assert count(auto_on, JsonLoggerCallback) == 1  # the automatic one: proof the switch was on
    # A sweep runs with them off: --logger csv is then the only CSV writer.
    with tune_env(verbose=False):
        off = _create_default_callbacks([FedtuneCSVLogger()], air_verbosity=None)
    assert count(off, CSVLoggerCallback) == 1 and count(off, JsonLoggerCallback) == 0


def test_a_round_reported_again_is_logged_once_and_the_state_survives_a_restore():
    from ray.tune.logger import LoggerCallback

    from fedtune.tune.trial.loggers import _OncePerRound

    # _OncePerRound passes what it logs to the next class: a recording sink stands for Ray's logger
    class Sink(LoggerCallback):
        def log_trial_result(self, iteration, trial, result):
            sink.got.append((trial.trial_id, result["training_iteration"], tuple(sorted(result))))

    class Logger(_OncePerRound, Sink):
        pass

    sink = SimpleNamespace(got=[])
    a, b = SimpleNamespace(trial_id="a"), SimpleNamespace(trial_id="b")
    lg = Logger()
    for trial, rnd in ((a, 1), (a, 2), (b, 1), (a, 2), (a, 1), (a, 3)):  # a restarted after round 2
        lg.on_trial_result(0, [], trial, {"training_iteration": rnd, "val_acc": 0.5, "fedtune_row": {"x": 1}})
    assert [(t, r) for t, r, _ in sink.got] == [("a", 1), ("a", 2), ("b", 1), ("a", 3)]
    assert all("fedtune_row" not in keys and "val_acc" in keys for _, _, keys in sink.got)
    restored = Logger()  # a driver restart: Tune hands the saved state back
    restored.set_state(lg.get_state())
    for rnd in (1, 2, 3, 4):
        restored.on_trial_result(0, [], a, {"training_iteration": rnd})
    assert [(t, r) for t, r, _ in sink.got][4:] == [("a", 4)]


def _wandb_env(monkeypatch, tmp_path: Path, **env: str) -> None:
    """Only ``env`` of W&B's settings, and no W&B login of this machine's user."""
    import os

    for k in [k for k in os.environ if k.startswith("WANDB_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("NETRC", str(tmp_path / "home" / ".netrc"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "home" / "wandb-config"))
    for k, v in env.items():
        monkeypatch.setenv(k, v)


def test_wandb_is_offline_unless_the_user_says_otherwise_and_bad_settings_fail_early(monkeypatch, tmp_path):
    from fedtune.tune.trial.loggers import logger_callbacks, wandb_mode

    _wandb_env(monkeypatch, tmp_path)
    assert wandb_mode() == "offline"  # nothing set: offline (nothing leaves the machine)
    monkeypatch.setenv("WANDB_API_KEY", "not-a-real-key")
    assert wandb_mode() == "online"  # a key in the environment: the user wants W&B's server
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert wandb_mode() == "offline"  # WANDB_MODE wins
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_mode() == "disabled"
    (cb,) = logger_callbacks(["wandb"], tmp_path / "s", "s", "fedavg/A")
    assert (cb.project, cb.group, cb.kwargs["mode"], cb.kwargs["dir"]) == ("s", "fedavg/A", "disabled",
                                                                           str((tmp_path / "s").resolve()))
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "elsewhere"))
    assert logger_callbacks(["wandb"], tmp_path / "s", "s", "fedavg")[0].kwargs["dir"] == str(tmp_path / "elsewhere")

    monkeypatch.setenv("WANDB_MODE", "sometimes")
    with pytest.raises(ConfigError, match=r"^option '--logger': wandb: WANDB_MODE 'sometimes' is not allowed; "
                                          r"allowed: online, offline, disabled"):
        logger_callbacks(["wandb"], tmp_path / "s", "s", "fedavg")
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.delenv("WANDB_API_KEY")
    with pytest.raises(ConfigError) as err:  # online, and neither a key nor a `wandb login`: before anything runs
        logger_callbacks(["wandb"], tmp_path / "s", "s", "fedavg")
    assert str(err.value).startswith("option '--logger': wandb: WANDB_MODE=online needs W&B credentials")
    assert "WANDB_API_KEY" in str(err.value) and "wandb login" in str(err.value) and "\n" not in str(err.value)
    monkeypatch.delenv("WANDB_MODE")
    with pytest.raises(ConfigError, match=r"^option '--logger': wandb: the study name 'a:b' is not a W&B project "
                                          r"name .*; allowed: .*--name"):
        logger_callbacks(["wandb"], tmp_path / "a:b", "a:b", "fedavg")
