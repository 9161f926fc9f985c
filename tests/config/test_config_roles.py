"""Run fields declare their roles once (fedtune.config_roles): every list is derived, a field without
a trial-id role is refused in one line, and every earlier study's stored trial ids come back from its
stored configs (tests/config/old_studies: trials.parquet files written by earlier versions)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from fedtune.algorithms.base import HParam
from fedtune.config import ROLES, FederatedRunConfig
from fedtune.config_roles import GROUPS, roles_of, run_field
from fedtune.trial_ids import params_roles, trial_id_of

OLD_STUDIES = Path(__file__).parent / "old_studies"
STUDY_FILES = sorted(OLD_STUDIES.glob("*/*/trials.parquet"))


def test_the_old_study_fixtures_are_there():
    assert [str(p.relative_to(OLD_STUDIES).parent) for p in STUDY_FILES] == [
        "53e47ab/run", "53e47ab/sweep", "5b27eb1/run", "5b27eb1/sweep", "c5d0771/run", "ee1dc27/run"]


@pytest.mark.parametrize("path", STUDY_FILES, ids=lambda p: str(p.relative_to(OLD_STUDIES).parent))
def test_every_earlier_studys_trial_ids_come_back_from_its_stored_configs(path):
    rows = pq.read_table(path, columns=["trial_id", "config_json"]).to_pylist()
    assert len(rows) >= 2
    for row in rows:
        cfg = FederatedRunConfig.from_dict(json.loads(row["config_json"]))
        assert cfg.trial_id() == row["trial_id"], f"{path}: {row['config_json']}"


# The hand-kept ledgers these roles replaced (as they were when the roles were declared): the history
# of every study written so far. A later field may join any list; none of these may leave or change.
LEDGER_NEVER = {"plugins", "backend", "address", "eval_every", "eval_batch_size", "eval_batch_mib", "num_cpus",
                "num_gpus", "output", "name", "max_client_actors", "placement_timeout_s", "on_client_failure",
                "client_placement", "client_cpus", "client_gpus", "coordinator_cpus", "coordinator_gpus",
                "checkpoint_every", "cache_dir", "cache_key", "cache_wait_s"}
LEDGER_WHEN_SET = {"weights": "none", "augment": "none", "local_optimizer": "sgd", "precision": "fp32",
                   "channels_last": True, "cudnn_benchmark": True, "server_optimizer": "sgd",
                   "domain_homogeneity": None, "domain_homogeneity_rounding": "authors", "target_lr_scale": 1.0,
                   "split_scheme": None, "freeze_batchnorm": False, "fidelity_participation": None,
                   "fidelity_grace_rounds": 1, "fidelity_factor": 2.0, "fedex_configs": 0,
                   "fedex_knobs": ["local_lr"], "fedex_eps": 0.5, "fedex_schedule": "aggressive",
                   "fedex_baseline": 0.0, "fedex_diff": False, "fedex_cutoff": 0.0, "fedex_objective": "error"}
LEDGER_PARAMS_WHEN_SET = {"client_weighting": "examples", "server_v_start": "tau_squared"}
LEDGER_PARAMS_AS_RUN = {"fedadg_variant", "fish_inner_optimizer", "feddg_window", "feddg_ratio_low",
                        "feddg_ratio_high"}
LEDGER_PLAN = {"algorithm", "client_method", "server_rule", "dataset", "data_root", "data_seed", "image_size",
               "setting", "target_domain", "clients_per_domain", "num_clients", "dirichlet_alpha",
               "domain_homogeneity", "domain_homogeneity_rounding", "split_scheme", "participation",
               "target_fraction", "val_fraction", "test_fraction", "probe_fraction", "model", "pretrained_path",
               "seed"}


def test_the_derived_trial_id_lists_keep_every_earlier_rule():
    stored = {k for path in STUDY_FILES for row in pq.read_table(path, columns=["config_json"]).to_pylist()
              for k in json.loads(row["config_json"])}  # the fields earlier versions had
    always = stored - LEDGER_NEVER - set(LEDGER_WHEN_SET)
    assert len(always) > 30 and "rounds" in always and "fedex_eps" not in always
    when_set, as_run = params_roles()
    assert LEDGER_NEVER <= ROLES.never_hashed
    # a run field that becomes a component's hyperparameter (FedEx's) keeps its baseline there
    assert {k: ROLES.hashed_when_set.get(k, when_set.get(k, "missing")) for k in LEDGER_WHEN_SET} == LEDGER_WHEN_SET
    assert not always & (ROLES.never_hashed | set(ROLES.hashed_when_set))  # every other field: always
    assert {k: when_set.get(k, "missing") for k in LEDGER_PARAMS_WHEN_SET} == LEDGER_PARAMS_WHEN_SET
    assert LEDGER_PARAMS_AS_RUN <= set(as_run)
    assert set(ROLES.plan_fields) == LEDGER_PLAN  # the key of the plan cache (num_clients_of)


def test_the_sweep_and_cli_lists_are_the_declared_roles():
    from fedtune.cli import RUN_FLAGS, build_parser
    from fedtune.tune.study.resume import RESUME_FIXED

    assert RUN_FLAGS == {k: k for k in ("algorithm", "dataset", "data_root", "target_domain", "rounds", "seed",
                                        "backend", "address", "output", "name")}
    run = build_parser().parse_args(["run", "--algorithm", "fedprox", "--data-root", "/d", "--target-domain", "30",
                                     "--rounds", "3", "--seed", "2", "--backend", "local", "--address", "auto",
                                     "--output", "o", "--name", "n", "--dataset", "rotated-digits"])
    assert (run.rounds, run.seed, run.target_domain, run.data_root) == (3, 2, "30", "/d")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--backend", "dask"])
    assert ROLES.sweep_options == {"algorithm": "algorithms", "dataset": "dataset", "data_root": "data_root",
                                   "target_domain": "target_domain", "rounds": "rounds", "address": "address",
                                   "output": "output", "name": "name"}
    assert ROLES.study_place == ("address", "output", "name")
    assert set(RESUME_FIXED) == {
        "spaces", "algorithms", "dataset", "data_root", "target_domain", "rounds", "num_samples", "seeds",
        "max_concurrent", "scheduler", "sampler", "metric", "selection", "trial_seeds", "grace_period",
        "reduction_factor", "client_fidelity", "sampler_seed", "knobs", "set", "config", "loggers",
        "optuna_storage", "max_failures", "storage_path", "scale_up_timeout", "perturbation_interval"}


def test_a_field_without_a_trial_id_role_is_refused_in_one_line():
    @dataclass
    class WithExtra(FederatedRunConfig):
        new_knob: int = 0

    message = ("run field 'new_knob' of WithExtra declares no trial-id role; allowed: trial_id='always', "
               "'when_set' or 'never' in its run_field(...) (fedtune.config_roles)")
    with pytest.raises(TypeError) as exc:
        roles_of(WithExtra)
    assert str(exc.value) == message
    with pytest.raises(TypeError, match=r"^run field 'new_knob' of WithExtra declares no trial-id role"):
        WithExtra().trial_id()  # the id is never computed without the role
    with pytest.raises(TypeError, match="missing 1 required keyword-only argument: 'trial_id'"):
        run_field(0, "a knob", group="training")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"^run_field: trial_id='sometimes' is not a trial-id role; allowed: "
                                        r"always, when_set, never$"):
        run_field(0, "a knob", trial_id="sometimes", group="training")


def test_a_field_without_a_group_is_refused_in_one_line():
    @dataclass
    class NoGroup(FederatedRunConfig):
        new_knob: int = dataclasses.field(default=0, metadata={"trial_id": "always"})

    with pytest.raises(TypeError, match=r"^run field 'new_knob' of NoGroup declares no group of fedtune fields; "
                                        r"allowed: group='run', .* or 'results' in its run_field\(\.\.\.\)"):
        roles_of(NoGroup)
    with pytest.raises(TypeError, match=r"^run_field: group='misc' is not a group of fedtune fields; allowed: run, "):
        run_field(0, "a knob", trial_id="always", group="misc")


def test_a_field_added_later_keeps_every_earlier_id_at_its_legacy_value():
    @dataclass
    class Later(FederatedRunConfig):
        later: int = run_field(5, "a later field", trial_id="when_set", group="training")
        pinned: str = run_field("new", "a default changed", trial_id="when_set", legacy="old", group="training")
        where: str = run_field("here", "where it writes", trial_id="never", group="results")

    @dataclass
    class Always(FederatedRunConfig):
        counted: int = run_field(1, "a field of every id", trial_id="always", group="training")

    base = FederatedRunConfig().trial_id()
    assert Later(pinned="old").trial_id() == base  # at the values earlier runs had: their ids
    assert Later(pinned="old", where="there").trial_id() == base
    assert Later(pinned="new").trial_id() != base  # the new default: not taken for an earlier run
    assert Later(pinned="old", later=6).trial_id() != base
    assert Always().trial_id() != base  # "always" for a field added later: every earlier id changes
    assert Always(counted=2).trial_id() != Always().trial_id()
    assert roles_of(Later).hashed_when_set == {**ROLES.hashed_when_set, "later": 5, "pinned": "old"}
    with pytest.raises(TypeError, match=r"^run_field: legacy='x' is the baseline of trial_id='when_set', not 'never'$"):
        run_field("a", "b", trial_id="never", legacy="x", group="results")


def test_trial_id_of_reads_the_roles_not_a_list():
    """Moving a field from ``always`` to ``never`` (in a subclass) changes what the id covers."""
    @dataclass
    class Quiet(FederatedRunConfig):
        seed: int = run_field(0, "seed, left out here", trial_id="never", group="training")

    assert trial_id_of(Quiet(seed=1)) == trial_id_of(Quiet(seed=0))
    assert FederatedRunConfig(seed=1).trial_id() != FederatedRunConfig(seed=0).trial_id()


def test_a_hyperparameters_trial_id_role_is_declared_and_checked():
    with pytest.raises(TypeError, match=r"^HParam 'x': trial_id='later' is not a trial-id role; allowed: always, "
                                        r"when_set, as_run$"):
        HParam("x", 1.0, "a knob", trial_id="later")
    assert HParam("x", 1.0, "a knob").trial_id == "always"


def test_fedtune_fields_shows_every_field_once_under_its_declared_group(capsys):
    from fedtune.cli import main

    assert main(["fields"]) == 0
    out = capsys.readouterr().out
    titles = [GROUPS[g] for g in ROLES.groups]
    starts = [out.index("\n" + t) for t in titles]
    assert starts == sorted(starts)
    assert sorted(n for names in ROLES.groups.values() for n in names) == sorted(FederatedRunConfig.field_names())
    for (group, names), start, end in zip(ROLES.groups.items(), starts, [*starts[1:], len(out)]):
        section = out[start:end]
        for name in names:
            assert f"│ {name} " in section, (group, name)


def test_resume_refuses_a_changed_perturbation_interval_and_takes_the_saved_one(tmp_path):
    """--perturbation-interval was neither kept nor allowed on --resume: the saved options ran and the
    flag was dropped without a word. Declared resume_fixed now, like every other option of the study."""
    from fedtune.cli import build_parser
    from fedtune.cli_sweep import options_from_args
    from fedtune.errors import ConfigError
    from fedtune.results.study_dir import write_study
    from fedtune.tune.study.options import SweepOptions

    saved = SweepOptions(algorithms=["fedavg"], scheduler="pbt", rounds=8, output=str(tmp_path), name="s")
    write_study(tmp_path / "s", {"options": saved.to_json(), "started_at": "2024-01-01T00:00:00"})
    base = ["sweep", "--resume", "--output", str(tmp_path), "--name", "s", "--perturbation-interval"]
    with pytest.raises(ConfigError) as err:
        options_from_args(build_parser().parse_args([*base, "3"]))
    assert ("--perturbation-interval cannot change them (--perturbation-interval given 3, the study's 2 (unset: "
            "the default))") in str(err.value)
    assert options_from_args(build_parser().parse_args([*base, "2"])).perturbation_interval == 2  # its own again
