"""A study's driver and its resume when things go wrong (issue 19): one driver per study, rows
rebuilt after ``trials.parquet`` was renamed away, a deleted Optuna storage, SIGTERM in every
phase of a sweep, and the options ``--resume`` refuses.

The slow tier (the tests/slow/ folder: every test here is marked slow by tests/conftest.py);
the quick tests of the same subject are in tests/tune/test_study_reliability.py."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedtune.errors import ConfigError
from fedtune.tune.study.options import SweepOptions
from fedtune.tune.study.sweep import run_sweep

from tests.tune.test_study_reliability import TINY, sigterm_a_sweep_in


# ------------------------------------------------------------------------------------------------
# A finished study, resumed after trials.parquet or optuna.db went away.
@pytest.fixture(scope="module")
def finished_study(ray_session, tmp_path_factory):
    """A finished study: 2 searched trials and one --seeds re-run (3 trial rows)."""
    out = tmp_path_factory.mktemp("finished")
    run_sweep(SweepOptions(algorithms=["fedavg"], rounds=2, num_samples=2, seeds=2, output=str(out), name="done",
                           overrides=dict(TINY), sampler="random", max_concurrent=1, report=False))
    return out / "done"


def copy_study(study_dir: Path, tmp_path: Path) -> Path:
    dest = tmp_path / study_dir.name
    shutil.copytree(study_dir, dest)
    return dest


def test_resume_rebuilds_every_missing_trial_row_of_a_finished_study(finished_study, tmp_path):
    from fedtune.results.store import load
    from fedtune.cli_sweep import _any_completed

    study_dir = copy_study(finished_study, tmp_path)
    before = {r["trial_id"]: r for r in load(study_dir, "trials").to_pylist()}
    assert len(before) == 3 and {r["status"] for r in before.values()} == {"completed"}
    # fedtune's advice for an unreadable trials.parquet: rename it to *.corrupt, then --resume
    (study_dir / "trials.parquet").rename(study_dir / "trials.parquet.corrupt")
    # and a driver killed while writing trials.parquet left the atomic writer's temp file
    stray = study_dir / ".trials.parquet.fedtune-0a1b2c3d.tmp"
    stray.write_bytes(b"PAR1 half a file")
    os.utime(stray, (time.time() - 3600, time.time() - 3600))

    result = run_sweep(SweepOptions(output=str(tmp_path), name="done", report=False), resume=True)

    after = {r["trial_id"]: r for r in load(study_dir, "trials").to_pylist()}
    assert sorted(after) == sorted(before)  # the seed re-run's row too (it is not an Optuna trial)
    def config(row):  # the copy lives in another output folder
        return {k: v for k, v in json.loads(row["config_json"]).items() if k != "output"}

    for tid, row in after.items():
        for col in ("status", "rounds_done", "best_val_acc", "best_round", "target_acc_at_best_val", "seed"):
            assert row[col] == before[tid][col], (tid, col)
        assert config(row) == config(before[tid]), tid
    assert _any_completed(study_dir)
    assert sum("rebuilt" in w for w in result.warnings) == 3
    assert not stray.exists() and any(stray.name in w for w in result.warnings)
    from fedtune.reports.report import make_report

    report = make_report(study_dir, plots=False, write=False)
    assert report.cells[("fedavg", report.domains[0])].n == 2  # the two seeds, as before


def test_resume_with_the_optuna_storage_deleted_says_so_and_changes_nothing(finished_study, tmp_path):
    from fedtune.reports.importances import study_optuna

    study_dir = copy_study(finished_study, tmp_path)
    (study_dir / "optuna.db").unlink()
    with pytest.raises(ConfigError) as err:
        run_sweep(SweepOptions(output=str(tmp_path), name="done", report=False), resume=True)
    text = str(err.value)
    assert "Optuna storage" in text and "optuna.db' is missing" in text and "fedavg" in text
    assert "fedtune report" in text and "another --name" in text
    assert not (study_dir / "optuna.db").exists()  # not silently re-created empty
    storage, names, notes = study_optuna(study_dir)  # the report says what happened, not "not an Optuna sweep"
    assert storage is None and "optuna.db is missing" in notes[0]


def _orphan_with_rounds(study_dir: Path, optuna_state: str) -> str:
    """The state two SIGKILLs leave: a trial Optuna asked (left RUNNING, or already closed FAIL as
    orphaned) that Tune's snapshot never held, with its first round on disk and no trials.parquet
    row. Returns its trial id."""
    import optuna

    from fedtune.results.store import ResultsStore, load
    from fedtune.results.study_dir import read_study, write_study
    from fedtune.tune.common.searches import optuna_storage_url
    from fedtune.tune.trial.trainable import trial_run_config

    data = read_study(study_dir)
    key = next(k for k in data["searches"] if not k.endswith(" seeds"))
    study = optuna.load_study(study_name=data["searches"][key]["optuna_study"], storage=optuna_storage_url(study_dir))
    config = dict(study.trials[0].user_attrs["config"], local_lr=0.0123)
    trial_id = trial_run_config(config).trial_id()
    first = study.trials[0].user_attrs["fedtune_trial_id"]
    rows = [dict(r, trial_id=trial_id) for r in load(study_dir / "rounds" / f"{first}.parquet").to_pylist()
            if r["round"] == 1]
    ResultsStore(study_dir.parent, study_dir.name).write_rounds(trial_id, rows)
    asked = study.ask()
    asked.set_user_attr("fedtune_trial_id", trial_id)
    asked.set_user_attr("config", config)
    if optuna_state == "orphaned":  # a driver after it closed it: the search ended
        asked.set_user_attr("fedtune_status", "orphaned")
        study.tell(asked, state=optuna.trial.TrialState.FAIL)
    else:  # the search is unfinished: the resumed driver restores it, and closes the trial at its end
        data["searches"][key]["status"] = "running"
        write_study(study_dir, data)
    return trial_id


@pytest.mark.parametrize("optuna_state", ["orphaned", "running"])
def test_a_trial_no_driver_continued_gets_a_row_and_the_four_records_agree(finished_study, tmp_path,
                                                                           optuna_state):
    """Two SIGKILLs (the first with a trial's rounds on disk, the second while its resume ran) left a
    trial with a round file, no trials.parquet row and Optuna holding it RUNNING or FAIL/orphaned:
    --resume records it as interrupted, and Optuna, trials.parquet, the round files and the report
    name the same trials."""
    import optuna

    from fedtune.reports.report import make_report
    from fedtune.results.store import load
    from fedtune.results.study_dir import read_study
    from fedtune.tune.common.searches import optuna_storage_url

    study_dir = copy_study(finished_study, tmp_path)
    orphan = _orphan_with_rounds(study_dir, optuna_state)

    result = run_sweep(SweepOptions(output=str(tmp_path), name="done", report=False), resume=True)

    rows = {r["trial_id"]: r for r in load(study_dir, "trials").to_pylist()}
    assert rows[orphan]["status"] == "interrupted" and rows[orphan]["rounds_done"] == 1
    assert any(orphan in w and "not continued" in w for w in result.warnings), result.warnings
    round_files = {p.stem for p in (study_dir / "rounds").glob("*.parquet")}
    report = make_report(study_dir, plots=False, write=False)
    assert set(rows) == round_files == set(report.trials["trial_id"]) and len(rows) == 4
    assert report.trials["has_trial_row"].all()
    seeds = set(read_study(study_dir)["searches"]["fedavg seeds"]["trial_ids"][1:])  # --seeds re-runs: not Optuna's
    trials = optuna.load_study(study_name=read_study(study_dir)["searches"]["fedavg"]["optuna_study"],
                               storage=optuna_storage_url(study_dir)).trials
    assert not [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]
    told = {t.user_attrs["fedtune_trial_id"]: (t.state.name, t.user_attrs.get("fedtune_status")) for t in trials}
    assert set(told) == set(rows) - seeds
    assert told[orphan] == ("FAIL", "orphaned")
    assert all(told[t] == ("COMPLETE", "completed") and rows[t]["status"] == "completed" for t in told if t != orphan)


# ------------------------------------------------------------------------------------------------
# Ray lost mid-sweep: one line; after --resume, Optuna and the Arrow store agree.
def _descendants(pid: int) -> list[tuple[int, str]]:
    """(pid, command name) of every descendant of ``pid`` (from /proc; no psutil needed)."""
    parent: dict[int, int] = {}
    names: dict[int, str] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        name = text[text.index("(") + 1:text.rindex(")")]
        fields = text[text.rindex(")") + 2:].split()
        p = int(stat.parent.name)
        parent[p], names[p] = int(fields[1]), name
    out = []
    for p in parent:
        q = p
        while q in parent and q != pid and q > 1:
            q = parent[q]
        if q == pid and p != pid:
            out.append((p, names[p]))
    return out


@pytest.mark.ray
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the raylet through /proc (Linux)")
def test_ray_lost_mid_sweep_is_one_line_and_resume_leaves_optuna_and_arrow_agreeing(ray_session, tmp_path, capsys):
    import optuna

    from fedtune.cli import main
    from fedtune.results.store import load

    args = ["sweep", "--algorithm", "fedavg", "--rounds", "4", "--num-samples", "2", "--set", "local_steps=20",
            "--set", "model=mlp", "--set", "num_cpus=2", "--set", "max_client_actors=1", "--max-concurrent", "1",
            "--output", str(tmp_path), "--name", "lost", "--no-report"]
    # The sweep starts a Ray of its own (its raylet is killed below). Its GCS marks the dead node dead
    # after 3 failed health checks 0.5 s apart instead of Ray's default 5 x 3 s: the same loss, seen sooner.
    env = {**os.environ, "RAY_health_check_period_ms": "500", "RAY_health_check_failure_threshold": "3"}
    proc = subprocess.Popen([sys.executable, "-m", "fedtune.cli", *args], cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.time() + 240
        while time.time() < deadline and proc.poll() is None and not list((tmp_path / "lost" / "rounds").glob("*.parquet")):
            time.sleep(0.05)
        raylets = [p for p, name in _descendants(proc.pid) if name == "raylet"]
        assert proc.poll() is None and raylets, proc.stderr.read()[-3000:] if proc.poll() is not None else "no raylet"
        os.kill(raylets[0], signal.SIGKILL)  # the node is lost mid-trial
        _, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = [line for line in err.splitlines() if line.startswith("fedtune:")]
    assert proc.returncode == 2 and "Traceback" not in err and "ActorDiedError" not in err, err[-3000:]
    assert len(lines) == 1 and "Ray went away" in lines[0] and "--resume --name lost" in lines[0], err[-3000:]

    # The resume command, run by the CLI's main in this process: a new driver of the study, on this
    # session's Ray (already up, so the study's num_cpus, which sizes a Ray fedtune starts, is not used).
    capsys.readouterr()
    rc = main(["sweep", "--resume", "--name", "lost", "--output", str(tmp_path), "--no-report"])
    assert rc == 0, capsys.readouterr().err[-3000:]
    study = optuna.load_study(study_name="lost/fedavg", storage=f"sqlite:///{tmp_path / 'lost' / 'optuna.db'}")
    trials = {r["trial_id"]: r["status"] for r in load(tmp_path / "lost", "trials").to_pylist()}
    optuna_says = {t.user_attrs["fedtune_trial_id"]: t.user_attrs.get("fedtune_status") for t in study.trials
                   if t.state != optuna.trial.TrialState.FAIL or t.user_attrs.get("fedtune_status") != "orphaned"}
    assert optuna_says == trials and set(trials.values()) == {"completed"} and len(trials) == 2


@pytest.mark.parametrize("phase", ["between-searches", "report"])  # "ray-start": tests/tune/test_study_reliability.py
def test_sigterm_ends_every_phase_of_a_sweep_with_exit_130_and_the_resume_line(ray_session, tmp_path, phase, capsys):
    sigterm_a_sweep_in(phase, ray_session, tmp_path, capsys)
