"""Writes that the disk or the folder refuses: a full device (ENOSPC) while a round or a trial row is
written, and an output folder that cannot be written. Each is one line naming the file, with the
finished rounds intact and the trial row written when it can be; an unwritable ``--output`` is
refused before anything runs."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fedtune.results import atomic
from fedtune.results.atomic import ResultsWriteError, StorageFullError
from fedtune.results.store import check_output_dir
from fedtune.cli import main  # noqa: E402
from fedtune.config import FederatedRunConfig  # noqa: E402
from fedtune.errors import ConfigError, ResourceError  # noqa: E402
from fedtune.results.store import ResultsStore, load
from fedtune.results import store as store_mod  # noqa: E402

REAL_WRITE = atomic._write_all  # where a Parquet file's bytes go to the disk (fedtune.results.arrow.write_parquet)


def _full_from(monkeypatch, n: int, *, only: int | None = None, err: int = errno.ENOSPC) -> list[int]:
    """Make the n-th Parquet write (1-based) and every later one fail with ``err`` (``only``: just that
    one) after writing 4 bytes, as a full disk leaves a file; returns the sizes written or refused."""
    calls: list[int] = []

    def write(fd, data):
        calls.append(len(data))
        k_ = len(calls)
        if k_ == n or (only is None and k_ > n):
            os.write(fd, b"PAR1")
            raise OSError(err, os.strerror(err))
        return REAL_WRITE(fd, data)

    monkeypatch.setattr(atomic, "_write_all", write)
    return calls


def _rows(n: int, trial: str = "t") -> list[dict]:
    return [{"trial_id": trial, "round": r, "val_acc": 0.5} for r in range(1, n + 1)]


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    # the run's first note (which augmentation runs) comes before anything is written; the error is one line
    (line,) = [ln for ln in err.strip().splitlines() if not ln.startswith("fedtune: augmentation: ")]
    return line


# --------------------------------------------------------------------------- the store


def test_a_full_disk_is_one_storage_error_and_the_previous_file_stays(tmp_path, monkeypatch):
    store = ResultsStore(tmp_path, "s")
    path = store.write_rounds("t", _rows(1))
    _full_from(monkeypatch, 1)
    with pytest.raises(StorageFullError) as err:
        store.write_rounds("t", _rows(2))
    exc = err.value
    assert isinstance(exc, ResourceError) and isinstance(exc, OSError) and exc.errno == errno.ENOSPC
    assert str(exc).startswith(f"no space left on device writing '{path}'")
    assert exc.path == path
    with pytest.raises(StorageFullError, match="trials.parquet"):
        store.write_trial({"trial_id": "t", "status": "completed"})
    monkeypatch.setattr(atomic, "_write_all", REAL_WRITE)
    assert load(path).num_rows == 1
    assert sorted(p.name for p in store.rounds_dir.iterdir()) == ["t.parquet"]  # no temp file left


@pytest.fixture
def small_disk(tmp_path):
    """A 256 KiB tmpfs: a device that really fills up (pyarrow's own ENOSPC, not a stand-in)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], capture_output=True,
                         text=True, check=False)
    if res.returncode != 0:
        pytest.skip(f"environment: cannot mount a small tmpfs here ({res.stderr.strip()}); the monkeypatched "
                    "ENOSPC tests cover the same code")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(folder: Path) -> Path:
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 512)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return filler


def test_a_run_on_a_disk_that_really_fills_up(small_disk):
    from fedtune.runtime.driver import run

    cfg = FederatedRunConfig.from_dict({"backend": "local", "dataset": "rect4", "rounds": 3, "output": str(small_disk),
                                        "local_steps": 1})
    filler: list[Path] = []
    with pytest.raises(StorageFullError) as err:  # the disk is full from round 2 on
        run(cfg, progress=False, on_round=lambda row: filler.append(_fill(small_disk)) if not filler else None)
    rounds_file = small_disk / "default" / "rounds" / f"{cfg.trial_id()}.parquet"
    msg = str(err.value)
    assert msg.startswith(f"no space left on device writing '{rounds_file}'"), msg
    assert f"finished rounds are intact in '{rounds_file}' (round 1)" in msg
    assert "the trial row could not be written either" in msg
    assert load(rounds_file).column("round").to_pylist() == [1]
    filler[0].unlink()
    assert [p.name for p in rounds_file.parent.iterdir()] == [rounds_file.name]  # no temp file left


