"""Tests of the YAML search spaces and their validation (fedtune/spaces/, search_spaces/)."""

from __future__ import annotations

import dataclasses
import doctest
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import fedtune  # noqa: E402
from fedtune import algorithms  # noqa: E402
from fedtune.algorithms import SERVER_OPTIMIZERS  # noqa: E402
from fedtune.algorithms.base import Preset  # noqa: E402
from fedtune.algorithms.presets import PRESETS  # noqa: E402
from fedtune.algorithms.base import ClientMethodSpec, HParam  # noqa: E402
from fedtune.algorithms.client.method import SGD  # noqa: E402
from fedtune.errors import ConfigError
from fedtune.config import FederatedRunConfig
from fedtune.spaces import lookup  # noqa: E402
from fedtune.spaces.lookup import SPACES_DIR, load_space  # noqa: E402
from fedtune.spaces.model import OMITTED, strip_switches  # noqa: E402

SPACE_FILES = sorted(SPACES_DIR.glob("*.yaml"))
PAPER_SETUP = Path(__file__).resolve().parents[2] / "examples" / "paper-setup"
# Every space file: search_spaces/ and the paper setup's (its run preset is not a space).
EVERY_SPACE_FILE = SPACE_FILES + sorted(p for p in PAPER_SETUP.glob("*.yaml") if p.name != "pacs-resnet18.yaml")
# Compute-budget fields a study's base configuration sets, the same for every algorithm.
BUDGET_FIELDS = {"local_epochs", "local_steps", "batch_size"}


# --------------------------------------------------------------------------- a toy algorithm


class ToyMethod(SGD):
    """A client method declaring one hyperparameter of every kind (registered per test)."""

    name = "toy"
    spec = ClientMethodSpec("toy", f"{__name__}:ToyMethod", "toy", hparams=(
        HParam("toy_kappa", 0.5, "a float in [0, 1]", lo=0.0, hi=1.0),
        HParam("toy_iters", 3, "an int >= 1", kind="int", lo=1),
        HParam("toy_beta", 0.5, "a float in [0, 1] or auto", kind="float_or_choice", lo=0.0, hi=1.0,
               choices=("auto",)),
        HParam("toy_flag", False, "a bool", kind="bool"),
        HParam("toy_solver", "exact", "a choice", kind="choice", choices=("exact", "sgd")),
    ))


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setitem(algorithms.CLIENT_METHODS, "toy", ToyMethod)
    monkeypatch.setitem(algorithms.PRESETS, "toy", Preset("toy", "toy", "fedavg", ("fdg",), "toy"))
    return "toy"


TOY_YAML = """\
algorithm: toy
complete: true
switches:
  beta_mode: {choices: [fixed, auto], default: fixed}
params:
  toy_kappa:  {distribution: uniform, low: 0.0, high: 1.0, default: 0.5}
  local_lr:   {distribution: loguniform, low: 1e-3, high: 0.1, default: 0.01}
  toy_iters:  {distribution: int, low: 1, high: 3, default: 2}
  toy_solver: {distribution: categorical, choices: [exact, sgd], default: exact}
  toy_flag:   {distribution: fixed, value: true}
  toy_beta:   {distribution: uniform, low: 0.2, high: 0.8, default: 0.5, when: {beta_mode: fixed}, otherwise: auto}
  global_lr:  {distribution: uniform, low: 0.5, high: 1.0, default: 1.0, when: {toy_solver: sgd}}
"""


