"""Optuna for teams and concurrent trials: ``fedtune sweep --optuna-storage URL`` (a journal file or a
database outside the study directory; bad URLs refused before anything starts; a killed driver
resumed onto the same storage), TPE's constant liar when trials run side by side, and the
Pareto-front plot of multi-objective (nsga2) studies.

The slow tier (the tests/slow/ folder: every test here is marked slow by tests/conftest.py);
the quick tests of the same subject are in tests/tune/test_optuna_storage.py."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedtune.tune.study.options import SweepOptions
from fedtune.tune.study.sweep import run_sweep

from tests.tune.test_optuna_storage import PNG_MAGIC, TINY, opts


def trial_ids(study_dir: Path) -> list[str]:
    from fedtune.results.store import load

    return sorted(load(study_dir, "trials").column("trial_id").to_pylist())


# ------------------------------------------------------------------------------------------------
# Real studies on the session's Ray (2 CPUs).
@pytest.mark.ray
def test_journal_storage_holds_the_trials_and_concurrent_tpe_lies(ray_session, tmp_path):
    import optuna
    from optuna.storages.journal import JournalFileBackend

    log = tmp_path / "shared" / "optuna.log"
    log.parent.mkdir()
    result = run_sweep(opts(tmp_path, name="j", max_concurrent=2, optuna_storage=f"journal://{log}"))
    study_dir = result.study_dir
    assert not (study_dir / "optuna.db").exists()
    data = json.loads((study_dir / "study.json").read_text())
    assert data["options"]["optuna_storage"] == data["optuna_storage"] == f"journal://{log}"
    assert data["max_concurrent"] == 2 and data["constant_liar"] is True
    journal = optuna.storages.JournalStorage(JournalFileBackend(str(log)))
    study = optuna.load_study(study_name="j/fedavg", storage=journal)
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"]
    assert sorted(t.user_attrs["fedtune_trial_id"] for t in study.trials) == trial_ids(study_dir)
    # the sampler Tune ran (its searcher's saved state): TPE with Optuna's constant liar on
    (state,) = (study_dir / "tune" / "fedavg").glob("searcher-state-*.pkl")
    sampler = pickle.loads(state.read_bytes())["_sampler"]
    assert type(sampler).__name__ == "TPESampler" and sampler._constant_liar is True


@pytest.mark.ray
def test_sqlite_outside_the_study_survives_a_killed_driver_and_nsga2_gets_a_pareto_plot(ray_session, tmp_path):
    import optuna
    from optuna.trial import TrialState

    from fedtune.results.store import load

    team = tmp_path / "team"
    team.mkdir()
    url = f"sqlite:///{team / 'optuna-team.db'}"
    out = tmp_path / "out"
    study_dir = out / "kill"
    cmd = [sys.executable, "-m", "fedtune.cli", "sweep", "--algorithm", "fedavg", "--rounds", "1", "--num-samples", "3",
           "--max-concurrent", "1", "--sampler", "nsga2", "--optuna-storage", url, "--output", str(out),
           "--name", "kill", "--address", ray_session.get_runtime_context().gcs_address, "--no-report",
           *[a for k, v in TINY.items() for a in ("--set", f"{k}={json.dumps(v)}")]]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 180
        while time.time() < deadline and proc.poll() is None:
            if (study_dir / "trials.parquet").is_file() and load(study_dir, "trials").num_rows >= 1 \
                    and any((study_dir / "tune" / "fedavg").glob("experiment_state-*.json")):
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
        os.kill(proc.pid, signal.SIGKILL)  # the driver dies mid-study, after its first trial and a Tune snapshot
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()
    assert len(trial_ids(study_dir)) < 3

    # --resume from another directory: the saved URL is absolute; Tune's pickled searcher reopens it
    result = run_sweep(SweepOptions(output=str(out), name="kill"), resume=True)

    assert not (study_dir / "optuna.db").exists()
    assert optuna.get_all_study_names(storage=url) == ["kill/fedavg"]
    study = optuna.load_study(study_name="kill/fedavg", storage=url)
    assert all(t.state.is_finished() for t in study.trials)
    complete = [t for t in study.trials if t.state == TrialState.COMPLETE]
    # every trial of the Arrow store was told COMPLETE in the team database (the trials the resumed
    # driver ran too: its searcher, unpickled from Tune's experiment, wrote there)
    assert sorted(t.user_attrs["fedtune_trial_id"] for t in complete) == trial_ids(study_dir)
    assert len(complete) == 3 and all(len(t.values) == 2 for t in complete)
    # the budget was spent across the two drivers: done, nothing "ended early"
    assert result.searches["fedavg"]["status"] == "done" and "ended_early" not in result.searches["fedavg"]
    # the rest never ran: asked by the killed driver after Tune's last snapshot, or a draw the
    # restored sampler replayed (a configuration that already ran)
    assert all(t.user_attrs["fedtune_status"] in ("orphaned", "duplicate") for t in study.trials
               if t.state != TrialState.COMPLETE)
    png = result.report.plots["pareto fedavg"]
    assert png == study_dir / "plots" / "pareto_fedavg.png" and png.read_bytes()[:8] == PNG_MAGIC
    assert "(plots/pareto_fedavg.png)" in result.report.markdown_path.read_text()
    assert "kill/fedavg" in " ".join(result.report.importance_notes) + " ".join(result.report.importances)
