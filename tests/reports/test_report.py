"""Tests of `fedtune report` (fedtune/reports/report.py) on synthetic studies with known numbers."""

from __future__ import annotations

import doctest
import itertools
import json
import math
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fedtune.cli import main  # noqa: E402
from fedtune.errors import ConfigError
from fedtune.results.store import ResultsStore
from fedtune.results.summary import summarize_trial
from fedtune.reports import plots as plots_mod  # noqa: E402
from fedtune.reports import report as report_mod  # noqa: E402
from fedtune.reports.report import make_report, read_selection  # noqa: E402
from fedtune.reports.stats import AVERAGE  # noqa: E402

# Target accuracy at the best-validation round of the "val-best" configuration, per
# (algorithm, target domain, seed). Every trial has 3 rounds:
#   round 1: val 0.50, target 0.30
#   round 2: val V,    target T          <- best val_acc: the honest reported round
#   round 3: val V-.05, target T + 0.10  <- best target_acc: the oracle round
# config "val-best":    V = 0.80, T = T0
# config "target-best": V = 0.70, T = T0 + 0.05   (better target, worse validation)
T0 = {
    ("fedavg", "0", 0): 0.40, ("fedavg", "0", 1): 0.44,
    ("fedavg", "15", 0): 0.50, ("fedavg", "15", 1): 0.56,
    ("fedomg", "0", 0): 0.60, ("fedomg", "0", 1): 0.62,
    ("fedomg", "15", 0): 0.30, ("fedomg", "15", 1): 0.40,
}
HP = {"fedavg": ("hp.local_lr", {"val-best": 0.01, "target-best": 0.1}),
      "fedomg": ("hp.omg_kappa", {"val-best": 0.2, "target-best": 0.8})}
NO_TRIAL_ROW = "fedomg-15-s1-val-best"  # still running: rounds only, no trials.parquet row
DIVERGED = "fedavg-0-s0-diverged"


def trial_rows(algorithm: str, domain: str, seed: int, config: str) -> tuple[str, list[dict]]:
    t0 = T0[(algorithm, domain, seed)]
    v, t = (0.80, t0) if config == "val-best" else (0.70, t0 + 0.05)
    tid = f"{algorithm}-{domain}-s{seed}-{config}"
    hp_name, hp_values = HP[algorithm]
    base = {"algorithm": algorithm, "target_domain": domain, "seed": seed, "dataset": "rotated-digits",
            "setting": "fdg", "status": "ok", hp_name: hp_values[config], "hp.global_lr": 1.0}
    # oracle_acc (the held-out target slice): the val-best config peaks at round 2 (0.9) but ends
    # lower (0.5) than the target-best one (0.6): oracle selection looks at the last round only
    o2, o3 = (0.90, 0.50) if config == "val-best" else (0.55, 0.60)
    rounds = [(1, 0.50, 0.30, 0.2), (2, v, t, o2), (3, v - 0.05, t + 0.10, o3)]
    return tid, [{**base, "round": r, "val_acc": va, "target_acc": ta, "oracle_acc": oa, "wall_s": 1.0}
                 for r, va, ta, oa in rounds]


def build_study(output: Path, name: str = "study") -> Path:
    store = ResultsStore(output, name)
    for (algorithm, domain, seed) in T0:
        for config in ("val-best", "target-best"):
            tid, rows = trial_rows(algorithm, domain, seed, config)
            store.write_rounds(tid, rows)
            if tid != NO_TRIAL_ROW:
                store.write_trial(summarize_trial(rows, config={"trial_id": tid}, status="completed",
                                                  error=None, started_at=None, ended_at=None))
    # A diverged trial: a huge target accuracy in round 1, NaN validation afterwards. Its best
    # finite val_acc (0.55) loses to 0.80, so it is never selected despite its target 0.99.
    rows = [{"algorithm": "fedavg", "target_domain": "0", "seed": 0, "round": 1, "val_acc": 0.55,
             "target_acc": 0.99, "oracle_acc": 0.99, "status": "ok", "hp.local_lr": 1.0, "hp.global_lr": 1.0},
            {"algorithm": "fedavg", "target_domain": "0", "seed": 0, "round": 2, "val_acc": math.nan,
             "target_acc": math.nan, "status": "diverged", "hp.local_lr": 1.0, "hp.global_lr": 1.0}]
    store.write_rounds(DIVERGED, rows)
    store.write_trial(summarize_trial(rows, config={"trial_id": DIVERGED}, status="diverged", error=None,
                                      started_at=None, ended_at=None))
    return store.study_dir


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    return build_study(tmp_path_factory.mktemp("out"))