def test_a_refused_write_names_the_file_and_the_reason(tmp_path, monkeypatch):
    _full_from(monkeypatch, 1, err=errno.EACCES)
    store = ResultsStore(tmp_path, "s")
    with pytest.raises(ResultsWriteError) as err:
        store.write_rounds("t", _rows(1))
    assert not isinstance(err.value, StorageFullError)
    assert str(err.value).startswith(f"cannot write '{store.rounds_path('t')}': permission denied")


# --------------------------------------------------------------------------- fedtune run


def _run(out: Path, rounds: int = 3) -> int:
    return main(["run", "--backend", "local", "--dataset", "rect4", "--rounds", str(rounds), "--output", str(out),
                 "--no-progress", "--set", "local_steps=1"])


def _trial_id(out: Path, rounds: int = 3) -> str:
    return FederatedRunConfig.from_dict({"backend": "local", "dataset": "rect4", "rounds": rounds,
                                         "output": str(out), "local_steps": 1}).trial_id()


def test_run_on_a_full_disk_is_one_line_with_the_rounds_intact_and_the_trial_row_failed(tmp_path, capsys,
                                                                                          monkeypatch):
    _full_from(monkeypatch, 2, only=2)  # round 2's write fails; the trial row (3rd write) fits
    assert _run(tmp_path) == 2
    line = _one_line(capsys)
    rounds_file = tmp_path / "default" / "rounds" / f"{_trial_id(tmp_path)}.parquet"
    assert line.startswith(f"fedtune: error: no space left on device writing '{rounds_file}'")
    assert f"finished rounds are intact in '{rounds_file}' (round 1)" in line
    assert "status failed" in line
    monkeypatch.setattr(atomic, "_write_all", REAL_WRITE)
    assert load(rounds_file).column("round").to_pylist() == [1]
    (trial,) = load(tmp_path / "default", "trials").to_pylist()
    assert trial["status"] == "failed" and "no space left on device" in trial["error"]
    assert trial["rounds_done"] == 1  # the trial row counts the rounds on disk, not the lost one


def test_run_when_even_the_trial_row_does_not_fit(tmp_path, capsys, monkeypatch):
    _full_from(monkeypatch, 3)  # rounds 1 and 2 fit; round 3 and the trial row do not
    assert _run(tmp_path) == 2
    line = _one_line(capsys)
    assert "no space left on device writing" in line and "(rounds 1-2)" in line
    assert "the trial row could not be written either" in line
    monkeypatch.setattr(atomic, "_write_all", REAL_WRITE)
    assert load(tmp_path / "default").column("round").to_pylist() == [1, 2]
    assert not (tmp_path / "default" / "trials.parquet").exists()


def test_run_whose_first_round_does_not_fit(tmp_path, capsys, monkeypatch):
    _full_from(monkeypatch, 1, only=1)
    assert _run(tmp_path, rounds=2) == 2
    line = _one_line(capsys)
    assert "no round is stored" in line
    monkeypatch.setattr(atomic, "_write_all", REAL_WRITE)
    (trial,) = load(tmp_path / "default", "trials").to_pylist()
    assert trial["status"] == "failed" and trial["rounds_done"] == 0


def test_run_whose_trial_row_alone_does_not_fit(tmp_path, capsys, monkeypatch):
    _full_from(monkeypatch, 3, only=3)  # both rounds fit, the trial row does not
    assert _run(tmp_path, rounds=2) == 2
    line = _one_line(capsys)
    assert "trials.parquet" in line and "(rounds 1-2)" in line
    monkeypatch.setattr(atomic, "_write_all", REAL_WRITE)
    assert load(tmp_path / "default").num_rows == 2


