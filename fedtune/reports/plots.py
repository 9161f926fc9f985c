"""The PNG figures of ``fedtune report`` (all of fedtune's matplotlib).

:func:`make_plots` draws, under ``STUDY_DIR/plots/``: ``convergence.png`` (the protocol's
score dashed and ``target_acc`` solid vs round of each algorithm's selected trials, mean over
seeds, one panel per target domain), ``sensitivity_<algorithm>.png`` (every ``hp.*`` that
varies among an algorithm's trials: each trial's ``target_acc`` (filled) and score (hollow) at
its reported round against the value, coloured by target domain, with a line through the mean
target accuracy per value when there are at most 12 distinct values: the papers' ablation
plots), ``importances.png`` (Optuna's fANOVA importances, when the report has some) and
``pareto_<search>.png`` (Optuna's own Pareto-front plot, ``visualization.matplotlib``, of every
multi-objective Optuna study of the study, e.g. ``--sampler nsga2``: one per search).
fedtune's figures use matplotlib's Agg canvas directly (no pyplot, no display); Optuna's
draws through pyplot, so its figure is closed and its style reverted after saving. Every PNG is
written atomically (:func:`fedtune.results.atomic.atomic_write`).

To add a plot: write ``_plot_<name>(report, ..., path) -> Path`` ending in :func:`_save`, and
call it from :func:`make_plots`.
"""

from __future__ import annotations

import math
import textwrap
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from fedtune.reports.importances import study_optuna
from fedtune.reports.stats import NO_DOMAIN, missing
from fedtune.results.atomic import atomic_write
from fedtune.results.study_dir import StudyDir, read_study_if_any

if TYPE_CHECKING:
    from fedtune.reports.model import ReportData

__all__ = ["AXIS_LABELS", "make_plots", "pareto_file", "pareto_fronts"]

# Axis labels that must say which convention a value follows (docs/methods-seeds.md §2: fedtune's gp_beta
# weights the source term; the authors' code weights the target, i.e. their β is 1 − gp_beta).
AXIS_LABELS = {"gp_beta": "gp_beta (weight of the source term, paper Def. 4.3)"}


def make_plots(report: ReportData, rounds: pd.DataFrame) -> dict[str, Path]:
    """Draw every figure ``report`` has data for; returns name -> PNG path."""
    out_dir = StudyDir(report.study_dir).plots_dir
    out_dir.mkdir(exist_ok=True)
    made: dict[str, Path] = {}
    if report.algorithms:
        made["convergence"] = _plot_convergence(report, rounds, out_dir / "convergence.png")
        for a in report.algorithms:
            if report.varying_hparams(a):
                made[f"sensitivity_{a}"] = _plot_sensitivity(report, a, out_dir / f"sensitivity_{a}.png")
    if report.importances:
        made["importances"] = _plot_importances(report, out_dir / "importances.png")
    made.update(pareto_fronts(report.study_dir, out_dir))
    return made


# --------------------------------------------------------------------------- figure helpers


def _figure(n_panels: int, width: float = 4.2, height: float = 3.2, max_cols: int = 4):
    from matplotlib.figure import Figure  # lazy: keeps matplotlib, PIL out of this module's import

    cols = min(max_cols, max(1, n_panels))
    rows = max(1, math.ceil(n_panels / cols))
    fig = Figure(figsize=(width * cols, height * rows + 0.6), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax in axes[n_panels:]:
        ax.set_visible(False)
    return fig, axes


def _suptitle(fig: Any, text: str) -> None:
    """A figure title wrapped to the figure's width (long titles would be cut off)."""
    width = max(40, int(fig.get_figwidth() * 14))
    fig.suptitle(textwrap.fill(text, width), fontsize=10)


def _save(fig: Any, path: Path) -> Path:
    """Write ``fig`` as a PNG to ``path`` atomically."""
    return atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=100, format="png"))


def _colors(keys: list[str]) -> dict[str, Any]:
    from matplotlib import colormaps  # lazy: keeps matplotlib, PIL out of this module's import

    cmap = colormaps["tab10"]
    return {k: cmap(i % 10) for i, k in enumerate(keys)}


# --------------------------------------------------------------------------- the figures


def _plot_convergence(report: ReportData, rounds: pd.DataFrame, path: Path) -> Path:
    from matplotlib.ticker import MaxNLocator  # lazy: keeps matplotlib, PIL out of this module's import

    fig, axes = _figure(len(report.domains))
    colors = _colors(report.algorithms)
    r = rounds.copy()
    r["domain"] = [NO_DOMAIN if missing(d) else str(d) for d in r["target_domain"]]
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


def _plot_sensitivity(report: ReportData, algorithm: str, path: Path) -> Path:
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


def _plot_importances(report: ReportData, path: Path) -> Path:
    fig, axes = _figure(len(report.importances), width=5.0, max_cols=2)
    for ax, (name, imp) in zip(axes, report.importances.items()):
        items = sorted(imp.items(), key=lambda kv: kv[1])
        ax.barh([k for k, _ in items], [v for _, v in items], color="tab:blue")
        ax.set_xlabel("importance (fANOVA, normalised)")
        ax.set_title(f"Optuna study {name}", fontsize=10)
    _suptitle(fig, "Optuna parameter importances (each study's own objective)")
    return _save(fig, path)


