"""Several searches of a study in one Ray Tune fit (fedtune.tune.tuner.study_search,
fedtune.tune.study.search_fit): the routers' rules, which searches share a fit, and real studies:
the same rows as fits of one search each, actors carried from one search to the next, and a
driver killed inside the shared fit resumed exactly once.

The slow tier (the tests/slow/ folder: every test here is marked slow by tests/conftest.py);
the quick tests of the same subject are in tests/tune/test_study_fit.py."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys

import pytest

from fedtune.tune.common.searches import SEARCH_FIELD
from fedtune.tune.study.plan import STUDY_FIT

from tests.tune.test_sweep import TINY, TINY_SET, load_optuna, opts, paused_driver, rounds_by_trial, wait_until_paused
from tests.tune.test_study_fit import SMALL


def _trial_results(study_dir, fit):
    """Tune's config, last result and start of every trial of the fit ``fit`` (its newest experiment
    snapshot), by Tune trial id."""
    path = sorted(glob.glob(str(study_dir / "tune" / fit / "experiment_state-*.json")))[-1]
    out = {}
    for trial, run in json.load(open(path))["trial_data"]:
        trial, run = json.loads(trial), (json.loads(run) if isinstance(run, str) else run)
        out[trial["trial_id"]] = (trial["config"], run["last_result"], run["start_time"])
    return out


def _numbers(rows):
    """Rows without their study's name, their timings (seconds: ``*_s``, ``*_s.<part>``; ``*_at``) and
    the empty columns a store of several algorithms has (FedAvg's rows beside FedProx's: ``hp.prox_mu``)."""
    timing = lambda k: k == "study" or k.endswith(("_s", "_at")) or "_s." in k  # noqa: E731
    return {t: {r: json.dumps({k: v for k, v in row.items() if not timing(k) and v is not None}, sort_keys=True,
                              default=str)
                for r, row in by.items()} for t, by in rows.items()}  # JSON: NaN equals NaN


@pytest.mark.ray
def test_searches_share_one_fit_reuse_actors_and_give_the_rows_of_fits_of_their_own(ray_session, tmp_path):
    from fedtune.tune.study.sweep import run_sweep

    both = run_sweep(opts(tmp_path, name="both", algorithms=["fedavg", "fedprox"], **SMALL)).study_dir
    alone = [run_sweep(opts(tmp_path, name=a, algorithms=[a], **SMALL)).study_dir for a in ("fedavg", "fedprox")]
    assert sorted(os.listdir(both / "tune")) == [STUDY_FIT]
    assert [sorted(os.listdir(d / "tune")) for d in alone] == [["fedavg"], ["fedprox"]]
    data = json.loads((both / "study.json").read_text())
    assert {k: (v["status"], v["tune_dir"]) for k, v in data["searches"].items()} == \
        {"fedavg": ("done", "tune/_searches"), "fedprox": ("done", "tune/_searches")}
    rows = rounds_by_trial(both)
    rows_alone = {**rounds_by_trial(alone[0]), **rounds_by_trial(alone[1])}
    assert len(rows) == 4 and set(rows) == set(rows_alone)  # the same trials (ids: their configurations) ...
    assert _numbers(rows) == _numbers(rows_alone)  # ... computing the same numbers
    # every trial after the first ran on the first trial's actors (Tune's reuse across searches)
    results = sorted(_trial_results(both, STUDY_FIT).values(), key=lambda t: t[2])  # by start time
    assert [c[SEARCH_FIELD] for c, _, _ in results] == ["fedavg", "fedavg", "fedprox", "fedprox"]
    assert [r["actors_reused"] for _, r, _ in results] == [False, True, True, True]
    told = lambda d, name: [(t.user_attrs["fedtune_trial_id"], t.state.name, t.values)  # noqa: E731
                            for t in load_optuna(d, name).trials]
    for a, alone_dir in zip(("fedavg", "fedprox"), alone):  # each search's Optuna study: as when it ran alone
        assert len(told(both, f"both/{a}")) == 2 and told(both, f"both/{a}") == told(alone_dir, f"{a}/{a}")


@pytest.mark.ray
def test_a_driver_killed_inside_the_shared_fit_resumes_it_exactly_once(ray_session, tmp_path):
    from fedtune.results.store import load
    from fedtune.tune.study.options import SweepOptions
    from fedtune.tune.study.sweep import run_sweep

    address = ray_session.get_runtime_context().gcs_address
    cmd = [sys.executable, "-m", "fedtune.cli", "sweep", "--algorithm", "fedavg", "--algorithm", "fedprox",
           "--rounds", "2", "--num-samples", "2", "--sampler", "random", "--max-concurrent", "1",
           "--set", "local_steps=1", *TINY_SET, "--output", str(tmp_path), "--name", "res", "--address", address,
           "--no-report"]
    env, flag, _ = paused_driver(tmp_path, "result:3")  # fedprox's first trial: fedavg's search is spent
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_until_paused(proc, flag)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()
    study_dir = tmp_path / "res"
    states = {k: v["status"] for k, v in json.loads((study_dir / "study.json").read_text())["searches"].items()}
    assert states == {"fedavg": "running", "fedprox": "running"}  # one fit: done together, at its end

    run_sweep(SweepOptions(output=str(tmp_path), name="res", report=False), resume=True)
    fresh = run_sweep(opts(tmp_path, name="fresh", algorithms=["fedavg", "fedprox"], **SMALL)).study_dir

    data = json.loads((study_dir / "study.json").read_text())
    assert {k: v["status"] for k, v in data["searches"].items()} == {"fedavg": "done", "fedprox": "done"}
    assert sorted(os.listdir(study_dir / "tune")) == [STUDY_FIT]
    # Tune restored the fit: its experiment holds fedavg trials of the first driver's snapshot (a new fit
    # would hold none: fedavg's budget is spent in Optuna), run to their end (again, if still running
    # then), unless Optuna recorded their end after that snapshot: such a trial is not run again
    fit = {tid: r for tid, (c, r, _) in _trial_results(study_dir, STUDY_FIT).items() if c[SEARCH_FIELD] == "fedavg"}
    ended = {t.user_attrs["tune_trial_id"] for t in load_optuna(study_dir, "res/fedavg").trials
             if t.state.name == "COMPLETE"}
    assert fit and all(r.get("round") == 2 or (tid in ended and "round" not in r) for tid, r in fit.items())
    rows = rounds_by_trial(study_dir)  # asserts (trial, round) exactly once
    trials = {t["trial_id"]: t for t in load(study_dir, "trials").to_pylist()}
    assert set(rows) == set(trials)  # every round file has a row
    # fedavg's search ended before the kill: its trials are the uninterrupted study's, number for number
    fresh_rows = rounds_by_trial(fresh)
    ours = {t: rows[t] for t in rows if t.startswith("fedavg")}
    assert len(ours) == 2 and _numbers(ours) == _numbers({t: fresh_rows[t] for t in fresh_rows if t.startswith("fedavg")})
    ran = ("completed", "diverged")
    for name, algorithm in (("res/fedavg", "fedavg"), ("res/fedprox", "fedprox")):
        study = load_optuna(study_dir, name)
        assert all(t.state.is_finished() for t in study.trials)  # nothing left RUNNING
        finished = [t for t in study.trials if t.user_attrs.get("fedtune_status") in ran]
        # each search ran its 2 trials to their end; anything else was asked by the dead driver
        assert len(finished) == 2 and all(trials[t.user_attrs["fedtune_trial_id"]]["status"] in ran for t in finished)
        assert all(t.user_attrs["fedtune_status"] == "orphaned" for t in study.trials if t not in finished)
        assert sorted(t for t in trials if t.startswith(algorithm) and trials[t]["status"] in ran) == \
            sorted(t.user_attrs["fedtune_trial_id"] for t in finished)


@pytest.mark.ray
def test_asha_in_a_shared_fit_stops_each_searchs_trials_as_it_would_alone(ray_session, tmp_path):
    """Each search's ASHA sees only its own trials: FedProx's trials stop (or not) at the same rounds
    after FedAvg's search in the same fit as in a study of FedProx alone."""
    from fedtune.results.store import load
    from fedtune.tune.study.sweep import run_sweep

    asha = dict(SMALL, rounds=3, num_samples=3, scheduler="asha", grace_period=1, reduction_factor=2.0,
                overrides={"local_steps": 2, **TINY})
    both = run_sweep(opts(tmp_path, name="both", algorithms=["fedavg", "fedprox"], **asha)).study_dir
    alone = run_sweep(opts(tmp_path, name="alone", algorithms=["fedprox"], **asha)).study_dir
    assert sorted(os.listdir(both / "tune")) == [STUDY_FIT]
    ended = lambda d: sorted((t["trial_id"], t["status"], t["rounds_done"])  # noqa: E731
                             for t in load(d, "trials").to_pylist() if t["algorithm"] == "fedprox")
    assert len(ended(both)) == 3 and ended(both) == ended(alone)
    assert {s for _, s, _ in ended(both) + ended(alone)} & {"pruned"}  # ASHA did stop some: the check bites


