"""``fedtune sweep --resume`` of an ASHA study (Ray issue 30838: ``Tuner.restore`` does not
restore a scheduler's state). A tiny ASHA study is interrupted (Ctrl-C: SIGTERM), then resumed;
what happens is pinned here and said in docs/sweep.md ("Resume"):

* the study completes, every (trial, round) once in the Arrow store and in ``--logger csv``;
* trials that ended before the interruption, ASHA's stopped ones included, stay as they were;
* ASHA itself comes back (it is pickled in Tune's ``tuner.pkl``) but with its rungs as they were
  when the search started: empty. Trials after the resume are compared only with results
  reported after the resume, so the first trial to reach a rung is never stopped there, and
  ASHA stops fewer trials than it would have without the break.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

# the same study as test_sweep's uninterrupted ASHA test, and its way of stopping a driver at a chosen point
from tests.tune.test_sweep import ASHA_SPACE, TINY_SET, paused_driver, wait_until_paused


@pytest.mark.ray
def test_resumed_asha_study_completes_keeps_stopped_trials_and_starts_with_empty_rungs(ray_session, tmp_path,
                                                                                       monkeypatch):
    from optuna.trial import TrialState
    from ray.tune.schedulers import async_hyperband

    from fedtune.results.store import load
    from fedtune.tune.study.options import SweepOptions
    from fedtune.tune.common.searches import optuna_storage_url
    from fedtune.tune.study.sweep import run_sweep

    space = tmp_path / "space.yaml"
    space.write_text(ASHA_SPACE)
    study_dir = tmp_path / "asha"
    # As in test_sweep's ASHA study: seeded random sampling draws local_lr 0.2, 0.2, 1e-5, 1e-5; run
    # without a break, ASHA stops both lr = 1e-5 trials after round 1 (test_sweep pins that).
    cmd = [sys.executable, "-m", "fedtune.cli", "sweep", str(space), "--rounds", "3", "--num-samples", "4",
           "--scheduler", "asha", "--grace-period", "1", "--reduction-factor", "2", "--sampler", "random",
           "--sampler-seed", "13", "--max-concurrent", "1", "--set", "local_steps=2", *TINY_SET, "--logger", "csv",
           "--output", str(tmp_path), "--name", "asha", "--no-report",
           "--address", ray_session.get_runtime_context().gcs_address]
    env, flag, go = paused_driver(tmp_path, "end:2")  # the driver holds once its second trial has ended
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_until_paused(proc, flag)
        # Ctrl-C (SIGTERM reads the same): Tune stops gracefully and saves its experiment, with
        # every trial that has ended; fedtune exits 130 and says how to resume.
        os.kill(proc.pid, signal.SIGTERM)
        go.touch()
        assert proc.wait(timeout=120) == 130, proc.stderr.read().decode()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()
    before = {t["trial_id"]: t for t in load(study_dir, "trials").to_pylist()}
    rounds_before = {}
    for row in load(study_dir).to_pylist():
        rounds_before.setdefault(row["trial_id"], set()).add(row["round"])
    assert len(before) >= 2 and sum(1 in r for r in rounds_before.values()) >= 2  # rung 1 had results
    assert len(before) < 4, "the interruption came after the last trial: nothing left to resume"

    # Watch ASHA's rungs at every decision of the resumed driver (it runs in this process).
    seen: list[dict] = []
    on_result = async_hyperband._Bracket.on_result

    def spy(self, trial, cur_iter, cur_rew):
        seen.append({"trial": trial.trial_id, "iter": cur_iter,
                     "rungs": {int(m): dict(rec) for m, rec in self._rungs}})
        action = on_result(self, trial, cur_iter, cur_rew)
        seen[-1]["action"] = action
        return action

    monkeypatch.setattr(async_hyperband._Bracket, "on_result", spy)
    before_resume = json.loads((study_dir / "study.json").read_text())  # the killed driver's
    run_sweep(SweepOptions(output=str(tmp_path), name="asha", report=False), resume=True)

    # The study completed; every (trial, round) once; Optuna holds every trial in a finished state.
    data = json.loads((study_dir / "study.json").read_text())
    assert data["searches"]["fedavg"]["status"] == "done"
    rows: dict[str, dict[int, dict]] = {}
    for row in load(study_dir).to_pylist():
        assert row["round"] not in rows.setdefault(row["trial_id"], {}), ("duplicate", row["trial_id"], row["round"])
        rows[row["trial_id"]][row["round"]] = row
    trials = {t["trial_id"]: t for t in load(study_dir, "trials").to_pylist()}
    assert set(trials) == set(rows) and len(trials) == 4
    for tid, t in trials.items():
        assert sorted(rows[tid]) == list(range(1, max(rows[tid]) + 1))
        assert (t["status"] == "completed") == (max(rows[tid]) == 3)
    # the search's start is the first driver's (the resume keeps it): before every trial, before its end
    from datetime import datetime

    started = datetime.fromisoformat(data["searches"]["fedavg"]["started_at"])
    assert started <= min(t["started_at"] for t in trials.values())
    assert started <= datetime.fromisoformat(data["searches"]["fedavg"]["ended_at"])
    assert data["searches"]["fedavg"]["started_at"] == before_resume["searches"]["fedavg"]["started_at"]
    import optuna

    study = optuna.load_study(study_name="asha/fedavg", storage=optuna_storage_url(study_dir))
    complete_or_pruned = [t for t in study.trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert len(complete_or_pruned) == 4 and all(t.state.is_finished() for t in study.trials)

    # Trials that had ended before the interruption (completed or stopped by ASHA) stay as they were.
    for tid, t in before.items():
        assert trials[tid]["status"] == t["status"] and set(rows[tid]) == rounds_before[tid]

    # ASHA came back (it decided every result after the resume) with empty rungs: the results two
    # trials recorded at rung 1 before the interruption are gone.
    assert seen, "ASHA made no decision after the resume"
    assert all(not rec for rec in seen[0]["rungs"].values()), seen[0]
    first = [s for s in seen if s["trial"] == seen[0]["trial"]]
    assert [s["iter"] for s in first] == [1, 2, 3] and {s["action"] for s in first} == {"CONTINUE"}
    # What that costs: run without a break, ASHA stops both lr = 1e-5 trials after round 1
    # (test_sweep); judged only against post-resume results, the first one now runs all 3 rounds.
    lr = {tid: json.loads(t["config_json"]).get("local_lr") for tid, t in trials.items()}
    after = [tid for tid in trials if tid not in before]
    assert after and all(lr[tid] == 1e-5 for tid in after)
    assert any(trials[tid]["status"] == "completed" and sorted(rows[tid]) == [1, 2, 3] for tid in after)
    # --logger csv: one row per round in each trial's progress.csv, also across the resume.
    paths = sorted((study_dir / "tune" / "fedavg").glob("trial_*/progress.csv"))
    assert len(paths) == 4
    for path in paths:
        with path.open(newline="") as f:
            its = [int(r["training_iteration"]) for r in csv.DictReader(f)]
        assert its == sorted(set(its)) and its == list(range(1, len(its) + 1)), (path, its)


HB_COMMON = ["--rounds", "3", "--num-samples", "6", "--scheduler", "hyperband", "--grace-period", "1",
             "--reduction-factor", "2", "--sampler", "random", "--sampler-seed", "13", "--max-concurrent", "1",
             "--set", "local_steps=2", *TINY_SET, "--name", "hb", "--no-report"]


def hb_outcome(root):
    """Per Optuna trial of the HyperBand study in ``root``: (number, local_lr, Optuna state, rounds it
    reported, rounds in the Arrow store, trials.parquet status); each (trial, round) stored once."""
    import optuna

    from fedtune.results.store import load
    from fedtune.tune.common.searches import optuna_storage_url

    study = optuna.load_study(study_name="hb/fedavg", storage=optuna_storage_url(root / "hb"))
    rows = {}
    for row in load(root / "hb").to_pylist():
        assert row["round"] not in rows.setdefault(row["trial_id"], set()), ("duplicate", row)
        rows[row["trial_id"]].add(row["round"])
    status = {t["trial_id"]: t["status"] for t in load(root / "hb", "trials").to_pylist()}
    return [(t.number, t.params["local_lr"], t.state.name, sorted(t.intermediate_values),
             sorted(rows[t.user_attrs["fedtune_trial_id"]]), status[t.user_attrs["fedtune_trial_id"]])
            for t in study.trials]


@pytest.fixture(scope="module")
def unbroken_hb(ray_session, tmp_path_factory):
    """The HyperBand study below run without a break: its :func:`hb_outcome`."""
    from fedtune.tune.study.options import SweepOptions
    from fedtune.tune.study.sweep import run_sweep
    from tests.tune.test_sweep import TINY

    root = tmp_path_factory.mktemp("unbroken")
    space = root / "space.yaml"
    space.write_text(ASHA_SPACE)
    run_sweep(SweepOptions(spaces=[str(space)], rounds=3, num_samples=6, scheduler="hyperband", grace_period=1,
                           reduction_factor=2.0, max_concurrent=1, name="hb", output=str(root),
                           overrides=dict(TINY, local_steps=2), sampler="random", sampler_seed=13, report=False))
    unbroken = hb_outcome(root)
    assert [o[2] for o in unbroken].count("PRUNED") >= 2  # the study prunes something to compare
    for t in unbroken:
        assert t[3] == t[4] and (t[2] == "PRUNED") == (t[5] == "pruned")  # Optuna and Arrow agree
    return unbroken


@pytest.mark.ray
def test_a_resumed_hyperband_study_prunes_exactly_as_an_unbroken_one(ray_session, tmp_path, unbroken_hb):
    """``--scheduler hyperband`` keeps its rungs in the Optuna study (Optuna's HyperbandPruner), so
    unlike ASHA above a resume loses nothing: the same study interrupted after two trials and
    resumed prunes the same trials at the same rounds as it does without the break (seeded random
    sampling draws local_lr 0.2, 0.2, 1e-5, 1e-5, 0.2, 1e-5; the study name, which places trials in
    HyperBand's brackets, is the same for both)."""
    from fedtune.results.store import load
    from fedtune.tune.study.options import SweepOptions
    from fedtune.tune.study.sweep import run_sweep

    space = tmp_path / "space.yaml"
    space.write_text(ASHA_SPACE)
    cmd = [sys.executable, "-m", "fedtune.cli", "sweep", str(space), *HB_COMMON, "--output", str(tmp_path / "broken"),
           "--address", ray_session.get_runtime_context().gcs_address]
    env, flag, go = paused_driver(tmp_path, "end:2")  # held once its second trial has ended
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_until_paused(proc, flag)
        os.kill(proc.pid, signal.SIGTERM)
        go.touch()
        assert proc.wait(timeout=120) == 130, proc.stderr.read().decode()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()
    assert len(load(tmp_path / "broken" / "hb", "trials").to_pylist()) < 6, "nothing left to resume"
    run_sweep(SweepOptions(output=str(tmp_path / "broken"), name="hb", report=False), resume=True)
    assert hb_outcome(tmp_path / "broken") == unbroken_hb


KILL_AFTER_PRUNE = textwrap.dedent("""
    import os, signal
    from fedtune.tune.tuner import optuna_search as m
    _complete = m.FedtuneOptunaSearch.on_trial_complete

    def on_trial_complete(self, trial_id, result=None, error=False):
        _complete(self, trial_id, result, error)
        ot = self._ot_trials.get(trial_id)
        frozen = self._frozen(ot) if ot is not None else None
        if frozen is not None and frozen.state.name == "PRUNED":  # told Optuna, before Tune's next snapshot
            with open(os.environ["PRUNED_FLAG"], "w") as f:
                f.write(frozen.user_attrs["fedtune_trial_id"])
            os.kill(os.getpid(), signal.SIGKILL)

    m.FedtuneOptunaSearch.on_trial_complete = on_trial_complete
""")


@pytest.mark.ray
def test_a_trial_hyperband_pruned_just_before_a_sigkill_stays_pruned(ray_session, tmp_path, unbroken_hb):
    """The driver is SIGKILLed right after Optuna recorded HyperBand's first prune, before Tune's
    next experiment snapshot (one at every step here), which still holds the trial running: the
    resume does not run it again (it ran 3 rounds and was stored completed, Optuna saying pruned),
    and the study ends exactly as the unbroken one, both stores agreeing."""
    from fedtune.tune.study.options import SweepOptions
    from fedtune.tune.study.sweep import run_sweep

    space = tmp_path / "space.yaml"
    space.write_text(ASHA_SPACE)
    patch, flag = tmp_path / "site", tmp_path / "pruned"
    patch.mkdir()
    (patch / "sitecustomize.py").write_text(KILL_AFTER_PRUNE)
    env = {**os.environ, "PRUNED_FLAG": str(flag), "TUNE_GLOBAL_CHECKPOINT_S": "0",
           "PYTHONPATH": os.pathsep.join(p for p in (str(patch), os.environ.get("PYTHONPATH")) if p)}
    cmd = [sys.executable, "-m", "fedtune.cli", "sweep", str(space), *HB_COMMON, "--output", str(tmp_path),
           "--address", ray_session.get_runtime_context().gcs_address]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == -signal.SIGKILL and flag.is_file(), proc.stderr[-3000:]
    pruned = flag.read_text()

    result = run_sweep(SweepOptions(output=str(tmp_path), name="hb", report=False), resume=True)

    resumed = hb_outcome(tmp_path)
    assert resumed == unbroken_hb
    mine = [o for o, t in zip(resumed, _trial_ids(tmp_path)) if t == pruned]
    assert len(mine) == 1 and mine[0][2] == "PRUNED" and mine[0][5] == "pruned" and mine[0][4] == mine[0][3]
    assert any(f"fedtune trial {pruned}: PRUNED at round {mine[0][3][-1]}" in w and "not run again" in w
               for w in result.warnings), result.warnings


def _trial_ids(root):
    import optuna

    from fedtune.tune.common.searches import optuna_storage_url

    return [t.user_attrs["fedtune_trial_id"] for t in
            optuna.load_study(study_name="hb/fedavg", storage=optuna_storage_url(root / "hb")).trials]