@pytest.fixture(scope="module")
def val_report(study):
    return make_report(study)


def copy_study(study: Path, tmp_path: Path) -> Path:
    dst = tmp_path / study.name
    shutil.copytree(study, dst)
    for p in ("report.md", "plots"):
        if (dst / p).is_dir():
            shutil.rmtree(dst / p)
        elif (dst / p).exists():
            (dst / p).unlink()
    return dst


# --------------------------------------------------------------------------- honest selection


def test_table_means_and_standard_errors_are_hand_checked(val_report):
    r = val_report
    assert r.selection == "val" and not r.oracle
    assert r.algorithms == ["fedavg", "fedomg"] and r.domains == ["0", "15"]
    assert r.columns == ["0", "15", AVERAGE]
    # With two seeds, SE = |a - b| / 2.
    expected = {
        ("fedavg", "0"): (0.42, 0.02), ("fedavg", "15"): (0.53, 0.03),
        ("fedavg", AVERAGE): (0.475, 0.025),  # per seed (.40+.50)/2=.45, (.44+.56)/2=.50
        ("fedomg", "0"): (0.61, 0.01), ("fedomg", "15"): (0.35, 0.05),
        ("fedomg", AVERAGE): (0.48, 0.03),  # per seed .45 and .51
    }
    for key, (mean, se) in expected.items():
        cell = r.cells[key]
        assert cell.n == 2
        assert cell.mean == pytest.approx(mean, abs=1e-12), key
        assert cell.se == pytest.approx(se, abs=1e-12), key
    assert r.cells[("fedavg", "0")].text() == "42.0 ± 2.0"
    assert r.cells[("fedomg", AVERAGE)].text() == "48.0 ± 3.0"
    assert r.val_cells[("fedavg", "0")].mean == pytest.approx(0.80)
    assert r.val_cells[("fedavg", "0")].se == pytest.approx(0.0)


def test_best_trial_and_round_are_chosen_by_validation(val_report):
    sel = val_report.selected
    assert len(sel) == 8  # one per (algorithm, domain, seed)
    assert set(sel["trial_id"].str.endswith("-val-best")) == {True}
    assert set(sel["round"]) == {2}  # the best-val round, not the best-target round 3
    row = sel[sel["trial_id"] == "fedavg-0-s0-val-best"].iloc[0]
    assert (row["val_acc"], row["target_acc"], row["hp.local_lr"]) == (0.80, 0.40, 0.01)
    # The target-best trial would have won on target accuracy, and the diverged one too.
    trials = val_report.trials.set_index("trial_id")
    assert trials.loc["fedavg-0-s0-target-best", "target_acc"] > row["target_acc"]
    assert trials.loc[DIVERGED, "status"] == "diverged"
    assert (trials.loc[DIVERGED, "round"], trials.loc[DIVERGED, "target_acc"]) == (1, 0.99)


def test_trial_with_rounds_but_no_trials_row(val_report):
    trials = val_report.trials.set_index("trial_id")
    assert not trials.loc[NO_TRIAL_ROW, "has_trial_row"]
    assert trials.loc[NO_TRIAL_ROW, "status"] == "running"
    assert trials.loc[NO_TRIAL_ROW, "rounds_done"] == 3
    assert NO_TRIAL_ROW in set(val_report.selected["trial_id"])  # still counted (fedomg 15 seed 1)
    assert any(NO_TRIAL_ROW in n and "without a trials.parquet row" in n for n in val_report.notes)
    assert val_report.status_counts() == {"completed": 15, "diverged": 1, "running": 1}