# --------------------------------------------------------------------------- sweeps: the Arrow callback


def _trial(tid: str = "tune0", rounds: int = 3) -> SimpleNamespace:
    cfg = {"backend": "local", "dataset": "rect4", "rounds": rounds, "local_steps": 1}
    return SimpleNamespace(trial_id=tid, config=cfg, num_failures=0)


def test_the_callback_records_a_full_disk_and_stops_the_study(tmp_path, monkeypatch):
    from fedtune.tune.trial.callback import ArrowCallback, write_failure

    cb = ArrowCallback(str(tmp_path), "st")
    trial = _trial()
    row = {"trial_id": "x1", "algorithm": "fedavg", "status": "ok", "val_acc": 0.5}
    cb.on_trial_result(0, [], trial, {"fedtune_row": {**row, "round": 1}})
    _full_from(monkeypatch, 1)
    with pytest.raises(StorageFullError) as err:
        cb.on_trial_result(0, [], trial, {"fedtune_row": {**row, "round": 2}})
    msg = str(err.value)
    rounds_file = tmp_path / "st" / "rounds" / "x1.parquet"
    assert msg.startswith(f"no space left on device writing '{rounds_file}'; round 2 of trial x1 was not written")
    assert "the study stopped" in msg and msg.endswith("then resume the study")
    assert str(write_failure(tmp_path / "st", clear=False)) == msg
    # a trial that ends now: its row does not fit either; recorded, not raised into Tune
    cb.on_trial_complete(0, [], trial)
    failure = write_failure(tmp_path / "st", resume_command="fedtune sweep --resume --name st")
    assert isinstance(failure, StorageFullError) and str(rounds_file) in str(failure)  # the first one
    assert str(failure).endswith("then resume it with: fedtune sweep --resume --name st")
    assert write_failure(tmp_path / "st") is None  # taken
    monkeypatch.setattr(atomic, "_write_all", REAL_WRITE)
    assert load(rounds_file).column("round").to_pylist() == [1]


def test_the_callback_records_a_trial_row_that_does_not_fit(tmp_path, monkeypatch):
    from fedtune.tune.trial.callback import ArrowCallback, write_failure

    cb = ArrowCallback(str(tmp_path), "st")
    trial = _trial(rounds=1)
    cb.on_trial_result(0, [], trial, {"fedtune_row": {"trial_id": "x1", "round": 1, "status": "ok"}})
    _full_from(monkeypatch, 1)
    cb.on_trial_complete(0, [], trial)  # no exception into Tune
    failure = write_failure(tmp_path / "st")
    assert isinstance(failure, StorageFullError) and "trials.parquet" in str(failure)


# --------------------------------------------------------------------------- an output folder that refuses writes


def _unwritable_dir(tmp_path: Path, monkeypatch) -> Path:
    """A folder this process cannot create files in: a read-only folder for a normal user; for root,
    whom permissions do not stop, /sys (sysfs refuses new files, even root's). Where sysfs takes
    root's files too, the read-only folder's refusal is simulated at the probe's write (the real
    probe is tested by test_check_output_dir_probes_by_writing)."""
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    if os.geteuid() != 0:
        return ro
    try:
        fd, probe = tempfile.mkstemp(dir="/sys")
    except OSError:
        return Path("/sys")
    os.close(fd)
    os.unlink(probe)
    from fedtune.results import store

    real = store._create_probe

    def refused_in_ro(folder):
        if Path(folder) == ro or ro in Path(folder).parents:
            raise PermissionError(errno.EACCES, "Permission denied", str(folder))
        real(folder)

    monkeypatch.setattr(store, "_create_probe", refused_in_ro)
    return ro


def test_run_refuses_an_unwritable_output_before_anything_runs(tmp_path, capsys, monkeypatch):
    from fedtune.runtime import driver

    def no_run(*a, **k):
        raise AssertionError("the run started")

    monkeypatch.setattr(driver, "build_plan", no_run)
    out = _unwritable_dir(tmp_path, monkeypatch) / "fedtune-out"
    assert _run(out) == 2
    line = _one_line(capsys)
    assert line.startswith("fedtune: error: field 'output' (--output):") and f"'{out}'" in line
    assert "cannot be written" in line and "allowed:" in line
    assert not out.exists()


