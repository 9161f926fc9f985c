"""PBT and PB2 (issue 31 item 1): Ray Tune's population-based training over federated runs. A
member exploiting another restarts from the donor's whole federated state with the donor's
configuration, perturbed within the space; its rows say so (``pbt_history``), its fedtune trial id
stays one per member, every (member, round) is recorded once, Optuna holds every member once with
the Arrow records' values, also after a killed driver resumed; structural choices (the server
optimiser) are never mutated; bad options are one line."""

from __future__ import annotations

import json

import pytest

from fedtune.errors import ConfigError
from fedtune.spaces.lookup import load_space
from fedtune.tune.study.options import SweepOptions
from fedtune.tune.trial.population import fold_history
from fedtune.tune.tuner.schedulers import ClipToSpace, make_population_scheduler


def test_pbt_mutates_the_numeric_knobs_clipped_to_the_space_and_never_a_structural_choice():
    space = load_space("fedavg")
    pbt = make_population_scheduler("pbt", "val_acc", "max", 2, space, seed=0)
    mutations = pbt._hyperparam_mutations
    assert set(mutations) == {"local_lr", "local_momentum", "weight_decay", "global_lr"}
    assert mutations["local_momentum"] == [0.0, 0.5, 0.9]  # a categorical of numbers: shifted along its choices
    assert "server_optimizer" not in mutations and "server_tau" not in mutations  # structure, and what follows it
    config = {"local_lr": 0.2 * 1.2, "global_lr": 0.005 * 0.8, "local_momentum": 0.9, "algorithm": "fedavg"}
    clipped = pbt._custom_explore_fn(dict(config))
    assert clipped["local_lr"] == 0.2 and clipped["global_lr"] == 0.005 and clipped["local_momentum"] == 0.9
    assert ClipToSpace({"local_epochs": (1, 5, True)})({"local_epochs": 5.6}) == {"local_epochs": 5}
    pb2 = make_population_scheduler("pb2", "val_acc", "max", 2, space, seed=0)
    assert set(pb2._hyperparam_bounds) == {"local_lr", "global_lr"}  # PB2's GP: the float ranges


def test_the_member_history_folds_each_exploit_into_every_later_row():
    rows = {1: {"round": 1}, 2: fold_history({"round": 2, "pbt_event": json.dumps({"round": 1, "from": "a"})},
                                            {1: {"round": 1}})}
    assert json.loads(rows[2]["pbt_history"]) == [{"round": 1, "from": "a"}] and "pbt_event" not in rows[2]
    rows[3] = fold_history({"round": 3}, rows)
    assert rows[3]["pbt_history"] == rows[2]["pbt_history"]
    rows[4] = fold_history({"round": 4, "pbt_event": json.dumps({"round": 3, "from": "b"})}, rows)
    assert [e["from"] for e in json.loads(rows[4]["pbt_history"])] == ["a", "b"]
    assert "pbt_history" not in fold_history({"round": 2}, {1: {"round": 1}})


@pytest.mark.parametrize("kw, words", [
    ({"scheduler": "pbt", "sampler": "gp"}, "option '--sampler': --scheduler pbt draws its population at random"),
    ({"scheduler": "pbt", "seeds": 2}, "option '--seeds': a pbt member's configuration changes along its run"),
    ({"scheduler": "pb2", "sampler": "nsga2"}, "option '--scheduler': pb2 exploits by one objective"),
    ({"scheduler": "asha", "perturbation_interval": 2}, "option '--perturbation-interval': PBT's and PB2's; allowed "
                                                        "with --scheduler pbt or pb2, not asha"),
    ({"scheduler": "pbt", "perturbation_interval": 0}, "option '--perturbation-interval'"),
])
def test_bad_population_options_are_one_line(tmp_path, kw, words):
    with pytest.raises(ConfigError) as err:
        SweepOptions(algorithms=["fedavg"], output=str(tmp_path), name="p", **kw).validate()
    assert words in str(err.value) and "\n" not in str(err.value), str(err.value)
