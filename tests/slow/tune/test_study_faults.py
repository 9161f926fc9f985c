"""Faults in ``fedtune sweep`` studies (issue 44): a disk that fills mid-study (optuna.db refused,
Tune's snapshot cut), checkpoints damaged by a SIGKILL, ``--resume`` with the saved options spelled
again, options and folders checked before anything starts, Ray not starting in time, and a
selection protocol whose validation rows the split file lacks. Each is one line or a faithful
recovery, and afterwards Optuna and the Arrow store agree.

The slow tier (the tests/slow/ folder: every test here is marked slow by tests/conftest.py);
the quick tests of the same subject are in tests/tune/test_study_faults.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fedtune.tune.study.options import SweepOptions

from tests.tune.test_study_faults import KILL_AT_ROUND, TINY_ARGS, _database_full


def _optuna_and_arrow(study_dir: Path, optuna_study: str) -> tuple[dict, dict]:
    """(fedtune trial id -> Optuna's fedtune_status, for every trial but orphans and duplicates;
    fedtune trial id -> trials.parquet status, for every row but interrupted ones)."""
    import optuna

    from fedtune.results.store import load
    from fedtune.tune.common.searches import optuna_storage_url

    study = optuna.load_study(study_name=optuna_study, storage=optuna_storage_url(study_dir))
    told = {t.user_attrs["fedtune_trial_id"]: t.user_attrs.get("fedtune_status") for t in study.trials
            if t.user_attrs.get("fedtune_status") not in ("orphaned", "duplicate")}
    rows = {r["trial_id"]: r["status"] for r in load(study_dir, "trials").to_pylist() if r["status"] != "interrupted"}
    return told, rows


@pytest.mark.ray
def test_a_disk_that_fills_mid_study_is_one_line_and_both_resumes_run_the_studys_options(ray_session, tmp_path,
                                                                                        monkeypatch, capsys):
    from fedtune.cli import main
    from fedtune.results.store import load
    from fedtune.tune.tuner import optuna_search

    real = optuna_search.FedtuneRDBStorage.set_trial_intermediate_value
    calls = []

    def filling(self, *args, **kwargs):  # trial 1's two rounds fit; the disk is full from trial 2's first
        calls.append(1)
        return _database_full() if len(calls) > 2 else real(self, *args, **kwargs)

    monkeypatch.setattr(optuna_search.FedtuneRDBStorage, "set_trial_intermediate_value", filling)
    args = ["sweep", "--algorithm", "fedavg", "--rounds", "2", "--num-samples", "3", "--sampler", "random",
            *TINY_ARGS, "--output", str(tmp_path), "--name", "full", "--no-report"]
    assert main(args) == 2  # a write failure, not exit 130 "interrupted"
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("fedtune:")]
    study_dir = tmp_path / "full"
    assert "Traceback" not in err and "StorageInternalError" not in err and len(lines) == 1, err[-3000:]
    assert lines[0].startswith(f"fedtune: error: no space left on device writing '{study_dir / 'optuna.db'}'")
    assert lines[0].endswith(f"then resume it with: fedtune sweep --resume --name full --output {tmp_path}")
    # The full disk also cut Tune's experiment snapshot (Tune copies it without an atomic rename).
    (snapshot,) = (study_dir / "tune" / "fedavg").glob("experiment_state-*.json")
    snapshot.write_bytes(snapshot.read_bytes()[: snapshot.stat().st_size // 2])
    monkeypatch.setattr(optuna_search.FedtuneRDBStorage, "set_trial_intermediate_value", real)  # space again

    for attempt in (1, 2):  # the resume, then a resume of the finished study: neither is "interrupted"
        capsys.readouterr()
        rc = main(["sweep", "--resume", "--name", "full", "--output", str(tmp_path), "--no-report"])
        out, err = capsys.readouterr()
        assert rc == 0 and "Traceback" not in err and "JSONDecodeError" not in err, err[-3000:]
        said = " ".join(out.split())
        assert (f"Tune's experiment snapshot '{study_dir / 'tune' / 'fedavg' / snapshot.name}' cannot be read"
                in said) == (attempt == 1), said[-3000:]
    assert (study_dir / "tune" / "fedavg" / f"{snapshot.name}.corrupt").is_file()
    rows = load(study_dir, "trials").to_pylist()
    configs = [json.loads(r["config_json"]) for r in rows]
    assert {(c["rounds"], c["local_steps"], c["model"]) for c in configs} == {(2, 1, "mlp")}  # never the defaults
    assert {p.stem for p in (study_dir / "rounds").glob("*.parquet")} == {r["trial_id"] for r in rows}
    told, statuses = _optuna_and_arrow(study_dir, "full/fedavg")
    assert told == statuses and set(statuses.values()) == {"completed"} and len(statuses) == 3


def _killed_driver(tmp_path: Path, args: list[str], env_extra: dict[str, str], site: str) -> None:
    patch = tmp_path / "site"
    patch.mkdir()
    (patch / "sitecustomize.py").write_text(site)
    env = {**os.environ, **env_extra, "TUNE_GLOBAL_CHECKPOINT_S": "0",  # a snapshot at every step
           "PYTHONPATH": os.pathsep.join(p for p in (str(patch), os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run([sys.executable, "-m", "fedtune.cli", *args], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]


def _damage(checkpoint: Path) -> None:
    state = checkpoint / "fedtune_state.json"
    state.write_bytes(state.read_bytes()[:17])  # cut mid-write


@pytest.mark.ray
@pytest.mark.parametrize("damaged", ["all", "all but the oldest"])
def test_a_trial_whose_checkpoints_were_damaged_continues_from_a_readable_one_or_round_1(ray_session, tmp_path,
                                                                                         damaged):
    """A trial checkpointed every round, its driver SIGKILLed at round 4 of 5, its checkpoints then
    damaged (all of them, or all but the round-1 one): --resume fails nothing and duplicates nothing."""
    import shutil

    from fedtune.results.store import load
    from fedtune.tune.study.sweep import run_sweep

    first = tmp_path / "first"
    first.mkdir()
    address = ray_session.get_runtime_context().gcs_address
    _killed_driver(first, ["sweep", "--algorithm", "fedavg", "--rounds", "5", "--num-samples", "1", *TINY_ARGS,
                           "--set", "checkpoint_every=1", "--output", str(first), "--name", "ck", "--no-report",
                           "--address", address], {"KILL_AT_ROUND": "4"}, KILL_AT_ROUND)
    study_dir = tmp_path / "ck"
    shutil.copytree(first / "ck", study_dir)  # a study folder resumes where it is copied
    (rounds_file,) = (study_dir / "rounds").glob("*.parquet")
    before = {r["round"]: r for r in load(rounds_file).to_pylist()}
    assert sorted(before) == [1, 2, 3, 4]
    checkpoints = sorted((study_dir / "tune" / "fedavg").glob("trial_*/checkpoint_*"))
    assert len(checkpoints) == 3, checkpoints  # after rounds 1-3 (Tune's snapshot holds round 2's or 3's)
    for c in checkpoints if damaged == "all" else checkpoints[1:]:
        _damage(c)

    result = run_sweep(SweepOptions(output=str(tmp_path), name="ck", report=False), resume=True)

    (row,) = load(study_dir, "trials").to_pylist()
    assert (row["status"], row["rounds_done"], row["trial_id"]) == ("completed", 5, rounds_file.stem)
    after = load(rounds_file).to_pylist()
    assert sorted(r["round"] for r in after) == [1, 2, 3, 4, 5]  # each round once
    for r in after:  # a run is deterministic: the rounds run again are the rounds that ran
        if r["round"] in before:
            assert (r["train_loss"], r["val_acc"]) == (before[r["round"]]["train_loss"], before[r["round"]]["val_acc"])
    (warning,) = [w for w in result.warnings if "is damaged" in w]
    assert any(f"checkpoint '{c}' is damaged: fedtune_state.json cannot be read" in warning for c in checkpoints[1:])
    if damaged == "all":
        assert warning.endswith("no readable checkpoint is left: it starts again from round 1")
    else:
        assert warning.endswith(f"it continues from the readable checkpoint '{checkpoints[0]}' (round 1)")