def test_markdown_and_pngs_are_written(val_report, study):
    text = (study / "report.md").read_text()
    assert val_report.markdown_path == study / "report.md"
    assert "| fedavg | 42.0 ± 2.0 | 53.0 ± 3.0 | 47.5 ± 2.5 | 2 | 9 |" in text
    assert "| fedomg | 61.0 ± 1.0 | 35.0 ± 5.0 | 48.0 ± 3.0 | 2 | 8 |" in text
    assert "oracle" not in text.lower()
    assert "no optuna.db" in text
    expected = {"convergence", "sensitivity_fedavg", "sensitivity_fedomg"}
    assert set(val_report.plots) == expected
    for key in expected:
        path = study / "plots" / f"{key}.png"
        assert val_report.plots[key] == path
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
        assert f"(plots/{key}.png)" in text
    # only hp.* columns that vary are plotted: global_lr is 1.0 everywhere
    assert val_report.varying_hparams("fedavg") == ["hp.local_lr"]
    assert val_report.varying_hparams("fedomg") == ["hp.omg_kappa"]


def test_rich_tables_print_the_numbers(val_report):
    from rich.console import Console

    console = Console(record=True, width=220)
    val_report.print(console)
    out = console.export_text()
    assert "selection by source validation accuracy" in out
    assert "42.0 ± 2.0" in out and "48.0 ± 3.0" in out
    assert "fedomg-15-s1-val-best" in out


def _selected_hparams(report) -> list[tuple[str, str]]:
    """(name, value as the report writes it) of every varying hyperparameter of a selected trial."""
    out = []
    for a in report.algorithms:
        header, rows = report.detail_rows(a)
        hps = [h[3:] for h in report.varying_hparams(a)]
        for row in rows:
            out += list(zip(hps, row[len(header) - len(hps):]))
    return out


def test_per_trial_tables_stay_readable_at_80_columns(val_report):
    from rich.console import Console

    console = Console(record=True, width=80)
    val_report.print(console)
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= 80
    text = "\n".join(lines)
    assert "42.0 ± 2.0" in text and "48.0 ± 3.0" in text  # the main table
    pairs = _selected_hparams(val_report)
    assert {name for name, _ in pairs} == {"local_lr", "omg_kappa"}
    for name, value in pairs:  # name and value whole, on one line
        assert any(name in line and value in line for line in lines), (name, value)
    for _, r in val_report.selected.iterrows():
        assert r["trial_id"] in text and r["status"] in text


def test_per_trial_tables_are_wide_on_a_wide_console(val_report):
    from rich.console import Console

    console = Console(record=True, width=200)
    val_report.print(console)
    lines = console.export_text().splitlines()
    assert any(all(h in line for h in ("target domain", "seed", "trial", "round", "val_acc", "target_acc", "status",
                                       "local_lr")) for line in lines)  # one column per field and hyperparameter
    assert any(all(v in line for v in ("fedavg-0-s0-val-best", "80.0", "40.0", "completed", "0.01"))
               for line in lines)  # one line per trial


def _leave_one_out_study(output: Path, algorithms: list[str]) -> Path:
    """Six target domains, one trial per (algorithm i, domain j, seed s): target acc (%) =
    10·(i+1) + j − 1 + 2s, so each cell is ``10·(i+1) + j`` ± 1.0 over the two seeds."""
    store = ResultsStore(output, f"loo{len(algorithms)}")
    domains = enumerate(("0", "15", "30", "45", "60", "75"))
    for (i, a), (j, d), seed in itertools.product(enumerate(algorithms), list(domains), (0, 1)):
        tid = f"{a}-{d}-s{seed}"
        rows = [{"algorithm": a, "target_domain": d, "seed": seed, "dataset": "rotated-digits", "setting": "fdg",
                 "status": "ok", "round": 1, "val_acc": 0.5, "target_acc": (10 * (i + 1) + j - 1 + 2 * seed) / 100,
                 "hp.local_lr": 0.01 * (j + 1)}]
        store.write_rounds(tid, rows)
        store.write_trial(summarize_trial(rows, config={"trial_id": tid}, status="completed", error=None,
                                          started_at=None, ended_at=None))
    return store.study_dir


