"""``fedtune report STUDY_DIR``: tables, ``report.md`` and PNG plots of a study.

A study directory ``OUTPUT/<study>`` holds ``rounds/<trial_id>.parquet`` (one row per round),
usually ``trials.parquet`` (one row per finished trial), maybe ``optuna.db`` (the Optuna
study of a sweep) and ``study.json`` (the sweep's settings). :func:`make_report` reads it
through :func:`fedtune.results.store.load`, so it also works on a study that is still running:
trials without a ``trials.parquet`` row yet are summarised from their rounds.

Selection protocol (:mod:`fedtune.results.selection` owns it; docs/methods-protocol.md §5). ``val`` (default,
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
study; otherwise the report says why they are missing) and ``STUDY_DIR/plots/pareto_<search>.png``
(Optuna's Pareto-front plot of each multi-objective Optuna study, e.g. ``--sampler nsga2``). With
``fedtune sweep --optuna-storage URL`` the Optuna studies are read from that storage (only those
named ``<study>/...``; :func:`fedtune.reports.importances.study_optuna`). fedtune's plots use
matplotlib's Agg canvas directly (no pyplot, no display); Optuna's Pareto plot goes through pyplot
and is closed after saving.

This module reads a study and builds its :class:`Report` (:func:`make_report`); the rooms beside
it: :mod:`fedtune.reports.stats` (per-trial summaries, selected trials, cells and gaps),
:mod:`fedtune.reports.model` (what the report holds and what its tables say),
:mod:`fedtune.reports.render` (``report.md`` and the console tables),
:mod:`fedtune.reports.plots` (the PNGs) and :mod:`fedtune.reports.importances` (Optuna's importances).
"""

from __future__ import annotations

import os
from typing import Any

import pandas as pd

from fedtune.errors import ConfigError, shown
from fedtune.reports.importances import optuna_importances
from fedtune.reports.model import ReportData
from fedtune.reports.plots import make_plots
from fedtune.reports.render import markdown, print_report
from fedtune.reports.stats import domain_order, select_trials, summarise_trials, table_cells
from fedtune.results import selection as protocol
from fedtune.results.atomic import atomic_write_text
from fedtune.results.store import check_study_dir, check_writable, load
from fedtune.results.study_dir import TRIALS_FILE, StudyDir, read_study_if_any

__all__ = ["SELECTIONS", "Report", "make_report", "read_selection", "read_variance"]

SELECTIONS = protocol.PROTOCOLS
"""The selection protocols (:data:`fedtune.results.selection.PROTOCOLS`)."""


class Report(ReportData):
    """Everything :func:`make_report` computed (the fields and table rows of
    :class:`~fedtune.reports.model.ReportData`), plus its two renderings: :meth:`markdown`
    (``report.md``) and :meth:`print` (rich tables)."""

    def markdown(self) -> str:
        """The text of ``report.md`` (:func:`fedtune.reports.render.markdown`)."""
        return markdown(self)

    def print(self, console: Any = None) -> None:
        """Print the tables with rich (:func:`fedtune.reports.render.print_report`): per-trial
        tables are wide on a wide console and one row per trial, hyperparameters as
        ``name = value`` lines, on a narrow one (80 columns)."""
        print_report(self, console)


# --------------------------------------------------------------------------- entry point


def read_selection(study_dir: str | os.PathLike[str]) -> str:
    """The study's selection protocol from ``STUDY_DIR/study.json`` (key ``selection``);
    ``val`` when the file or the key is missing. A bad value is a ConfigError.

    >>> import tempfile
    >>> read_selection(tempfile.mkdtemp())
    'val'
    """
    value = read_study_if_any(study_dir).get("selection", protocol.DEFAULT)
    if value not in SELECTIONS:
        path = StudyDir(study_dir).study_json
        raise ConfigError(f"{path}: key 'selection': {shown(value)} is not allowed; allowed: {', '.join(SELECTIONS)}")
    return value


def read_variance(study_dir: str | os.PathLike[str]) -> tuple[str | None, int]:
    """What the study's seeds are, from ``study.json``: ``("trial-seeds", K)`` for K > 1 whole
    searches (``--trial-seeds``), ``("seeds", K)`` for K > 1 re-runs of the selected
    configuration (``--seeds``), else ``(None, 1)``.

    >>> import tempfile
    >>> read_variance(tempfile.mkdtemp())
    (None, 1)
    """
    data = read_study_if_any(study_dir)
    opts = data.get("options") if isinstance(data.get("options"), dict) else {}
    def count(key: str, value: Any) -> int:
        try:
            return int(value or 1)
        except (TypeError, ValueError):
            raise ConfigError(f"{StudyDir(study_dir).study_json}: key '{key}': {shown(value)} is not allowed; "
                              "allowed: an integer >= 1") from None

    trial_seeds = count("trial_seeds", data.get("trial_seeds") or opts.get("trial_seeds"))
    if trial_seeds > 1:
        return "trial-seeds", trial_seeds
    seeds = data.get("seeds")
    k = len(seeds) if isinstance(seeds, list) else count("seeds", opts.get("seeds"))
    return ("seeds", k) if k > 1 else (None, 1)


