"""The report says what its table can conclude: nothing from one search per algorithm, and a
difference only when the 95 % paired t-interval over seeds excludes zero."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fedtune.results.store import ResultsStore
from fedtune.results.summary import summarize_trial
from fedtune.reports.report import make_report  # noqa: E402


def _study(tmp_path: Path, acc: dict[tuple[str, str, int], float]) -> Path:
    """One trial per (algorithm, domain, seed), one round; val_acc = target_acc = acc."""
    store = ResultsStore(tmp_path, "s")
    for (algorithm, domain, seed), a in acc.items():
        tid = f"{algorithm}-{domain}-{seed}"
        rows = [{"algorithm": algorithm, "target_domain": domain, "seed": seed, "dataset": "rotated-digits",
                 "setting": "fdg", "status": "ok", "round": 1, "val_acc": a, "target_acc": a, "oracle_acc": a}]
        store.write_rounds(tid, rows)
        store.write_trial(summarize_trial(rows, config={"trial_id": tid}, status="completed", error=None,
                                          started_at=None, ended_at=None))
    return store.study_dir


def test_one_seed_decides_nothing(tmp_path):
    d = _study(tmp_path, {("fedavg", "0", 0): 0.9, ("fedomg", "0", 0): 0.2})
    rep = make_report(d, plots=False, write=False)
    lines = rep.conclusions()
    assert len(lines) == 1 and lines[0].startswith("This table decides nothing")
    assert "--trial-seeds" in lines[0]


def test_consistent_gap_is_a_difference(tmp_path):
    # fedavg beats fedomg by about 0.10 on every seed (two domains averaged): t-interval excludes 0
    acc = {}
    for s, noise in enumerate((0.00, 0.01, 0.02)):
        for dom in ("0", "15"):
            acc[("fedavg", dom, s)] = 0.60 + noise
            acc[("fedomg", dom, s)] = 0.50 + noise + (0.01 if s == 1 else 0.0)
    rep = make_report(_study(tmp_path, acc), plots=False, write=False)
    lines = rep.conclusions()
    assert lines[0].startswith("At this budget fedavg is best, ahead of every other algorithm")
    assert "fedavg is ahead of fedomg: +9.7 ± 0.3 points (95 % interval ±1.4) over 3 paired seeds" in lines[1]


def test_noisy_gap_is_not_separated(tmp_path):
    # mean gap +0.02 but the per-seed differences are +0.10, -0.06, +0.02: s.e. 0.046 > gap / 2
    acc = {("fedavg", "0", 0): 0.70, ("fedomg", "0", 0): 0.60,
           ("fedavg", "0", 1): 0.50, ("fedomg", "0", 1): 0.56,
           ("fedavg", "0", 2): 0.62, ("fedomg", "0", 2): 0.60}
    rep = make_report(_study(tmp_path, acc), plots=False, write=False)
    lines = rep.conclusions()
    assert lines[0].startswith("At this budget the table does not separate the algorithms")
    assert "fedavg and fedomg are not separated at this budget: +2.0 ± 4.6 points (95 % interval ±19.9)" in lines[1]
    text = rep.markdown()
    assert "**What this table can conclude.** At this budget the table does not separate" in text


def test_two_seeds_need_a_large_consistent_gap():
    from fedtune.reports.stats import paired_gap

    # +1.8 +- 0.1 over 2 seeds: beyond two standard errors, but t(0.975, 1) = 12.7 -> interval +-1.3
    assert paired_gap({0: 0.167, 1: 0.168}, {0: 0.148, 1: 0.151}).resolved
    # +1.8 +- 0.3: beyond 2 s.e. (0.6) yet within the 95 % interval (12.7 * 0.3 = 3.8): not resolved
    g = paired_gap({0: 0.170, 1: 0.166}, {0: 0.149, 1: 0.151})
    assert abs(g.mean) > 2 * g.se and not g.resolved
    assert not paired_gap({0: 0.9}, {0: 0.1}).resolved  # one seed: never


def test_the_report_names_the_paper_vs_code_variants_that_ran(tmp_path):
    from fedtune.algorithms import all_hparams

    variants = {n for n, (_, spec) in all_hparams().items() if spec.variant}
    assert {"gala_gate", "gala_weights", "omg_solver", "omg_rescale", "gp_align"} <= variants
    assert "local_lr" not in variants and "omg_kappa" not in variants  # tuning knobs are not variants
    store = ResultsStore(tmp_path, "s")
    for tid, algorithm, hps in (("g1", "fedgala", {"hp.gala_gate": "literal", "hp.gala_weights": "per-tensor"}),
                                ("g2", "fedgala", {"hp.gala_gate": "descent", "hp.gala_weights": "per-tensor"}),
                                ("a1", "fedavg", {"hp.local_lr": 0.1})):
        rows = [{"algorithm": algorithm, "target_domain": "0", "seed": 0, "dataset": "rotated-digits",
                 "setting": "fdg", "status": "ok", "round": 1, "val_acc": 0.5, "target_acc": 0.5, **hps}]
        store.write_rounds(tid, rows)
    rep = make_report(store.study_dir, plots=False, write=False)
    assert rep.variants() == {"fedgala": {"gala_gate": ["descent", "literal"], "gala_weights": ["per-tensor"]}}
    assert "fedgala: gala_gate=descent|literal, gala_weights=per-tensor" in rep.variants_text()
    assert rep.variants_text() in rep.markdown()
