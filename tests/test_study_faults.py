"""Faults in ``fedtune sweep`` studies (issue 44): a disk that fills mid-study (optuna.db refused,
Tune's snapshot cut), checkpoints damaged by a SIGKILL, ``--resume`` with the saved options spelled
again, options and folders checked before anything starts, Ray not starting in time, and a
selection protocol whose validation rows the split file lacks. Each is one line or a faithful
recovery, and afterwards Optuna and the Arrow store agree."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fedtune.errors import ConfigError, ResourceError
from fedtune.tune.study.options import SweepOptions

TINY_ARGS = ["--set", "local_steps=1", "--set", "model=mlp", "--set", "mlp_hidden=[8]", "--set", "max_client_actors=1",
             "--max-concurrent", "1"]


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


# ------------------------------------------------------------------------------------------------
# A full disk: optuna.db refused mid-study, Tune's snapshot cut; --resume afterwards.
def _database_full(*args, **kwargs):
    """What SQLite says through Optuna when the disk under optuna.db is full."""
    import optuna

    try:
        raise sqlite3.OperationalError("database or disk is full")
    except sqlite3.OperationalError as exc:
        raise optuna.exceptions.StorageInternalError("An exception is raised during the commit.") from exc


@pytest.mark.ray
@pytest.mark.slow
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


def test_write_error_in_finds_a_full_disk_anywhere_in_the_chain(tmp_path):
    import errno

    import optuna

    from fedtune.results.atomic import StorageFullError, write_error_in
    from fedtune.tune.study.search_fit import study_write_error

    with pytest.raises(optuna.exceptions.StorageInternalError) as caught:
        _database_full()
    err = write_error_in(caught.value, tmp_path / "optuna.db")
    assert isinstance(err, StorageFullError) and err.errno == errno.ENOSPC
    assert str(err) == f"no space left on device writing '{tmp_path / 'optuna.db'}'"
    tune_write = RuntimeError("sync failed")
    tune_write.__cause__ = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "tune" / "x.json"))
    assert str(write_error_in(tune_write, "db")).startswith(f"no space left on device writing '{tmp_path}/tune/x.json'")
    assert write_error_in(ValueError("bad value"), "db") is None
    assert study_write_error(ValueError("bad value"), tmp_path, "resume") is None
    line = str(study_write_error(caught.value, tmp_path, "fedtune sweep --resume --name s"))
    assert line.startswith(f"no space left on device writing '{tmp_path / 'optuna.db'}'; the study stopped")
    assert line.endswith("then resume it with: fedtune sweep --resume --name s")


def test_an_unreadable_snapshot_is_set_aside_and_the_one_before_it_restored(tmp_path):
    from fedtune.tune.tuner.storage import set_aside_unreadable_state

    exp = tmp_path / "exp"
    exp.mkdir()
    for session, state in (("2026-01-01_00-00-00", {"trial_data": []}), ("2026-01-02_00-00-00", {"trial_data": []})):
        (exp / f"experiment_state-{session}.json").write_text(json.dumps(state))
        (exp / f"searcher-state-{session}.pkl").write_bytes(b"x")
    assert set_aside_unreadable_state(exp) == []  # both read: nothing moved
    newest = exp / "experiment_state-2026-01-02_00-00-00.json"
    newest.write_text('{"trial_data": [["cut')
    notes = set_aside_unreadable_state(exp)
    assert len(notes) == 1 and str(newest) in notes[0] and "experiment_state-2026-01-01_00-00-00.json" in notes[0]
    assert sorted(p.name for p in exp.iterdir()) == [
        "experiment_state-2026-01-01_00-00-00.json", "experiment_state-2026-01-02_00-00-00.json.corrupt",
        "searcher-state-2026-01-01_00-00-00.pkl", "searcher-state-2026-01-02_00-00-00.pkl.corrupt"]
    (exp / "experiment_state-2026-01-01_00-00-00.json").write_text("")  # the one before it is empty too
    notes = set_aside_unreadable_state(exp)
    assert len(notes) == 1 and "starts again on its Optuna study" in notes[0]
    assert not list(exp.glob("experiment_state-*.json"))


# ------------------------------------------------------------------------------------------------
# Checkpoints damaged by a SIGKILL: the newest readable one, else round 1.
KILL_AT_ROUND = textwrap.dedent("""
    import os, signal
    from fedtune.tune.trial import callback
    _result = callback.ArrowCallback.on_trial_result

    def on_trial_result(self, *args, **kwargs):
        out = _result(self, *args, **kwargs)
        result = kwargs["result"] if "result" in kwargs else args[3]
        if (result.get("fedtune_row") or {}).get("round") == int(os.environ["KILL_AT_ROUND"]):
            os.kill(os.getpid(), signal.SIGKILL)
        return out

    callback.ArrowCallback.on_trial_result = on_trial_result
