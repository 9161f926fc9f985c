"""``fedtune sweep``: option and input validation (no Ray), the Optuna bookkeeping of
FedtuneOptunaSearch (PRUNED / FAIL / COMPLETE, intermediate values), and three small real
studies on the session's Ray: ASHA -> PRUNED, a driver killed with SIGKILL then ``--resume``
(exactly-once rounds, Optuna completeness) followed by the ``--seeds`` re-run (mean ± se).

The slow tier (the tests/slow/ folder: every test here is marked slow by tests/conftest.py);
the quick tests of the same subject are in tests/tune/test_sweep.py."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from fedtune.tune.study.options import SweepOptions
from fedtune.tune.study.sweep import run_sweep

from tests.tune.test_sweep import (ASHA_SPACE, GP_SPACE, TINY, TINY_SET, load_optuna, opts, paused_driver,
                                   rounds_by_trial, wait_until_paused, write_space)


@pytest.mark.ray
def test_asha_stops_trials_early_and_optuna_records_them_pruned(ray_session, tmp_path):
    from optuna.trial import TrialState

    from fedtune.results.store import load

    space = write_space(tmp_path, ASHA_SPACE)
    # The first trial is the space's defaults (local_lr 0.2, weight_decay 0); seeded random sampling
    # then draws local_lr = 0.2, 1e-5, 1e-5 (checked by hand); one trial at a
    # time, so ASHA's rung-1 cutoff (median of the recorded round-1 val_acc) is set by the first two,
    # which learn, and both lr = 1e-5 trials (still at the initial accuracy) stop after round 1.
    o = opts(tmp_path, algorithms=[], spaces=[space], rounds=3, num_samples=4, scheduler="asha", grace_period=1,
             reduction_factor=2.0, max_concurrent=1, name="asha", overrides=dict(TINY, local_steps=2),
             sampler="random", sampler_seed=13)
    result = run_sweep(o)
    study_dir = result.study_dir
    data = json.loads((study_dir / "study.json").read_text())
    assert data["selection"] == "val" and data["algorithms"] == ["fedavg"] and data["searches"]["fedavg"]["status"] == "done"

    study = load_optuna(study_dir, "asha/fedavg")
    rows = rounds_by_trial(study_dir)
    trials = {r["trial_id"]: r for r in load(study_dir, "trials").to_pylist()}
    states = [t.state for t in study.trials]
    assert len(study.trials) == 4 and TrialState.RUNNING not in states
    assert TrialState.PRUNED in states and TrialState.COMPLETE in states
    for t in study.trials:
        tid = t.user_attrs["fedtune_trial_id"]
        val = {rnd: row["val_acc"] for rnd, row in rows[tid].items()}
        # every round's val_acc is an intermediate value at step = round, and nothing else is
        assert t.intermediate_values == pytest.approx(val)
        if t.state == TrialState.PRUNED:
            assert max(val) < 3 and trials[tid]["status"] == "pruned" and t.user_attrs["fedtune_status"] == "pruned"
            assert t.value == pytest.approx(val[max(val)])  # Optuna keeps the last intermediate value
        else:
            assert sorted(val) == [1, 2, 3] and trials[tid]["status"] == "completed"
            assert t.value == pytest.approx(max(val.values())) == pytest.approx(trials[tid]["best_val_acc"])
    assert [t.params["local_lr"] for t in study.trials] == [0.2, 0.2, 1e-5, 1e-5]
    assert study.trials[0].params == {"local_lr": 0.2, "weight_decay": 0.0}  # the defaults first
    for t in study.trials[2:]:
        assert t.state == TrialState.PRUNED and list(t.intermediate_values) == [1]
    assert study.trials[0].state == TrialState.COMPLETE


@pytest.mark.ray
def test_hyperband_prunes_through_optunas_pruner_and_the_records_agree(ray_session, tmp_path):
    """--scheduler hyperband with --sampler gp, on a real search: Optuna's HyperbandPruner decides at
    each round (one trial at a time, where Tune's synchronous HyperBand would stop nothing); a pruned
    trial is PRUNED in Optuna with the rounds it ran as intermediate values, and `pruned` with
    exactly those rounds in Arrow; a complete one's value is its Arrow row's best_val_acc; the
    defaults come first, then points the GP proposes."""
    import pickle

    from optuna.trial import TrialState

    from fedtune.results.store import load

    space = write_space(tmp_path, GP_SPACE)
    o = opts(tmp_path, algorithms=[], spaces=[space], rounds=4, num_samples=8, scheduler="hyperband", grace_period=1,
             reduction_factor=2.0, max_concurrent=1, name="hb", overrides=dict(TINY, local_steps=2),
             sampler="gp", sampler_seed=5)
    study_dir = run_sweep(o).study_dir
    study = load_optuna(study_dir, "hb/fedavg")
    rows = rounds_by_trial(study_dir)
    trials = {r["trial_id"]: r for r in load(study_dir, "trials").to_pylist()}
    states = [t.state for t in study.trials]
    assert len(states) == 8 and TrialState.PRUNED in states and TrialState.COMPLETE in states
    for t in study.trials:
        tid = t.user_attrs["fedtune_trial_id"]
        val = {rnd: row["val_acc"] for rnd, row in rows[tid].items()}
        assert t.intermediate_values == pytest.approx(val)
        if t.state == TrialState.PRUNED:
            assert max(val) < 4 and trials[tid]["status"] == "pruned"
            assert any(k.startswith("completed_rung_") for k in t.system_attrs)  # the pruner's own record
        elif t.state == TrialState.COMPLETE:
            assert sorted(val) == [1, 2, 3, 4] and trials[tid]["status"] == "completed"
            assert t.value == pytest.approx(trials[tid]["best_val_acc"])
    assert study.trials[0].params == {"local_lr": 0.1, "weight_decay": 0.0}  # the defaults first
    assert len({t.params["local_lr"] for t in study.trials}) == 8 and all(
        1e-3 <= t.params["local_lr"] <= 0.5 for t in study.trials)
    # the scheduler goes into Tune's experiment pickle without its open study
    from fedtune.tune.tuner.schedulers import make_scheduler

    sched = make_scheduler("hyperband", "val_acc", "max", 4, 1, 2.0, storage=None, study_name="x")
    sched._study = object()
    assert pickle.loads(pickle.dumps(sched))._study is None


@pytest.mark.ray
def test_killed_driver_resumes_exactly_once_then_reruns_the_selected_config_with_seeds(ray_session, tmp_path):
    from optuna.trial import TrialState

    from fedtune.results.store import load
    from fedtune.reports.report import make_report

    study_dir = tmp_path / "res"
    address = ray_session.get_runtime_context().gcs_address
    cmd = [sys.executable, "-m", "fedtune.cli", "sweep", "--algorithm", "fedavg", "--rounds", "3",
           "--num-samples", "2", "--seeds", "2", "--max-concurrent", "1", "--set", "local_steps=1", *TINY_SET,
           "--output", str(tmp_path), "--name", "res", "--address", address, "--no-report"]
    env, flag, _ = paused_driver(tmp_path, "result:2")
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_until_paused(proc, flag)
        # the driver dies mid-study: after its first trial, while the second one runs (round 1 on disk)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()
    before = load(study_dir, "trials").to_pylist()
    assert len(before) == 1 and json.loads((study_dir / "study.json").read_text())["searches"]["fedavg"]["status"] == "running"

    run_sweep(SweepOptions(output=str(tmp_path), name="res", report=False), resume=True)

    rows = rounds_by_trial(study_dir)  # asserts (trial, round) exactly once
    trials = load(study_dir, "trials").to_pylist()
    assert set(rows) == {t["trial_id"] for t in trials}  # every round file has a row
    # a trial the dead driver asked after Tune's last snapshot, with rounds on disk: nobody continued it
    interrupted = {t["trial_id"] for t in trials if t["status"] == "interrupted"}
    search = [t for t in trials if t["seed"] == 0 and t["trial_id"] not in interrupted]
    assert len(search) == 2 and {t["status"] for t in search} == {"completed"}
    for t in trials:
        assert sorted(rows[t["trial_id"]]) == ([1, 2, 3] if t["trial_id"] not in interrupted
                                               else list(range(1, len(rows[t["trial_id"]]) + 1)))
    # The trial that finished before the kill is kept once: if Tune's last snapshot (every 2 s) still
    # had it running, it ran again from round 1 and, being deterministic, rewrote identical rows.
    first = before[0]
    again = [t for t in search if t["trial_id"] == first["trial_id"]]
    assert len(again) == 1 and again[0]["best_val_acc"] == first["best_val_acc"]

    study = load_optuna(study_dir, "res/fedavg")
    complete = [t for t in study.trials if t.state == TrialState.COMPLETE]
    assert all(t.state.is_finished() for t in study.trials)  # nothing left RUNNING
    # Tune restored the experiment (a restart would have asked 2 more trials): 2 complete trials,
    # exactly the search's trials of the Arrow store; any other Optuna trial was asked by the dead driver
    assert sorted(t.user_attrs["fedtune_trial_id"] for t in complete) == sorted(t["trial_id"] for t in search)
    assert all(t.user_attrs["fedtune_status"] == "orphaned" for t in study.trials if t.state != TrialState.COMPLETE)
    assert interrupted <= {t.user_attrs.get("fedtune_trial_id") for t in study.trials if t.state != TrialState.COMPLETE}

    # --seeds 2: the selected configuration (best val_acc at its best round) ran again with seed 1
    best = max(sorted(search, key=lambda t: t["trial_id"]), key=lambda t: t["best_val_acc"])  # first on ties
    (rerun,) = [t for t in trials if t["seed"] == 1]
    pick = lambda t: {k: v for k, v in json.loads(t["config_json"]).items() if k not in ("seed", "name", "output")}
    assert pick(rerun) == pick(best)
    seeds_state = json.loads((study_dir / "study.json").read_text())["searches"]["fedavg seeds"]
    assert seeds_state["status"] == "done" and seeds_state["trial_ids"] == [best["trial_id"], rerun["trial_id"]]
    report = make_report(study_dir, plots=False, write=False)
    (domain,) = report.domains
    cell = report.cells[("fedavg", domain)]
    honest = [t["target_acc_at_best_val"] for t in (best, rerun)]
    assert cell.n == 2 and cell.mean == pytest.approx(np.mean(honest))
    assert cell.se == pytest.approx(abs(honest[0] - honest[1]) / 2)  # std(ddof=1)/sqrt(2) of two values
    assert "±" in cell.text() or math.isclose(honest[0], honest[1])


@pytest.mark.ray
def test_trial_seeds_run_whole_searches_and_the_report_is_over_searches(ray_session, tmp_path):
    from fedtune.results.store import load
    from fedtune.reports.report import make_report
    from fedtune.spaces.lookup import load_space

    o = opts(tmp_path, name="ts", trial_seeds=2, rounds=1, num_samples=2, sampler="random", max_concurrent=1,
             overrides={"local_steps": 1, "model": "mlp", "mlp_hidden": [8], "max_client_actors": 1})
    result = run_sweep(o)
    study_dir = result.study_dir
    data = json.loads((study_dir / "study.json").read_text())
    assert data["trial_seeds"] == 2 and {k: v["status"] for k, v in data["searches"].items()} == \
        {"fedavg": "done", "fedavg@ts1": "done"}
    trials = load(study_dir, "trials").to_pylist()
    by_seed = {s: [t for t in trials if t["seed"] == s] for s in (0, 1)}
    assert [len(v) for v in by_seed.values()] == [2, 2] and len(trials) == 4
    for s, ts in by_seed.items():  # search k ran with seed k and data_seed k
        assert {json.loads(t["config_json"])["data_seed"] for t in ts} == {s}
    defaults = load_space("fedavg").defaults()
    for name in ("ts/fedavg", "ts/fedavg@ts1"):  # each search's first trial is the space's defaults
        first = load_optuna(study_dir, name).trials[0]
        assert all(first.params[k] == defaults[k] for k in first.params)
    report = make_report(study_dir, plots=False, write=False)
    cell = report.cells[("fedavg", report.domains[0])]
    picks = []
    for s, ts in by_seed.items():  # the selected trial of each search: best val_acc (ties: first id)
        best = max(sorted(ts, key=lambda t: t["trial_id"]), key=lambda t: t["best_val_acc"])
        picks.append(best["target_acc_at_best_val"])
    assert cell.n == 2 and cell.mean == pytest.approx(np.mean(picks))
    assert cell.se == pytest.approx(np.std(picks, ddof=1) / math.sqrt(2))
    assert "± over 2 independent searches (includes selection variance)" in report.title()
