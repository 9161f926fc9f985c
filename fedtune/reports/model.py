"""The model of ``fedtune report``: :class:`ReportData`, everything
:func:`~fedtune.reports.report.make_report` computed about a study, and what its tables say
(labels, rows, conclusions).

It holds no I/O and no rendering: :mod:`fedtune.reports.render` writes it as Markdown and
console tables, :mod:`fedtune.reports.plots` draws it, and :class:`fedtune.reports.report.Report`
(the class users get) adds those two as ``markdown()`` and ``print()``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from fedtune.algorithms import all_hparams
from fedtune.reports.stats import (AVERAGE, Cell, fmt, missing, natural_key, paired_gap, pct, per_seed_average,
                                   varying_hparams)
from fedtune.results import selection as protocol

__all__ = ["ReportData"]


@dataclass
class ReportData:
    """Everything :func:`~fedtune.reports.report.make_report` computed, plus where it wrote things.

    ``trials``: one row per trial (``trial_id``, identity columns, ``status``,
    ``rounds_done``, ``has_trial_row``, ``round`` / ``score`` (the protocol's metric) /
    ``val_acc`` / ``target_acc`` at the reported round, ``hp.*``). ``selected``: the selected
    trial per (algorithm, target domain, seed). ``cells``: (algorithm, domain label or
    ``Avg``) -> :class:`Cell` of target accuracy; ``val_cells`` the same for the protocol's
    score. ``variance``: ``(kind, K)`` from :func:`~fedtune.reports.report.read_variance`.
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
    # a study with split-file trials: the same study under the split file's other validation (val <->
    # ood-val), its main table printed after this one's (the WILDS protocol's two selections)
    companion: ReportData | None = None

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
        return varying_hparams(self.trials[self.trials["algorithm"] == algorithm])

    def variants(self) -> dict[str, dict[str, list[str]]]:
        """algorithm -> {hyperparameter: values that ran} for every hyperparameter marked
        ``variant`` (a choice between a paper and its authors' code, e.g. ``gala_gate``,
        ``omg_solver``), over the algorithm's trials: the tables say which variant produced them."""
        names = [n for n, (_, spec) in all_hparams().items() if spec.variant]
        out: dict[str, dict[str, list[str]]] = {}
        for a in self.algorithms:
            rows = self.trials[self.trials["algorithm"] == a]
            for n in names:
                col = f"hp.{n}"
                if col in rows:
                    vals = sorted({fmt(v) for v in rows[col] if not missing(v)}, key=natural_key)
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
        return per_seed_average(self.selected, algorithm, self.domains)

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

    # -- table rows -------------------------------------------------------------------------
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
            rows.append([str(r["domain"]), fmt(r["seed"]), str(r["trial_id"]), fmt(r["round"]),
                         pct(r["val_acc"]), *[pct(r["score"]) for _ in scores], pct(r["target_acc"]),
                         str(r["status"]), *[fmt(r.get(h)) for h in hps]])
        return header, rows
