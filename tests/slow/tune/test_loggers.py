"""``fedtune sweep --logger csv|tensorboard|mlflow|wandb``: early errors, each (trial, round) once
in every sink (Ray Tune's own logger callbacks, :mod:`fedtune.tune.trial.loggers`), and a tiny real sweep
read back from the CSV files, the TensorBoard event files, the MLflow database and W&B's offline
run files.

The slow tier (the tests/slow/ folder: every test here is marked slow by tests/conftest.py);
the quick tests of the same subject are in tests/tune/test_loggers.py."""

from __future__ import annotations

import csv
import json
import pickle
import struct
import time
from pathlib import Path

import pytest

from tests.tune.test_loggers import _wandb_env


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


def wandb_records(path: Path) -> list:
    """The records of a W&B run file (``run-<id>.wandb``, what ``wandb sync`` uploads): a 7-byte
    header (``:W&B``, magic, version), then LevelDB-log framing in 32 KiB blocks (per chunk: u32
    crc, u16 length, u8 type 1 full / 2 first / 3 middle / 4 last; a block tail under 7 bytes is
    padding) around ``wandb_internal_pb2.Record`` protobufs."""
    from wandb.proto.wandb_internal_pb2 import Record

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    block, i, out, parts = 32768, 7, [], b""
    while i + 7 <= len(data):
        left = block - i % block
        if left < 7:
            i += left
            continue
        _, n, kind = struct.unpack("<IHB", data[i:i + 7])
        if kind == 0:  # zero padding to the end of the block
            i += left
            continue
        parts, i = parts + data[i + 7:i + 7 + n], i + 7 + n
        if kind in (1, 4):
            out.append(Record.FromString(parts))
            parts = b""
    return out


def _wandb_file_is_whole(path: Path) -> bool:
    try:
        return any(r.WhichOneof("record_type") == "exit" for r in wandb_records(path))
    except Exception:  # noqa: BLE001 - a file still being written may end anywhere
        return False