def test_sweep_refuses_an_unwritable_output_when_planned(tmp_path, monkeypatch):
    from fedtune.tune.study.options import SweepOptions
    from fedtune.tune.study.plan import plan_study

    out = _unwritable_dir(tmp_path, monkeypatch)
    opts = SweepOptions(algorithms=["fedavg"], rounds=1, num_samples=1, output=str(out), name="s",
                        overrides={"local_steps": 1}, report=False)
    with pytest.raises(ConfigError, match=r"option '--output': .*cannot be written"):
        plan_study(opts)


def test_check_output_dir_probes_by_writing(tmp_path, monkeypatch):
    denied = []

    def refuse(folder):
        denied.append(Path(folder))
        raise PermissionError(errno.EACCES, "Permission denied", str(folder))

    # os.access says yes for root whatever the mode: the check must write, and name what refused it
    monkeypatch.setattr(store_mod, "_create_probe", refuse)
    with pytest.raises(ConfigError) as err:
        check_output_dir(tmp_path / "new" / "deeper", "option '--output'")
    assert denied == [tmp_path]  # the nearest folder that exists
    msg = str(err.value)
    assert msg.startswith(f"option '--output': '{tmp_path / 'new' / 'deeper'}' cannot be written")
    assert f"creating a file in '{tmp_path}' failed: permission denied" in msg
    # an existing study folder is probed itself (a resume into a read-only study)
    (tmp_path / "st" / "rounds").mkdir(parents=True)
    denied.clear()
    with pytest.raises(ConfigError):
        check_output_dir(tmp_path, study="st")
    assert denied == [tmp_path / "st" / "rounds"]
    monkeypatch.undo()
    assert check_output_dir(tmp_path, study="st") == tmp_path
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["rounds", "st"]  # the probe left nothing


def test_report_in_a_folder_that_refuses_writes_is_one_line(tmp_path, capsys, monkeypatch):
    store = ResultsStore(tmp_path, "s")
    store.write_rounds("t", [{**r, "algorithm": "fedavg", "target_acc": 0.4, "status": "ok"} for r in _rows(2)])
    monkeypatch.setattr(store_mod, "_create_probe",
                        lambda folder: (_ for _ in ()).throw(OSError(errno.EROFS, "Read-only file system")))
    assert main(["report", str(store.study_dir), "--no-plots"]) == 2
    line = _one_line(capsys)
    assert f"'{store.study_dir}'" in line and "read-only file system" in line
    assert not store.files.report_md.exists()


def test_report_on_a_full_disk_is_one_line(tmp_path, capsys, monkeypatch):
    store = ResultsStore(tmp_path, "s")
    store.write_rounds("t", [{**r, "algorithm": "fedavg", "target_acc": 0.4, "status": "ok"} for r in _rows(2)])
    real_replace = os.replace

    def full(src, dst, *a, **k):
        if str(dst).endswith("report.md"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_replace(src, dst, *a, **k)

    monkeypatch.setattr(os, "replace", full)
    assert main(["report", str(store.study_dir), "--no-plots"]) == 2
    line = _one_line(capsys)
    assert line == f"fedtune: error: no space left on device writing '{store.files.report_md}'"
    assert sorted(p.name for p in store.study_dir.iterdir()) == ["rounds"]  # no report.md, no temp file


def test_report_on_a_disk_that_really_is_full(small_disk, capsys):
    store = ResultsStore(small_disk, "s")
    store.write_rounds("t", [{**r, "algorithm": "fedavg", "target_acc": 0.4, "status": "ok"} for r in _rows(2)])
    _fill(small_disk)
    assert main(["report", str(store.study_dir)]) == 2
    line = _one_line(capsys)
    assert line.startswith("fedtune: error: no space left on device writing ") and str(store.study_dir) in line
