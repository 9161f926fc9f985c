"""fedtune.results.selection: the one selection protocol (val / target-val / oracle), on hand-built round
tables where each protocol picks a known round and trial, and the runtime's routing of the FDA
target client's validation split and of the oracle slice into their own columns."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest

from fedtune.results import selection
from fedtune.errors import ConfigError

# Two trials of one search, 3 rounds each (a pyarrow table, as the results store holds them).
#                 round:      1     2     3
# a  val_acc             0.60  0.90  0.70     <- val: a, round 2 (0.90 > b's 0.80)
#    target_val_acc      0.20  0.30  0.40
#    oracle_acc          0.95  0.50  0.40     <- the oracle never looks at round 1's 0.95
#    ood_val_acc         0.10  0.20  0.30
#    target_acc          0.11  0.12  0.13
# b  val_acc             0.80  0.50  0.40
#    target_val_acc      0.70  0.60  0.65     <- target-val: b, round 1
#    oracle_acc          0.30  0.60  0.55     <- oracle: b, last round (0.55 > a's 0.40)
#    ood_val_acc         0.35  0.45  0.40     <- ood-val (a split file's): b, round 2
#    target_acc          0.21  0.22  0.23
# macro-F1 picks otherwise than accuracy:
# a  val_macro_f1        0.50  0.40  0.65     <- val-f1: a, round 3 (0.65 > b's 0.60)
#    ood_val_macro_f1    0.30  0.50  0.20     <- ood-val-f1: a, round 2 (0.50 > b's 0.45)
# b  val_macro_f1        0.60  0.55  0.30
#    ood_val_macro_f1    0.25  0.35  0.45
TABLE = pa.table({
    "trial_id": ["a"] * 3 + ["b"] * 3,
    "round": [1, 2, 3] * 2,
    "status": ["ok"] * 6,
    "val_acc": [0.60, 0.90, 0.70, 0.80, 0.50, 0.40],
    "target_val_acc": [0.20, 0.30, 0.40, 0.70, 0.60, 0.65],
    "oracle_acc": [0.95, 0.50, 0.40, 0.30, 0.60, 0.55],
    "ood_val_acc": [0.10, 0.20, 0.30, 0.35, 0.45, 0.40],
    "target_acc": [0.11, 0.12, 0.13, 0.21, 0.22, 0.23],
    "val_macro_f1": [0.50, 0.40, 0.65, 0.60, 0.55, 0.30],
    "ood_val_macro_f1": [0.30, 0.50, 0.20, 0.25, 0.35, 0.45],
})

EXPECTED = {  # protocol -> (selected trial, its reported round, score, reported target_acc)
    "val": ("a", 2, 0.90, 0.12),
    "target-val": ("b", 1, 0.70, 0.21),
    "oracle": ("b", 3, 0.55, 0.23),
    "ood-val": ("b", 2, 0.45, 0.22),
    "val-f1": ("a", 3, 0.65, 0.13),
    "ood-val-f1": ("a", 2, 0.50, 0.12),
}


def _rows(trial: str) -> list[dict]:
    return [r for r in TABLE.to_pylist() if r["trial_id"] == trial]


@pytest.mark.parametrize("protocol", selection.PROTOCOLS)
def test_each_protocol_picks_the_known_trial_and_round(protocol):
    choices = {t: selection.choose_round(_rows(t), protocol) for t in ("a", "b")}
    chosen = selection.select((t, c.score) for t, c in choices.items())
    trial, rnd, score, target = EXPECTED[protocol]
    assert chosen == trial
    assert choices[trial] == selection.Choice(rnd, score, target)


def test_report_and_trials_parquet_agree_with_the_protocol(tmp_path):
    from fedtune.results.store import ResultsStore, load
    from fedtune.results.summary import summarize_trial
    from fedtune.reports.report import make_report

    store = ResultsStore(tmp_path, "s")
    for t in ("a", "b"):
        rows = [{**r, "algorithm": "fedda", "setting": "fda", "target_domain": "0", "seed": 0} for r in _rows(t)]
        store.write_rounds(t, rows)
        store.write_trial(summarize_trial(rows, config={"trial_id": t}, status="completed", error=None,
                                          started_at=None, ended_at=None))
    for protocol, (trial, rnd, score, target) in EXPECTED.items():
        if protocol in ("ood-val", *selection.F1):  # need a split file's trials: tests/data/test_split_file.py
            continue
        r = make_report(store.study_dir, selection=protocol, plots=False, write=False)
        (row,) = r.selected.to_dict("records")
        assert (row["trial_id"], row["round"], row["score"], row["target_acc"]) == (trial, rnd, score, target)
    trials = {t["trial_id"]: t for t in load(store.study_dir, "trials").to_pylist()}
    assert trials["a"]["best_round"] == 2 and trials["b"]["target_val_round"] == 1
    assert trials["b"]["final_oracle_acc"] == 0.55 and trials["a"]["final_oracle_acc"] == 0.40


def test_ties_go_to_the_earliest_round_and_the_first_trial_id_and_nan_never_wins():
    rows = [{"round": 1, "val_acc": 0.5, "target_acc": 0.1}, {"round": 2, "val_acc": 0.5, "target_acc": 0.2},
            {"round": 3, "val_acc": math.nan, "target_acc": 0.9}]
    assert selection.choose_round(rows, "val") == selection.Choice(1, 0.5, 0.1)
    assert selection.select([("z", 0.5), ("y", 0.5), ("x", math.nan)]) == "y"
    assert selection.select([("x", math.nan)]) is None
    # the oracle's last round: a diverged trial has no last model; eval_every gaps are skipped
    assert selection.choose_round([{"round": 1, "oracle_acc": 0.9}, {"round": 2, "status": "diverged",
                                                                      "oracle_acc": math.nan}], "oracle").round is None
    assert selection.choose_round([{"round": 1, "oracle_acc": 0.9, "target_acc": 0.3},
                                   {"round": 2, "oracle_acc": None}], "oracle") == selection.Choice(1, 0.9, 0.3)


def test_protocols_outside_their_settings_are_clear_errors():
    assert selection.check_protocol("target-val", "fda") == "target-val"
    with pytest.raises(ConfigError, match="'target-val' needs setting fda.*allows: val, oracle"):
        selection.check_protocol("target-val", "ufdg")
    with pytest.raises(ConfigError, match="'oracle' needs a held-out target domain.*allowed: val"):
        selection.check_protocol("oracle", "fl")
    with pytest.raises(ConfigError, match="oracle_fraction"):
        selection.check_protocol("oracle", "fdg", oracle_fraction=0.0)
    with pytest.raises(ConfigError, match="allowed: val, target-val, ood-val, val-f1, ood-val-f1, oracle"):
        selection.check_protocol("best-target")


def test_coordinator_keeps_the_target_clients_validation_and_the_oracle_slice_out_of_val_and_target():
    from fedtune.data.partition import make_plan
    from fedtune.data.base import DatasetInfo
    from fedtune.runtime.common import EvalCounts
    from fedtune.runtime.coordinator import Coordinator
    from fedtune.runtime.messages import EvalReply, eval_shards

    info = DatasetInfo("toy", ("A", "B", "C"), ("x", "y"), (2,), "mlp", "fdg")
    labels = {d: np.arange(40) % 2 for d in info.domains}
    plan = make_plan(info, labels, setting="fda", target_domain="C", target_fraction=0.25, oracle_fraction=0.2)
    shards = eval_shards(plan)
    assert [s.split for s in shards] == ["test", "oracle"]
    # sources: 3/4 and 1/4 correct; the target client's val: 2/2; target test 1/2; oracle 5/10
    replies = [EvalReply(client_ids=[0, 1, 2], val=[EvalCounts(3, 4, 4.0), EvalCounts(1, 4, 8.0), EvalCounts(2, 2, 0.2)],
                         test=[EvalCounts()] * 3, shard_ids=[0, 1],
                         shards=[EvalCounts(1, 2, 2.0), EvalCounts(5, 10, 10.0)])]
    stub = SimpleNamespace(plan=plan, shards=shards)
    out = Coordinator._eval_metrics(stub, replies)
    assert out["val_acc"] == 0.5 and out["val_loss"] == 1.5  # the sources only
    assert out["target_val_acc"] == 1.0 and out["target_val_loss"] == pytest.approx(0.1)
    assert out["target_acc"] == 0.5 and out["oracle_acc"] == 0.5 and out["oracle_loss"] == 1.0
    fdg = make_plan(info, labels, setting="fdg", target_domain="C", oracle_fraction=0.0)
    out = Coordinator._eval_metrics(SimpleNamespace(plan=fdg, shards=eval_shards(fdg)),
                                    [EvalReply([0, 1], [EvalCounts(1, 2, 0.0)] * 2, [EvalCounts()] * 2, [0],
                                               [EvalCounts(3, 4, 0.0)])])
    assert "target_val_acc" not in out and "oracle_acc" not in out and out["target_acc"] == 0.75
