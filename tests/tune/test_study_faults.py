"""Faults in ``fedtune sweep`` studies (issue 44): a disk that fills mid-study (optuna.db refused,
Tune's snapshot cut), checkpoints damaged by a SIGKILL, ``--resume`` with the saved options spelled
again, options and folders checked before anything starts, Ray not starting in time, and a
selection protocol whose validation rows the split file lacks. Each is one line or a faithful
recovery, and afterwards Optuna and the Arrow store agree."""

from __future__ import annotations

import json
import sqlite3
import textwrap
from pathlib import Path

import pytest

from fedtune.errors import ConfigError
from fedtune.tune.study.options import SweepOptions

TINY_ARGS = ["--set", "local_steps=1", "--set", "model=mlp", "--set", "mlp_hidden=[8]", "--set", "max_client_actors=1",
             "--max-concurrent", "1"]


# ------------------------------------------------------------------------------------------------
# A full disk: optuna.db refused mid-study, Tune's snapshot cut; --resume afterwards.
def _database_full(*args, **kwargs):
    """What SQLite says through Optuna when the disk under optuna.db is full."""
    import optuna

    try:
        raise sqlite3.OperationalError("database or disk is full")
    except sqlite3.OperationalError as exc:
        raise optuna.exceptions.StorageInternalError("An exception is raised during the commit.") from exc


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
    from tests.results.test_write_failures import _unwritable_dir

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
    from tests.data import wilds_copies

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
    from tests.data import wilds_copies

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
