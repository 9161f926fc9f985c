"""``fedtune sweep``: option and input validation (no Ray), the Optuna bookkeeping of
FedtuneOptunaSearch (PRUNED / FAIL / COMPLETE, intermediate values), and three small real
studies on the session's Ray: ASHA -> PRUNED, a driver killed with SIGKILL then ``--resume``
(exactly-once rounds, Optuna completeness) followed by the ``--seeds`` re-run (mean ± se)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedtune.errors import ConfigError
from fedtune.config import FederatedRunConfig
from fedtune.results.selection import objective_values
from fedtune.tune.tuner.capacity import concurrency_cap
from fedtune.tune.study.options import METRICS, SweepOptions
from fedtune.tune.common.searches import optuna_storage_url
from fedtune.tune.study.plan import plan_study
from fedtune.tune.study.sweep import run_sweep

ROOT = Path(__file__).resolve().parents[2]


def opts(tmp_path, **kw) -> SweepOptions:
    base = {"algorithms": ["fedavg"], "rounds": 2, "num_samples": 2, "output": str(tmp_path), "name": "s",
            "overrides": {"local_steps": 1}, "report": False}
    base.update(kw)
    return SweepOptions(**base)


def write_space(tmp_path, text: str, name: str = "space.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# ------------------------------------------------------------------------------------------------
# Validation: every bad input is a ConfigError before Ray starts.
@pytest.mark.parametrize("kw, words", [
    ({"algorithms": ["nope"]}, ["'--algorithm'", "'nope' is unknown", "fedavg"]),
    ({"metric": ["target_acc"]}, ["'target_acc'", "never chooses", "val_acc", "oracle_acc"]),
    ({"selection": "oracle", "metric": ["val_acc"]}, ["--selection oracle", "oracle_acc"]),
    ({"selection": "target-val"}, ["'--selection'", "'target-val' needs setting fda", "allows: val, oracle"]),
    ({"metric": ["target_val_acc"]}, ["'target-val' needs setting fda"]),  # --metric implies the protocol
    ({"selection": "oracle", "overrides": {"local_steps": 1, "setting": "fl"}}, ["'oracle'", "allowed: val"]),
    ({"selection": "oracle", "overrides": {"local_steps": 1, "oracle_fraction": 0.0}}, ["oracle_fraction"]),
    ({"seeds": 2, "trial_seeds": 2}, ["--trial-seeds", "cannot be combined"]),
    ({"trial_seeds": 0}, ["'--trial-seeds'", ">= 1"]),
    ({"sampler": "nsga2", "metric": ["val_acc", "target_acc"]}, ["cost metric", "server_s"]),
    ({"num_samples": 0}, ["'--num-samples'", ">= 1"]),
    ({"overrides": {"local_lr": 0.1}}, ["local_lr", "sampled by search space"]),
    ({"overrides": {"rounds": 3}}, ["--rounds"]),
    ({"overrides": {"no_such_field": 1}}, ["unknown field 'no_such_field'"]),
    ({"dataset": "rotated-digits", "target_domain": "999"}, ["999"]),
    ({"scheduler": "hyperband", "sampler": "nsga2"}, ["'--scheduler': hyperband prunes by one objective", "fifo, asha"]),
    ({"scheduler": "hyperband", "reduction_factor": 2.5}, ["'--reduction-factor': 2.5 with --scheduler hyperband",
                                                           "an integer >= 2"]),
])
def test_bad_options_fail_before_anything_starts(tmp_path, kw, words):
    from fedtune.errors import DataError

    with pytest.raises((ConfigError, DataError)) as err:
        plan_study(opts(tmp_path, **kw))
    for w in words:
        assert w in str(err.value), (w, str(err.value))


def test_bad_space_files_name_the_file_and_the_key(tmp_path):
    unknown = write_space(tmp_path, "algorithm: fedavg\nparams:\n  local_lr: {distribution: uniform, low: 0.01,"
                                    " high: 0.1, default: 0.05, bogus: 1}\n", "unknown.yaml")
    out_of_range = write_space(tmp_path, "algorithm: fedavg\nparams:\n  local_momentum: {distribution: uniform,"
                                         " low: 0.0, high: 2.0, default: 0.5}\n", "range.yaml")
    malformed = write_space(tmp_path, "algorithm: fedavg\nparams: [unclosed\n", "bad.yaml")
    for path, words in ((unknown, ["unknown.yaml", "bogus"]), (out_of_range, ["range.yaml", "local_momentum", "2"]),
                        (malformed, ["bad.yaml", "not valid YAML"])):
        with pytest.raises(ConfigError) as err:
            plan_study(opts(tmp_path, algorithms=[], spaces=[path]))
        for w in words:
            assert w in str(err.value)


def test_leave_one_domain_out_plans_one_search_per_target(tmp_path):
    plan = plan_study(opts(tmp_path, algorithms=["fedavg", "fedprox"], target_domain="all", name="lodo"))
    domains = ["0", "15", "30", "45", "60", "75"]
    assert [s.key for s in plan.searches] == [f"{a}/{d}" for a in ("fedavg", "fedprox") for d in domains]
    assert plan.searches[1].optuna_study("lodo") == "lodo/fedavg/15"
    assert plan.searches[1].tune_name == "fedavg--15"
    assert plan.fixed["fedprox/45"]["target_domain"] == "45" and plan.fixed["fedprox/45"]["algorithm"] == "fedprox"
    assert plan.study_dir == tmp_path / "lodo"
    single = plan_study(opts(tmp_path, target_domain="30"))
    assert [s.key for s in single.searches] == ["fedavg"] and single.fixed["fedavg"]["target_domain"] == "30"


def test_resume_of_a_missing_study_and_rerun_of_an_existing_one_are_clear_errors(tmp_path):
    with pytest.raises(ConfigError, match="no study 'missing'"):
        run_sweep(opts(tmp_path, name="missing"), resume=True)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "study.json").write_text("{}")
    with pytest.raises(ConfigError, match="already exists.*--resume"):
        run_sweep(opts(tmp_path, name="taken"))


def test_concurrency_is_capped_with_the_numbers():
    cfg = {"dataset": "rect4", "client_cpus": 0.5, "max_client_actors": 1}
    n, warning = concurrency_cap([cfg], 8, {"CPU": 2.0}, nodes=[{"CPU": 2.0}])
    assert n == 4 and "8 concurrent trials need 4 CPU" in warning and "0.5 CPU" in warning and "at most 4" in warning
    assert concurrency_cap([cfg], 3, {"CPU": 2.0}, nodes=[{"CPU": 2.0}]) == (3, None)
    assert concurrency_cap([cfg], None, {"CPU": 2.0}, nodes=[{"CPU": 2.0}]) == (4, None)
    # rect4 has 3 source clients; by default a trial takes as many client actors as fit: 2 x 1 CPU
    assert concurrency_cap([{"dataset": "rect4"}], 2, {"CPU": 2.0}, nodes=[{"CPU": 2.0}])[0] == 1
    with pytest.raises(ConfigError, match="CPU"):
        concurrency_cap([{"dataset": "rect4", "client_cpus": 4}], 1, {"CPU": 2.0}, nodes=[{"CPU": 2.0}])


def test_objective_is_the_best_round_of_an_accuracy_and_the_mean_of_a_cost():
    per_round = {1: {"val_acc": 0.2, "server_s": 1.0}, 2: {"val_acc": float("nan"), "server_s": 3.0},
                 3: {"val_acc": 0.5, "server_s": 2.0}}
    assert objective_values(per_round, ["val_acc", "server_s"], ["max", "min"]) == [0.5, 2.0]
    assert objective_values(per_round, ["val_acc"], ["min"]) == [0.2]
    assert objective_values({1: {"val_acc": float("nan")}}, ["val_acc"], ["max"]) is None
    # oracle: DomainBed's test-domain validation scores the last round only, not the best one
    oracle = {1: {"oracle_acc": 0.9}, 2: {"oracle_acc": 0.4}, 3: {"oracle_acc": 0.6}}
    assert objective_values(oracle, ["oracle_acc"], ["max"]) == [0.6]
    assert objective_values({1: {"oracle_acc": 0.9}, 2: {}}, ["oracle_acc"], ["max"]) is None  # last round NaN
    assert objective_values({1: {"target_val_acc": 0.3}, 2: {"target_val_acc": 0.5}},
                            ["target_val_acc"], ["max"]) == [0.5]


def test_fda_and_oracle_protocols_plan_and_trial_seeds_replicate_whole_searches(tmp_path):
    plan = plan_study(opts(tmp_path, algorithms=["fedda"], metric=["target_val_acc"], name="tv"))
    assert plan.options.protocol() == "target-val" and plan.metrics == ["target_val_acc"]
    plan = plan_study(opts(tmp_path, selection="oracle", name="or"))
    assert plan.metrics == ["oracle_acc"]
    plan = plan_study(opts(tmp_path, trial_seeds=3, name="ts", overrides={"local_steps": 1, "data_seed": 5}))
    assert [s.key for s in plan.searches] == ["fedavg", "fedavg@ts1", "fedavg@ts2"]
    assert [s.optuna_study("ts") for s in plan.searches] == ["ts/fedavg", "ts/fedavg@ts1", "ts/fedavg@ts2"]
    assert len({s.tune_name for s in plan.searches}) == 3
    assert [(plan.fixed[s.key].get("seed", 0), plan.fixed[s.key]["data_seed"]) for s in plan.searches] == \
        [(0, 5), (1, 6), (2, 7)]


@pytest.mark.parametrize("space", ["fedavg", "fedgp"])
def test_the_first_trial_of_a_search_is_the_search_spaces_defaults(tmp_path, space):
    from fedtune.spaces.lookup import load_space
    from fedtune.spaces.model import strip_switches

    sp = load_space(space)
    s, _ = make_searcher(tmp_path, space=space, first_point=sp.default_point())
    first, second = s.suggest("a"), s.suggest("b")
    assert strip_switches(first) == {k: v for k, v in sp.defaults().items() if k in first}
    assert set(strip_switches(first)) >= {p.name for p in sp.params.values() if p.sampled and not p.when}
    assert second != first  # the sampler takes over from the second trial
    # a searcher re-created on the same Optuna study (a restarted search) does not enqueue them again
    again, _ = make_searcher(tmp_path, space=space, first_point=sp.default_point())
    assert len([t for t in again._ot_study.get_trials() if t.state.name == "WAITING"]) == 0


# ------------------------------------------------------------------------------------------------
# FedtuneOptunaSearch's bookkeeping, driven by hand (no Tune loop).
def make_searcher(tmp_path, metrics=("val_acc",), space="fedavg", name="x", first_point=None):
    import optuna

    from fedtune.tune.tuner.optuna_search import FedtuneOptunaSearch as S
    from fedtune.spaces.lookup import load_space

    fixed = {"algorithm": load_space(space).algorithm, "rounds": 3, "local_steps": 1}
    return S(load_space(space).optuna_define_by_run, metrics=list(metrics), modes=[METRICS[m] for m in metrics],
             rounds=3, fixed=fixed, sampler=optuna.samplers.RandomSampler(seed=0), study_name=f"{name}/{space}",
             storage=optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/optuna.db"), first_point=first_point), fixed


def test_searcher_tells_pruned_fail_and_complete_with_intermediate_values(tmp_path):
    from optuna.trial import TrialState

    s, fixed = make_searcher(tmp_path)
    configs = {t: s.suggest(t) for t in ("early", "full", "nan", "boom")}
    r = lambda rnd, acc, **kw: {"round": rnd, "training_iteration": rnd, "val_acc": acc, "target_acc": 0.1,
                                "status": "ok", **kw}
    s.on_trial_result("early", r(1, 0.30))
    s.on_trial_complete("early", r(2, 0.25, done=True))  # stopped by a scheduler after round 2 of 3
    for rnd, acc in ((1, 0.2), (2, 0.6)):
        s.on_trial_result("full", r(rnd, acc))
    s.on_trial_result("full", r(1, 0.2))  # a restarted trial replays round 1: ignored, no error
    s.on_trial_complete("full", r(3, 0.5, done=True))
    s.on_trial_result("nan", r(1, 0.4))
    s.on_trial_complete("nan", r(2, float("nan"), status="diverged", done=True))
    s.on_trial_complete("boom", None, error=True)
    s.on_trial_complete("full", r(3, 0.5, done=True))  # a second completion changes nothing

    trials = {t.user_attrs["tune_trial_id"]: t for t in s._ot_study.get_trials()}
    early, full, nan, boom = (trials[k] for k in ("early", "full", "nan", "boom"))
    assert early.state == TrialState.PRUNED and early.intermediate_values == {1: 0.30, 2: 0.25}
    assert early.value == 0.25 and early.user_attrs["fedtune_status"] == "pruned" and early.user_attrs["rounds_done"] == 2
    assert full.state == TrialState.COMPLETE and full.value == 0.6  # best round, not the last
    assert full.intermediate_values == {1: 0.2, 2: 0.6, 3: 0.5}
    assert nan.state == TrialState.FAIL and nan.user_attrs["fedtune_status"] == "diverged"
    assert nan.intermediate_values == {1: 0.4}
    assert boom.state == TrialState.FAIL and boom.user_attrs["fedtune_status"] == "failed"
    # the Optuna record names the Arrow store's trial and holds the full configuration
    from fedtune.spaces.model import strip_switches

    cfg = FederatedRunConfig.from_dict(strip_switches({**fixed, **configs["full"]}))
    assert full.user_attrs["fedtune_trial_id"] == cfg.trial_id()
    assert not any(k.startswith("fedtune.") for k in configs["full"])  # the sampled values, no private keys
    assert full.user_attrs["config"]["local_lr"] == configs["full"]["local_lr"] == full.params["local_lr"]


def test_multi_objective_searcher_and_switches(tmp_path):
    from optuna.trial import TrialState

    s, _ = make_searcher(tmp_path, metrics=("val_acc", "server_s"))
    s.suggest("a")
    for rnd, acc, srv in ((1, 0.1, 0.2), (2, 0.3, 0.4)):
        s.on_trial_result("a", {"round": rnd, "val_acc": acc, "server_s": srv, "status": "ok"})
    s.on_trial_complete("a", {"round": 3, "val_acc": 0.2, "server_s": 0.6, "status": "ok", "done": True})
    (t,) = s._ot_study.get_trials()
    assert t.state == TrialState.COMPLETE and t.values == pytest.approx([0.3, 0.4])
    assert t.intermediate_values == {}  # Optuna has none for several objectives
    # a conditional space: the switch is an Optuna parameter but never a trial config key
    g, _ = make_searcher(tmp_path, space="fedgp", name="y")
    config = g.suggest("b")
    (t,) = g._ot_study.get_trials()
    assert "switch.gp_beta_mode" in t.params and not any(k.startswith("switch.") for k in config)
    assert (config["gp_beta"] == "auto") == (t.params["switch.gp_beta_mode"] == "auto")


def test_interruption_detection():
    from fedtune.tune.trial import progress

    assert progress.interrupted({"started": {"a"}, "ended": {"a"}, "statuses": {"a": "TERMINATED"}, "num_trials": 1}, 1) is False
    assert progress.interrupted({"started": {"a"}, "ended": set(), "statuses": {"a": "TERMINATED"}, "num_trials": 1}, 1)
    assert progress.interrupted({"started": set(), "ended": set(), "statuses": {"a": "PENDING"}, "num_trials": 1}, 1)
    assert progress.interrupted({"started": set(), "ended": set(), "statuses": {}, "num_trials": 1}, 2)


def test_live_view_keeps_every_search_name_whole_at_80_columns(tmp_path):
    from rich.console import Console

    from fedtune.tune.trial.progress import LiveView

    plan = plan_study(opts(tmp_path, algorithms=["fedavg", "fedprox"], target_domain="all", trial_seeds=3,
                           name="live"))
    console = Console(record=True, width=80)
    view = LiveView(plan, console, live=False)
    for search in plan.searches:
        view.row(search.key, 4)["best"] = (0.9067, 0.4875)
    console.print(view.render())
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= 80
    keys = [s.key for s in plan.searches]
    assert any("@ts2" in k for k in keys) and len(keys) == 2 * 6 * 3
    for key in keys:  # each name whole on the line that holds its numbers
        assert any(key in line.replace("│", " ").split() and "0.9067" in line and "0.4875" in line
                   for line in lines), key

# ------------------------------------------------------------------------------------------------
# The command line (subprocesses: argument parsing and exit codes; no Ray starts).
def fedtune_cli(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fedtune.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, check=False)


def test_cli_help_and_bad_input_exit_2_without_a_traceback(tmp_path):
    help_ = fedtune_cli("sweep", "--help", cwd=tmp_path)
    assert help_.returncode == 0
    for flag in ("--target-domain", "--num-samples", "--seeds", "--max-concurrent", "--scheduler", "--sampler",
                 "--selection", "--resume", "--set", "SPACE.yaml"):
        assert flag in help_.stdout
    for args, words in ((["--algorithm", "nope"], "'nope' is unknown"),
                        (["--resume", "--name", "missing"], "no study 'missing'"),
                        (["--resume", "--algorithm", "fedavg"], "--algorithms cannot change"),
                        (["--metric", "target_acc"], "honest selection"),
                        (["--algorithm", "irm", "groupdro"], "repeat the flag: --algorithm irm --algorithm groupdro")):
        res = fedtune_cli("sweep", "--output", str(tmp_path), *args, cwd=tmp_path)
        assert res.returncode == 2, res.stderr
        assert words in res.stderr and "Traceback" not in res.stderr, res.stderr
    bad_choice = fedtune_cli("sweep", "--sampler", "grid", cwd=tmp_path)
    assert bad_choice.returncode == 2 and "invalid choice" in bad_choice.stderr


# ------------------------------------------------------------------------------------------------
# Real studies on the session's Ray (2 CPUs: one trial at a time): their helpers here, the studies in
# tests/slow/tune/test_sweep.py (and test_asha_resume, test_population, test_study_fit there).
# A sweep driver subprocess is stopped at a chosen point of its study: PAUSE_DRIVER (its sitecustomize)
# holds Tune's loop right after the Arrow callback handled that event, and the test signals it there.
# Polling the store instead races the (millisecond) trials of a tiny study.
PAUSE_DRIVER = '''
import os, time
from fedtune.tune.trial import callback

_event, _nth = os.environ["PAUSE_AT"].split(":")  # result:N = the N-th trial's first result; end:N = its end
_trials, _ends = [], []
_result, _complete = callback.ArrowCallback.on_trial_result, callback.ArrowCallback.on_trial_complete


def _hold():
    open(os.environ["PAUSE_FLAG"], "w").close()
    deadline = time.time() + 240
    while time.time() < deadline and not os.path.exists(os.environ["PAUSE_GO"]):
        time.sleep(0.02)


def on_trial_result(self, *args, **kwargs):
    out = _result(self, *args, **kwargs)
    trial = kwargs["trial"] if "trial" in kwargs else args[2]
    if trial.trial_id not in _trials:
        _trials.append(trial.trial_id)
        if _event == "result" and len(_trials) == int(_nth):
            _hold()
    return out


def on_trial_complete(self, *args, **kwargs):
    out = _complete(self, *args, **kwargs)
    _ends.append(1)
    if _event == "end" and len(_ends) == int(_nth):
        _hold()
    return out


callback.ArrowCallback.on_trial_result = on_trial_result
callback.ArrowCallback.on_trial_complete = on_trial_complete
'''


def paused_driver(tmp_path: Path, at: str) -> tuple[dict, Path, Path]:
    """The environment of a driver subprocess held at ``at`` (see PAUSE_DRIVER), the file it
    touches once held there and the file that lets it go on."""
    patch = tmp_path / "pause"
    patch.mkdir()
    (patch / "sitecustomize.py").write_text(PAUSE_DRIVER)
    flag, go = tmp_path / "paused", tmp_path / "go-on"
    env = {**os.environ, "PAUSE_AT": at, "PAUSE_FLAG": str(flag), "PAUSE_GO": str(go),
           "PYTHONPATH": os.pathsep.join(p for p in (str(patch), os.environ.get("PYTHONPATH")) if p)}
    return env, flag, go


def wait_until_paused(proc: subprocess.Popen, flag: Path, timeout: float = 240) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None and not flag.exists():
        time.sleep(0.05)
    assert flag.exists(), proc.stderr.read().decode()[-3000:] if proc.poll() is not None else "never paused"
    assert proc.poll() is None, proc.stderr.read().decode()[-3000:]


def load_optuna(study_dir: Path, name: str):
    import optuna

    return optuna.load_study(study_name=name, storage=optuna_storage_url(study_dir))


def rounds_by_trial(study_dir: Path) -> dict[str, dict[int, dict]]:
    from fedtune.results.store import load

    out: dict[str, dict[int, dict]] = {}
    for row in load(study_dir).to_pylist():
        out.setdefault(row["trial_id"], {})
        assert row["round"] not in out[row["trial_id"]], ("duplicate round", row["trial_id"], row["round"])
        out[row["trial_id"]][row["round"]] = row
    return out


# A small model on one client actor: a trial's rounds take milliseconds and it starts one torch
# process, not two (the studies below are about Tune, Optuna and the store, not about learning).
TINY = {"model": "mlp", "mlp_hidden": [32], "max_client_actors": 1}
TINY_SET = [a for k, v in TINY.items() for a in ("--set", f"{k}={json.dumps(v)}")]  # the same on the command line

ASHA_SPACE = """algorithm: fedavg
complete: true  # this space alone: nothing derived from the declarations
params:
  local_lr:       {distribution: categorical, choices: [0.2, 1.0e-5], default: 0.2}
  weight_decay:   {distribution: uniform, low: 0.0, high: 1.0e-3, default: 0.0}
  local_momentum: {distribution: fixed, value: 0.9}