def _scheme_for(rounds: pd.DataFrame, setting: str, selection: str) -> str | None:
    """The split scheme to check ``selection`` against in ``setting``'s rows: ``ood-val`` (and the F1 protocols) needs one trial
    with a split file, ``oracle`` one without (a study may hold both protocols' trials)."""
    if "split_scheme" not in rounds:
        return None
    schemes = rounds.loc[rounds["setting"] == setting, "split_scheme"]
    named = sorted(str(x) for x in schemes.dropna().unique())
    if not named or (selection == "oracle" and schemes.isna().any()):
        return None
    return named[0]


def make_report(study_dir: str | os.PathLike[str], *, selection: str | None = None,
                plots: bool = True, write: bool = True, companion: bool = True) -> Report:
    """Summarise the study in ``study_dir``; write ``report.md`` and the plots there.

    ``selection`` (one of :data:`SELECTIONS`) overrides ``study.json``; ``plots=False`` skips
    the PNGs and the Optuna importances; ``write=False`` writes nothing (the plots are then
    skipped too). See the module docstring for the protocol. A study with split-file trials
    (``split_scheme``) also gets, under ``val`` or ``ood-val`` (``val-f1`` or ``ood-val-f1``), the other one's main table
    (``Report.companion``; ``companion=False`` leaves it out).

    A path that is not a study folder (:func:`fedtune.results.store.check_study_dir`) or, with ``write``,
    a study folder that refuses new files is a ConfigError before anything is read or written; a
    Parquet file there that is not fedtune's a :class:`~fedtune.results.arrow.ForeignResultsError`; a
    write the disk refuses midway a :class:`~fedtune.results.atomic.ResultsWriteError` naming the file.
    """
    study_dir = check_study_dir(study_dir)  # not a study (a typo, an output folder): refused, nothing written
    files = StudyDir(study_dir)
    if write:  # a folder that refuses writes: one line now, not a PermissionError after the computing
        check_writable(study_dir, "fedtune report writes report.md and plots/ into the study folder")
    if selection is None:
        selection = read_selection(study_dir)
    protocol.check_protocol(selection)
    rounds = load(study_dir).to_pandas()
    settings = {str(s) for s in rounds["setting"].dropna().unique()} if "setting" in rounds else set()
    for s in sorted(settings):  # target-val outside fda, oracle in fl: a clear error, not an empty table
        protocol.check_protocol(selection, s, split_scheme=_scheme_for(rounds, s, selection))
    has_trials_file = files.trials.is_file()
    trial_rows = load(study_dir, "trials").to_pandas() if has_trials_file else pd.DataFrame()
    notes: list[str] = []
    if not has_trials_file:
        notes.append(f"no {TRIALS_FILE} yet: every trial is summarised from its rounds")

    trials = summarise_trials(rounds, trial_rows, selection)
    missing_row = trials[~trials["has_trial_row"]] if not trials.empty else trials
    if has_trials_file and len(missing_row):
        notes.append(f"{len(missing_row)} trial(s) without a {TRIALS_FILE} row (still running or "
                     f"interrupted), summarised from their rounds: {', '.join(missing_row['trial_id'])}")
    no_metric = trials[trials["round"].isna()] if not trials.empty else trials
    if len(no_metric):
        notes.append(f"{len(no_metric)} trial(s) without a finite {protocol.SCORE[selection]} at a reportable round "
                     f"(not selectable): {', '.join(no_metric['trial_id'])}")

    searches = read_study_if_any(study_dir).get("searches") or {}
    for key, state in sorted(searches.items()):
        if isinstance(state, dict) and state.get("ended_early"):
            notes.append(f"search '{key}' ran fewer trials than asked: {state['ended_early']}")

    selected = select_trials(trials)
    algorithms = sorted(selected["algorithm"].unique()) if not selected.empty else []
    domains = domain_order(selected)
    cells = table_cells(selected, algorithms, domains, "target_acc")
    val_cells = table_cells(selected, algorithms, domains, "score")
    if any(c.partial for c in cells.values()):
        notes.append("* Avg of an algorithm without one seed covering every target domain: the mean of the "
                     "domain means, without a standard error")

    report = Report(study_dir=study_dir, selection=selection, trials=trials, selected=selected,
                    algorithms=algorithms, domains=domains, cells=cells, val_cells=val_cells, notes=notes,
                    variance=read_variance(study_dir))
    other = {"val": "ood-val", "ood-val": "val", "val-f1": "ood-val-f1", "ood-val-f1": "val-f1"}.get(selection)
    if companion and other and "split_scheme" in rounds and rounds["split_scheme"].notna().any():
        report.companion = make_report(study_dir, selection=other, plots=False, write=False, companion=False)
    if write and plots:
        report.importances, report.importance_notes = optuna_importances(study_dir)
        report.plots = make_plots(report, rounds)
    else:
        report.importance_notes = ["Optuna importances not computed (plots turned off)"]
    if write:
        report.markdown_path = atomic_write_text(files.report_md, report.markdown())
    return report
