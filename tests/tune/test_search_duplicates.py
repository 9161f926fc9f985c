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
