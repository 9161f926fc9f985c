"""Multi-fidelity over clients (issue 31 item 2): ``fidelity_participation`` raises a run's
participation along ASHA's rungs, and ``fedtune sweep --client-fidelity P`` sets it from the ASHA
options. Planning and a local run: no Ray."""

from __future__ import annotations

import pytest

from fedtune.cli import build_parser

from fedtune.cli_sweep import options_from_args
from fedtune.config import FederatedRunConfig
from fedtune.data.partition import fidelity_participation
from fedtune.errors import ConfigError
from fedtune.results.store import load
from fedtune.runtime.driver import run
from fedtune.tune.study.plan import plan_study


def _rungs_by_hand(round_: int, full: float, first: float, grace: int, factor: float) -> float:
    """ASHA's milestones grace * factor**k: a round after the k-th milestone runs at first * factor**(k+1)."""
    passed = sum(1 for k in range(64) if grace * factor ** k < round_)
    return min(full, first * factor ** passed)


@pytest.mark.parametrize("full, first, grace, factor", [(1.0, 0.25, 2, 2.0), (0.8, 0.1, 1, 3.0), (0.5, 0.5, 1, 2.0)])
def test_the_participation_grows_by_the_factor_after_each_asha_milestone(full, first, grace, factor):
    for r in range(1, 40):
        assert fidelity_participation(r, full, first, grace, factor) == pytest.approx(
            _rungs_by_hand(r, full, first, grace, factor))


def test_a_run_samples_the_rungs_participation_and_its_trial_id_says_so(tmp_path):
    base = {"dataset": "rotated-digits", "setting": "fl", "num_clients": 8, "model": "mlp", "mlp_hidden": [16],
            "local_steps": 1, "rounds": 5, "backend": "local", "output": str(tmp_path), "name": "f"}
    cfg = FederatedRunConfig.from_dict({**base, "fidelity_participation": 0.25, "fidelity_grace_rounds": 1,
                                        "fidelity_factor": 2.0})
    assert [cfg.participation_at(r) for r in range(1, 6)] == [0.25, 0.5, 1.0, 1.0, 1.0]
    result = run(cfg, progress=False)
    rows = sorted((r for r in load(tmp_path / "f").to_pylist() if r["trial_id"] == result.trial_id),
                  key=lambda r: r["round"])
    assert [r["num_participants"] for r in rows] == [2, 4, 8, 8, 8]
    plain = FederatedRunConfig.from_dict(base)
    assert plain.participation_at(3) == 1.0 and plain.trial_id() != cfg.trial_id()
    # unset, the fields leave the trial id of every earlier study as it was
    assert FederatedRunConfig.from_dict({**base, "fidelity_grace_rounds": 1}).trial_id() == plain.trial_id()


def test_bad_fidelity_fields_are_one_line():
    with pytest.raises(ConfigError, match=r"field 'fidelity_participation': 0.6 is above participation 0.5 .*"
                                          r"allowed: \(0, 0.5\]"):
        FederatedRunConfig.from_dict({"participation": 0.5, "fidelity_participation": 0.6})
    with pytest.raises(ConfigError, match="field 'fidelity_factor'"):
        FederatedRunConfig.from_dict({"fidelity_participation": 0.5, "fidelity_factor": 1.0})


def _opts(tmp_path, *argv: str):
    return options_from_args(build_parser().parse_args(["sweep", "--output", str(tmp_path), "--name", "c",
                                                        "--algorithm", "fedavg", *argv]))


def test_sweep_client_fidelity_gives_every_trial_the_asha_rungs(tmp_path):
    opts = _opts(tmp_path, "--scheduler", "asha", "--grace-period", "2", "--reduction-factor", "3",
                 "--client-fidelity", "0.1", "--set", "setting=fl")
    opts.validate()
    (search,) = plan_study(opts).searches
    fixed = plan_study(opts).fixed[search.key]
    assert (fixed["fidelity_participation"], fixed["fidelity_grace_rounds"], fixed["fidelity_factor"]) == (0.1, 2, 3.0)
    assert opts.to_json()["client_fidelity"] == 0.1  # saved with the study: a resume keeps it


@pytest.mark.parametrize("argv, words", [
    (["--client-fidelity", "0.2"], "option '--client-fidelity': raises the participation along ASHA's rungs; allowed "
                                   "with --scheduler asha, not fifo"),
    (["--scheduler", "asha", "--client-fidelity", "1.5"], r"option '--client-fidelity': 1.5 is above 1; allowed: \(0, 1\]"),
    (["--scheduler", "asha", "--client-fidelity", "0"], "option '--client-fidelity': 0"),
    (["--scheduler", "asha", "--client-fidelity", "0.2", "--set", "fidelity_factor=3"],
     "option '--client-fidelity' sets field 'fidelity_factor' from the ASHA options"),
])
def test_bad_client_fidelity_options_are_one_line(tmp_path, argv, words):
    with pytest.raises(ConfigError, match=words):
        _opts(tmp_path, *argv).validate()