def write(tmp_path: Path, text: str, name: str = "space.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def error_of(path: Path) -> str:
    with pytest.raises(ConfigError) as info:
        load_space(path)
    return str(info.value)


# --------------------------------------------------------------------------- the shipped files


def test_every_preset_has_a_space_and_every_shipped_file_names_a_preset():
    assert set(lookup.list_spaces()) >= set(PRESETS)  # derived when no file overrides it
    assert {p.stem for p in SPACE_FILES} <= set(PRESETS)


@pytest.mark.parametrize("path", SPACE_FILES, ids=[p.stem for p in SPACE_FILES])
def test_shipped_space_loads_validates_and_covers_every_hparam(path):
    """Fails for an algorithm whose preset / hyperparameters are not registered yet."""
    space = load_space(path)
    assert space.algorithm == path.stem
    assert load_space(path.stem).params == space.params  # lookup by name finds the same file
    # The default configuration is a valid run configuration of the algorithm.
    cfg = FederatedRunConfig.from_dict(strip_switches(space.defaults()))
    assert cfg.algorithm == path.stem
    # Every tunable hyperparameter is in the file (fixed or sampled), budget fields excepted.
    resolved = algorithms.resolve(cfg)
    tunable = set(resolved.hparam_specs()) | {
        f.name for f in dataclasses.fields(FederatedRunConfig) if f.metadata.get("hp")} | {
        h.name for opt in SERVER_OPTIMIZERS for h in SERVER_OPTIMIZERS.spec(opt).hparams}
    assert set(space.params) == tunable - BUDGET_FIELDS
    # Every sampled parameter's default lies in its range; fixed values are what a run uses.
    for p in space.params.values():
        if p.distribution in ("uniform", "loguniform", "int"):
            assert p.low <= p.default <= p.high
        if p.distribution == "categorical":
            assert p.default in p.choices


def test_fedomg_space_has_the_papers_ranges():
    omg = load_space("fedomg")
    kappa = omg.params["omg_kappa"]
    assert (kappa.distribution, kappa.low, kappa.high, kappa.default) == ("uniform", 0.0, 1.0, 0.5)
    assert omg.defaults()["global_lr"] == 0.05
    assert omg.params["global_lr"].distribution == "loguniform"


def test_paper_ranges_of_the_shipped_spaces():
    gala = load_space("fedgala").params
    assert (gala["gala_tau"].low, gala["gala_tau"].high, gala["gala_tau"].default) == (-0.5, 0.5, 0.0)
    assert (gala["gala_iters"].low, gala["gala_iters"].high, gala["gala_iters"].default) == (1, 5, 3)
    gfm = load_space("gfm")
    assert (gfm.params["sam_rho"].distribution, gfm.params["sam_rho"].low, gfm.params["sam_rho"].high) == (
        "loguniform", 0.005, 0.1)
    assert (gfm.params["gfm_interval"].low, gfm.params["gfm_interval"].high) == (1, 20)
    for name in ("fedda", "fedgp"):
        s = load_space(name)
        assert s.params["gp_beta"].when == {"gp_beta_mode": ("fixed",)}
        assert s.params["gp_beta"].fallback == "auto"
        assert s.defaults()["setting"] == "fda"


def test_public_search_space_is_the_tune_space():
    from ray.tune.search.sample import Categorical, Float

    space = fedtune.search_space("fedavg")
    assert space["algorithm"] == "fedavg"
    assert isinstance(space["local_lr"], Float) and isinstance(space["local_momentum"], Categorical)
    assert isinstance(space["global_lr"], Float)  # tuned like FedOMG's (shared knob)


# --------------------------------------------------------------------------- the toy space


def test_toy_space_defaults_and_points(toy, tmp_path):
    space = load_space(write(tmp_path, TOY_YAML))
    assert space.defaults() == {"algorithm": "toy", "toy_kappa": 0.5, "local_lr": 0.01, "toy_iters": 2,
                                "toy_solver": "exact", "toy_flag": True, "toy_beta": 0.5, "global_lr": None}
    # global_lr's condition fails by default: it takes the algorithm's default (None = the rule's).
    assert space.default_point() == {"switch.beta_mode": "fixed", "toy_kappa": 0.5, "local_lr": 0.01,
                                     "toy_iters": 2, "toy_solver": "exact", "toy_beta": 0.5}
    FederatedRunConfig.from_dict(space.defaults())
    assert space.has_conditions


def test_numeric_text_such_as_1e_minus_3_is_a_number(toy, tmp_path):
    # YAML 1.1 reads "1e-3" as text; the space accepts it as the number it means.
    assert load_space(write(tmp_path, TOY_YAML)).params["local_lr"].low == pytest.approx(0.001)


def test_tune_space_sampler_types_and_ranges(toy, tmp_path):
    from ray.tune.search.sample import (
        Categorical,
        Float,
        Function,
        Integer,
        LogUniform,
        Uniform,
    )
    from ray.tune.search.variant_generator import generate_variants

    space = load_space(write(tmp_path, TOY_YAML)).tune_space()
    kappa, lr, iters, solver = space["toy_kappa"], space["local_lr"], space["toy_iters"], space["toy_solver"]
    assert isinstance(kappa, Float) and isinstance(kappa.get_sampler(), Uniform)
    assert (kappa.lower, kappa.upper) == (0.0, 1.0)
    assert isinstance(lr, Float) and isinstance(lr.get_sampler(), LogUniform)
    assert (lr.lower, lr.upper) == (pytest.approx(0.001), 0.1)
    assert isinstance(iters, Integer) and (iters.lower, iters.upper) == (1, 4)  # randint excludes upper
    assert isinstance(solver, Categorical) and solver.categories == ["exact", "sgd"]
    assert isinstance(space["switch.beta_mode"], Categorical)
    assert space["switch.beta_mode"].categories == ["fixed", "auto"]
    assert space["toy_flag"] is True and space["algorithm"] == "toy"
    assert isinstance(space["toy_beta"], Function) and isinstance(space["global_lr"], Function)

    np.random.seed(0)
    samples = [v for _ in range(120) for _, v in generate_variants({"config": space})]
    configs = [s["config"] for s in samples]
    assert {c["toy_iters"] for c in configs} == {1, 2, 3}
    assert all(0.0 <= c["toy_kappa"] <= 1.0 and 0.001 <= c["local_lr"] <= 0.1 for c in configs)
    for c in configs:  # conditional parameters follow their condition, both ways
        if c["switch.beta_mode"] == "auto":
            assert c["toy_beta"] == "auto"
        else:
            assert isinstance(c["toy_beta"], float) and 0.2 <= c["toy_beta"] <= 0.8
        if c["toy_solver"] == "sgd":
            assert 0.5 <= c["global_lr"] <= 1.0
        else:
            assert c["global_lr"] is None
        FederatedRunConfig.from_dict(strip_switches(c))
    assert {c["switch.beta_mode"] for c in configs} == {"fixed", "auto"}
    assert {c["toy_solver"] for c in configs} == {"exact", "sgd"}


def test_define_by_run_samples_a_conditional_parameter_only_when_its_condition_holds(toy, tmp_path):
    import optuna

    space = load_space(write(tmp_path, TOY_YAML))
    base = {"toy_kappa": 0.3, "local_lr": 0.02, "toy_iters": 2, "toy_solver": "exact"}
    # FixedTrial raises for any parameter it does not hold: toy_beta / global_lr are not asked.
    constants = space.optuna_define_by_run(optuna.trial.FixedTrial({**base, "switch.beta_mode": "auto"}))
    assert constants == {"algorithm": "toy", "toy_flag": True, "toy_beta": "auto", "global_lr": None}
    with pytest.raises(ValueError, match="toy_beta"):
        space.optuna_define_by_run(optuna.trial.FixedTrial({**base, "switch.beta_mode": "fixed"}))
    constants = space.optuna_define_by_run(
        optuna.trial.FixedTrial({**base, "switch.beta_mode": "fixed", "toy_beta": 0.25}))
    assert "toy_beta" not in constants and constants["global_lr"] is None

    # A real in-memory study: toy_beta is a parameter of exactly the trials whose switch says fixed.
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    modes = set()
    for _ in range(30):
        trial = study.ask()
        constants = space.optuna_define_by_run(trial)
        mode = trial.params["switch.beta_mode"]
        modes.add(mode)
        assert ("toy_beta" in trial.params) == (mode == "fixed")
        assert ("global_lr" in trial.params) == (trial.params["toy_solver"] == "sgd")
        if mode == "fixed":
            assert 0.2 <= trial.params["toy_beta"] <= 0.8
        else:
            assert constants["toy_beta"] == "auto"
        assert trial.params["toy_iters"] in (1, 2, 3)
        study.tell(trial, 0.0)
    assert modes == {"fixed", "auto"}


def test_ray_optuna_search_merges_suggestions_and_constants(toy, tmp_path):
    from ray.tune.search.optuna import OptunaSearch

    space = load_space(write(tmp_path, TOY_YAML))
    search = OptunaSearch(space=space.optuna_define_by_run, metric="val_acc", mode="max",
                          points_to_evaluate=[space.default_point()], seed=0)
    first = search.suggest("t0")
    assert strip_switches(first) == space.defaults()  # the default point comes first
    for i in range(1, 6):
        config = search.suggest(f"t{i}")
        assert set(strip_switches(config)) == set(space.params) | {"algorithm"}
        FederatedRunConfig.from_dict(strip_switches(config))


# --------------------------------------------------------------------------- bad input


OPT_HEAD = ("algorithm: fedavg\nparams:\n  server_optimizer: {distribution: categorical, "
            "choices: [sgd, avgm, adam, yogi, adagrad], default: sgd}\n")


@pytest.mark.parametrize("text, key, problem", [
    ("algorithm: toy\nparamz: {}\n", "paramz", "unknown key 'paramz' at the top level; did you mean 'params'?"),
    ("algorithm: toy\nparams:\n  toy_kappa: {distribution: uniform, lo: 0.0, high: 1.0, default: 0.5}\n",
     "params.toy_kappa.lo", "unknown key 'lo' for distribution 'uniform'"),
    ("algorithm: toy\nparams:\n  toy_kappa: {distribution: normal, low: 0.0, high: 1.0, default: 0.5}\n",
     "params.toy_kappa.distribution", "unknown distribution 'normal'"),
    ("algorithm: toy\nparams:\n  toy_kappa: {distribution: uniform, low: 0.9, high: 0.1, default: 0.5}\n",
     "params.toy_kappa", "low 0.9 > high 0.1"),
    ("algorithm: toy\nparams:\n  local_lr: {distribution: loguniform, low: 0.0, high: 0.1, default: 0.01}\n",
     "params.local_lr.low", "loguniform needs low > 0"),
    ("algorithm: toy\nparams:\n  toy_kappa: {distribution: uniform, low: 0.1, high: 0.4, default: 0.5}\n",
     "params.toy_kappa.default", "default 0.5 is outside the range [0.1, 0.4]"),
    ("algorithm: toy\nparams:\n  toy_iters: {distribution: int, low: 1, high: 5, default: 9}\n",
     "params.toy_iters.default", "outside the range"),
    ("algorithm: toy\nparams:\n  toy_solver: {distribution: categorical, choices: [exact, sgd], default: newton}\n",
     "params.toy_solver.default", "not among the choices"),
    ("algorithm: fedavg\nparams:\n  toy_kappa: {distribution: uniform, low: 0.0, high: 1.0, default: 0.5}\n",
     "params.toy_kappa", "is a hyperparameter of client method toy, which algorithm 'fedavg'"),
    ("algorithm: toy\nparams:\n  toy_kapa: {distribution: uniform, low: 0.0, high: 1.0, default: 0.5}\n",
     "params.toy_kapa", "unknown hyperparameter 'toy_kapa' (did you mean toy_kappa"),
    ("algorithm: toy\nparams:\n  rounds: {distribution: int, low: 1, high: 5, default: 2}\n",
     "params.rounds", "is a run setting, not a tunable hyperparameter"),
    # ranges outside what the hyperparameter allows: HParam lo/hi and FederatedRunConfig field lo/hi
    ("algorithm: toy\nparams:\n  toy_kappa: {distribution: uniform, low: 0.0, high: 2.0, default: 0.5}\n",
     "params.toy_kappa.high", "high 2.0 is not allowed for 'toy_kappa'"),
    ("algorithm: toy\nparams:\n  toy_iters: {distribution: int, low: 0, high: 5, default: 2}\n",
     "params.toy_iters.low", "low 0 is not allowed for 'toy_iters'"),
    ("algorithm: toy\nparams:\n  local_momentum: {distribution: uniform, low: 0.0, high: 1.5, default: 0.9}\n",
     "params.local_momentum.high", "high 1.5 is not allowed for 'local_momentum'"),
    ("algorithm: toy\nparams:\n  local_lr: {distribution: uniform, low: 0.0, high: 0.1, default: 0.05}\n",
     "params.local_lr.low", "low 0.0 is not allowed for 'local_lr'"),
    ("algorithm: toy\nparams:\n  toy_solver: {distribution: categorical, choices: [exact, newton], default: exact}\n",
     "params.toy_solver.choices", "choice 'newton' is not allowed for 'toy_solver'"),
    ("algorithm: toy\nparams:\n  toy_beta: {distribution: categorical, choices: [0.2, 1.5, auto], default: 0.2}\n",
     "params.toy_beta.choices", "choice 1.5 is not allowed"),
    ("algorithm: toy\nparams:\n  toy_flag: {distribution: fixed, value: maybe}\n",
     "params.toy_flag.value", "value 'maybe' is not allowed"),
    ("algorithm: toy\nparams:\n  toy_iters: {distribution: uniform, low: 1, high: 5, default: 2}\n",
     "params.toy_iters.distribution", "'uniform' does not fit 'toy_iters', an integer hyperparameter"),
    ("algorithm: toy\nparams:\n  toy_iters: {distribution: int, low: 1.5, high: 5, default: 2}\n",
     "params.toy_iters.low", "expected an integer"),
    ("algorithm: toy\nparams:\n  toy_kappa: {distribution: uniform, low: 0.5, high: 0.5, default: 0.5}\n",
     "params.toy_kappa", "use distribution: fixed"),
    ("algorithm: toy\nparams:\n  toy_kappa: {distribution: uniform, low: 0.0, high: 1.0}\n",
     "params.toy_kappa", "missing required key 'default'"),
    # conditions
    (("algorithm: toy\nparams:\n  toy_beta: {distribution: uniform, low: 0.0, high: 1.0, default: 0.5, "
      "when: {mode: fixed}}\n"), "params.toy_beta.when.mode", "'mode' is neither a switch nor a parameter"),
    (("algorithm: toy\nswitches:\n  mode: {choices: [a, b], default: a}\nparams:\n"
      "  toy_beta: {distribution: uniform, low: 0.0, high: 1.0, default: 0.5, when: {mode: c}}\n"),
     "params.toy_beta.when.mode", "'c' is never taken by 'mode'"),
    (("algorithm: toy\nswitches:\n  mode: {choices: [a, b], default: a}\nparams:\n"
      "  toy_kappa: {distribution: uniform, low: 0.0, high: 1.0, default: 0.5}\n"),
     "switches.mode", "no parameter's 'when' uses this switch"),
    ("algorithm: toy\nparams:\n  toy_beta: {distribution: uniform, low: 0.0, high: 1.0, default: 0.5, otherwise: auto}\n",
     "params.toy_beta.otherwise", "'otherwise' needs a 'when' condition"),
    (("algorithm: toy\nswitches:\n  mode: {choices: [a, b], default: a}\nparams:\n"
      "  toy_beta: {distribution: uniform, low: 0.0, high: 1.0, default: 0.5, when: {mode: a}, otherwise: never}\n"),
     "params.toy_beta.otherwise", "otherwise 'never' is not allowed"),
    (("algorithm: toy\nswitches:\n  mode: {choices: [a, b], default: c}\nparams:\n"
      "  toy_beta: {distribution: uniform, low: 0.0, high: 1.0, default: 0.5, when: {mode: a}}\n"),
     "switches.mode.default", "'c' is not among the choices"),
    # server optimiser hyperparameters: only where server_optimizer takes an optimiser that uses them
    (f"{OPT_HEAD}  server_momentum: {{distribution: fixed, value: 0.9, when: {{server_optimizer: [avgm, adam]}}}}\n",
     "params.server_momentum.when.server_optimizer", "server_optimizer 'adam' does not use 'server_momentum'; "
                                                     "allowed: avgm"),
    (f"{OPT_HEAD}  server_beta1: {{distribution: fixed, value: 0.9, when: null}}\n",
     "params.server_beta1", "server_optimizer 'sgd' does not use 'server_beta1'; allowed: adam, yogi"),
    ("algorithm: fedavg\ncomplete: true\nparams:\n  server_tau: {distribution: fixed, value: 0.001}\n",
     "params.server_tau", "add server_optimizer to this file and condition it: when: {server_optimizer: [adam, yogi, "
                          "adagrad]}"),
    (f"{OPT_HEAD}  server_tau: {{distribution: fixed, value: 0.001, when: {{server_optimizer: adam}}, otherwise: 0.1}}\n",
     "params.server_tau.otherwise", "'server_tau' is left out where its condition fails"),
    (f"{OPT_HEAD}  server_beta2: {{distribution: uniform, low: 0.9, high: 1.5, default: 0.99, "
     "when: {server_optimizer: adam}}\n", "params.server_beta2.high", "high 1.5 is not allowed for 'server_beta2'"),
    (f"{OPT_HEAD}  server_tau: {{distribution: fixed, value: 0.001, when: {{server_optimizer: rmsprop}}}}\n",
     "params.server_tau.when.server_optimizer", "condition value 'rmsprop' is not allowed for 'server_optimizer'"),
    # the file as a whole
    ("algorithm: nope\nparams:\n  local_lr: {distribution: fixed, value: 0.1}\n",
     "algorithm", "'nope' is unknown"),
    ("params:\n  local_lr: {distribution: fixed, value: 0.1}\n", "algorithm", "missing required key 'algorithm'"),
    ("algorithm: toy\nparams: {}\n", "params", "expected a non-empty mapping"),
])
def test_bad_input_names_file_key_and_problem(toy, tmp_path, text, key, problem):
    path = write(tmp_path, text)
    message = error_of(path)
    assert message.startswith(f"{path}: {key}: "), message
    assert problem in message, message


def test_malformed_yaml_and_non_mapping(toy, tmp_path):
    path = write(tmp_path, "algorithm: toy\nparams: {toy_kappa: [1, 2\n")
    message = error_of(path)
    assert message.startswith(f"{path}: not valid YAML:") and "line" in message
    path = write(tmp_path, "- algorithm\n- toy\n")
    assert error_of(path).startswith(f"{path}: a search space must be a YAML mapping")


def test_missing_file_and_unknown_name(tmp_path):
    with pytest.raises(ConfigError, match="search space file '.*nope.yaml' does not exist"):
        load_space(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="no search space named 'nope'.*available: .*fedavg"):
        load_space("nope")


def test_lookup_by_name_prefers_the_current_directory_and_checks_the_name(toy, tmp_path, monkeypatch):
    (tmp_path / "search_spaces").mkdir()
    write(tmp_path / "search_spaces", TOY_YAML, "toy.yaml")
    write(tmp_path / "search_spaces", "algorithm: toy\nparams:\n  toy_kappa: {distribution: fixed, value: 0.2}\n",
          "fedavg.yaml")
    monkeypatch.chdir(tmp_path)
    assert load_space("toy").params["toy_kappa"].distribution == "uniform"
    assert "toy" in lookup.list_spaces() and "fedgp" in lookup.list_spaces()
    with pytest.raises(ConfigError, match=r"fedavg.yaml: algorithm: 'toy' does not match the file's name 'fedavg'"):
        load_space("fedavg")


def test_strip_switches_keeps_everything_else():
    config = {"switch.a": 1, "switch.b": "x", "gp_beta": "auto", "algorithm": "fedgp"}
    assert strip_switches(config) == {"gp_beta": "auto", "algorithm": "fedgp"}


def test_doctests():
    failures, _ = doctest.testmod(lookup, optionflags=doctest.ELLIPSIS)
    assert failures == 0


# --------------------------------------------------------------------------- bounded input
def test_a_long_choice_list_is_refused_at_once_and_named(tmp_path):
    import time

    many = ", ".join(str(i + 1) for i in range(50_000))
    path = write(tmp_path, f"algorithm: fedavg\nparams:\n  batch_size: {{distribution: categorical, choices: [{many}], "
                           "default: 1}\n")
    t0 = time.monotonic()
    msg = error_of(path)
    assert time.monotonic() - t0 < 10  # was an O(n^2) duplicate scan (hours), then one config per value
    assert msg == (f"{path}: params.batch_size.choices: 50000 values; allowed: at most 1000 (for more, sample a "
                   "range: uniform, loguniform or int)")


def test_duplicate_choices_keep_value_in_equality(tmp_path):
    for choices, dup in (("[1, 2, 1.0]", "1.0"), ("[true, 1, 'x', 'x']", "'x'"), ("[sgd, adam, sgd]", "'sgd'")):
        path = write(tmp_path, f"algorithm: fedavg\nswitches:\n  s: {{choices: {choices}, default: 2}}\n"
                               "params:\n  local_lr: {distribution: fixed, value: 0.1, when: {s: 2}}\n")
        assert f"switches.s.choices: {dup} is listed twice" in error_of(path)
    path = write(tmp_path, "algorithm: fedavg\nswitches:\n  s: {choices: [true, 1, 0, false], default: 1}\n"
                           "params:\n  local_lr: {distribution: fixed, value: 0.1, when: {s: 1}}\n")
    assert load_space(path).switches["s"].choices == (True, 1, 0, False)  # a bool is not a number here


def test_huge_values_and_names_in_a_space_file_are_shown_cut_short(tmp_path):
    long = "q" * 100_000
    for text in (f"algorithm: fedavg\ndescription: [{', '.join(['7'] * 20_000)}]\nparams: {{}}\n",
                 f"algorithm: fedavg\nparams:\n  {long}: {{distribution: fixed, value: 1}}\n",
                 f"algorithm: fedavg\n{long}: 1\nparams: {{}}\n",
                 f"algorithm: fedavg\nparams:\n  local_lr: {{distribution: fixed, value: {long}}}\n"):
        msg = error_of(write(tmp_path, text))
        assert len(msg) < 600, msg[:800]


# --------------------------------------------------------------------------- the server optimisers
OPTIMIZER_HPARAMS = {opt: {h.name for h in SERVER_OPTIMIZERS.spec(opt).hparams} for opt in SERVER_OPTIMIZERS}
OPT_NAMES = {"server_optimizer"}.union(*OPTIMIZER_HPARAMS.values())


def _without_the_optimizer_block(space):
    """The space as it was before the server optimisers: its parameters removed (a complete file)."""
    from fedtune.spaces.yaml_files import build_space

    doc = space.to_document()
    doc["params"] = {k: v for k, v in doc["params"].items() if k not in OPT_NAMES}
    return build_space(doc, space.source, None)


@pytest.mark.parametrize("path", EVERY_SPACE_FILE, ids=[f"{p.parent.name}/{p.stem}" for p in EVERY_SPACE_FILE])
def test_every_space_offers_the_server_optimizers_and_its_defaults_run_as_before(path):
    space = load_space(str(path))
    before = _without_the_optimizer_block(space)
    so = space.params["server_optimizer"]
    assert (so.distribution, so.choices, so.default, so.when) == ("categorical", tuple(SERVER_OPTIMIZERS), "sgd", {})
    for name in OPT_NAMES - {"server_optimizer"}:  # each conditioned on exactly the optimisers that use it
        users = {opt for opt, names in OPTIMIZER_HPARAMS.items() if name in names}
        assert set(space.params[name].when) == {"server_optimizer"}, name
        assert set(space.params[name].when["server_optimizer"]) == users, name
        assert space.params[name].fallback is OMITTED
    # Reddi et al. 2021 fix beta1 = 0.9, beta2 = 0.99
    assert (space.params["server_beta1"].value, space.params["server_beta2"].value) == (0.9, 0.99)
    assert space.defaults() == {**before.defaults(), "server_optimizer": "sgd"}
    assert space.default_point() == {**before.default_point(), "server_optimizer": "sgd"}
    cfg = FederatedRunConfig.from_dict(strip_switches(space.defaults()))
    assert cfg.server_optimizer == "sgd" and not set(cfg.params) & OPT_NAMES
    assert cfg.trial_id() == FederatedRunConfig.from_dict(strip_switches(before.defaults())).trial_id()


def _check_optimizer_keys(config: dict) -> str:
    """A sampled configuration carries exactly its optimiser's hyperparameters; returns the optimiser."""
    opt = config["server_optimizer"]
    assert {k for k in config if k in OPT_NAMES} - {"server_optimizer"} == OPTIMIZER_HPARAMS[opt], config
    if opt in ("adam", "yogi"):
        assert (config["server_beta1"], config["server_beta2"]) == (0.9, 0.99)
    if opt in ("adam", "yogi", "adagrad"):
        assert 1e-9 <= config["server_tau"] <= 0.1
    if opt == "avgm":
        assert config["server_momentum"] in (0.9, 0.97, 0.99)
    cfg = FederatedRunConfig.from_dict(config)
    assert cfg.server_optimizer == opt and set(cfg.params) & OPT_NAMES == OPTIMIZER_HPARAMS[opt]
    return opt


def test_ray_param_space_samples_only_the_chosen_optimizers_hyperparameters():
    from ray.tune.search.variant_generator import generate_variants

    space = load_space("fedavg").tune_space()
    np.random.seed(1)
    configs = [v["config"] for _ in range(150) for _, v in generate_variants({"config": space})]
    seen = set()
    for raw in configs:
        config = strip_switches(raw)
        seen.add(_check_optimizer_keys(config))
        # the raw config marks the others as left out, never with a value a run would refuse
        assert all(raw[k] is OMITTED for k in OPT_NAMES if k not in config)
        assert "server_momentum" not in config or config["server_optimizer"] == "avgm"
    assert seen == set(SERVER_OPTIMIZERS)
    # Ray pickles and copies trial configs: the marker stays the one strip_switches removes
    import copy
    import pickle

    assert pickle.loads(pickle.dumps(OMITTED)) is OMITTED and copy.deepcopy(OMITTED) is OMITTED


def test_optuna_define_by_run_asks_only_the_chosen_optimizers_hyperparameters():
    import optuna

    space = load_space("fedprox")
    point = space.default_point()
    # FixedTrial raises for any parameter it does not hold: sgd asks none of the optimisers' knobs
    constants = space.optuna_define_by_run(optuna.trial.FixedTrial(point))
    assert not set(constants) & OPT_NAMES
    adam = {**point, "server_optimizer": "adam", "server_tau": 1e-4, "server_adam_bias_correction": True}
    constants = space.optuna_define_by_run(optuna.trial.FixedTrial(adam))
    assert {k: constants[k] for k in set(constants) & OPT_NAMES} == {"server_beta1": 0.9, "server_beta2": 0.99,
                                                                     "server_v_start": "tau_squared"}
    assert _check_optimizer_keys({**adam, **constants}) == "adam"
    with pytest.raises(ValueError, match="server_momentum"):  # avgm asks for its momentum
        space.optuna_define_by_run(optuna.trial.FixedTrial({**point, "server_optimizer": "avgm"}))

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(40):
        trial = study.ask()
        constants = space.optuna_define_by_run(trial)
        opt = _check_optimizer_keys({**trial.params, **constants})
        sampled = {h.name for h in SERVER_OPTIMIZERS.spec(opt).hparams if space.params[h.name].sampled}
        assert set(trial.params) & OPT_NAMES == {"server_optimizer"} | sampled
        seen.add(opt)
        study.tell(trial, 0.0)
    assert seen == set(SERVER_OPTIMIZERS)


def test_a_when_naming_an_optimizer_that_does_not_use_the_parameter_is_one_line(tmp_path):
    path = write(tmp_path, OPT_HEAD + "  server_beta1: {distribution: fixed, value: 0.9, "
                                      "when: {server_optimizer: [adam, yogi, adagrad]}}\n")
    assert error_of(path) == (f"{path}: params.server_beta1.when.server_optimizer: server_optimizer 'adagrad' does "
                              "not use 'server_beta1'; allowed: adam, yogi")


def test_a_pinned_server_optimizer_drops_the_other_optimizers_hyperparameters(tmp_path):
    block = ("  server_beta1: {distribution: fixed, value: 0.9, when: {server_optimizer: [adam, yogi]}}\n"
             "  server_tau: {distribution: loguniform, low: 1.0e-9, high: 0.1, default: 1.0e-3, "
             "when: {server_optimizer: [adam, yogi, adagrad]}}\n")
    pinned = load_space(write(tmp_path, "algorithm: fedavg\ncomplete: true\nparams:\n  server_optimizer: "
                                        "{distribution: fixed, value: sgd}\n" + block))
    assert set(pinned.params) == {"server_optimizer"}  # never sampled: not parameters of the space
    assert pinned.defaults() == {"algorithm": "fedavg", "server_optimizer": "sgd"}
    adam = load_space(write(tmp_path, "algorithm: fedavg\ncomplete: true\nparams:\n  server_optimizer: "
                                      "{distribution: fixed, value: adam}\n" + block))
    assert adam.defaults() == {"algorithm": "fedavg", "server_optimizer": "adam", "server_beta1": 0.9,
                               "server_tau": 1e-3}
    FederatedRunConfig.from_dict(adam.defaults())
    # the same pin as a one-line override of the derived space: every other optimiser's knob is gone
    derived = load_space(write(tmp_path, "algorithm: fedavg\nparams:\n  server_optimizer: {distribution: fixed, "
                                         "value: sgd}\n", "pin.yaml"))
    assert not set(derived.params) & (OPT_NAMES - {"server_optimizer"}) and derived.defaults()["server_optimizer"] == "sgd"
    adam = load_space(write(tmp_path, "algorithm: fedavg\nparams:\n  server_optimizer: {distribution: fixed, value: adam}\n",
                            "pin.yaml"))
    assert set(adam.params) & OPT_NAMES == {"server_optimizer"} | OPTIMIZER_HPARAMS["adam"]
    FederatedRunConfig.from_dict(adam.defaults())
    bad = write(tmp_path, "algorithm: fedavg\nparams:\n  server_optimizer: {distribution: fixed, value: sgd}\n"
                          "  server_tau: {distribution: fixed, value: 0.001, when: null}\n")
    assert error_of(bad) == (f"{bad}: params.server_tau: server_optimizer 'sgd' does not use 'server_tau'; "
                             "allowed: adam, yogi, adagrad")


def test_knobs_own_fixes_the_server_optimizer_at_sgd_for_every_method(tmp_path):
    from fedtune.tune.study.options import SweepOptions
    from fedtune.tune.study.plan import plan_study
    from fedtune.tune.study.study_start import knob_summary, say_knobs, snapshot_spaces

    o = SweepOptions(algorithms=["fedavg", "fedprox"], rounds=2, num_samples=2, output=str(tmp_path), name="own",
                     overrides={"local_steps": 1}, report=False, knobs="own")
    _, plan = snapshot_spaces(o, plan_study(o))
    for algorithm in ("fedavg", "fedprox"):
        space = load_space(plan.study_dir / "spaces" / f"{algorithm}.yaml")
        assert space.params["server_optimizer"].initial == "sgd" and not space.params["server_optimizer"].sampled
        assert not set(space.params) & (OPT_NAMES - {"server_optimizer"})
    knobs = knob_summary(plan)
    assert knobs["searched"] == {"fedavg": [], "fedprox": ["prox_mu"]}
    assert knobs["shared_fixed"]["server_optimizer"] == {"value": "sgd", "algorithms": ["fedavg", "fedprox"]}
    lines: list[str] = []
    say_knobs(type("Console", (), {"print": lambda self, text, **kw: lines.append(text)})(), knobs)
    fixed = next(line for line in lines if line.startswith("fixed for every method"))
    assert "server_optimizer=sgd" in fixed.split(": ", 1)[1].split(", ")
    assert not any(name in fixed for name in OPT_NAMES - {"server_optimizer"})