"""


GP_SPACE = """algorithm: fedavg
complete: true  # this space alone: nothing derived from the declarations
params:
  local_lr:       {distribution: loguniform, low: 1.0e-3, high: 0.5, default: 0.1}
  weight_decay:   {distribution: uniform, low: 0.0, high: 1.0e-3, default: 0.0}
  local_momentum: {distribution: fixed, value: 0.9}
"""


@pytest.mark.parametrize("name", ["gp", "qmc"])
def test_gp_and_qmc_samplers_are_optunas_seeded_and_model_the_space(name):
    """--sampler gp is Optuna's GPSampler (modelling after the first max(1, min(10, n // 3)) trials),
    qmc its scrambled Sobol QMCSampler; the same seed draws the same points, another seed others."""
    import optuna

    from fedtune.tune.tuner.samplers import make_sampler

    def draws(seed: int) -> list[tuple[float, float]]:
        sampler = make_sampler(name, seed, 9)
        study = optuna.create_study(direction="maximize", sampler=sampler)
        study.optimize(lambda t: -(t.suggest_float("x", 0, 1) - 0.3) ** 2 - t.suggest_float("y", 1e-3, 1, log=True),
                       n_trials=5)
        return [(t.params["x"], t.params["y"]) for t in study.trials]

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    assert type(make_sampler(name, 0, 9)).__name__ == {"gp": "GPSampler", "qmc": "QMCSampler"}[name]
    if name == "gp":
        assert make_sampler(name, 0, 9)._n_startup_trials == 3
    first = draws(1)
    assert first == draws(1) and first != draws(2)
    assert all(0 <= x <= 1 and 1e-3 <= y <= 1 for x, y in first)


def test_the_default_study_repeats_its_searches_so_its_table_has_an_error_bar():
    from fedtune.tune.study.default_study import DEFAULT_STUDY, apply_default_study, is_default_study
    from fedtune.tune.study.options import SweepOptions

    opts = SweepOptions()
    assert is_default_study(opts)
    out = apply_default_study(opts)
    assert out.trial_seeds == DEFAULT_STUDY["trial_seeds"] >= 3  # a paired interval needs >= 2; 3 resolves real gaps
    assert out.num_samples == DEFAULT_STUDY["num_samples"] and out.rounds == DEFAULT_STUDY["rounds"]
    assert apply_default_study(SweepOptions(trial_seeds=5)).trial_seeds == 5  # the user's choice wins
    assert apply_default_study(SweepOptions(seeds=2)).trial_seeds == 1  # --seeds and --trial-seeds do not combine
    out.validate()
    # a first command of about a minute and a half: each method's own knobs, the mlp
    assert out.knobs == "own" and out.overrides["model"] == "mlp"
    assert apply_default_study(SweepOptions(knobs="all")).knobs == "all"  # the user's choice wins


def test_own_knobs_fix_every_shared_knob_at_one_value_for_every_method(tmp_path):
    from fedtune.spaces.lookup import load_space
    from fedtune.tune.study.study_start import knob_summary, new_study_data, snapshot_spaces

    o = opts(tmp_path, algorithms=["fedavg", "fedprox", "fedomg"], knobs="own", name="own")
    o2, plan = snapshot_spaces(o, plan_study(o))
    searched = {a: sorted(n for n, p in load_space(plan.study_dir / "spaces" / f"{a}.yaml").params.items()
                          if p.sampled) for a in ("fedavg", "fedprox", "fedomg")}
    assert searched == {"fedavg": [], "fedprox": ["prox_mu"], "fedomg": ["global_lr", "omg_kappa"]}
    for a in ("fedavg", "fedprox", "fedomg"):  # the shared ones, at the same value everywhere
        d = load_space(plan.study_dir / "spaces" / f"{a}.yaml").defaults()
        assert (d["local_lr"], d["local_momentum"], d["weight_decay"]) == (0.05, 0.9, 0.0)
    knobs = new_study_data(o2, plan, tmp_path)["knobs"]
    assert knobs == knob_summary(plan) and knobs["shared_fixed"]["global_lr"] == {
        "value": 1.0, "algorithms": ["fedavg", "fedprox"]}  # FedOMG's server step is its own
    # every method searching all knobs: nothing changed
    o3, plan3 = snapshot_spaces(opts(tmp_path, algorithms=["fedprox"], name="all"), plan_study(
        opts(tmp_path, algorithms=["fedprox"], name="all")))
    copy = load_space(plan3.study_dir / "spaces" / "fedprox.yaml")  # the effective space, complete
    assert (copy.params, copy.switches, copy.constants) == (
        load_space("fedprox").params, load_space("fedprox").switches, load_space("fedprox").constants)


def test_own_knobs_refuse_shared_defaults_that_differ(tmp_path):
    a = write_space(tmp_path, "algorithm: fedavg\nparams:\n  local_lr: {distribution: uniform, low: 0.01, high: 0.1, "
                              "default: 0.05}\n", "a.yaml")
    b = write_space(tmp_path, "algorithm: fedprox\nparams:\n  local_lr: {distribution: uniform, low: 0.01, high: 0.1, "
                              "default: 0.02}\n  prox_mu: {distribution: uniform, low: 0.0, high: 1.0, default: 0.1}\n",
                    "b.yaml")
    from fedtune.tune.study.study_start import own_knob_spaces

    with pytest.raises(ConfigError, match="'local_lr' at one value for every method.*fedavg: 0.05, fedprox: 0.02"):
        own_knob_spaces(plan_study(opts(tmp_path, algorithms=[], spaces=[a, b], knobs="own")))
