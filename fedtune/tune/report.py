"""``fedtune report STUDY_DIR``: tables, ``report.md`` and PNG plots of a study.

A study directory ``OUTPUT/<study>`` holds ``rounds/<trial_id>.parquet`` (one row per round),
usually ``trials.parquet`` (one row per finished trial), maybe ``optuna.db`` (the Optuna
study of a sweep) and ``study.json`` (the sweep's settings). :func:`make_report` reads it
through :func:`fedtune.results.load`, so it also works on a study that is still running:
trials without a ``trials.parquet`` row yet are summarised from their rounds.

Selection protocol (:mod:`fedtune.selection` owns it; METHODS.md §5). ``val`` (default,
DomainBed's training-domain validation), ``target-val`` (fda: the target client's held-out
labels) or ``oracle`` (DomainBed's test-domain validation on the held-out oracle slice of the
target, last round only; labelled "oracle" in every title):

1. In every trial, the *reported round* is chosen by the protocol's score (``val_acc``,
   ``target_val_acc``: the best round, earliest on ties; ``oracle_acc``: the last evaluated
   round); its ``target_acc`` is the trial's result.
2. Trials are grouped by (algorithm, target domain, seed); in each group the trial with the
   highest score at its reported round is *selected* (the hyperparameter choice; on ties
   the first trial id in sorted order).
3. A table cell (algorithm, target domain) is the mean of the selected trials' ``target_acc``
   over seeds, ± the standard error ``std(ddof=1)/sqrt(n)`` when there are ≥ 2 seeds.
   With several target domains an ``Avg`` column is added: the per-seed average over the
   domains, then mean ± standard error over the seeds that have every domain (if no seed
   has every domain yet, the mean of the domain means, marked ``*``, without an error).
   What the seeds are comes from ``study.json``: ``trial_seeds`` K > 1 (``fedtune sweep
   --trial-seeds``): K whole searches, so the ± includes selection variance (DomainBed's);
   ``seeds`` K > 1 (``--seeds``): K re-runs of each search's selected configuration, so the
   ± excludes selection variance. Every table caption says which.

The protocol comes from ``study.json``'s ``selection`` (``val`` when absent) or
``make_report(..., selection=...)``. A study with no target domain (the ``fl`` setting,
target accuracy over all clients' test splits) shows one column, ``all``; it allows only
``val``.

Outputs: ``STUDY_DIR/report.md``, ``STUDY_DIR/plots/convergence.png`` (``val_acc`` dashed and
``target_acc`` solid vs round of each algorithm's selected trials, mean over seeds, one panel
per target domain), ``STUDY_DIR/plots/sensitivity_<algorithm>.png`` (for every ``hp.<name>``
that varies among an algorithm's trials: each trial's ``target_acc`` (filled) and ``val_acc``
(hollow) at its reported round against the value, coloured by target domain, with a line
through the mean target accuracy per value when there are at most 12 distinct values: the
papers' ablation plots) and
``STUDY_DIR/plots/importances.png`` (Optuna's fANOVA parameter importances, seed 0, of each
study in ``optuna.db`` with ≥ 2 complete trials, for the first objective of a multi-objective
study; otherwise the report says why they are missing). Plots use matplotlib's Agg canvas directly (no pyplot, no display).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fedtune import selection as protocol
from fedtune.config import ConfigError

__all__ = ["SELECTIONS", "Cell", "Gap", "Report", "make_report", "paired_gap", "read_selection", "read_variance"]

SELECTIONS = protocol.PROTOCOLS
"""The selection protocols (:data:`fedtune.selection.PROTOCOLS`)."""

NO_DOMAIN = "all"
"""Column label of studies without a target domain (``fl``: all clients' test splits)."""

AVERAGE = "Avg"
"""Column label of the average over target domains."""

_IDENTITY = ("algorithm", "target_domain", "seed", "dataset", "setting")


@dataclass(frozen=True)
class Cell:
    """One table entry: accuracies (fractions) of the selected trials, one per seed."""

    values: tuple[float, ...]
    partial: bool = False  # Avg only: not every seed has every domain

    @property
    def n(self) -> int:
        """Number of seeds."""
        return len(self.values)

    @property
    def mean(self) -> float:
        """Mean over seeds (NaN when empty)."""
        return float(np.mean(self.values)) if self.values else math.nan

    @property
    def se(self) -> float | None:
        """Standard error over seeds, ``std(ddof=1) / sqrt(n)``; None with fewer than 2 seeds
        (and for a partial average).

        >>> round(Cell((0.5, 0.7)).se, 6)
        0.1
        """
        if self.n < 2 or self.partial:
            return None
        return float(np.std(self.values, ddof=1) / math.sqrt(self.n))

    def text(self) -> str:
        """Percent with one decimal, ``mean ± se``.

        >>> Cell((0.5, 0.7)).text(), Cell((0.825,)).text(), Cell(()).text()
        ('60.0 ± 10.0', '82.5', '—')
        """
        if not self.values:
            return "—"
        out = f"{100 * self.mean:.1f}"
        if self.se is not None:
            out += f" ± {100 * self.se:.1f}"
        return out + ("*" if self.partial else "")


@dataclass(frozen=True)
class Gap:
    """The paired difference ``a − b`` of two algorithms' per-seed results (same seeds, same data).

    ``half_width`` is the half-width of the two-sided 95 % Student-t interval
    (``t_{0.975, n−1} · se``): a gap is *resolved* only when that interval excludes zero. With
    two seeds t is 12.7, with three 4.3: few seeds resolve only large, consistent gaps.
    """

    mean: float
    se: float
    n: int
    half_width: float

    @property
    def resolved(self) -> bool:
        return self.n >= 2 and math.isfinite(self.half_width) and abs(self.mean) > self.half_width

    def text(self) -> str:
        """``+9.7 ± 0.3 points (95 % CI ±1.4) over 3 paired seeds``"""
        return (f"{100 * self.mean:+.1f} ± {100 * self.se:.1f} points (95 % interval ±{100 * self.half_width:.1f}) "
                f"over {self.n} paired seeds")


def paired_gap(a: dict[int, float], b: dict[int, float]) -> Gap:
    """:class:`Gap` of ``a − b`` over the seeds both have.

    >>> g = paired_gap({0: 0.6, 1: 0.61, 2: 0.62}, {0: 0.5, 1: 0.52, 2: 0.52})
    >>> round(g.mean, 4), g.n, g.resolved
    (0.0967, 3, True)
    >>> paired_gap({0: 0.7, 1: 0.5}, {0: 0.6, 1: 0.56}).resolved
    False
    """
    from scipy.stats import t as student_t

    seeds = sorted(set(a) & set(b))
    diff = np.array([a[s] - b[s] for s in seeds], dtype=float)
    n = len(diff)
    if n < 2:
        return Gap(float(diff.mean()) if n else math.nan, math.nan, n, math.nan)
    se = float(diff.std(ddof=1) / math.sqrt(n))
    return Gap(float(diff.mean()), se, n, float(student_t.ppf(0.975, n - 1)) * se)


@dataclass
class Report:
    """Everything :func:`make_report` computed, plus where it wrote things.

    ``trials``: one row per trial (``trial_id``, identity columns, ``status``,
    ``rounds_done``, ``has_trial_row``, ``round`` / ``score`` (the protocol's metric) /
    ``val_acc`` / ``target_acc`` at the reported round, ``hp.*``). ``selected``: the selected
    trial per (algorithm, target domain, seed). ``cells``: (algorithm, domain label or
    ``Avg``) -> :class:`Cell` of target accuracy; ``val_cells`` the same for the protocol's
    score. ``variance``: ``(kind, K)`` from :func:`read_variance`.
    """

    study_dir: Path
    selection: str
    trials: pd.DataFrame
    selected: pd.DataFrame
    algorithms: list[str]
    domains: list[str]
    cells: dict[tuple[str, str], Cell]
    val_cells: dict[tuple[str, str], Cell]
    importances: dict[str, dict[str, float]] = field(default_factory=dict)
    importance_notes: list[str] = field(default_factory=list)
    plots: dict[str, Path] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    markdown_path: Path | None = None
    variance: tuple[str | None, int] = (None, 1)

    # -- labels ----------------------------------------------------------------------------
    @property
    def oracle(self) -> bool:
        """True under oracle selection (the held-out target slice chose)."""
        return self.selection == "oracle"

    @property
    def selection_label(self) -> str:
        """Words for titles: what chose the reported round and the trial."""
        return protocol.LABELS[self.selection]

    @property
    def score_column(self) -> str:
        """The round column the protocol chooses by (``val_acc``, ``target_val_acc``, ``oracle_acc``)."""
        return protocol.SCORE[self.selection]

    def variance_text(self) -> str:
        """What the tables' ± is over (selection variance included or not)."""
        kind, k = self.variance
        n = int(self.selected["seed_key"].nunique()) if not self.selected.empty else 0
        return protocol.variance_note(kind, k if kind else n)

    @property
    def columns(self) -> list[str]:
        """Table columns: the target domains, then ``Avg`` when there are several."""
        return self.domains + ([AVERAGE] if len(self.domains) > 1 else [])

    def title(self) -> str:
        """Title of the main table."""
        out = f"Target accuracy (%) of {self.study_dir.name} — {self.selection_label}"
        if not self.selected.empty and self.selected["seed_key"].nunique() > 1:
            out += f" — {self.variance_text()}"
        return out

    def status_counts(self) -> dict[str, int]:
        """Trials per status."""
        if self.trials.empty:
            return {}
        return {str(k): int(v) for k, v in self.trials["status"].value_counts().sort_index().items()}

    def varying_hparams(self, algorithm: str) -> list[str]:
        """``hp.*`` columns with ≥ 2 distinct values among ``algorithm``'s trials."""
        return _varying(self.trials[self.trials["algorithm"] == algorithm])

    def variants(self) -> dict[str, dict[str, list[str]]]:
        """algorithm -> {hyperparameter: values that ran} for every hyperparameter marked
        ``variant`` (a choice between a paper and its authors' code, e.g. ``gala_gate``,
        ``omg_solver``), over the algorithm's trials: the tables say which variant produced them."""
        from fedtune.algorithms import all_hparams

        names = [n for n, (_, spec) in all_hparams().items() if spec.variant]
        out: dict[str, dict[str, list[str]]] = {}
        for a in self.algorithms:
            rows = self.trials[self.trials["algorithm"] == a]
            for n in names:
                col = f"hp.{n}"
                if col in rows:
                    vals = sorted({_fmt(v) for v in rows[col] if not _missing(v)}, key=_natural)
                    if vals:
                        out.setdefault(a, {})[n] = vals
        return out

    def variants_text(self) -> str | None:
        """One line naming the paper-vs-code variants that ran, or None when no algorithm has one."""
        parts = []
        for a, hps in self.variants().items():
            parts.append(f"{a}: " + ", ".join(f"{n}={'|'.join(v)}" for n, v in hps.items()))
        if not parts:
            return None
        return "Variants that ran (paper vs authors' code; see docs/search-spaces.md): " + "; ".join(parts)

    def per_seed_average(self, algorithm: str) -> dict[int, float]:
        """seed -> the selected trials' ``target_acc`` averaged over the table's target domains
        (only seeds that have every domain)."""
        sel = self.selected[self.selected["algorithm"] == algorithm]
        out: dict[int, float] = {}
        for seed, g in sel.groupby("seed_key", sort=True):
            vals = {d: float(v) for d, v in zip(g["domain"], g["target_acc"].astype(float)) if math.isfinite(v)}
            if self.domains and all(d in vals for d in self.domains):
                out[int(seed)] = float(np.mean([vals[d] for d in self.domains]))
        return out

    def conclusions(self) -> list[str]:
        """What the main table can and cannot conclude, in plain words.

        With one seed per algorithm there is no error bar, so the table ranks nothing. With
        several, each algorithm is compared with the best one by the paired difference of their
        per-seed averages (same seeds, same data, :func:`paired_gap`): a gap whose 95 % Student-t
        interval excludes zero is called a difference, anything else "not separated at this budget".
        """
        if len(self.algorithms) < 2:
            return []
        per = {a: self.per_seed_average(a) for a in self.algorithms}
        k = min((len(v) for v in per.values()), default=0)
        what = self.variance_text()
        if k < 2:
            return [("This table decides nothing: each algorithm has one search (one seed), so there is no error "
                     "bar, and the gaps between rows are within what a different seed or a different draw of "
                     "hyperparameters changes. To rank algorithms, repeat the whole search: fedtune sweep "
                     "--trial-seeds 3 (or more).")]
        means = {a: float(np.mean(list(v.values()))) for a, v in per.items() if v}
        best = max(means, key=lambda a: (means[a], a))
        lines = []
        separated = []
        for a in self.algorithms:
            if a == best or a not in means:
                continue
            gap = paired_gap(per[best], per[a])
            if gap.n < 2:
                lines.append(f"{best} vs {a}: fewer than 2 common seeds, not compared.")
            elif gap.resolved:
                separated.append(a)
                lines.append(f"{best} is ahead of {a}: {gap.text()}.")
            else:
                lines.append(f"{best} and {a} are not separated at this budget: {gap.text()}.")
        others = [a for a in self.algorithms if a != best and a in means]
        if others and len(separated) == len(others):
            head = (f"At this budget {best} is best, ahead of every other algorithm (95 % paired intervals "
                    f"exclude zero; {what}).")
        elif separated:
            head = (f"At this budget the table separates {best} from {', '.join(separated)} only; the other "
                    f"gaps are within noise ({what}).")
        else:
            head = (f"At this budget the table does not separate the algorithms: no gap to the best ({best}) "
                    f"has a 95 % paired interval that excludes zero ({what}). More trials, rounds or trial "
                    "seeds are needed to rank them.")
        return [head, *lines]

    # -- rendering -------------------------------------------------------------------------
    def main_rows(self) -> list[list[str]]:
        """Rows of the main table: algorithm, one cell per column, seeds, trials."""
        rows = []
        for a in self.algorithms:
            seeds = self.selected.loc[self.selected["algorithm"] == a, "seed"].nunique()
            ntrials = int((self.trials["algorithm"] == a).sum())
            rows.append([a, *[self.cells[(a, c)].text() for c in self.columns], str(seeds), str(ntrials)])
        return rows

    def detail_rows(self, algorithm: str) -> tuple[list[str], list[list[str]]]:
        """Header and rows of an algorithm's selected trials (its varying hyperparameters too)."""
        hps = self.varying_hparams(algorithm)
        scores = [] if self.score_column == "val_acc" else [self.score_column]
        header = ["target domain", "seed", "trial", "round", "val_acc", *scores, "target_acc", "status",
                  *[h[3:] for h in hps]]
        rows = []
        sel = self.selected[self.selected["algorithm"] == algorithm]
        for _, r in sel.iterrows():
            rows.append([str(r["domain"]), _fmt(r["seed"]), str(r["trial_id"]), _fmt(r["round"]),
                         _pct(r["val_acc"]), *[_pct(r["score"]) for _ in scores], _pct(r["target_acc"]),
                         str(r["status"]), *[_fmt(r.get(h)) for h in hps]])
        return header, rows

    def markdown(self) -> str:
        """The text of ``report.md``."""
        lines = [f"# Study report: {self.study_dir.name}", ""]
        lines.append(f"Study directory: `{self.study_dir}`  ")
        lines.append(f"Selection: **{self.selection_label}**.  ")
        counts = ", ".join(f"{v} {k}" for k, v in self.status_counts().items()) or "none"
        lines.append(f"Trials: {len(self.trials)} ({counts}).")
        lines.append("")
        if self.oracle:
            lines += [("> **Oracle selection**: the hyperparameters were chosen by accuracy on a held-out slice "
                       "of the *target* domain (the last round of each trial; the slice is never part of the "
                       "reported target accuracy). DomainBed's test-domain validation: an upper bound, not an "
                       "honest result."), ""]
        lines += [f"## {self.title()}", ""]
        if self.algorithms:
            header = ["algorithm", *self.columns, "seeds", "trials"]
            lines += _md_table(header, self.main_rows())
            lines += ["", _protocol_text(self), ""]
            if self.variants_text():
                lines += [self.variants_text(), ""]
            conclusions = self.conclusions()
            if conclusions:
                lines += ["**What this table can conclude.** " + conclusions[0], ""]
                lines += [f"- {c}" for c in conclusions[1:]]
                lines += [""] if len(conclusions) > 1 else []
            lines += [f"## {_score_name(self.score_column)} (%) at the reported round — {self.selection_label}",
                      ""]
            vrows = [[a, *[self.val_cells[(a, c)].text() for c in self.columns]] for a in self.algorithms]
            lines += _md_table(["algorithm", *self.columns], vrows)
            lines.append("")
            for a in self.algorithms:
                header, rows = self.detail_rows(a)
                lines += [f"### {a}: selected trials ({self.selection_label})", ""]
                lines += _md_table(header, rows)
                lines.append("")
        else:
            lines += ["No trial has a round with accuracies yet.", ""]
        lines += ["## Plots", ""]
        for key, path in self.plots.items():
            rel = os.path.relpath(path, self.study_dir)
            lines += [f"![{key}]({rel})", ""]
        if not self.plots:
            lines += ["No plots (nothing to plot yet, or plots were turned off).", ""]
        lines += ["## Optuna parameter importances", ""]
        for study, imp in self.importances.items():
            lines += [f"Study `{study}` (fANOVA; each trial's objective as Optuna recorded it):", ""]
            lines += _md_table(["parameter", "importance"], [[k, f"{v:.3f}"] for k, v in imp.items()])
            lines.append("")
        lines += [f"- {n}" for n in self.importance_notes]
        if self.importance_notes:
            lines.append("")
        if self.notes:
            lines += ["## Notes", "", *[f"- {n}" for n in self.notes], ""]
        return "\n".join(lines)

    def print(self, console: Any = None) -> None:
        """Print the tables with rich."""
        from rich.console import Console
        from rich.table import Table

        console = console or Console()
        style = "bold red" if self.oracle else None
        if not self.algorithms:
            console.print(f"{self.study_dir}: no trial has a round with accuracies yet")
        else:
            t = Table(title=self.title(), title_style=style, caption=_protocol_text(self))
            for col in ("algorithm", *self.columns, "seeds", "trials"):
                t.add_column(col, justify="left" if col == "algorithm" else "right")
            for row in self.main_rows():
                t.add_row(*row)
            console.print(t)
            if self.variants_text():
                console.print(self.variants_text())
            for i, line in enumerate(self.conclusions()):
                console.print(f"[bold]{line}[/bold]" if i == 0 else f"  {line}")
            for a in self.algorithms:
                header, rows = self.detail_rows(a)
                t = Table(title=f"{a}: selected trials — {self.selection_label}", title_style=style)
                for col in header:
                    t.add_column(col, overflow="fold", no_wrap=col == "trial")
                for row in rows:
                    t.add_row(*row)
                console.print(t)
        for study, imp in self.importances.items():
            t = Table(title=f"Optuna parameter importances (fANOVA) — study {study}")
            t.add_column("parameter")
            t.add_column("importance", justify="right")
            for k, v in imp.items():
                t.add_row(k, f"{v:.3f}")
            console.print(t)
        for n in [*self.importance_notes, *self.notes]:
            console.print(f"[dim]{n}[/dim]")


# --------------------------------------------------------------------------- entry point


def _study_json(study_dir: str | os.PathLike[str]) -> dict[str, Any]:
    path = Path(study_dir) / "study.json"
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: not valid JSON: {exc}") from None
    return data if isinstance(data, dict) else {}


def read_selection(study_dir: str | os.PathLike[str]) -> str:
    """The study's selection protocol from ``STUDY_DIR/study.json`` (key ``selection``);
    ``val`` when the file or the key is missing. A bad value is a ConfigError.

    >>> read_selection(tempfile.mkdtemp())
    'val'
    """
    value = _study_json(study_dir).get("selection", protocol.DEFAULT)
    if value not in SELECTIONS:
        path = Path(study_dir) / "study.json"
        raise ConfigError(f"{path}: key 'selection': {value!r} is not allowed; allowed: {', '.join(SELECTIONS)}")
    return value


def read_variance(study_dir: str | os.PathLike[str]) -> tuple[str | None, int]:
    """What the study's seeds are, from ``study.json``: ``("trial-seeds", K)`` for K > 1 whole
    searches (``--trial-seeds``), ``("seeds", K)`` for K > 1 re-runs of the selected
    configuration (``--seeds``), else ``(None, 1)``.

    >>> read_variance(tempfile.mkdtemp())
    (None, 1)
    """
    data = _study_json(study_dir)
    opts = data.get("options") if isinstance(data.get("options"), dict) else {}
    trial_seeds = int(data.get("trial_seeds") or opts.get("trial_seeds") or 1)
    if trial_seeds > 1:
        return "trial-seeds", trial_seeds
    seeds = data.get("seeds")
    k = len(seeds) if isinstance(seeds, list) else int(opts.get("seeds") or 1)
    return ("seeds", k) if k > 1 else (None, 1)


def make_report(study_dir: str | os.PathLike[str], *, selection: str | None = None,
                plots: bool = True, write: bool = True) -> Report:
    """Summarise the study in ``study_dir``; write ``report.md`` and the plots there.

    ``selection`` (one of :data:`SELECTIONS`) overrides ``study.json``; ``plots=False`` skips
    the PNGs and the Optuna importances; ``write=False`` writes nothing (the plots are then
    skipped too). See the module docstring for the protocol.
    """
    from fedtune import results

    study_dir = Path(study_dir)
    if not study_dir.is_dir():
        raise ConfigError(f"study directory '{study_dir}' does not exist")
    if selection is None:
        selection = read_selection(study_dir)
    protocol.check_protocol(selection)
    rounds = results.load(study_dir).to_pandas()
    settings = {str(s) for s in rounds["setting"].dropna().unique()} if "setting" in rounds else set()
    for s in sorted(settings):  # target-val outside fda, oracle in fl: a clear error, not an empty table
        protocol.check_protocol(selection, s)
    has_trials_file = (study_dir / results.TRIALS_FILE).is_file()
    trial_rows = results.load(study_dir, "trials").to_pandas() if has_trials_file else pd.DataFrame()
    notes: list[str] = []
    if not has_trials_file:
        notes.append("no trials.parquet yet: every trial is summarised from its rounds")

    trials = _summarise_trials(rounds, trial_rows, selection)
    missing_row = trials[~trials["has_trial_row"]] if not trials.empty else trials
    if has_trials_file and len(missing_row):
        notes.append(f"{len(missing_row)} trial(s) without a trials.parquet row (still running or "
                     f"interrupted), summarised from their rounds: {', '.join(missing_row['trial_id'])}")
    no_metric = trials[trials["round"].isna()] if not trials.empty else trials
    if len(no_metric):
        notes.append(f"{len(no_metric)} trial(s) without a finite {protocol.SCORE[selection]} at a reportable round "
                     f"(not selectable): {', '.join(no_metric['trial_id'])}")

    selected = _select(trials, selection)
    algorithms = sorted(selected["algorithm"].unique()) if not selected.empty else []
    domains = _domain_order(selected)
    cells = _cells(selected, algorithms, domains, "target_acc")
    val_cells = _cells(selected, algorithms, domains, "score")
    if any(c.partial for c in cells.values()):
        notes.append("* Avg of an algorithm without one seed covering every target domain: the mean of the "
                     "domain means, without a standard error")

    report = Report(study_dir=study_dir, selection=selection, trials=trials, selected=selected,
                    algorithms=algorithms, domains=domains, cells=cells, val_cells=val_cells, notes=notes,
                    variance=read_variance(study_dir))
    if write and plots:
        report.importances, report.importance_notes = _importances(study_dir)
        report.plots = _plots(report, rounds)
    else:
        report.importance_notes = ["Optuna importances not computed (plots turned off)"]
    if write:
        report.markdown_path = _write_text(study_dir / "report.md", report.markdown())
    return report


# --------------------------------------------------------------------------- tables


def _summarise_trials(rounds: pd.DataFrame, trial_rows: pd.DataFrame, selection: str) -> pd.DataFrame:
    """One row per trial, with the reported round and score :func:`fedtune.selection.choose_round` gives."""
    by_id: dict[str, dict[str, Any]] = {}
    if not trial_rows.empty:
        for _, r in trial_rows.iterrows():
            if isinstance(r.get("trial_id"), str):
                by_id[r["trial_id"]] = r.to_dict()
    hp_cols = sorted({c for df in (rounds, trial_rows) for c in df.columns if str(c).startswith("hp.")})
    out = []
    for tid, g in rounds.groupby("trial_id", sort=True):
        g = g.sort_values("round", kind="stable")
        row: dict[str, Any] = {"trial_id": tid}
        for c in _IDENTITY:
            row[c] = _last(g[c]) if c in g else None
        for c in hp_cols:
            row[c] = _last(g[c]) if c in g else None
        cols = [c for c in dict.fromkeys(("round", "status", "val_acc", "target_acc", *protocol.SCORE.values()))
                if c in g]
        records = [{k: (None if _missing(v) else v) for k, v in rec.items()}
                   for rec in g[cols].to_dict("records")]
        choice = protocol.choose_round(records, selection)
        if choice.round is not None:
            at = next(r for r in records if r.get("round") is not None and int(r["round"]) == choice.round)
            row.update(round=choice.round, score=choice.score, val_acc=_float(at.get("val_acc")),
                       target_acc=choice.target_acc)
        else:
            row.update(round=None, score=math.nan, val_acc=math.nan, target_acc=math.nan)
        row["rounds_done"] = int(g["round"].nunique())
        tr = by_id.get(tid)
        row["has_trial_row"] = tr is not None
        if tr is not None and isinstance(tr.get("status"), str):
            row["status"] = tr["status"]
        else:
            statuses = set(g["status"].dropna())
            row["status"] = "diverged" if "diverged" in statuses else "running"
        out.append(row)
    for tid, tr in by_id.items():  # trials with a row but no rounds (e.g. failed at start)
        if tid in set(rounds["trial_id"]):
            continue
        row = {"trial_id": tid, **{c: tr.get(c) for c in (*_IDENTITY, *hp_cols)},
               "round": None, "score": math.nan, "val_acc": math.nan, "target_acc": math.nan,
               "rounds_done": 0, "has_trial_row": True, "status": tr.get("status") or "unknown"}
        out.append(row)
    cols = ["trial_id", *_IDENTITY, "status", "rounds_done", "has_trial_row", "round", "score", "val_acc",
            "target_acc", *hp_cols]
    df = pd.DataFrame(out, columns=cols)
    df["domain"] = [NO_DOMAIN if _missing(d) else str(d) for d in df["target_domain"]]
    return df.sort_values("trial_id", kind="stable").reset_index(drop=True)


def _select(trials: pd.DataFrame, selection: str) -> pd.DataFrame:
    """The selected trial per (algorithm, domain, seed): :func:`fedtune.selection.select` on the
    trials' scores (``selection`` only chose those scores, in :func:`_summarise_trials`)."""
    ok = trials[trials["round"].notna() & trials["algorithm"].notna()].copy()
    ok["seed_key"] = ok["seed"].map(lambda s: -1 if _missing(s) else int(s))
    if ok.empty:
        return ok
    picks = []
    for _, g in ok.groupby(["algorithm", "domain", "seed_key"], sort=True):
        chosen = protocol.select(zip(g["trial_id"], g["score"].astype(float)))
        if chosen is not None:
            picks.append(g[g["trial_id"] == chosen].iloc[0])
    return pd.DataFrame(picks).reset_index(drop=True)


def _domain_order(selected: pd.DataFrame) -> list[str]:
    if selected.empty:
        return []
    ds = sorted(set(selected["domain"]), key=lambda d: (d == NO_DOMAIN, _natural(d)))
    return ds


def _cells(selected: pd.DataFrame, algorithms: list[str], domains: list[str], metric: str) -> dict[tuple[str, str], Cell]:
    cells: dict[tuple[str, str], Cell] = {}
    for a in algorithms:
        sel = selected[selected["algorithm"] == a]
        for d in domains:
            vals = sel.loc[sel["domain"] == d].sort_values("seed_key")[metric].astype(float)
            cells[(a, d)] = Cell(tuple(float(v) for v in vals if math.isfinite(v)))
        if len(domains) > 1:
            per_seed = []
            for _, g in sel.groupby("seed_key", sort=True):
                vals = {d: float(v) for d, v in zip(g["domain"], g[metric].astype(float)) if math.isfinite(v)}
                if all(d in vals for d in domains):
                    per_seed.append(float(np.mean([vals[d] for d in domains])))
            if per_seed:
                cells[(a, AVERAGE)] = Cell(tuple(per_seed))
            elif all(cells[(a, d)].values for d in domains):
                cells[(a, AVERAGE)] = Cell((float(np.mean([cells[(a, d)].mean for d in domains])),), partial=True)
            else:
                cells[(a, AVERAGE)] = Cell(())
    return cells


def _score_name(column: str) -> str:
    return {"val_acc": "Source validation accuracy", "target_val_acc": "Target-client validation accuracy",
            "oracle_acc": "Oracle-slice accuracy (ORACLE)"}.get(column, column)


def _protocol_text(report: Report) -> str:
    col = report.score_column
    if report.oracle:
        rnd = (f"Per trial, the last round (its {col} on the held-out oracle slice of the target; "
               "target_acc is measured on the rest of the target)")
    else:
        rnd = f"Per trial, the round with the best {col}"
    avg = (" Avg: per-seed mean over the target domains, then mean ± SE over seeds."
           if len(report.domains) > 1 else "")
    return (f"{rnd}; per (algorithm, target domain, seed), the trial with the best {col}; cells: mean "
            f"{report.variance_text()}.{avg}")


# --------------------------------------------------------------------------- importances


def _importances(study_dir: Path) -> tuple[dict[str, dict[str, float]], list[str]]:
    path = study_dir / "optuna.db"
    if not path.is_file():
        return {}, [("Optuna importances: no optuna.db in the study directory (not an Optuna sweep, "
                     "or its Optuna study was kept in memory)")]
    import optuna
    from optuna.importance import FanovaImportanceEvaluator

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = f"sqlite:///{path}"
    try:
        names = optuna.get_all_study_names(storage=storage)
    except Exception as exc:  # noqa: BLE001 -- a corrupt or foreign file: say so, keep the report
        return {}, [f"Optuna importances: cannot read {path}: {exc}"]
    if not names:
        return {}, [f"Optuna importances: {path} holds no study"]
    out: dict[str, dict[str, float]] = {}
    notes: list[str] = []
    for name in sorted(names):
        study = optuna.load_study(study_name=name, storage=storage)
        complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
        target = None
        if len(study.directions) > 1:  # the first objective is the selection metric
            target = _first_objective
            notes.append(f"Optuna importances of study '{name}': multi-objective study; importances of its "
                         "first objective")
        if len(complete) < 2:
            notes.append(f"Optuna importances of study '{name}': {len(complete)} complete trial(s); "
                         "at least 2 are needed")
        else:
            try:
                imp = optuna.importance.get_param_importances(
                    study, evaluator=FanovaImportanceEvaluator(seed=0), target=target)
            except Exception as exc:  # noqa: BLE001 -- e.g. no parameter common to all trials, or none varies
                notes.append(f"Optuna importances of study '{name}': not computable: {exc}")
                continue
            if not imp:
                notes.append(f"Optuna importances of study '{name}': no parameter appears in every complete trial")
                continue
            out[name] = {k: float(v) for k, v in imp.items()}
    return out, notes


def _first_objective(trial: Any) -> float:
    return float(trial.values[0])


# --------------------------------------------------------------------------- plots


def _plots(report: Report, rounds: pd.DataFrame) -> dict[str, Path]:
    out_dir = report.study_dir / "plots"
    out_dir.mkdir(exist_ok=True)
    made: dict[str, Path] = {}
    if report.algorithms:
        made["convergence"] = _plot_convergence(report, rounds, out_dir / "convergence.png")
        for a in report.algorithms:
            if report.varying_hparams(a):
                made[f"sensitivity_{a}"] = _plot_sensitivity(report, a, out_dir / f"sensitivity_{a}.png")
    if report.importances:
        made["importances"] = _plot_importances(report, out_dir / "importances.png")
    return made


def _figure(n_panels: int, width: float = 4.2, height: float = 3.2, max_cols: int = 4):
    from matplotlib.figure import Figure

    cols = min(max_cols, max(1, n_panels))
    rows = max(1, math.ceil(n_panels / cols))
    fig = Figure(figsize=(width * cols, height * rows + 0.6), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax in axes[n_panels:]:
        ax.set_visible(False)
    return fig, axes


def _suptitle(fig: Any, text: str) -> None:
    """A figure title wrapped to the figure's width (long titles would be cut off)."""
    import textwrap

    width = max(40, int(fig.get_figwidth() * 14))
    fig.suptitle(textwrap.fill(text, width), fontsize=10)


def _save(fig: Any, path: Path) -> Path:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".png", dir=path.parent)
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=100)
        _publish(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _plot_convergence(report: Report, rounds: pd.DataFrame, path: Path) -> Path:
    from matplotlib.ticker import MaxNLocator

    fig, axes = _figure(len(report.domains))
    colors = _colors(report.algorithms)
    r = rounds.copy()
    r["domain"] = [NO_DOMAIN if _missing(d) else str(d) for d in r["target_domain"]]
    for ax, d in zip(axes, report.domains):
        for a in report.algorithms:
            ids = report.selected.loc[(report.selected["algorithm"] == a) & (report.selected["domain"] == d), "trial_id"]
            if ids.empty:
                continue
            g = r[r["trial_id"].isin(set(ids))]
            for metric, style in (("target_acc", "-"), (report.score_column, "--")):
                if metric not in g:
                    continue
                vals = g[["trial_id", "round", metric]].copy()
                vals[metric] = pd.to_numeric(vals[metric], errors="coerce")
                curve = vals.dropna().groupby("round")[metric].mean()
                if curve.empty:
                    continue
                label = f"{a} {'target' if metric == 'target_acc' else metric.removesuffix('_acc')}"
                ax.plot(curve.index, 100 * curve.to_numpy(), style, color=colors[a], marker=".", label=label)
        ax.set_title(f"target domain {d}" if d != NO_DOMAIN else "all clients' test data", fontsize=10)
        ax.set_xlabel("round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("accuracy (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    seeds = report.selected["seed"].nunique()
    _suptitle(fig, f"Convergence of each algorithm's selected trial (mean over {seeds} seed(s); solid: target, "
                   f"dashed: {report.score_column}) — {report.selection_label}")
    return _save(fig, path)


# Axis labels that must say which convention a value follows (METHODS.md §2: fedtune's gp_beta
# weights the source term; the authors' code weights the target, i.e. their β is 1 − gp_beta).
AXIS_LABELS = {"gp_beta": "gp_beta (weight of the source term, paper Def. 4.3)"}


def _plot_sensitivity(report: Report, algorithm: str, path: Path) -> Path:
    hps = report.varying_hparams(algorithm)
    fig, axes = _figure(len(hps), max_cols=3)
    trials = report.trials[(report.trials["algorithm"] == algorithm) & report.trials["round"].notna()]
    colors = _colors(report.domains)
    for ax, h in zip(axes, hps):
        xs, ticks, log = _x_positions(trials[h])
        for d in report.domains:
            mask = (trials["domain"] == d).to_numpy() & ~np.isnan(xs)
            if not mask.any():
                continue
            x = xs[mask]
            label = f"{d}" if len(report.domains) > 1 else None
            ax.scatter(x, 100 * trials["target_acc"].to_numpy(dtype=float)[mask], color=colors[d], label=label, s=22)
            ax.scatter(x, 100 * trials["score"].to_numpy(dtype=float)[mask], facecolors="none",
                       edgecolors=colors[d], s=22)
            if len(set(x.tolist())) <= 12:  # a grid of values: join the mean target accuracy per value
                means = pd.Series(100 * trials["target_acc"].to_numpy(dtype=float)[mask]).groupby(x).mean()
                ax.plot(means.index, means.to_numpy(), "-", color=colors[d], alpha=0.6, linewidth=1)
        if log:
            ax.set_xscale("log")
        if ticks is not None:
            ax.set_xticks(ticks[0], labels=ticks[1])
        ax.set_xlabel(AXIS_LABELS.get(h[3:], h[3:]))
        ax.set_ylabel("accuracy (%) at the reported round")
        ax.grid(alpha=0.3)
        if len(report.domains) > 1:
            ax.legend(title="target domain", fontsize=7, title_fontsize=7)
    _suptitle(fig, f"{algorithm}: sensitivity to each varied hyperparameter (filled: target, hollow: "
                   f"{report.score_column}; one point per trial) — {report.selection_label}")
    return _save(fig, path)


def _plot_importances(report: Report, path: Path) -> Path:
    fig, axes = _figure(len(report.importances), width=5.0, max_cols=2)
    for ax, (name, imp) in zip(axes, report.importances.items()):
        items = sorted(imp.items(), key=lambda kv: kv[1])
        ax.barh([k for k, _ in items], [v for _, v in items], color="tab:blue")
        ax.set_xlabel("importance (fANOVA, normalised)")
        ax.set_title(f"Optuna study {name}", fontsize=10)
    _suptitle(fig, "Optuna parameter importances (each study's own objective)")
    return _save(fig, path)


def _x_positions(values: pd.Series) -> tuple[np.ndarray, tuple[list[float], list[str]] | None, bool]:
    """x coordinates of hyperparameter values: numbers as such (log axis when all > 0 and
    spanning ≥ 20×), text/bool values as categories to the right of the numbers (e.g.
    gp_beta ∈ [0, 1] ∪ {auto}). Returns (x, optional (tick positions, labels), log)."""
    nums: list[float | None] = []
    for v in values:
        nums.append(_as_number(v))
    cats = sorted({str(v) for v, n in zip(values, nums) if n is None and not _missing(v)})
    finite = [n for n in nums if n is not None]
    if not cats:
        x = np.array([np.nan if n is None else n for n in nums], dtype=float)
        log = bool(finite) and min(finite) > 0 and max(finite) / min(finite) >= 20
        return x, None, log
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 0.0)
    span = (hi - lo) or 1.0
    cat_x = {c: (hi if finite else 0.0) + (i + 1) * 0.25 * span for i, c in enumerate(cats)}
    x = np.array([n if n is not None else cat_x.get(str(v), np.nan) if not _missing(v) else np.nan
                  for v, n in zip(values, nums)], dtype=float)
    num_ticks = sorted(set(np.linspace(lo, hi, 3).tolist())) if finite else []
    ticks = (num_ticks + list(cat_x.values()), [f"{t:g}" for t in num_ticks] + cats)
    return x, ticks, False


# --------------------------------------------------------------------------- small helpers


def _missing(v: Any) -> bool:
    if v is None:
        return True
    try:
        return bool(pd.isna(v))
    except (TypeError, ValueError):
        return False


def _last(col: pd.Series) -> Any:
    vals = col.dropna()
    if vals.empty:
        return None
    v = vals.iloc[-1]
    return v.item() if isinstance(v, np.generic) else v


def _float(v: Any) -> float:
    try:
        return math.nan if _missing(v) else float(v)
    except (TypeError, ValueError):
        return math.nan


def _as_number(v: Any) -> float | None:
    """A hyperparameter value as a number (JSON-encoded numbers in text columns too)."""
    if _missing(v) or isinstance(v, (bool, np.bool_)):
        return None
    if isinstance(v, (int, float, np.integer, np.floating)):
        return float(v)
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _varying(trials: pd.DataFrame) -> list[str]:
    out = []
    for c in trials.columns:
        if str(c).startswith("hp."):
            distinct = {json.dumps(v, default=str) if not isinstance(v, str) else v
                        for v in trials[c] if not _missing(v)}
            if len(distinct) >= 2:
                out.append(c)
    return out


def _natural(s: str) -> tuple:
    """Sort key putting numeric domain names ("0", "15", "30") in numeric order."""
    try:
        return (0, float(s), s)
    except ValueError:
        return (1, 0.0, s)


def _colors(keys: list[str]) -> dict[str, Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    return {k: cmap(i % 10) for i, k in enumerate(keys)}


def _pct(v: Any) -> str:
    f = _float(v)
    return "—" if math.isnan(f) else f"{100 * f:.1f}"


def _fmt(v: Any) -> str:
    if _missing(v):
        return "—"
    if isinstance(v, (float, np.floating)):
        return f"{float(v):.4g}"
    if isinstance(v, (np.integer,)):
        return str(int(v))
    return str(v)


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    def esc(s: str) -> str:
        return str(s).replace("|", "\\|")

    lines = ["| " + " | ".join(esc(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows]
    return lines


def _publish(tmp: str, path: Path) -> None:
    """Give the temp file ordinary permissions (mkstemp makes it 0600), then move it in place."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    os.replace(tmp, path)


def _write_text(path: Path, text: str) -> Path:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        _publish(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