def pareto_file(optuna_study: str) -> str:
    """The file of an Optuna study's Pareto-front plot: its search key (the name after
    ``<study>/``) with ``/`` as ``--``, like the search's Tune experiment.

    >>> pareto_file("lodo/fedavg/30@ts1"), pareto_file("s/nsga")
    ('pareto_fedavg--30@ts1.png', 'pareto_nsga.png')
    """
    key = optuna_study.split("/", 1)[1] if "/" in optuna_study else optuna_study
    return f"pareto_{key.replace('/', '--')}.png"


def pareto_fronts(study_dir: Path, out_dir: Path) -> dict[str, Path]:
    """``pareto_<search>.png`` for every Optuna study of ``study_dir`` (its ``--optuna-storage``
    or ``optuna.db``: :func:`fedtune.reports.importances.study_optuna`) with 2 or 3 objectives and a
    complete trial: Optuna's ``plot_pareto_front``, axes named by the study's metrics. Returns
    ``pareto <search>`` -> path; a single-objective study gets none."""
    storage, names, _ = study_optuna(study_dir)
    if storage is None:
        return {}
    import optuna  # lazy: keeps optuna out of this module's import

    metrics = read_study_if_any(study_dir).get("metric")
    made: dict[str, Path] = {}
    for name in names:
        study = optuna.load_study(study_name=name, storage=storage)
        n = len(study.directions)
        if n not in (2, 3) or not study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
            continue
        targets = [str(m) for m in metrics] if isinstance(metrics, list) and len(metrics) == n else None
        path = out_dir / pareto_file(name)
        made[f"pareto {path.stem.removeprefix('pareto_')}"] = _plot_pareto(study, name, targets, path)
    return made


def _plot_pareto(study: Any, name: str, target_names: list[str] | None, path: Path) -> Path:
    # lazy: keeps matplotlib, PIL out of this module's import
    import matplotlib
    import optuna
    from matplotlib import pyplot as plt
    from optuna.visualization.matplotlib import plot_pareto_front

    with matplotlib.rc_context(), warnings.catch_warnings():  # Optuna sets the ggplot style: undone on exit
        warnings.simplefilter("ignore", category=optuna.exceptions.ExperimentalWarning)
        ax = plot_pareto_front(study, target_names=target_names)
        fig = ax.get_figure()
        try:
            directions = ", ".join(f"{t} ({d.name.lower()})" for t, d in
                                   zip(target_names or [f"objective {i}" for i in range(len(study.directions))],
                                       study.directions))
            ax.set_title(textwrap.fill(f"Pareto front of Optuna study {name}: {directions}", 60), fontsize=9)
            fig.set_layout_engine("constrained")
            return _save(fig, path)
        finally:
            plt.close(fig)


# --------------------------------------------------------------------------- hyperparameter axes


def _as_number(v: Any) -> float | None:
    """A hyperparameter value as a number (JSON-encoded numbers in text columns too)."""
    if missing(v) or isinstance(v, (bool, np.bool_)):
        return None
    if isinstance(v, (int, float, np.integer, np.floating)):
        return float(v)
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _x_positions(values: pd.Series) -> tuple[np.ndarray, tuple[list[float], list[str]] | None, bool]:
    """x coordinates of hyperparameter values: numbers as such (log axis when all > 0 and
    spanning ≥ 20×), text/bool values as categories to the right of the numbers (e.g.
    gp_beta ∈ [0, 1] ∪ {auto}). Returns (x, optional (tick positions, labels), log).

    >>> x, ticks, log = _x_positions(pd.Series([0.0, 1.0, "auto"]))
    >>> x.tolist(), ticks[1], log
    ([0.0, 1.0, 1.25], ['0', '0.5', '1', 'auto'], False)
    """
    nums: list[float | None] = [_as_number(v) for v in values]
    cats = sorted({str(v) for v, n in zip(values, nums) if n is None and not missing(v)})
    finite = [n for n in nums if n is not None]
    if not cats:
        x = np.array([np.nan if n is None else n for n in nums], dtype=float)
        log = bool(finite) and min(finite) > 0 and max(finite) / min(finite) >= 20
        return x, None, log
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 0.0)
    span = (hi - lo) or 1.0
    cat_x = {c: (hi if finite else 0.0) + (i + 1) * 0.25 * span for i, c in enumerate(cats)}
    x = np.array([n if n is not None else cat_x.get(str(v), np.nan) if not missing(v) else np.nan
                  for v, n in zip(values, nums)], dtype=float)
    num_ticks = sorted(set(np.linspace(lo, hi, 3).tolist())) if finite else []
    ticks = (num_ticks + list(cat_x.values()), [f"{t:g}" for t in num_ticks] + cats)
    return x, ticks, False