@pytest.mark.ray
def test_seed_re_runs_of_several_searches_share_one_fit_with_the_rows_of_fits_of_their_own(ray_session, tmp_path):
    from fedtune.tune.study.search_fit import SEEDS_FIT
    from fedtune.tune.study.sweep import run_sweep

    seeds = dict(SMALL, seeds=2)
    both = run_sweep(opts(tmp_path, name="both", algorithms=["fedavg", "fedprox"], **seeds)).study_dir
    alone = [run_sweep(opts(tmp_path, name=a, algorithms=[a], **seeds)).study_dir for a in ("fedavg", "fedprox")]
    assert sorted(os.listdir(both / "tune")) == sorted([STUDY_FIT, SEEDS_FIT])
    assert [sorted(os.listdir(d / "tune")) for d in alone] == [["fedavg", "fedavg--seeds"], ["fedprox", "fedprox--seeds"]]
    data = json.loads((both / "study.json").read_text())["searches"]
    for a, d in zip(("fedavg", "fedprox"), alone):
        mine, theirs = data[f"{a} seeds"], json.loads((d / "study.json").read_text())["searches"][f"{a} seeds"]
        assert mine["status"] == "done" and mine["tune_dir"] == "tune/_seeds"
        assert mine["trial_ids"] == theirs["trial_ids"] and len(mine["trial_ids"]) == 2  # selected, then seed 1
    rows, rows_alone = rounds_by_trial(both), {**rounds_by_trial(alone[0]), **rounds_by_trial(alone[1])}
    assert set(rows) == set(rows_alone) and _numbers(rows) == _numbers(rows_alone)
    results = sorted(_trial_results(both, SEEDS_FIT).values(), key=lambda t: t[2])
    assert [c[SEARCH_FIELD] for c, _, _ in results] == ["fedavg seeds", "fedprox seeds"]
    assert [r["actors_reused"] for _, r, _ in results] == [False, True]  # the second re-run on the first's actors