@pytest.mark.parametrize("n_algorithms, form", [(2, "column per algorithm"), (8, "row per (algorithm, domain)")])
def test_main_table_with_six_target_domains_stays_readable_at_80_columns(tmp_path, n_algorithms, form):
    from rich.console import Console

    algorithms = ["fedavg", "fedprox", "fedomg", "fedsam", "fedgala", "gfm", "fedgp", "fedda"][:n_algorithms]
    report = make_report(_leave_one_out_study(tmp_path, algorithms), plots=False)
    console = Console(record=True, width=80)
    report.print(console)
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= 80
    for i, a in enumerate(algorithms):  # every algorithm's name whole, and its cells unbroken
        assert any(a in line for line in lines), a
        for j, d in enumerate(("0", "15", "30", "45", "60", "75")):
            cell = f"{10 * (i + 1) + j:.1f} ± 1.0"
            if form == "column per algorithm":  # the domain's row holds every algorithm's cell
                row = next(line for line in lines if line.startswith(f"│ {d} "))
                assert cell in row, (a, d, row)
            else:  # one line per (algorithm, domain)
                assert any(f" {d} " in line and cell in line for line in lines), (a, d)
    wide = Console(record=True, width=200)
    report.print(wide)
    header = next(line for line in wide.export_text().splitlines() if "algorithm" in line and "Avg" in line)
    assert all(d in header for d in ("0", "15", "30", "45", "60", "75", "seeds", "trials"))  # one row per algorithm


# --------------------------------------------------------------------------- oracle selection


def test_oracle_selection_from_study_json_is_labelled_everywhere(study, tmp_path, monkeypatch):
    d = copy_study(study, tmp_path)
    (d / "study.json").write_text(json.dumps({"selection": "oracle", "metric": "val_acc"}))
    assert read_selection(d) == "oracle"
    titles: list[str] = []

    def recording_save(fig, path):  # the PNGs themselves are checked in test_markdown_and_pngs_are_written
        titles.append(fig.get_suptitle())
        return path

    monkeypatch.setattr(plots_mod, "_save", recording_save)
    r = make_report(d)
    assert r.oracle
    # oracle: the last round's oracle_acc chooses (0.6 > 0.5: the target-best trial, although
    # val-best's round-2 oracle_acc 0.9 is the highest); reported: its round-3 target = T0 + 0.15.
    # The diverged trial (oracle_acc 0.99 in round 1) has no last model and is never selected.
    sel = r.selected.set_index("trial_id")
    assert DIVERGED not in sel.index and len(sel) == 8
    assert set(sel["round"]) == {3} and set(sel["score"]) == {0.6}
    assert set(sel.index.str.endswith("-target-best")) == {True}
    assert r.cells[("fedavg", "0")].mean == pytest.approx(0.57)
    assert r.cells[("fedavg", "0")].se == pytest.approx(0.02)
    assert r.cells[("fedavg", "15")].mean == pytest.approx(0.68)
    assert r.cells[("fedavg", "15")].se == pytest.approx(0.03)
    assert r.cells[("fedomg", AVERAGE)].mean == pytest.approx(0.63)  # per seed .60 and .66
    assert r.cells[("fedomg", AVERAGE)].se == pytest.approx(0.03)
    # every table title and every plot title says oracle
    text = (d / "report.md").read_text()
    headings = [line for line in text.splitlines() if line.startswith(("## Target", "## Oracle", "### "))]
    assert len(headings) == 4 and all("ORACLE" in h for h in headings)
    assert r.trials.set_index("trial_id").loc[DIVERGED, "round"] is None or math.isnan(
        r.trials.set_index("trial_id").loc[DIVERGED, "round"])
    assert len(titles) == 3 and all("ORACLE" in t for t in titles)
    assert "oracle" in r.title().lower()


def test_selection_override_and_bad_study_json(study, tmp_path):
    d = copy_study(study, tmp_path)
    r = make_report(d, selection="oracle", plots=False)
    assert r.oracle and r.plots == {}
    (d / "study.json").write_text(json.dumps({"selection": "best"}))
    with pytest.raises(ConfigError, match="study.json: key 'selection': 'best' is not allowed; allowed: val, target-val, ood-val, val-f1, ood-val-f1, oracle"):
        make_report(d, plots=False)
    with pytest.raises(ConfigError, match="does not exist"):
        make_report(tmp_path / "nope")