""")


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
@pytest.mark.slow
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


def test_reading_a_damaged_checkpoint_names_the_file_and_falls_back_to_an_older_one(tmp_path):
    import numpy as np

    from fedtune.runtime.checkpoint import DamagedCheckpoint, newest_readable_checkpoint, read_checkpoint, write_checkpoint

    state = {"round": 1, "weights": np.arange(3, dtype=np.float32), "rule": {"m": np.ones(2)}}
    for r in (1, 2, 3):
        write_checkpoint(tmp_path / f"checkpoint_00000{r}", dict(state, round=r))
    (tmp_path / "checkpoint_000003" / "arrays.npz").write_bytes(b"PK\x03\x04 cut")
    (tmp_path / "checkpoint_000002" / "weights.npy").write_bytes(b"\x93NUMPY")
    with pytest.raises(DamagedCheckpoint, match="checkpoint_000003' is damaged: arrays.npz cannot be read"):
        read_checkpoint(tmp_path / "checkpoint_000003")
    back, read, damaged = newest_readable_checkpoint(tmp_path / "checkpoint_000003")
    assert back["round"] == 1 and read == tmp_path / "checkpoint_000001"
    assert ["arrays.npz" in damaged[0], "weights.npy" in damaged[1]] == [True, True]
    (tmp_path / "checkpoint_000001" / "fedtune_state.json").write_text('{"format": 1, "round"')
    assert newest_readable_checkpoint(tmp_path / "checkpoint_000003")[:2] == (None, None)
    # another format is not damage: it is refused as before
    (tmp_path / "checkpoint_000001" / "fedtune_state.json").write_text('{"format": 99}')
    with pytest.raises(ValueError, match="has format 99") as err:
        read_checkpoint(tmp_path / "checkpoint_000001")
    assert not isinstance(err.value, DamagedCheckpoint)


# ------------------------------------------------------------------------------------------------
# --resume with the saved options given again, however they are spelled.
def _saved_study(tmp_path: Path, **options) -> Path:
    from fedtune.results.study_dir import write_study

    saved = SweepOptions(algorithms=["fedavg"], output=str(tmp_path), name="s", **options)
    (tmp_path / "s").mkdir()
    write_study(tmp_path / "s", {"options": saved.to_json(), "started_at": "2024-01-01T00:00:00"})
    return tmp_path / "s"


def test_resume_accepts_the_saved_options_after_normalisation_and_names_a_real_change(tmp_path, monkeypatch):
    from fedtune.cli import build_parser
    from fedtune.cli_sweep import options_from_args

    data = tmp_path / "data"
    data.mkdir()
    _saved_study(tmp_path, rounds=3, reduction_factor=3.0, data_root=str(data), storage_path=str(tmp_path / "tune"),
                 overrides={"local_steps": 1})
    monkeypatch.chdir(tmp_path)
    base = ["sweep", "--resume", "--output", str(tmp_path), "--name", "s"]
    # each the study's own value: unset ones as their defaults, relative paths, 3 for 3.0
    same = ["--knobs", "all", "--selection", "val", "--metric", "val_acc", "--dataset", "rotated-digits",
            "--target-domain", "0", "--rounds", "3", "--reduction-factor", "3", "--data-root", "data",
            "--storage-path", "tune", "--set", "local_steps=1", "--num-samples", "8", "--scheduler", "fifo",
            "--sampler-seed", "0"]
    assert options_from_args(build_parser().parse_args(base + same)).name == "s"
    for flag, given, saved in ((["--knobs", "own"], "'own'", "'all' (unset: the default)"),
                               (["--rounds", "10"], "10", "3"),
                               (["--target-domain", "15"], "'15'", "None (unset: the dataset's first domain)"),
                               (["--data-root", "elsewhere"], "'elsewhere'", repr(str(data))),
                               (["--selection", "oracle"], "'oracle'", "'val' (unset: the default)")):
        with pytest.raises(ConfigError) as err:  # with --knobs all, the saved value: only the change is named
            options_from_args(build_parser().parse_args(base + ["--knobs", "all"] + flag))
        text = str(err.value)
        assert f"; {flag[0]} cannot change them ({flag[0]} given {given}, the study's {saved});" in text, text


# ------------------------------------------------------------------------------------------------
# Checked before anything starts: the sampler seed, a read-only --storage-path.
@pytest.mark.parametrize("seed,trial_seeds,words", [(-1, 1, "-1 is out of range; allowed: >= 0 and <= 4294967295"),
                                                    (2**32, 1, "4294967296 is out of range"),
                                                    (2**32 - 1, 2, "seeds the last search's sampler with 4294967296")])
def test_a_sampler_seed_numpy_refuses_is_one_line_before_anything_is_made(tmp_path, capsys, seed, trial_seeds, words):
    from fedtune.cli import main

    rc = main(["sweep", "--algorithm", "fedavg", "--sampler-seed", str(seed), "--trial-seeds", str(trial_seeds),
               "--output", str(tmp_path), "--name", "seedy"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "option '--sampler-seed'" in err and words in err, err
    assert not (tmp_path / "seedy").exists()
    SweepOptions(sampler_seed=2**32 - 1).validate()  # NumPy's largest seed is allowed


def test_a_storage_path_that_refuses_writes_is_one_line_before_anything_is_made(tmp_path, monkeypatch):
    from test_write_failures import _unwritable_dir

    from fedtune.tune.study.sweep import run_sweep

    ro = _unwritable_dir(tmp_path, monkeypatch)
    with pytest.raises(ConfigError) as err:
        run_sweep(SweepOptions(algorithms=["fedavg"], output=str(tmp_path), name="st", storage_path=str(ro / "tune"),
                               report=False))
    assert str(err.value).startswith(f"option '--storage-path': '{ro / 'tune'}' cannot be written")
    assert not (tmp_path / "st").exists()


# ------------------------------------------------------------------------------------------------
# Ray that does not start in time: one line saying what to try.
@pytest.mark.parametrize("command", ["run", "sweep"])
def test_ray_not_starting_in_time_is_one_line_saying_what_to_try(tmp_path, monkeypatch, capsys, command):
    import ray
    import ray._private.services as services

    from fedtune.cli import main

    def too_slow(*args, **kwargs):
        raise Exception("The current node timed out during startup. This could happen because some of the raylet "
                        "failed to startup or the GCS has become overloaded.")

    stopped = []
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(services, "canonicalize_bootstrap_address", lambda addr, temp_dir=None: None)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", too_slow)
    monkeypatch.setattr(ray, "shutdown", lambda: stopped.append(1))  # not the test session's Ray
    args = (["run", "--backend", "ray", "--rounds", "1"] if command == "run"
            else ["sweep", "--algorithm", "fedavg", "--rounds", "1", "--num-samples", "1", "--name", "r"])
    rc = main([*args, "--output", str(tmp_path)])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("fedtune:") and "augmentation" not in ln]
    assert rc == 2 and "Traceback" not in err and len(lines) == 1, err
    assert lines[0].startswith("fedtune: error: Ray did not start on this machine: The current node timed out "
                               "during startup; ")
    assert "retry" in lines[0] and "RAY_gcs_server_port_wait_time_s" in lines[0] and "ray start --head" in lines[0]
    assert stopped  # whatever of Ray did start is stopped


# ------------------------------------------------------------------------------------------------
# A selection whose validation rows the split file lacks; a trial without an objective value.
def test_selecting_by_a_validation_split_the_file_lacks_is_refused_before_the_study(tmp_path):
    import wilds_copies

    from fedtune.tune.study.plan import plan_study

    root = wilds_copies.celeba(tmp_path / "data")
    common = dict(algorithms=["fedavg"], dataset="celeba", data_root=str(root), output=str(tmp_path), rounds=1,
                  overrides={"split_scheme": "official", "image_size": 16, "cache_dir": str(tmp_path / "cache")})
    for selection in (None, "val-f1"):  # None: val, the default
        with pytest.raises(ConfigError) as err:
            plan_study(SweepOptions(selection=selection, **common))
        text = str(err.value)
        assert text.startswith(f"option '--selection': '{selection or 'val'}' selects by ") and "'id_val' rows" in text
        assert "split scheme 'official' of dataset 'celeba' has none" in text and text.endswith("ood-val, ood-val-f1")
    plan_study(SweepOptions(selection="ood-val", **common))  # its OOD validation rows: allowed


def test_a_run_without_id_val_rows_says_why_it_has_no_val_acc(tmp_path, capsys):
    import wilds_copies

    from fedtune.cli import main

    root = wilds_copies.celeba(tmp_path / "data")
    rc = main(["run", "--backend", "local", "--dataset", "celeba", "--data-root", str(root), "--rounds", "1",
               "--set", "split_scheme=official", "--set", "image_size=16", "--set", "local_steps=1",
               "--set", "model=mlp", "--set", "mlp_hidden=[8]", "--set", f"cache_dir={tmp_path / 'cache'}",
               "--output", str(tmp_path / "out"), "--no-progress"])
    out = " ".join(capsys.readouterr().out.split())
    assert rc == 0 and "no round was evaluated" not in out
    assert "split_scheme 'official' has no ID validation rows (id_val)" in out


def test_a_trial_without_an_objective_value_is_failed_in_both_stores(tmp_path):
    from types import SimpleNamespace

    from fedtune.results.store import load
    from fedtune.tune.trial.callback import ArrowCallback
    from fedtune.tune.trial.trainable import trial_run_config

    config = {"rounds": 2, "model": "mlp", "mlp_hidden": [8]}
    tid = trial_run_config(config).trial_id()
    for name, val in (("none", float("nan")), ("some", 0.5)):
        cb = ArrowCallback(str(tmp_path), name, objective=(["val_acc"], ["max"]))
        trial = SimpleNamespace(trial_id="t1", config=config, num_failures=0)
        for r in (1, 2):
            cb.on_trial_result(0, [], trial, {"fedtune_row": {"trial_id": tid, "round": r, "status": "ok",
                                                              "val_acc": val if r == 2 else float("nan")}})
        cb.on_trial_complete(0, [], trial)
        (row,) = load(tmp_path / name, "trials").to_pylist()
        if name == "none":  # Optuna can only tell it FAIL (no_metric): not "completed" here either
            assert row["status"] == "failed" and row["error"].startswith("no round has a finite val_acc")
            assert row["rounds_done"] == 2
        else:
            assert row["status"] == "completed" and row["error"] is None
