"""A search never spends a trial on a configuration that already ran in it.

Samplers propose repeats: NSGA-II's child of two equal parents, TPE or random search on a
small categorical space, and a sampler restored from an older Tune snapshot (a killed driver)
replays its random draws. Equal configurations share a fedtune trial id, so a repeat would be a
second Tune trial that writes the same rows under the same id: the study would say N trials
where the Arrow store holds fewer. FedtuneOptunaSearch tells such a proposal FAIL
(``fedtune_status: duplicate``) and asks again; it ends the search once its Optuna study holds
``num_samples`` trials that ran, or when the space has nothing new (``fedtune_exhausted``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from fedtune.config import FederatedRunConfig
from fedtune.spaces.model import strip_switches


def searcher(tmp_path, sampler, *, num_samples=None, name="d"):
    import optuna

    from fedtune.tune.tuner.optuna_search import FedtuneOptunaSearch
    from fedtune.spaces.lookup import load_space

    fixed = {"algorithm": "fedavg", "rounds": 2, "local_steps": 1}
    return FedtuneOptunaSearch(load_space("fedavg").optuna_define_by_run, metrics=["val_acc"], modes=["max"], rounds=2,
                               fixed=fixed, sampler=sampler, study_name=f"{name}/fedavg",
                               storage=optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/optuna.db"),
                               num_samples=num_samples), fixed


def finish(s, trial_id, acc=0.5):
    s.on_trial_result(trial_id, {"round": 1, "training_iteration": 1, "val_acc": acc, "status": "ok"})
    s.on_trial_complete(trial_id, {"round": 2, "training_iteration": 2, "val_acc": acc, "status": "ok", "done": True})


def test_a_replayed_proposal_is_told_duplicate_and_the_sampler_asked_again(tmp_path):
    import optuna
    from optuna.trial import TrialState

    first, fixed = searcher(tmp_path, optuna.samplers.RandomSampler(seed=0))
    a = first.suggest("a")
    finish(first, "a")
    # a driver restarted from a snapshot taken before "a": the same sampler state, the same study
    again, _ = searcher(tmp_path, optuna.samplers.RandomSampler(seed=0))
    b = again.suggest("b")

    assert b != a
    trials = again._ot_study.get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.FAIL, TrialState.RUNNING]
    dup = trials[1]
    a_id = FederatedRunConfig.from_dict(strip_switches({**fixed, **a})).trial_id()
    assert dup.params == trials[0].params  # the replayed draw
    assert dup.user_attrs["fedtune_status"] == "duplicate" and dup.user_attrs["duplicate_of"] == a_id
    assert dup.user_attrs["duplicate_of_number"] == 0 and "fedtune_trial_id" not in dup.user_attrs
    assert trials[2].user_attrs["tune_trial_id"] == "b"
    assert trials[2].user_attrs["fedtune_trial_id"] == FederatedRunConfig.from_dict(strip_switches({**fixed, **b})).trial_id() != a_id
    # the trial Tune runs is the one asked last: its results are told there
    finish(again, "b", 0.7)
    assert again._ot_study.get_trials()[2].state == TrialState.COMPLETE and again._ot_study.get_trials()[2].value == 0.7


def test_budget_counts_trials_that_ran_and_running_here_not_orphans(tmp_path):
    import optuna

    from fedtune.tune.tuner.optuna_search import ended_early

    first, _ = searcher(tmp_path, optuna.samplers.RandomSampler(seed=1), num_samples=2)
    first.suggest("a")
    finish(first, "a")
    first.suggest("orphan")  # its driver dies: RUNNING in Optuna, running nowhere
    storage = first._ot_study._storage

    again, _ = searcher(tmp_path, optuna.samplers.RandomSampler(seed=2), num_samples=2)
    assert isinstance(again.suggest("c"), dict)  # 1 ran + 0 running here: one more
    assert again.suggest("d") == "FINISHED"  # 1 ran + "c" running here = 2
    assert ended_early(storage, "d/fedavg", 2) is None  # "c" has not ended: Tune's fit would be interrupted
    finish(again, "c")
    assert ended_early(storage, "d/fedavg", 2) == "its Optuna study holds 2 trials that ran"
    assert ended_early(storage, "d/fedavg", 3) is None


def test_a_space_with_nothing_new_ends_the_search_with_a_note(tmp_path, monkeypatch):
    import optuna
    from optuna.trial import TrialState

    from fedtune.tune.tuner import optuna_search
    from fedtune.tune.tuner.optuna_search import EXHAUSTED, ended_early

    monkeypatch.setattr(optuna_search, "MAX_DUPLICATE_ASKS", 4)
    point = {"local_lr": 0.05, "local_momentum": 0.9, "weight_decay": 0.0, "global_lr": 1.0, "server_optimizer": "sgd"}
    with pytest.warns(optuna.exceptions.ExperimentalWarning):  # PartialFixedSampler: "experimental" since 2.4
        one_point = optuna.samplers.PartialFixedSampler(point, optuna.samplers.RandomSampler(seed=0))
    s, _ = searcher(tmp_path, one_point, num_samples=5)
    assert strip_switches(s.suggest("a")) == point | {"algorithm": "fedavg", "local_optimizer": "sgd", "client_weighting": "examples"}  # fixed in the space
    finish(s, "a")
    assert s.suggest("b") == "FINISHED"

    states = [t.state for t in s._ot_study.get_trials()]
    assert states == [TrialState.COMPLETE] + [TrialState.FAIL] * 4
    note = ended_early(s._ot_study._storage, "d/fedavg", 5)
    assert note.startswith(EXHAUSTED) and "4 configurations in a row" in note and "after 1 distinct trials" in note


@pytest.mark.ray
@pytest.mark.slow
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


def test_resume_rebuilds_the_trials_row_a_killed_driver_did_not_write(tmp_path):
    """Tune tells the searcher before the Arrow callback: a driver killed in between leaves a trial
    Optuna holds as finished (so the resumed searcher never runs it again) without its
    trials.parquet row. --resume writes that row from the trial's round rows."""
    import optuna
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    from optuna.trial import TrialState

    from fedtune.results.store import ResultsStore, load
    from fedtune.runtime.driver import run
    from fedtune.tune.study.resume import FAILED_UNRECORDED, recover_trial_rows

    # in-process runs: the rows are the point, not the backend (a Ray backend here started a Ray per run)
    base = {"rounds": 2, "local_steps": 1, "model": "mlp", "mlp_hidden": [8], "backend": "local", "output": str(tmp_path),
            "name": "s"}
    cfgs = [FederatedRunConfig.from_dict({**base, "local_lr": lr}) for lr in (0.05, 0.1, 0.2, 0.3, 0.4)]
    for cfg in cfgs:
        run(cfg, progress=False)
    full, stopped, orphan, kept, raised = (c.trial_id() for c in cfgs)
    study_dir = tmp_path / "s"
    store = ResultsStore(str(tmp_path), "s")
    rounds = {c.trial_id(): load(store.rounds_path(c.trial_id())).to_pylist() for c in cfgs}
    store.write_rounds(stopped, rounds[stopped][:1])  # stopped by ASHA after round 1
    kept_row = next(r for r in load(study_dir, "trials").to_pylist() if r["trial_id"] == kept)
    # the race: of the four, only `kept` has its trials.parquet row
    table = load(study_dir, "trials")
    pq.write_table(table.filter(pc.equal(table["trial_id"], kept)), study_dir / "trials.parquet")

    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/optuna.db", study_name="s/fedavg")
    states = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING, TrialState.COMPLETE, TrialState.FAIL)
    for cfg, state in zip(cfgs, states):
        t = study.ask()
        t.set_user_attr("fedtune_trial_id", cfg.trial_id())
        if state == TrialState.FAIL:
            t.set_user_attr("fedtune_status", "failed")
        t.set_user_attr("config", json.loads(json.dumps(cfg.to_dict(), default=str)))
        if state == TrialState.PRUNED:
            t.report(0.1, 1)
        if state != TrialState.RUNNING:
            study.tell(t, 0.5 if state == TrialState.COMPLETE else None, state=state)
    dup = study.ask()  # a duplicate of `full`: never ran, no row
    dup.set_user_attr("fedtune_status", "duplicate")
    study.tell(dup, state=TrialState.FAIL)

    notes = recover_trial_rows(study_dir, study.get_trials())

    got = {r["trial_id"]: r for r in load(study_dir, "trials").to_pylist()}
    assert sorted(got) == sorted([full, stopped, kept, raised]) and len(notes) == 3
    assert all("had no trials.parquet row" in n and "rebuilt from its" in n for n in notes)
    assert full in notes[0] and stopped in notes[1] and raised in notes[2]
    assert got[raised]["status"] == "failed" and got[raised]["error"] == FAILED_UNRECORDED
    assert got[kept] == kept_row  # untouched
    assert got[full]["status"] == "completed" and got[full]["rounds_done"] == 2
    assert got[full]["best_val_acc"] == max(r["val_acc"] for r in rounds[full])
    assert got[full]["final_target_acc"] == rounds[full][-1]["target_acc"]
    assert FederatedRunConfig.from_dict(json.loads(got[full]["config_json"])).trial_id() == full
    assert (got[full]["algorithm"], got[full]["seed"]) == ("fedavg", cfgs[0].seed)
    assert got[stopped]["status"] == "pruned" and got[stopped]["rounds_done"] == 1
    assert recover_trial_rows(study_dir, study.get_trials()) == []  # nothing left to rebuild


SLOW_TRIAL_ROW = '''
import os, time
from fedtune.tune.trial import callback

_calls = []
_finish = callback.ArrowCallback.on_trial_complete


def on_trial_complete(self, *args, **kwargs):  # the driver is killed while this sleeps
    _calls.append(1)
    if len(_calls) == int(os.environ["SLOW_ROW_AT"]):
        open(os.environ["SLOW_ROW_FLAG"], "w").close()
        time.sleep(120)
    return _finish(self, *args, **kwargs)


callback.ArrowCallback.on_trial_complete = on_trial_complete
'''


@pytest.mark.ray
@pytest.mark.slow
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
