"""The numbers of ``fedtune report``: per-trial summaries, the selected trials, table cells, gaps.

From a study's round rows (and its ``trials.parquet`` rows, when there are any):
:func:`summarise_trials` gives one row per trial with its reported round and score under a
selection protocol (:func:`fedtune.results.selection.choose_round`); :func:`select_trials` keeps the
best trial per (algorithm, target domain, seed) (:func:`fedtune.results.selection.select`);
:func:`table_cells` averages the selected trials over seeds (:class:`Cell`, mean ± standard
error); :func:`paired_gap` compares two algorithms seed by seed (:class:`Gap`). The small
value helpers (:func:`missing`, :func:`fmt`, :func:`pct`, ...) are shared by the report's
tables and plots.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from fedtune.results import selection as protocol
from fedtune.results.schema import IDENTITY_COLUMNS
from fedtune.results.status import DIVERGED, RUNNING

__all__ = ["NO_DOMAIN", "AVERAGE", "TRIAL_IDENTITY", "Cell", "Gap", "paired_gap", "summarise_trials",
           "select_trials", "domain_order", "table_cells"]

NO_DOMAIN = "all"
"""Column label of studies without a target domain (``fl``: all clients' test splits)."""

AVERAGE = "Avg"
"""Column label of the average over target domains."""

TRIAL_IDENTITY = tuple(c for c in IDENTITY_COLUMNS if c not in ("study", "trial_id"))
"""The identity columns a report's per-trial row carries besides ``trial_id``."""


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
    from scipy.stats import t as student_t  # lazy: keeps scipy out of this module's import

    seeds = sorted(set(a) & set(b))
    diff = np.array([a[s] - b[s] for s in seeds], dtype=float)
    n = len(diff)
    if n < 2:
        return Gap(float(diff.mean()) if n else math.nan, math.nan, n, math.nan)
    se = float(diff.std(ddof=1) / math.sqrt(n))
    return Gap(float(diff.mean()), se, n, float(student_t.ppf(0.975, n - 1)) * se)


# --------------------------------------------------------------------------- trials


def summarise_trials(rounds: pd.DataFrame, trial_rows: pd.DataFrame, selection: str) -> pd.DataFrame:
    """One row per trial, with the reported round and score :func:`fedtune.results.selection.choose_round` gives."""
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
        for c in (*TRIAL_IDENTITY, *hp_cols):
            row[c] = last_value(g[c]) if c in g else None
        row["split_scheme"] = last_value(g["split_scheme"]) if "split_scheme" in g else None
        cols = [c for c in dict.fromkeys(("round", "status", "val_acc", "target_acc", *protocol.SCORE.values()))
                if c in g]
        records = [{k: (None if missing(v) else v) for k, v in rec.items()}
                   for rec in g[cols].to_dict("records")]
        choice = protocol.choose_round(records, selection)
        if choice.round is not None:
            at = next(r for r in records if r.get("round") is not None and int(r["round"]) == choice.round)
            row.update(round=choice.round, score=choice.score, val_acc=as_float(at.get("val_acc")),
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
            row["status"] = DIVERGED if DIVERGED in statuses else RUNNING
        out.append(row)
    for tid, tr in by_id.items():  # trials with a row but no rounds (e.g. failed at start)
        if tid in set(rounds["trial_id"]):
            continue
        row = {"trial_id": tid, **{c: tr.get(c) for c in (*TRIAL_IDENTITY, *hp_cols)},
               "round": None, "score": math.nan, "val_acc": math.nan, "target_acc": math.nan,
               "rounds_done": 0, "has_trial_row": True, "status": tr.get("status") or "unknown"}
        out.append(row)
    cols = ["trial_id", *TRIAL_IDENTITY, "split_scheme", "status", "rounds_done", "has_trial_row", "round", "score",
            "val_acc", "target_acc", *hp_cols]
    df = pd.DataFrame(out, columns=cols)
    # a split file's trials get their own column (the WILDS protocol beside leave-one-domain-out)
    df["domain"] = [NO_DOMAIN if missing(d) else str(d) if missing(s) else f"{d} ({s})"
                    for d, s in zip(df["target_domain"], df["split_scheme"])]
    return df.sort_values("trial_id", kind="stable").reset_index(drop=True)


def select_trials(trials: pd.DataFrame) -> pd.DataFrame:
    """The selected trial per (algorithm, domain, seed): :func:`fedtune.results.selection.select` on the
    trials' scores (the protocol only chose those scores, in :func:`summarise_trials`)."""
    ok = trials[trials["round"].notna() & trials["algorithm"].notna()].copy()
    ok["seed_key"] = ok["seed"].map(lambda s: -1 if missing(s) else int(s))
    if ok.empty:
        return ok
    picks = []
    for _, g in ok.groupby(["algorithm", "domain", "seed_key"], sort=True):
        chosen = protocol.select(zip(g["trial_id"], g["score"].astype(float)))
        if chosen is not None:
            picks.append(g[g["trial_id"] == chosen].iloc[0])
    return pd.DataFrame(picks).reset_index(drop=True)


def domain_order(selected: pd.DataFrame) -> list[str]:
    """The table's target-domain columns: numeric names in numeric order, ``all`` last."""
    if selected.empty:
        return []
    return sorted(set(selected["domain"]), key=lambda d: (d == NO_DOMAIN, natural_key(d)))


def _per_seed_means(sel: pd.DataFrame, domains: list[str], metric: str) -> dict[int, float]:
    """seed -> ``metric`` of the selected trials averaged over ``domains`` (seeds with every domain)."""
    out: dict[int, float] = {}
    for seed, g in sel.groupby("seed_key", sort=True):
        vals = {d: float(v) for d, v in zip(g["domain"], g[metric].astype(float)) if math.isfinite(v)}
        if domains and all(d in vals for d in domains):
            out[int(seed)] = float(np.mean([vals[d] for d in domains]))
    return out


def per_seed_average(selected: pd.DataFrame, algorithm: str, domains: list[str]) -> dict[int, float]:
    """seed -> ``algorithm``'s selected ``target_acc`` averaged over ``domains`` (only seeds that
    have every domain)."""
    return _per_seed_means(selected[selected["algorithm"] == algorithm], domains, "target_acc")


def table_cells(selected: pd.DataFrame, algorithms: list[str], domains: list[str],
                metric: str) -> dict[tuple[str, str], Cell]:
    """(algorithm, domain or ``Avg``) -> :class:`Cell` of the selected trials' ``metric``."""
    cells: dict[tuple[str, str], Cell] = {}
    for a in algorithms:
        sel = selected[selected["algorithm"] == a]
        for d in domains:
            vals = sel.loc[sel["domain"] == d].sort_values("seed_key")[metric].astype(float)
            cells[(a, d)] = Cell(tuple(float(v) for v in vals if math.isfinite(v)))
        if len(domains) > 1:
            per_seed = list(_per_seed_means(sel, domains, metric).values())
            if per_seed:
                cells[(a, AVERAGE)] = Cell(tuple(per_seed))
            elif all(cells[(a, d)].values for d in domains):
                cells[(a, AVERAGE)] = Cell((float(np.mean([cells[(a, d)].mean for d in domains])),), partial=True)
            else:
                cells[(a, AVERAGE)] = Cell(())
    return cells


# --------------------------------------------------------------------------- values


def missing(v: Any) -> bool:
    """True for None and NaN-like values (pandas' idea of missing)."""
    if v is None:
        return True
    try:
        return bool(pd.isna(v))
    except (TypeError, ValueError):
        return False


def last_value(col: pd.Series) -> Any:
    """The last non-missing value of ``col`` as a Python value, or None."""
    vals = col.dropna()
    if vals.empty:
        return None
    v = vals.iloc[-1]
    return v.item() if isinstance(v, np.generic) else v


def as_float(v: Any) -> float:
    """``v`` as a float; NaN when missing or not a number."""
    try:
        return math.nan if missing(v) else float(v)
    except (TypeError, ValueError):
        return math.nan


def varying_hparams(trials: pd.DataFrame) -> list[str]:
    """``hp.*`` columns of ``trials`` with ≥ 2 distinct values."""
    out = []
    for c in trials.columns:
        if str(c).startswith("hp."):
            distinct = {json.dumps(v, default=str) if not isinstance(v, str) else v
                        for v in trials[c] if not missing(v)}
            if len(distinct) >= 2:
                out.append(c)
    return out


def natural_key(s: str) -> tuple:
    """Sort key putting numeric domain names ("0", "15", "30") in numeric order.

    >>> sorted(["30", "art", "15", "0"], key=natural_key)
    ['0', '15', '30', 'art']
    """
    try:
        return (0, float(s), s)
    except ValueError:
        return (1, 0.0, s)


def pct(v: Any) -> str:
    """A fraction as percent with one decimal; ``—`` when missing."""
    f = as_float(v)
    return "—" if math.isnan(f) else f"{100 * f:.1f}"


def fmt(v: Any) -> str:
    """A table value: floats with 4 significant digits; ``—`` when missing.

    >>> fmt(0.000123456), fmt(3), fmt(None), fmt("auto")
    ('0.0001235', '3', '—', 'auto')
    """
    if missing(v):
        return "—"
    if isinstance(v, (float, np.floating)):
        return f"{float(v):.4g}"
    if isinstance(v, (np.integer,)):
        return str(int(v))
    return str(v)