def fda_study(output: Path, name: str, study_json: dict | None = None) -> Path:
    """Two fda trials per seed: "a" wins on source validation, "b" on the target client's
    validation (target_val_acc) at a different round; seeds 0 and 1."""
    store = ResultsStore(output, name)
    for seed in (0, 1):
        for cfg, rounds in (("a", [(1, 0.9, 0.2, 0.10), (2, 0.8, 0.3, 0.20)]),
                            ("b", [(1, 0.6, 0.7, 0.40 + seed / 10), (2, 0.5, 0.4, 0.50)])):
            tid = f"fedda-s{seed}-{cfg}"
            store.write_rounds(tid, [{"algorithm": "fedda", "target_domain": "0", "seed": seed, "setting": "fda",
                                      "round": r, "val_acc": v, "target_val_acc": tv, "target_acc": t,
                                      "oracle_acc": 0.5, "status": "ok"} for r, v, tv, t in rounds])
    if study_json is not None:
        (store.study_dir / "study.json").write_text(json.dumps(study_json))
    return store.study_dir


def test_target_val_selection_picks_by_the_target_clients_validation(tmp_path):
    d = fda_study(tmp_path, "fda")
    honest = make_report(d, plots=False, write=False)
    assert set(honest.selected["trial_id"]) == {"fedda-s0-a", "fedda-s1-a"} and set(honest.selected["round"]) == {1}
    assert honest.cells[("fedda", "0")].mean == pytest.approx(0.10)
    tv = make_report(d, selection="target-val", plots=False, write=False)
    assert set(tv.selected["trial_id"]) == {"fedda-s0-b", "fedda-s1-b"}
    assert set(tv.selected["round"]) == {1} and list(tv.selected["score"]) == [0.7, 0.7]
    assert tv.cells[("fedda", "0")].mean == pytest.approx(0.45) and tv.cells[("fedda", "0")].se == pytest.approx(0.05)
    assert "target-val" in tv.title() and "target_val_acc" in tv.detail_rows("fedda")[0]


def test_target_val_outside_fda_and_oracle_in_fl_are_refused(study, tmp_path):
    with pytest.raises(ConfigError, match="selection 'target-val' needs setting fda.*allows: val, oracle"):
        make_report(study, selection="target-val", plots=False, write=False)
    store = ResultsStore(tmp_path, "fl")
    store.write_rounds("t", [{"algorithm": "fedavg", "setting": "fl", "seed": 0, "round": 1, "val_acc": 0.5,
                              "target_acc": 0.6}])
    with pytest.raises(ConfigError, match="selection 'oracle' needs a held-out target domain.*allowed: val"):
        make_report(store.study_dir, selection="oracle", plots=False, write=False)
    with pytest.raises(ConfigError, match="allowed: val, target-val, ood-val, val-f1, ood-val-f1, oracle"):
        make_report(study, selection="best", plots=False, write=False)


@pytest.mark.parametrize("study_json, words", [
    ({"trial_seeds": 2, "seeds": [0]}, "± over 2 independent searches (includes selection variance)"),
    ({"seeds": [0, 1]}, "± over 2 re-runs of the selected configuration; excludes selection variance"),
])
def test_tables_say_whether_the_error_includes_selection_variance(tmp_path, study_json, words):
    from rich.console import Console

    d = fda_study(tmp_path, "v", study_json)
    r = make_report(d, plots=False)
    assert words in r.title() and words in (d / "report.md").read_text()
    console = Console(record=True, width=300)
    r.print(console)
    assert words in " ".join(console.export_text().split())  # rich wraps long titles


# --------------------------------------------------------------------------- partial studies


def test_study_without_trials_file_single_domain_single_seed(tmp_path):
    store = ResultsStore(tmp_path, "live")
    for config in ("val-best", "target-best"):
        tid, rows = trial_rows("fedomg", "0", 1, config)
        store.write_rounds(tid, rows[:2])  # only 2 rounds so far
    r = make_report(store.study_dir, plots=False)
    assert r.columns == ["0"]  # one domain: no Avg
    cell = r.cells[("fedomg", "0")]
    assert (cell.n, cell.mean, cell.se) == (1, 0.62, None)
    assert cell.text() == "62.0"
    assert set(r.trials["status"]) == {"running"}
    assert any("no trials.parquet yet" in n for n in r.notes)
    assert (store.study_dir / "report.md").is_file()


