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
