"""Several searches of a study in one Ray Tune fit (fedtune.tune.tuner.study_search,
fedtune.tune.study.search_fit): the routers' rules, which searches share a fit, and real studies:
the same rows as fits of one search each, actors carried from one search to the next, and a
driver killed inside the shared fit resumed exactly once."""

from __future__ import annotations


from ray.tune.search import Searcher

from fedtune.tune.common.searches import SEARCH_FIELD, search_of
from fedtune.tune.study.plan import plan_study
from fedtune.tune.study.search_fit import fit_groups
from fedtune.tune.tuner.study_search import PerSearchScheduler, StudySearcher

from tests.tune.test_sweep import TINY, opts


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
