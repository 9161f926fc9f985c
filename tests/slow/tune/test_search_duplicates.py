"""A search never spends a trial on a configuration that already ran in it.

The slow tier (the tests/slow/ folder: every test here is marked slow by tests/conftest.py);
the quick tests of the same subject are in tests/tune/test_search_duplicates.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.tune.test_search_duplicates import SLOW_TRIAL_ROW


@pytest.mark.ray
def test_sweep_on_a_two_point_space_runs_two_trials_and_says_why(ray_session, tmp_path, monkeypatch):
    import optuna

    from fedtune.results.store import load
    from fedtune.tune.study.options import SweepOptions
    from fedtune.tune.study.sweep import run_sweep
    from fedtune.tune.tuner import optuna_search

    # 10 duplicates in a row end the search, not 50 (each one an Optuna FAIL trial in SQLite); the seeded
    # random sampler on two points still finds the second one first
    monkeypatch.setattr(optuna_search, "MAX_DUPLICATE_ASKS", 10)

    space = tmp_path / "two.yaml"
    space.write_text("algorithm: fedavg\ncomplete: true\nparams:\n"  # two points: nothing derived
                     "  local_lr: {distribution: categorical, choices: [0.05, 0.1], default: 0.05}\n")
    out = tmp_path / "out"
    result = run_sweep(SweepOptions(spaces=[str(space)], rounds=1, num_samples=4, max_concurrent=1, sampler="random",
                                    output=str(out), name="two",
                                    overrides={"local_steps": 1, "model": "mlp", "mlp_hidden": [8],
                                               "max_client_actors": 1}))

    (state,) = result.searches.values()
    assert state["status"] == "done" and state["ended_early"].startswith("search space exhausted")
    assert any("search space exhausted" in w for w in result.warnings)
    assert any(n.startswith("search 'fedavg' ran fewer trials than asked: search space exhausted")
               for n in result.report.notes)
    trials = load(out / "two", "trials").to_pylist()
    assert sorted(t["hp.local_lr"] for t in trials) == [0.05, 0.1]
    assert {t["status"] for t in trials} == {"completed"}
    study = optuna.load_study(study_name=state["optuna_study"], storage=f"sqlite:///{out / 'two' / 'optuna.db'}")
    complete = [t for t in study.trials if t.state.name == "COMPLETE"]
    assert sorted(t.user_attrs["fedtune_trial_id"] for t in complete) == sorted(t["trial_id"] for t in trials)
    assert all(t.user_attrs["fedtune_status"] == "duplicate" for t in study.trials if t.state.name == "FAIL")


@pytest.mark.ray
def test_driver_killed_between_optunas_tell_and_the_trials_row(ray_session, tmp_path):
    """The interleaving that once failed CI: the second trial is COMPLETE in Optuna, its
    trials.parquet row not written, and Tune's snapshot may not know the trial. The resumed study
    rebuilds the row, never runs that configuration again and runs exactly one more trial."""
    import optuna

    from fedtune.results.store import load
    from fedtune.tune.study.options import SweepOptions
    from fedtune.tune.study.sweep import run_sweep

    (tmp_path / "patch").mkdir()
    (tmp_path / "patch" / "sitecustomize.py").write_text(SLOW_TRIAL_ROW)
    flag, out = tmp_path / "row-pending", tmp_path / "out"
    tiny = {"local_steps": 1, "model": "mlp", "mlp_hidden": [8], "max_client_actors": 1}
    cmd = [sys.executable, "-m", "fedtune.cli", "sweep", "--algorithm", "fedavg", "--rounds", "1", "--num-samples", "3",
           "--max-concurrent", "1", "--sampler", "nsga2", "--output", str(out), "--name", "k", "--no-report",
           "--address", ray_session.get_runtime_context().gcs_address,
           *[a for k, v in tiny.items() for a in ("--set", f"{k}={json.dumps(v)}")]]
    env = {**os.environ, "SLOW_ROW_AT": "2", "SLOW_ROW_FLAG": str(flag),
           "PYTHONPATH": os.pathsep.join(p for p in (str(tmp_path / "patch"), os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 180
        while time.time() < deadline and proc.poll() is None and not flag.exists():
            time.sleep(0.05)
        assert flag.exists(), proc.stderr.read().decode()[-3000:] if proc.poll() is not None else "no second trial"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()
    study_dir, storage = out / "k", f"sqlite:///{out / 'k' / 'optuna.db'}"
    told = [t for t in optuna.load_study(study_name="k/fedavg", storage=storage).trials if t.state.name == "COMPLETE"]
    assert len(told) == 2 and len(load(study_dir, "trials").to_pylist()) == 1  # the race, set up

    result = run_sweep(SweepOptions(output=str(out), name="k"), resume=True)

    rows = {r["trial_id"]: r for r in load(study_dir, "trials").to_pylist()}
    second = told[1].user_attrs["fedtune_trial_id"]
    assert len(rows) == 3 and rows[second]["status"] == "completed"
    assert any(w.startswith(f"trial {second} had no trials.parquet row") for w in result.warnings)
    study = optuna.load_study(study_name="k/fedavg", storage=storage)
    complete = [t.user_attrs["fedtune_trial_id"] for t in study.trials if t.state.name == "COMPLETE"]
    assert sorted(complete) == sorted(rows)  # one Optuna record per trial: nothing run twice, nothing lost
    assert result.searches["fedavg"]["status"] == "done" and "ended_early" not in result.searches["fedavg"]