def wandb_runs(wandb_dir: Path, trial_id: str) -> list[tuple[object, list[tuple[int, dict]]]]:
    """Each offline W&B run of ``trial_id`` under ``wandb_dir`` (oldest first): its run record
    (project, group, id, entity) and its history as (step, {key: value})."""
    paths = sorted(wandb_dir.glob(f"offline-run-*-{trial_id}/run-{trial_id}.wandb"))
    # W&B's service process finishes a run file on its own, after the logging actor that ran the run
    # is gone: read each one once it is whole (ends with its exit record), not while it is written
    # (under a load of 12 on 2 cores that took over 60 s once: a clean-clone CI run read a file
    # without its run record)
    deadline = time.time() + 240
    while time.time() < deadline and not all(_wandb_file_is_whole(p) for p in paths):
        time.sleep(0.1)
    unfinished = [str(p) for p in paths if not _wandb_file_is_whole(p)]
    assert not unfinished, f"W&B did not finish these run files in 240 s: {unfinished}"
    runs = []
    for path in paths:
        records = wandb_records(path)
        (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
        history = [(r.history.step.num, {(it.key or "/".join(it.nested_key)): json.loads(it.value_json)
                                         for it in r.history.item})
                   for r in records if r.WhichOneof("record_type") == "history"]
        runs.append((run, history))
    return runs


class _Trial:
    """What Ray's ``WandbLoggerCallback`` reads of a Tune trial."""

    def __init__(self, trial_id: str, local_path: Path):
        local_path.mkdir(parents=True, exist_ok=True)
        self.trial_id, self.local_path, self.experiment_dir_name = trial_id, str(local_path), "fedavg"
        self.config = {"local_lr": 0.05}

    def __str__(self) -> str:
        return f"trial_{self.trial_id}"


@pytest.mark.ray
def test_wandb_logs_each_round_once_across_a_restart_and_a_resumed_driver_and_drops_the_nested_row(
        ray_session, monkeypatch, tmp_path):
    from fedtune.tune.trial.loggers import logger_callbacks

    # Set after Ray started: the logging actor still sees it (fedtune hands the driver's WANDB_* over).
    _wandb_env(monkeypatch, tmp_path, WANDB_ENTITY="fedtune-team")
    study_dir = tmp_path / "st"
    trial = _Trial("t1", study_dir / "tune" / "fedavg" / "trial_t1")

    def result(rnd: int, seen: int) -> dict:
        return {"training_iteration": rnd, "val_acc": rnd / 10 + seen / 100, "done": False,
                "fedtune_row": {"round": rnd, "val_acc": rnd / 10, "config": {"local_lr": 0.05}}}

    first = pickle.loads(pickle.dumps(logger_callbacks(["wandb"], study_dir, "st", "fedavg")[0]))  # as tuner.pkl
    first.setup()
    first.on_trial_start(0, [], trial)
    for rnd, seen in ((1, 0), (2, 0), (1, 1), (2, 1)):  # Tune restarted the trial after round 2
        first.on_trial_result(0, [], trial, result(rnd, seen))
    state = first.get_state()  # the driver stops here; Tune saved the callback's state
    first.on_trial_complete(0, [], trial)
    first.on_experiment_end([trial])
    # W&B names an offline run folder by the second it started: the first run started before
    # on_experiment_end returned, the resumed one starts in a later second
    time.sleep(1.01 - time.time() % 1)

    resumed = pickle.loads(pickle.dumps(logger_callbacks(["wandb"], study_dir, "st", "fedavg")[0]))
    resumed.set_state(state)  # fedtune sweep --resume
    resumed.setup()
    resumed.on_trial_start(0, [], trial)
    for rnd, seen in ((2, 2), (3, 0)):  # restored from its round-1 checkpoint: round 2 again, then 3
        resumed.on_trial_result(0, [], trial, result(rnd, seen))
    resumed.on_trial_complete(0, [], trial)
    resumed.on_experiment_end([trial])

    runs = wandb_runs(study_dir / "wandb", "t1")  # OUTPUT/<study>/wandb/: `wandb sync` takes them from there
    assert len(runs) == 2  # offline, each driver wrote its own run file of the one W&B run t1
    for run, _ in runs:
        assert (run.project, run.run_group, run.run_id, run.entity) == ("st", "fedavg", "t1", "fedtune-team")
    steps = [step for _, history in runs for step, _ in history]
    assert steps == [1, 2, 3]  # each round once over both drivers; the first report of a round wins
    assert [row["val_acc"] for _, history in runs for _, row in history] == pytest.approx([0.1, 0.2, 0.3])
    assert [row["training_iteration"] for _, history in runs for _, row in history] == [1, 2, 3]
    assert not [k for _, history in runs for _, row in history for k in row if k.startswith("fedtune_row")]


@pytest.mark.ray
def test_tiny_sweep_logs_every_round_once_to_csv_tensorboard_mlflow_and_wandb(ray_session, tmp_path, monkeypatch):
    from mlflow import MlflowClient

    from fedtune.results.store import load
    from fedtune.cli import build_parser
    from fedtune.cli_sweep import options_from_args
    from fedtune.tune.trial.loggers import mlflow_tracking_uri
    from fedtune.tune.study.sweep import run_sweep

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    _wandb_env(monkeypatch, tmp_path)  # no WANDB_MODE, no key: W&B offline, into the study
    args = build_parser().parse_args([
        "sweep", "--algorithm", "fedavg", "--rounds", "2", "--num-samples", "2", "--sampler", "random",
        "--max-concurrent", "1", "--set", "local_steps=1", "--set", "model=mlp", "--set", "mlp_hidden=[8]",
        "--set", "max_client_actors=1", "--output", str(tmp_path), "--name", "lg", "--no-report",
        "--logger", "csv", "--logger", "tensorboard", "--logger", "mlflow", "--logger", "wandb"])
    opts = options_from_args(args)
    assert opts.loggers == ("csv", "tensorboard", "mlflow", "wandb")
    study_dir = run_sweep(opts).study_dir

    arrow: dict[str, dict[int, float]] = {}
    for row in load(study_dir).to_pylist():
        arrow.setdefault(row["trial_id"], {})[row["round"]] = row["val_acc"]
    assert len(arrow) == 2 and all(sorted(v) == [1, 2] for v in arrow.values())

    trial_dirs = sorted((study_dir / "tune" / "fedavg").glob("trial_*"))
    assert len(trial_dirs) == 2
    tune_ids: dict[str, str] = {}  # fedtune's trial id -> Tune's (W&B's run id)
    for d in trial_dirs:
        with (d / "progress.csv").open(newline="") as f:
            rows = list(csv.DictReader(f))
        assert [int(r["training_iteration"]) for r in rows] == [1, 2]  # one row per round, no duplicate
        assert not any(k.startswith("fedtune_row") for k in rows[0])  # the nested row is not logged again
        tid = rows[0]["fedtune_trial_id"]
        tune_ids[tid] = rows[0]["trial_id"]
        assert [float(r["val_acc"]) for r in rows] == pytest.approx([arrow[tid][r] for r in (1, 2)])
        tb = tfevents_scalars(d)
        assert tb["ray/tune/val_acc"] == [1, 2] and not any(t.startswith("ray/tune/fedtune_row") for t in tb)

    assert (study_dir / "mlflow.db").is_file() and mlflow_tracking_uri(study_dir).startswith("sqlite:///")
    client = MlflowClient(mlflow_tracking_uri(study_dir))
    experiment = client.get_experiment_by_name("lg")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 2 and {r.data.tags["fedtune_search"] for r in runs} == {"fedavg"}
    series = []
    for run in runs:
        history = sorted(client.get_metric_history(run.info.run_id, "val_acc"), key=lambda m: m.step)
        assert [m.step for m in history] == [1, 2]  # each round once
        series.append([m.value for m in history])
    expected = sorted([v[r] for r in (1, 2)] for v in arrow.values())
    assert [x for s in sorted(series) for x in s] == pytest.approx([x for s in expected for x in s])

    for tid, rounds in arrow.items():  # one offline W&B run per trial: project = study, group = search
        ((run, history),) = wandb_runs(study_dir / "wandb", tune_ids[tid])
        assert (run.project, run.run_group, run.run_id) == ("lg", "fedavg", tune_ids[tid])
        assert [step for step, _ in history] == [1, 2]
        assert [row["val_acc"] for _, row in history] == pytest.approx([rounds[r] for r in (1, 2)])
        assert not any(k.startswith("fedtune_row") for _, row in history for k in row)
