"""Several searches of a study in one Ray Tune fit (fedtune.tune.tuner.study_search,
fedtune.tune.study.search_fit): the routers' rules, which searches share a fit, and real studies:
the same rows as fits of one search each, actors carried from one search to the next, and a
driver killed inside the shared fit resumed exactly once."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys

import pytest
from ray.tune.search import Searcher

from fedtune.tune.common.searches import SEARCH_FIELD, search_of
from fedtune.tune.study.plan import STUDY_FIT, plan_study
from fedtune.tune.study.search_fit import fit_groups
from fedtune.tune.tuner.study_search import PerSearchScheduler, StudySearcher

from test_sweep import TINY, TINY_SET, load_optuna, opts, paused_driver, rounds_by_trial, wait_until_paused


class ListSearcher(Searcher):
    """Proposes its configs in order, then FINISHED; ``waiting`` makes it answer None."""

    def __init__(self, configs):
        super().__init__(metric="val_acc", mode="max")
        self.configs, self.told, self.results, self.waiting = list(configs), [], [], False

    def suggest(self, trial_id):
        if self.waiting:
            return None
        return self.configs.pop(0) if self.configs else Searcher.FINISHED

    def on_trial_result(self, trial_id, result):
        self.results.append((trial_id, result["round"]))

    def on_trial_complete(self, trial_id, result=None, error=False):
        self.told.append((trial_id, error))


def test_study_searcher_asks_searches_in_order_and_tells_each_only_its_trials(tmp_path):
    a, b = ListSearcher([{"local_lr": 0.1}, {"local_lr": 0.2}]), ListSearcher([{"prox_mu": 0.5}])
    s = StudySearcher([("fedavg", a), ("fedprox", b)], {"fedavg": {"algorithm": "fedavg"},
                                                        "fedprox": {"algorithm": "fedprox", "local_lr": 0.3}},
                      metric="val_acc", mode="max")
    assert s.suggest("t1") == {"algorithm": "fedavg", "local_lr": 0.1, SEARCH_FIELD: "fedavg"}
    a.waiting = True
    assert s.suggest("t2") is None  # a search that waits holds the next one back
    a.waiting = False
    assert s.suggest("t2") == {"algorithm": "fedavg", "local_lr": 0.2, SEARCH_FIELD: "fedavg"}
    # fedavg is spent: the next ask goes to fedprox; its proposal wins over the fixed part
    assert s.suggest("t3") == {"algorithm": "fedprox", "local_lr": 0.3, "prox_mu": 0.5, SEARCH_FIELD: "fedprox"}
    s.on_trial_result("t3", {"round": 1})
    s.on_trial_complete("t1", {"round": 2})
    s.on_trial_complete("t3", None, error=True)
    s.on_trial_complete("unknown", None)  # not asked here: nobody is told
    assert a.told == [("t1", False)] and b.told == [("t3", True)] and b.results == [("t3", 1)] and a.results == []
    assert s.suggest("t4") == Searcher.FINISHED and s.fedtune_finished == ["fedavg", "fedprox"]
    # Tune's snapshot of the searcher restores every search's state and who owns which trial
    path = str(tmp_path / "state.pkl")
    s.save(path)
    again = StudySearcher([("x", ListSearcher([]))], {"x": {}}, metric="val_acc", mode="max")
    again.restore(path)
    assert again.keys == ["fedavg", "fedprox"] and again.fedtune_owner == {"t1": "fedavg", "t2": "fedavg",
                                                                          "t3": "fedprox"}
    assert again.suggest("t5") == Searcher.FINISHED


class Trial:
    def __init__(self, trial_id, key):
        self.trial_id, self.config = trial_id, {SEARCH_FIELD: key}


class Recorder:
    def __init__(self, decision):
        self.seen, self.decision = [], decision

    def set_search_properties(self, metric, mode, **spec):
        return True

    def on_trial_add(self, controller, trial):
        self.seen.append(("add", trial.trial_id))

    def on_trial_result(self, controller, trial, result):
        self.seen.append(("result", trial.trial_id))
        return self.decision

    def on_trial_complete(self, controller, trial, result):
        self.seen.append(("complete", trial.trial_id))

    def on_trial_error(self, controller, trial):
        self.seen.append(("error", trial.trial_id))

    def on_trial_remove(self, controller, trial):
        self.seen.append(("remove", trial.trial_id))


def test_per_search_scheduler_gives_each_scheduler_only_its_searchs_trials():
    a, b = Recorder("STOP"), Recorder("CONTINUE")
    sched = PerSearchScheduler({"fedavg": a, "fedprox": b})
    ta, tb = Trial("1", "fedavg"), Trial("2", "fedprox")
    for t in (ta, tb):
        sched.on_trial_add(None, t)
    assert sched.on_trial_result(None, ta, {}) == "STOP" and sched.on_trial_result(None, tb, {}) == "CONTINUE"
    sched.on_trial_complete(None, ta, {})
    sched.on_trial_error(None, tb)
    sched.on_trial_remove(None, tb)
    assert a.seen == [("add", "1"), ("result", "1"), ("complete", "1")]
    assert b.seen == [("add", "2"), ("result", "2"), ("error", "2"), ("remove", "2")]
    assert sched.on_trial_result(None, Trial("3", "other"), {}) == "CONTINUE"  # no search of its own: go on
    assert search_of(ta) == "fedavg" and search_of(object(), "x") == "x"


def test_fit_groups_share_one_fit_except_population_done_and_earlier_lone_fits(tmp_path):
    plan = plan_study(opts(tmp_path, algorithms=["fedavg", "fedprox", "fedomg"]))
    keys = lambda groups: [[s.key for s in g] for g in groups]  # noqa: E731
    assert keys(fit_groups(plan, {})) == [["fedavg", "fedprox", "fedomg"]]
    # a finished search stays alone (it is skipped); so does one an earlier driver ran in a fit of its own
    lone = tmp_path / "s" / "tune" / "fedprox"
    lone.mkdir(parents=True)
    for name in ("tuner.pkl", "experiment_state-2026-01-01_00-00-00.json"):
        (lone / name).write_text("{}")
    assert keys(fit_groups(plan, {"fedavg": {"status": "done"}})) == [["fedavg"], ["fedprox"], ["fedomg"]]
    assert keys(fit_groups(plan, {})) == [["fedprox"], ["fedavg", "fedomg"]]
    one = plan_study(opts(tmp_path, algorithms=["fedavg"], name="one"))
    assert keys(fit_groups(one, {})) == [["fedavg"]]
    pbt = plan_study(opts(tmp_path, algorithms=["fedavg", "fedprox"], name="p", scheduler="pbt"))
    assert keys(fit_groups(pbt, {})) == [["fedavg"], ["fedprox"]]


SMALL = dict(rounds=2, num_samples=2, sampler="random", max_concurrent=1,
             overrides={"local_steps": 1, **TINY})


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
@pytest.mark.slow
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
@pytest.mark.slow
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
@pytest.mark.slow
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
@pytest.mark.slow
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
