"""``fedtune sweep --logger csv|tensorboard|mlflow``: early errors, each (trial, round) once in
every sink (Ray Tune's own logger callbacks, :mod:`fedtune.tune.loggers`), and a tiny real sweep
read back from the CSV files, the TensorBoard event files and the MLflow database."""

from __future__ import annotations

import csv
import struct
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from fedtune.config import ConfigError
from fedtune.tune.plan import SweepOptions


def test_bad_or_missing_loggers_fail_early_naming_the_option_and_the_extra(monkeypatch, tmp_path):
    for loggers, words in ((("wandb",), ["'--logger'", "'wandb'", "allowed: csv, tensorboard, mlflow"]),
                           (("csv", "csv"), ["'--logger'", "twice"])):
        with pytest.raises(ConfigError) as err:
            SweepOptions(loggers=loggers).validate()
        for w in words:
            assert w in str(err.value)
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in ("mlflow", "tensorboardX")
                        else real(name, *a))
    for name, extra in (("mlflow", "fedtune[mlflow]"), ("tensorboard", "fedtune[tensorboard]")):
        with pytest.raises(ConfigError, match=r"option '--logger'.*pip install '" + extra.replace("[", r"\[")):
            SweepOptions(loggers=(name,)).validate()
    SweepOptions(loggers=("csv",)).validate()  # csv needs nothing beyond Ray Tune
    res = subprocess.run([sys.executable, "-m", "fedtune.cli", "sweep", "--logger", "wandb", "--output", str(tmp_path)],
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 2 and "allowed: csv, tensorboard, mlflow" in res.stderr and "Traceback" not in res.stderr


def test_tune_auto_loggers_never_add_a_second_csv_writer(monkeypatch):
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback, TBXLoggerCallback
    from ray.tune.utils.callback import _create_default_callbacks

    from fedtune.tune.loggers import FedtuneCSVLogger, FedtuneTBXLogger
    from fedtune.tune.tune_env import tune_env

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

    from fedtune.tune.loggers import _OncePerRound

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


# ------------------------------------------------------------------------------------------------
def tfevents_scalars(folder: Path) -> dict[str, list[int]]:
    """tag -> steps of every scalar in the TensorBoard event files of ``folder`` (TFRecord framing:
    u64 length, u32 crc, payload, u32 crc)."""
    from tensorboardX.proto.event_pb2 import Event

    steps: dict[str, list[int]] = {}
    for path in sorted(folder.glob("events.out.tfevents.*")):
        data = path.read_bytes()
        i = 0
        while i < len(data):
            (n,) = struct.unpack("<Q", data[i:i + 8])
            event = Event.FromString(data[i + 12:i + 12 + n])
            i += 12 + n + 4
            for v in event.summary.value:
                if v.HasField("simple_value"):
                    steps.setdefault(v.tag, []).append(int(event.step))
    return steps


@pytest.mark.ray
def test_tiny_sweep_logs_every_round_once_to_csv_tensorboard_and_mlflow(ray_session, tmp_path, monkeypatch):
    from mlflow import MlflowClient

    from fedtune import results
    from fedtune.cli import build_parser, options_from_args
    from fedtune.tune.loggers import mlflow_tracking_uri
    from fedtune.tune.sweep import run_sweep

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    args = build_parser().parse_args([
        "sweep", "--algorithm", "fedavg", "--rounds", "3", "--num-samples", "2", "--sampler", "random",
        "--max-concurrent", "1", "--set", "local_steps=1", "--output", str(tmp_path), "--name", "lg", "--no-report",
        "--logger", "csv", "--logger", "tensorboard", "--logger", "mlflow"])
    opts = options_from_args(args)
    assert opts.loggers == ("csv", "tensorboard", "mlflow")
    study_dir = run_sweep(opts).study_dir

    arrow: dict[str, dict[int, float]] = {}
    for row in results.load(study_dir).to_pylist():
        arrow.setdefault(row["trial_id"], {})[row["round"]] = row["val_acc"]
    assert len(arrow) == 2 and all(sorted(v) == [1, 2, 3] for v in arrow.values())

    trial_dirs = sorted((study_dir / "tune" / "fedavg").glob("trial_*"))
    assert len(trial_dirs) == 2
    for d in trial_dirs:
        with (d / "progress.csv").open(newline="") as f:
            rows = list(csv.DictReader(f))
        assert [int(r["training_iteration"]) for r in rows] == [1, 2, 3]  # one row per round, no duplicate
        assert not any(k.startswith("fedtune_row") for k in rows[0])  # the nested row is not logged again
        tid = rows[0]["fedtune_trial_id"]
        assert [float(r["val_acc"]) for r in rows] == pytest.approx([arrow[tid][r] for r in (1, 2, 3)])
        tb = tfevents_scalars(d)
        assert tb["ray/tune/val_acc"] == [1, 2, 3] and not any(t.startswith("ray/tune/fedtune_row") for t in tb)

    assert (study_dir / "mlflow.db").is_file() and mlflow_tracking_uri(study_dir).startswith("sqlite:///")
    client = MlflowClient(mlflow_tracking_uri(study_dir))
    experiment = client.get_experiment_by_name("lg")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 2 and {r.data.tags["fedtune_search"] for r in runs} == {"fedavg"}
    series = []
    for run in runs:
        history = sorted(client.get_metric_history(run.info.run_id, "val_acc"), key=lambda m: m.step)
        assert [m.step for m in history] == [1, 2, 3]  # each round once
        series.append([m.value for m in history])
    expected = sorted([v[r] for r in (1, 2, 3)] for v in arrow.values())
    assert [x for s in sorted(series) for x in s] == pytest.approx([x for s in expected for x in s])