def test_empty_study_and_cli(tmp_path, capsys):
    (tmp_path / "empty" / "rounds").mkdir(parents=True)
    r = make_report(tmp_path / "empty")
    assert r.algorithms == [] and r.plots == {}
    assert "No trial has a round with accuracies yet" in (tmp_path / "empty" / "report.md").read_text()
    d = build_study(tmp_path, "cli")
    assert main(["report", str(d), "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert "42.0 ± 2.0" in out and f"report: {d / 'report.md'}" in out
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_fl_study_without_target_domain(tmp_path):
    store = ResultsStore(tmp_path, "fl")
    for seed, acc in ((0, 0.7), (1, 0.8)):
        store.write_rounds(f"t{seed}", [{"algorithm": "fedavg", "target_domain": None, "seed": seed, "round": 1,
                                          "val_acc": 0.5, "target_acc": acc}])
    r = make_report(store.study_dir, plots=False)
    assert r.columns == ["all"]
    assert r.cells[("fedavg", "all")].mean == pytest.approx(0.75)
    assert r.cells[("fedavg", "all")].se == pytest.approx(0.05)


def test_partial_average_when_no_seed_has_every_domain(tmp_path):
    store = ResultsStore(tmp_path, "p")
    for tid, dom, seed, acc in (("a", "0", 0, 0.6), ("b", "15", 1, 0.4)):
        store.write_rounds(tid, [{"algorithm": "fedavg", "target_domain": dom, "seed": seed, "round": 1,
                                  "val_acc": 0.5, "target_acc": acc}])
    r = make_report(store.study_dir, plots=False)
    avg = r.cells[("fedavg", AVERAGE)]
    assert avg.partial and avg.mean == pytest.approx(0.5) and avg.se is None and avg.text() == "50.0*"


# --------------------------------------------------------------------------- Optuna importances


def test_optuna_importances(tmp_path):
    import optuna

    store = ResultsStore(tmp_path, "opt")
    tid, rows = trial_rows("fedomg", "0", 0, "val-best")
    store.write_rounds(tid, rows)
    d = store.study_dir
    storage = f"sqlite:///{d / 'optuna.db'}"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    s = optuna.create_study(study_name="study-fedomg", storage=storage, direction="maximize",
                            sampler=optuna.samplers.RandomSampler(seed=0))
    s.optimize(lambda t: 10 * t.suggest_float("omg_kappa", 0, 1) + 0.01 * t.suggest_float("local_lr", 0, 1),
               n_trials=12)
    few = optuna.create_study(study_name="study-fedprox", storage=storage, direction="maximize",
                              sampler=optuna.samplers.RandomSampler(seed=2))
    few.optimize(lambda t: t.suggest_float("prox_mu", 0, 1), n_trials=9)  # 10 needed: noise, not shown
    one = optuna.create_study(study_name="study-fedavg", storage=storage)
    one.optimize(lambda t: t.suggest_float("local_lr", 0, 1), n_trials=1)
    multi = optuna.create_study(study_name="study-gfm", storage=storage, directions=["maximize", "minimize"],
                                sampler=optuna.samplers.RandomSampler(seed=1))
    multi.optimize(lambda t: (t.suggest_float("sam_rho", 0, 1), 5 * t.suggest_float("local_lr", 0, 1)), n_trials=10)
    r = make_report(d)
    imp = r.importances["study-fedomg"]
    assert set(imp) == {"omg_kappa", "local_lr"} and imp["omg_kappa"] > imp["local_lr"]
    assert r.importances["study-gfm"]["sam_rho"] > r.importances["study-gfm"]["local_lr"]  # first objective
    assert any("'study-gfm': multi-objective" in n for n in r.importance_notes)
    assert "study-fedavg" not in r.importances and "study-fedprox" not in r.importances
    (pooled,) = [n for n in r.importance_notes if "too few complete trials" in n]  # one note for both
    assert "'study-fedavg' (1 of 10)" in pooled and "'study-fedprox' (9 of 10)" in pooled
    png = r.plots["importances"]
    assert png == d / "plots" / "importances.png" and png.stat().st_size > 5000
    text = (d / "report.md").read_text()
    assert "| omg_kappa |" in text and "(plots/importances.png)" in text


def test_doctests():
    failures, _ = doctest.testmod(report_mod)
    assert failures == 0
