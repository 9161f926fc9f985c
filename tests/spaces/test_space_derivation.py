"""Search spaces derived from the declarations; a file is an override (fedtune/spaces/derive.py,
fedtune/spaces/shared.py, `fedtune spaces show`)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from fedtune.algorithms import SERVER_OPTIMIZERS, SERVER_RULES
from fedtune.algorithms.presets import PRESETS
from fedtune.config import FederatedRunConfig
from fedtune.errors import ConfigError
from fedtune.spaces import derive, shared
from fedtune.spaces.lookup import SPACES_DIR, list_spaces, load_space, search_space
from fedtune.spaces.model import OMITTED, Switch, strip_switches
from fedtune.spaces.show import space_text
from fedtune.spaces.yaml_files import build_space

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted(SPACES_DIR.glob("*.yaml")) + sorted(
    p for p in (ROOT / "examples" / "paper-setup").glob("*.yaml") if p.name != "pacs-resnet18.yaml")
SHARED_TAIL = ["local_lr", "local_optimizer", "local_momentum", "weight_decay", "global_lr"]
BLOCK = ["server_optimizer", "server_momentum", "server_beta1", "server_beta2", "server_tau",
         "server_adam_bias_correction", "server_v_start"]
BUDGET = {"local_epochs", "local_steps", "batch_size"}


def derived(algorithm: str, **constants) -> object:
    """The space of ``algorithm`` from the declarations alone (no file)."""
    return build_space({"algorithm": algorithm, **constants}, algorithm, None)


def write(tmp_path: Path, text: str, name: str = "space.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


# --------------------------------------------------------------------------- the derivation
@pytest.mark.parametrize("algorithm, constants, head", [
    ("fedavg", {}, ["client_weighting"]),
    ("fedprox", {}, ["prox_mu", "client_weighting"]),
    ("fishr", {}, ["fishr_penalty", "fishr_anneal_iters", "fishr_ema", "fishr_distance", "client_weighting"]),
    ("fedgala", {}, ["gala_tau", "gala_gate", "gala_iters", "gala_mix", "gala_weights"]),
    ("gfm", {}, ["sam_rho", "gfm_interval", "gfm_aug_lr", "gfm_color_scale", "gfm_geometry_scale", "client_weighting"]),
    # own_shared first among the shared knobs: FedOMG's server step is its own
    ("fedomg", {}, ["omg_kappa", "omg_solver", "omg_rescale", "global_lr"]),
    ("fediir-omg", {}, ["fediir_penalty", "fediir_ema", "omg_kappa", "omg_solver", "omg_rescale", "global_lr"]),
    # a composed pair: the client method's, then the rule's; the rule's default server step
    ("fedsam", {"server_rule": "fedomg"}, ["sam_rho", "omg_kappa", "omg_solver", "omg_rescale"]),
    ("fedgala", {"setting": "ufdg"}, ["simclr_temperature", "simclr_proj_dim", "gala_tau", "gala_gate", "gala_iters",
                                      "gala_mix", "gala_weights"]),
])
def test_the_derived_order_is_client_method_rule_shared_knobs_then_the_server_optimizer_block(algorithm, constants,
                                                                                              head):
    space = derived(algorithm, **constants)
    names = list(space.params)
    assert names == head + [n for n in SHARED_TAIL if n not in head] + BLOCK
    rule = SERVER_RULES.spec(space.constants.get("server_rule") or PRESETS[algorithm].server_rule)
    assert space.params["global_lr"].default == rule.default_global_lr
    for name in BLOCK[1:]:  # each optimiser's knob only with the optimisers that use it, left out otherwise
        users = tuple(o for o in SERVER_OPTIMIZERS if name in {h.name for h in SERVER_OPTIMIZERS.spec(o).hparams})
        assert space.params[name].when == {"server_optimizer": users} and space.params[name].fallback is OMITTED


# The sampled parameters of each shipped space, in order, as the full YAML files had them before the
# spaces were derived (the order Optuna samples in decides the sampled values and the trial ids of
# every study): each algorithm's own, then the shared tail below. Reordering a component's
# hyperparameters in the declarations changes this; it must not happen silently.
SAMPLED_BEFORE_THE_SHARED_KNOBS = {
    "fedavg": [], "scaffold": [], "target-only": [],
    "fedda": ["gp_beta", "gp_align"], "fedgp": ["gp_beta", "gp_align"],
    "feddyn": ["feddyn_alpha"], "fedga": ["fedga_step"], "fedgala": ["gala_tau", "gala_iters", "gala_mix"],
    "fediir": ["fediir_penalty", "fediir_ema"],
    "fediir-omg": ["fediir_penalty", "fediir_ema", "omg_kappa", "global_lr"],
    "fedomg": ["omg_kappa", "global_lr"], "fedprox": ["prox_mu"], "fedsam": ["sam_rho"],
    "fedsam-omg": ["sam_rho", "omg_kappa", "global_lr"], "fedsr": ["fedsr_l2r", "fedsr_cmi"],
    "fedsr-omg": ["fedsr_l2r", "fedsr_cmi", "omg_kappa", "global_lr"],
    "fishr": ["fishr_penalty", "fishr_anneal_iters", "fishr_ema"],
    "gca": ["gfm_interval", "gfm_aug_lr", "gfm_color_scale", "gfm_geometry_scale"],
    "gfm": ["sam_rho", "gfm_interval", "gfm_aug_lr", "gfm_color_scale", "gfm_geometry_scale"],
    "moon": ["moon_mu"],
}
SAMPLED_TAIL = ["local_lr", "local_momentum", "weight_decay", "global_lr", "server_optimizer", "server_momentum",
                "server_tau", "server_adam_bias_correction"]


@pytest.mark.parametrize("algorithm", sorted(SAMPLED_BEFORE_THE_SHARED_KNOBS))
def test_the_shipped_spaces_sample_in_the_order_their_full_files_did(algorithm):
    head = SAMPLED_BEFORE_THE_SHARED_KNOBS[algorithm]
    assert [n for n, p in load_space(algorithm).params.items() if p.sampled] == head + [
        n for n in SAMPLED_TAIL if n not in head]


def test_a_hyperparameter_without_search_is_fixed_at_the_presets_default_else_its_own():
    fedsr = derived("fedsr")
    weighting = fedsr.params["client_weighting"]
    assert (weighting.distribution, weighting.value) == ("fixed", "uniform")
    assert fedsr.origins["client_weighting"] == "preset fedsr's default"
    assert fedsr.params["fedsr_z_dim"].value == 512 and "no search" in fedsr.origins["fedsr_z_dim"]
    assert derived("fedsr-omg").params["omg_solver"].value == "exact"  # FedOMG weighs by examples: no client_weighting
    assert "client_weighting" not in derived("fedsr-omg").params
    assert derived("fedprox").params["client_weighting"].value == "examples"
    assert derived("fedprox").origins["prox_mu"] == "declared: client method prox"
    assert derived("fedprox").origins["local_lr"] == "shared"


def test_the_one_setting_a_pair_runs_in_is_derived():
    assert derived("fedgp").constants == {"algorithm": "fedgp", "setting": "fda"}
    assert derived("target-only").constants["setting"] == "fda"
    assert derived("simclr").constants["setting"] == "ufdg"
    assert "setting" not in derived("fedavg").constants
    assert derived("fedavg", setting="fl").constants["setting"] == "fl"  # a file's setting stands


@pytest.mark.parametrize("algorithm", list(PRESETS))
def test_every_named_algorithm_has_a_space_without_a_file(algorithm):
    space = derived(algorithm)
    cfg = FederatedRunConfig.from_dict(strip_switches(space.defaults()))
    tunable = set(cfg.resolved.hparam_specs()) | {
        f.name for f in dataclasses.fields(FederatedRunConfig) if f.metadata.get("hp")} | {
        h.name for opt in SERVER_OPTIMIZERS for h in SERVER_OPTIMIZERS.spec(opt).hparams}
    assert set(space.params) == tunable - BUDGET
    assert algorithm in list_spaces()


def test_a_name_without_a_file_is_derived_and_searchable(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert not (SPACES_DIR / "simclr.yaml").exists()
    space = load_space("simclr")
    assert space.source == "simclr" and load_space(space.source).params == space.params
    assert space.description == PRESETS["simclr"].description
    assert search_space("simclr")["setting"] == "ufdg"
    with pytest.raises(ConfigError, match="no search space named 'nope'"):
        load_space("nope")


def test_the_default_study_finds_its_algorithms():
    from fedtune.tune.study.default_study import DEFAULT_ALGORITHMS, apply_default_study
    from fedtune.tune.study.options import SweepOptions

    assert apply_default_study(SweepOptions()).algorithms == list(DEFAULT_ALGORITHMS)


# --------------------------------------------------------------------------- the shipped overrides
@pytest.mark.parametrize("path", SHIPPED, ids=[f"{p.parent.name}/{p.stem}" for p in SHIPPED])
def test_a_shipped_file_changes_only_what_it_names(path):
    """The space of a shipped file is its algorithm's derived space with exactly the entries the
    file names changed (each one changes something): same parameters, same order."""
    doc = yaml.safe_load(path.read_text())
    space = load_space(str(path))
    base = derived(doc["algorithm"], **{k: doc[k] for k in ("client_method", "server_rule", "setting") if k in doc})
    assert list(space.params) == list(base.params) and space.constants == base.constants
    named = set(doc.get("params") or {})
    for name, p in space.params.items():
        if name in named:
            assert p != base.params[name], f"{path.name}: params.{name} changes nothing"
        else:
            assert p == base.params[name], name
    assert space.switches == base.switches and not doc.get("switches")  # switches are declared once


def test_no_line_of_search_spaces_is_repeated_across_files():
    seen: dict[str, str] = {}
    for path in sorted(SPACES_DIR.glob("*.yaml")):
        for line in {ln for ln in path.read_text().splitlines() if ln.strip()}:
            assert line not in seen, f"{path.name} and {seen[line]} both say: {line}"
            seen[line] = path.name


def test_fediir_omg_keeps_the_papers_default_penalty_on_the_declared_range():
    base, space = derived("fediir-omg").params["fediir_penalty"], load_space("fediir-omg").params["fediir_penalty"]
    assert (space.low, space.high, space.default, space.help) == (base.low, base.high, 1e-4, base.help)
    assert load_space("fediir-omg").origins["fediir_penalty"] == "declared: client method fediir + file (default)"


# --------------------------------------------------------------------------- the override
def test_merge_entry_replaces_keys_and_a_new_distribution_drops_the_old_ones():
    base = {"distribution": "uniform", "low": 0.0, "high": 1.0, "default": 0.5, "when": {"m": "fixed"},
            "otherwise": "auto", "help": "beta"}
    assert derive.merge_entry(base, {"default": 0.2}) == {**base, "default": 0.2}
    assert derive.merge_entry(base, {"distribution": "fixed", "value": 0.3}) == {
        "distribution": "fixed", "when": {"m": "fixed"}, "otherwise": "auto", "help": "beta", "value": 0.3}
    assert derive.merge_entry(base, {"when": None}) == {k: v for k, v in base.items() if k not in ("when", "otherwise")}
    assert derive.merge_entry(base, "0.3") == "0.3"  # not a mapping: the file's check names it


def test_an_override_keeps_the_conditions_it_does_not_name(tmp_path):
    pinned = load_space(write(tmp_path, "algorithm: fedgp\nparams:\n  gp_beta: {distribution: fixed, value: 0.3}\n"))
    beta = pinned.params["gp_beta"]
    assert (beta.value, beta.when, beta.fallback) == (0.3, {"gp_beta_mode": ("fixed",)}, "auto")
    assert set(pinned.switches) == {"gp_beta_mode"}
    # when: null makes it unconditional: the rule's switch, now unused, is dropped
    plain = load_space(write(tmp_path, "algorithm: fedgp\nparams:\n  gp_beta: {distribution: fixed, value: 0.3, "
                                       "when: null}\n"))
    assert not plain.switches and plain.params["gp_beta"].when == {} and plain.defaults()["gp_beta"] == 0.3
    # a switch's default, overridden: the default configuration is auto-beta
    auto = load_space(write(tmp_path, "algorithm: fedgp\nswitches:\n  gp_beta_mode: {default: auto}\n"))
    assert auto.switches["gp_beta_mode"].choices == ("fixed", "auto") and auto.defaults()["gp_beta"] == "auto"


def test_an_override_may_add_a_budget_field_after_the_derived_parameters(tmp_path):
    space = load_space(write(tmp_path, "algorithm: fedprox\nparams:\n  local_steps: {distribution: int, low: 1, "
                                       "high: 5, default: 2}\n  prox_mu: {high: 0.1}\n"))
    assert list(space.params)[-1] == "local_steps" and space.origins["local_steps"] == "file"
    assert list(space.params)[0] == "prox_mu" and space.params["prox_mu"].high == 0.1
    assert space.origins["prox_mu"] == "declared: client method prox + file (high)"


@pytest.mark.parametrize("text, key, problem", [
    ("algorithm: fedavg\nparams:\n  local_lr: {low: 0.5}\n", "params.local_lr", "low 0.5 > high 0.2"),
    ("algorithm: fedavg\nparams:\n  server_optimizer: {value: adam}\n", "params.server_optimizer.value",
     "unknown key 'value' for distribution 'categorical'"),
    ("algorithm: fedavg\nparams:\n  omg_kappa: {distribution: uniform, low: 0.0, high: 1.0, default: 0.5}\n",
     "params.omg_kappa", "is a hyperparameter of server rule fedomg, which algorithm 'fedavg'"),
    ("algorithm: fediir\nparams:\n  fediir_penalty: {default: 0.5}\n", "params.fediir_penalty.default",
     "default 0.5 is outside the range [0.0001, 0.01]"),
    ("algorithm: fedgp\nswitches:\n  gp_beta_mode: {default: sometimes}\n", "switches.gp_beta_mode.default",
     "'sometimes' is not among the choices"),
    ("algorithm: fedavg\nswitches:\n  mode: {choices: [a, b], default: a}\n", "switches.mode",
     "no parameter's 'when' uses this switch"),
    ("algorithm: fedavg\nparams:\n  local_lr: 0.1\n", "params.local_lr", "expected a mapping such as"),
    ("algorithm: fedavg\nparams:\n  local_momentum: {when: {server_optimizer: rmsprop}}\n",
     "params.local_momentum.when.server_optimizer", "condition value"),
    ("algorithm: fedavg\ncomplete: yes please\n", "complete", "expected true or false"),
    ("algorithm: fedavg\ncomplete: true\n", "params", "missing required key 'params'"),
    ("algorithm: fedavg\nparams: {}\n", "params", "an override that changes no parameter leaves 'params' out"),
])
def test_a_bad_override_is_one_line_naming_the_file_and_the_key(tmp_path, text, key, problem):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_space(path)
    message = str(info.value)
    assert message.startswith(f"{path}: {key}: ") and "\n" not in message, message
    assert problem in message, message


# --------------------------------------------------------------------------- declared once
def test_the_switch_is_declared_once_by_the_rules():
    fedda, fedgp = SERVER_RULES.spec("fedda"), SERVER_RULES.spec("fedgp")
    assert fedda.search_switches is fedgp.search_switches
    assert load_space("fedda").switches["gp_beta_mode"] == Switch(
        "gp_beta_mode", ("fixed", "auto"), "fixed", "a fixed beta, or the auto-weighted estimate")
    assert load_space("fedgp").origins["gp_beta_mode"] == "declared: server rule fedgp"
    assert not any("switches" in yaml.safe_load(p.read_text()) for p in SHIPPED)


def test_the_shared_block_names_every_optimizer_and_each_of_their_hyperparameters():
    assert shared.SERVER_OPTIMIZER["choices"] == list(SERVER_OPTIMIZERS)
    knobs = {h.name for o in SERVER_OPTIMIZERS for h in SERVER_OPTIMIZERS.spec(o).hparams}
    assert sorted(shared.SERVER_OPTIMIZER_BLOCK) == sorted(knobs)
    hp = [f.name for f in dataclasses.fields(FederatedRunConfig) if f.metadata.get("hp")]
    assert set(shared.SHARED_KNOBS) == set(hp) - BUDGET - {"server_optimizer"}


def test_deriving_a_space_imports_no_torch():
    code = ("import sys; from fedtune.spaces.lookup import load_space; load_space('fedgp'); load_space('gfm'); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


# --------------------------------------------------------------------------- complete files, snapshots, show
@pytest.mark.parametrize("name", [*PRESETS, "examples/paper-setup/fedsr.yaml"])
def test_a_complete_copy_reads_back_the_same_space(name):
    space = load_space(str(ROOT / name) if name.endswith(".yaml") else name)
    again = build_space(yaml.safe_load(space_text(space)), "copy.yaml", None)
    assert (again.constants, again.switches, again.params, again.description) == (
        space.constants, space.switches, space.params, space.description)
    assert list(again.params) == list(space.params) and not again.origins


def test_a_snapshot_does_not_follow_a_later_change_of_the_declarations(tmp_path, monkeypatch):
    copy = write(tmp_path, space_text(load_space("fedavg")), "fedavg.yaml")
    monkeypatch.setitem(shared.SHARED_KNOBS, "local_lr", {**shared.SHARED_KNOBS["local_lr"], "high": 0.1})
    assert load_space("fedavg").params["local_lr"].high == 0.1
    assert load_space(copy).params["local_lr"].high == 0.2


def test_fedtune_spaces_show(capsys):
    from fedtune.cli import main

    assert main(["spaces", "show", "fediir-omg"]) == 0
    out = capsys.readouterr().out
    assert "search space of fediir-omg: overridden by " in out and "fediir-omg.yaml (fediir_penalty)" in out
    row = next(line for line in out.splitlines() if "fediir_penalty" in line and "│" in line)
    for cell in ("loguniform", "[0.0001, 0.01]", "0.0001", "declared: client method fediir + file (default)"):
        assert cell in row, row
    tau = next(line for line in out.splitlines() if "server_tau" in line)
    assert "server_optimizer in [adam, yogi, adagrad]; else left out" in tau
    assert "| shared" in out.replace("│", "|") and "constants: algorithm=fediir-omg" in out

    assert main(["spaces", "show", "simclr"]) == 0
    assert "search space of simclr: derived (from the declarations; no file)" in capsys.readouterr().out
    assert main(["spaces", "show", "fedgp", "--yaml"]) == 0
    doc = yaml.safe_load(capsys.readouterr().out)
    assert doc["complete"] is True and doc["setting"] == "fda" and "gp_beta_mode" in doc["switches"]
    assert main(["spaces", "show", "nope"]) == 2
    assert "no search space named 'nope'" in capsys.readouterr().err


def test_a_study_keeps_complete_copies_of_its_spaces(tmp_path):
    from fedtune.tune.study.options import SweepOptions
    from fedtune.tune.study.plan import plan_study
    from fedtune.tune.study.study_start import snapshot_spaces

    o = SweepOptions(algorithms=["fedgp", "simclr"], rounds=2, num_samples=2, output=str(tmp_path), name="s",
                     overrides={"local_steps": 2}, report=False)
    _, plan = snapshot_spaces(o, plan_study(o))
    for algorithm in ("fedgp", "simclr"):
        copy = load_space(plan.study_dir / "spaces" / f"{algorithm}.yaml")
        assert yaml.safe_load(Path(copy.source).read_text())["complete"] is True
        assert (copy.params, copy.switches, copy.constants) == (
            load_space(algorithm).params, load_space(algorithm).switches, load_space(algorithm).constants)


def test_a_studys_copy_written_before_derivation_is_read_as_the_whole_space(tmp_path):
    """A study started before spaces were derived keeps full copies without ``complete: true``: on
    --resume they are read as written (nothing derived is added), so the study samples what it did;
    the same text anywhere else is an override."""
    text = textwrap.dedent("""\
        algorithm: fedomg
        params:
          omg_kappa: {distribution: uniform, low: 0.0, high: 1.0, default: 0.5}
          local_lr:  {distribution: fixed, value: 0.05}
        """)
    study = tmp_path / "study"
    (study / "spaces").mkdir(parents=True)
    (study / "study.json").write_text("{}")
    (study / "spaces" / "fedomg.yaml").write_text(text)
    (tmp_path / "fedomg.yaml").write_text(text)
    assert list(load_space(study / "spaces" / "fedomg.yaml").params) == ["omg_kappa", "local_lr"]
    assert "server_optimizer" in load_space(tmp_path / "fedomg.yaml").params  # elsewhere: an override
