"""``fedtune sweep --config FILE.yaml``: the file's run fields are the base of every trial
(``fedtune run --config``'s loader), with defaults < file < flags < ``--set``; errors name the
file and the field. Planning only: no Ray."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fedtune.cli import build_parser

from fedtune.cli_sweep import options_from_args
from fedtune.errors import ConfigError
from fedtune.tune.study.default_study import is_default_study
from fedtune.tune.study.plan import plan_study


def sweep_opts(tmp_path, *argv: str):
    return options_from_args(build_parser().parse_args(["sweep", "--output", str(tmp_path), "--name", "c", *argv]))


def test_config_file_is_the_base_of_every_trial_and_flags_and_set_win(tmp_path):
    cfg = tmp_path / "base.yaml"
    cfg.write_text("algorithm: fedprox\ndataset: rotated-digits\ntarget_domain: 30\nrounds: 2\n"
                   "local_steps: 3\nbatch_size: 16\nseed: 4\n")
    opts = sweep_opts(tmp_path, "--config", str(cfg), "--set", "local_steps=1", "--rounds", "5")
    assert not is_default_study(opts)
    plan = plan_study(opts)
    (search,) = plan.searches
    fixed = plan.fixed[search.key]
    assert search.algorithm == "fedprox"  # the file's algorithm, no --algorithm given
    assert fixed["target_domain"] == "30" and fixed["dataset"] == "rotated-digits"  # coerced as fedtune run does
    assert fixed["rounds"] == 5  # --rounds beats the file
    assert fixed["local_steps"] == 1  # --set beats the file
    assert fixed["batch_size"] == 16 and fixed["seed"] == 4 and plan.base_seed == 4  # the file's own fields
    assert opts.config == str(cfg) and opts.to_json()["config_fields"] == {"local_steps": 3, "batch_size": 16,
                                                                           "seed": 4}
    # --algorithm wins over the file's algorithm
    assert [s.algorithm for s in plan_study(sweep_opts(tmp_path, "--config", str(cfg), "--algorithm",
                                                       "fedavg")).searches] == ["fedavg"]


@pytest.mark.parametrize("text, words", [
    ("local_lr: 0.1\n", ["config file", "base.yaml", "field 'local_lr'", "sampled by search space"]),
    ("local_stepz: 1\n", ["base.yaml", "unknown field 'local_stepz'", "local_steps"]),
    ("local_steps: -1\n", ["base.yaml", "local_steps"]),
    ("name: other\n", ["config file", "base.yaml", "field 'name'", "--name"]),
    ("output: /tmp/x\n", ["field 'output'", "--output"]),
    ("[1, 2]\n", ["base.yaml", "mapping"]),
    ("a: [unclosed\n", ["base.yaml", "not valid YAML"]),
])
def test_bad_config_files_name_the_file_and_the_field(tmp_path, text, words):
    cfg = tmp_path / "base.yaml"
    cfg.write_text(text)
    with pytest.raises(ConfigError) as err:
        plan_study(sweep_opts(tmp_path, "--config", str(cfg)))
    for w in words:
        assert w in str(err.value), (w, str(err.value))


def test_config_cli_errors_exit_2_and_resume_refuses_config_and_logger(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        sweep_opts(tmp_path, "--config", str(tmp_path / "missing.yaml"))
    (tmp_path / "x.yaml").write_text("rounds: 2\n")
    for extra in (["--config", str(tmp_path / "x.yaml")], ["--logger", "csv"]):  # no study to compare with
        with pytest.raises(ConfigError, match="--resume continues a study with its saved options"):
            sweep_opts(tmp_path, "--resume", *extra)
    (tmp_path / "bad.yaml").write_text("local_lr: 0.1\n")
    res = subprocess.run([sys.executable, "-m", "fedtune", "sweep", "--config", str(tmp_path / "bad.yaml"),
                          "--output", str(tmp_path)], capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 2 and "bad.yaml" in res.stderr and "Traceback" not in res.stderr, res.stderr


# ------------------------------------------------------------------------------------------------
# Reliability round 4: a scheduler option that has no effect, and one that comes after the last
# round, are one line before anything starts (nothing is made in the output folder).
def _refused(tmp_path, argv, words):
    with pytest.raises(ConfigError) as err:
        plan_study(sweep_opts(tmp_path, "--algorithm", "fedavg", *argv))
    text = str(err.value)
    assert "\n" not in text and all(w in text for w in words), text
    assert list(tmp_path.iterdir()) == []
    return text


@pytest.mark.parametrize("scheduler, name", [("asha", "ASHA"), ("hyperband", "HyperBand")])
def test_a_first_rung_at_or_after_the_last_round_is_refused_with_the_numbers(tmp_path, scheduler, name):
    _refused(tmp_path, ["--scheduler", scheduler, "--rounds", "5", "--grace-period", "12"],
             ["option '--grace-period': 12 is not before the last round (--rounds 5)", f"{name}'s first rung",
              "allowed: 1 to 4"])
    _refused(tmp_path, ["--scheduler", scheduler, "--rounds", "5", "--grace-period", "5"], ["allowed: 1 to 4"])
    _refused(tmp_path, ["--scheduler", scheduler, "--grace-period", "10"], ["(rounds 10, the default)"])
    _refused(tmp_path, ["--scheduler", scheduler, "--rounds", "1"],
             [f"allowed: --rounds >= 2 with --scheduler {scheduler}"])
    plan = plan_study(sweep_opts(tmp_path, "--algorithm", "fedavg", "--scheduler", scheduler, "--rounds", "5",
                                 "--grace-period", "4"))
    assert plan.options.grace_period == 4


@pytest.mark.parametrize("scheduler", ["fifo", "pbt"])
@pytest.mark.parametrize("flag, value", [("--grace-period", "3"), ("--grace-period", "1"),
                                         ("--reduction-factor", "3"), ("--reduction-factor", "2")])
def test_asha_options_without_a_scheduler_that_reads_them_are_refused(tmp_path, scheduler, flag, value):
    # given on the command line, even at its default value, it is refused: it would do nothing
    argv = ["--rounds", "4"] + ([] if scheduler == "fifo" else ["--scheduler", scheduler])
    with pytest.raises(ConfigError) as err:
        sweep_opts(tmp_path, "--algorithm", "fedavg", *argv, flag, value)
    text = str(err.value)
    assert text == (f"option '{flag}': ASHA's and HyperBand's; allowed with --scheduler asha or hyperband, "
                    f"not {scheduler}"), text
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("field, value", [("grace_period", 3), ("reduction_factor", 3.0)])
def test_asha_options_set_through_the_python_api_are_refused_without_a_rung_scheduler(tmp_path, field, value):
    from fedtune.tune.study.options import SweepOptions

    opts = SweepOptions(algorithms=["fedavg"], rounds=4, output=str(tmp_path), name="a", **{field: value})
    with pytest.raises(ConfigError, match=f"option '--{field.replace('_', '-')}': ASHA's and HyperBand's"):
        plan_study(opts)
    opts.scheduler = "asha"
    assert getattr(plan_study(opts).options, field) == value


@pytest.mark.parametrize("scheduler, name", [("pbt", "PBT"), ("pb2", "PB2")])
def test_a_perturbation_interval_past_the_last_round_is_refused(tmp_path, scheduler, name):
    _refused(tmp_path, ["--scheduler", scheduler, "--sampler", "random", "--rounds", "4", "--perturbation-interval",
                        "4"], ["option '--perturbation-interval': 4 is not before the last round (--rounds 4)",
                               f"{name} would never exploit or explore", "allowed: 1 to 3"])
    _refused(tmp_path, ["--scheduler", scheduler, "--rounds", "4", "--perturbation-interval", "40"],
             ["allowed: 1 to 3"])
    _refused(tmp_path, ["--scheduler", scheduler, "--rounds", "1"],  # the default interval: a quarter of 1 round
             ["option '--rounds': 1 round (--rounds 1)", f"leaves {name} no round", "allowed: --rounds >= 2"])
    assert plan_study(sweep_opts(tmp_path, "--algorithm", "fedavg", "--scheduler", scheduler, "--rounds", "4",
                                 "--perturbation-interval", "3")).options.perturbation_interval == 3


def test_a_started_study_keeps_the_scheduler_options_it_started_with(tmp_path):
    """A study that started (study.json is there) with an option that had no effect is planned again
    as it was (--resume), so it continues; a new study with the same options is refused."""
    from fedtune.tune.study.options import SweepOptions

    opts = SweepOptions(algorithms=["fedavg"], rounds=4, grace_period=3, output=str(tmp_path), name="old")
    with pytest.raises(ConfigError, match="option '--grace-period'"):
        plan_study(opts)
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "study.json").write_text("{}")
    assert plan_study(opts).options.grace_period == 3


def test_an_explicit_target_domain_under_a_split_scheme_is_refused(tmp_path):
    text = _refused(tmp_path, ["--dataset", "pacs", "--target-domain", "sketch", "--set", "split_scheme=official"],
                    ["option '--target-domain': 'sketch' has no effect with split_scheme 'official'",
                     "split file names the test domains", "allowed: leave --target-domain out"])
    assert len(text) < 300
    _refused(tmp_path, ["--dataset", "pacs", "--target-domain", "all", "--set", "split_scheme=official"],
             ["option '--target-domain': 'all' has no effect"])
    # fedtune run's field says the same
    from fedtune.config import FederatedRunConfig

    with pytest.raises(ConfigError, match="field 'target_domain': 'sketch' has no effect with split_scheme "
                                          "'official'.*allowed: null"):
        FederatedRunConfig.from_dict({"dataset": "pacs", "split_scheme": "official", "target_domain": "sketch"})
