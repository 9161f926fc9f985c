"""How a report reads (:class:`~fedtune.reports.model.ReportData`): ``report.md`` and the console tables.

:func:`markdown` gives ``report.md``; :func:`print_report` prints the same tables with rich.
An algorithm's selected trials are one wide table (one column per field and per varying
hyperparameter) in ``report.md`` and on a console wide enough for it; on a narrower console
(80 columns: log files, CI, ``ray job logs``) each trial is one row of a three-column table —
the trial, its result (``target domain 0, seed 1`` / ``round 2, completed`` / ``val_acc 80.0``
/ ``target_acc 40.0``) and its hyperparameters as ``name = value`` lines — so no name or number
is broken across lines. The main table likewise: one row per algorithm where it fits, else one
column per algorithm (a row per target domain), else one row per (algorithm, target domain).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from fedtune.reports.model import ReportData

__all__ = ["main_table", "markdown", "print_report", "md_table", "protocol_text", "score_name", "trials_table"]

_WIDE_ENOUGH = 10**6  # a width no table needs: measure a table's natural width with it


def score_name(column: str) -> str:
    """Words for a selection score column, for headings.

    >>> score_name("target_val_acc")
    'Target-client validation accuracy'
    """
    return {"val_acc": "Source validation accuracy", "target_val_acc": "Target-client validation accuracy",
            "oracle_acc": "Oracle-slice accuracy (ORACLE)"}.get(column, column)


def protocol_text(report: ReportData) -> str:
    """The caption of the main table: how rounds and trials were chosen and what a cell is."""
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


def md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    """Lines of a Markdown table (``|`` in cells escaped).

    >>> md_table(["a", "b"], [["1", "x|y"]])
    ['| a | b |', '|---|---|', '| 1 | x\\\\|y |']
    """
    def esc(s: str) -> str:
        return str(s).replace("|", "\\|")

    lines = ["| " + " | ".join(esc(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows]
    return lines


# --------------------------------------------------------------------------- report.md


def markdown(report: ReportData) -> str:
    """The text of ``report.md``."""
    lines = [f"# Study report: {report.study_dir.name}", ""]
    lines.append(f"Study directory: `{report.study_dir}`  ")
    lines.append(f"Selection: **{report.selection_label}**.  ")
    counts = ", ".join(f"{v} {k}" for k, v in report.status_counts().items()) or "none"
    lines.append(f"Trials: {len(report.trials)} ({counts}).")
    lines.append("")
    if report.oracle:
        lines += [("> **Oracle selection**: the hyperparameters were chosen by accuracy on a held-out slice "
                   "of the *target* domain (the last round of each trial; the slice is never part of the "
                   "reported target accuracy). DomainBed's test-domain validation: an upper bound, not an "
                   "honest result."), ""]
    lines += [f"## {report.title()}", ""]
    if report.algorithms:
        lines += _markdown_tables(report)
    else:
        lines += ["No trial has a round with accuracies yet.", ""]
    if report.companion is not None and report.companion.algorithms:
        other = report.companion
        lines += [f"## {other.title()}", ""]
        lines += md_table(["algorithm", *other.columns, "seeds", "trials"], other.main_rows())
        lines += ["", protocol_text(other), ""]
    lines += ["## Plots", ""]
    for key, path in report.plots.items():
        rel = os.path.relpath(path, report.study_dir)
        lines += [f"![{key}]({rel})", ""]
    if not report.plots:
        lines += ["No plots (nothing to plot yet, or plots were turned off).", ""]
    lines += ["## Optuna parameter importances", ""]
    for study, imp in report.importances.items():
        lines += [f"Study `{study}` (fANOVA; each trial's objective as Optuna recorded it):", ""]
        lines += md_table(["parameter", "importance"], [[k, f"{v:.3f}"] for k, v in imp.items()])
        lines.append("")
    lines += [f"- {n}" for n in report.importance_notes]
    if report.importance_notes:
        lines.append("")
    if report.notes:
        lines += ["## Notes", "", *[f"- {n}" for n in report.notes], ""]
    return "\n".join(lines)


def _markdown_tables(report: ReportData) -> list[str]:
    header = ["algorithm", *report.columns, "seeds", "trials"]
    lines = md_table(header, report.main_rows())
    lines += ["", protocol_text(report), ""]
    if report.variants_text():
        lines += [report.variants_text(), ""]
    conclusions = report.conclusions()
    if conclusions:
        lines += ["**What this table can conclude.** " + conclusions[0], ""]
        lines += [f"- {c}" for c in conclusions[1:]]
        lines += [""] if len(conclusions) > 1 else []
    lines += [f"## {score_name(report.score_column)} (%) at the reported round — {report.selection_label}", ""]
    vrows = [[a, *[report.val_cells[(a, c)].text() for c in report.columns]] for a in report.algorithms]
    lines += md_table(["algorithm", *report.columns], vrows)
    lines.append("")
    for a in report.algorithms:
        header, rows = report.detail_rows(a)
        lines += [f"### {a}: selected trials ({report.selection_label})", ""]
        lines += md_table(header, rows)
        lines.append("")
    return lines


# --------------------------------------------------------------------------- console


def print_report(report: ReportData, console: Console | None = None) -> None:
    """Print the report's tables with rich (per-trial tables fitted to the console's width)."""
    # lazy: keeps rich out of this module's import
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    style = "bold red" if report.oracle else None
    if not report.algorithms:
        console.print(f"{report.study_dir}: no trial has a round with accuracies yet")
    else:
        console.print(main_table(report, console, title_style=style))
        if report.variants_text():
            console.print(report.variants_text())
        for i, line in enumerate(report.conclusions()):
            console.print(f"[bold]{line}[/bold]" if i == 0 else f"  {line}")
        for a in report.algorithms:
            console.print(trials_table(report, a, console, title_style=style))
        if report.companion is not None and report.companion.algorithms:
            console.print(main_table(report.companion, console))
    for study, imp in report.importances.items():
        console.print(f"Optuna parameter importances (fANOVA) — study {study}")  # its own line: the name stays whole
        t = Table()
        t.add_column("parameter")
        t.add_column("importance", justify="right")
        for k, v in imp.items():
            t.add_row(k, f"{v:.3f}")
        console.print(t)
    for n in [*report.importance_notes, *report.notes]:
        console.print(f"[dim]{n}[/dim]")


def _fits(table: Table, console: Console) -> bool:
    """Whether ``table`` at its natural width (no cell wrapped) fits ``console``."""
    return console.measure(table, options=console.options.update_width(_WIDE_ENOUGH)).maximum <= console.width


def main_table(report: ReportData, console: Console, title_style: Any = None) -> Table:
    """The main table in the first form that fits ``console`` without breaking a cell: one row per
    algorithm (the form of ``report.md``); else one row per target domain and one column per
    algorithm; else one row per (algorithm, target domain)."""
    for build in (_wide_main_table, _transposed_main_table):
        table = build(report, title_style)
        if _fits(table, console):
            return table
    return _long_main_table(report, title_style)


def _main_table(report: ReportData, title_style: Any) -> Table:
    from rich.table import Table  # lazy: keeps rich out of this module's import

    return Table(title=report.title(), title_style=title_style, caption=protocol_text(report))


def _wide_main_table(report: ReportData, title_style: Any) -> Table:
    t = _main_table(report, title_style)
    for col in ("algorithm", *report.columns, "seeds", "trials"):
        t.add_column(col, justify="left" if col == "algorithm" else "right", no_wrap=True)
    for row in report.main_rows():
        t.add_row(*row)
    return t


def _transposed_main_table(report: ReportData, title_style: Any) -> Table:
    rows = report.main_rows()
    t = _main_table(report, title_style)
    t.add_column("target domain", no_wrap=True)
    for row in rows:
        t.add_column(row[0], justify="right", no_wrap=True)
    for j, name in enumerate([*report.columns, "seeds", "trials"], start=1):
        t.add_row(name, *[row[j] for row in rows], end_section=name == report.columns[-1])
    return t


def _long_main_table(report: ReportData, title_style: Any) -> Table:
    t = _main_table(report, title_style)
    t.add_column("algorithm", no_wrap=True)
    t.add_column("target domain", no_wrap=True)
    t.add_column("accuracy", justify="right", no_wrap=True)
    for row in report.main_rows():
        algorithm, cells, (seeds, trials) = row[0], row[1:-2], row[-2:]
        for i, (column, cell) in enumerate(zip(report.columns, cells)):
            t.add_row(algorithm if i == 0 else "", column, cell)
        t.add_row("", "seeds, trials", f"{seeds}, {trials}", end_section=True)
    return t


def trials_table(report: ReportData, algorithm: str, console: Console, title_style: Any = None) -> Table:
    """``algorithm``'s selected trials: the wide table when ``console`` is wide enough for it,
    else one row per trial with its result and hyperparameters as lines."""
    wide = _wide_trials_table(report, algorithm, title_style)
    return wide if _fits(wide, console) else _narrow_trials_table(report, algorithm, title_style)


def _trials_title(report: ReportData, algorithm: str) -> str:
    return f"{algorithm}: selected trials — {report.selection_label}"


def _wide_trials_table(report: ReportData, algorithm: str, title_style: Any) -> Table:
    from rich.table import Table  # lazy: keeps rich out of this module's import

    header, rows = report.detail_rows(algorithm)
    t = Table(title=_trials_title(report, algorithm), title_style=title_style)
    for col in header:
        t.add_column(col, overflow="fold", no_wrap=col == "trial")
    for row in rows:
        t.add_row(*row)
    return t


def _narrow_trials_table(report: ReportData, algorithm: str, title_style: Any) -> Table:
    from rich.table import Table  # lazy: keeps rich out of this module's import

    header, rows = report.detail_rows(algorithm)
    n_hps = len(report.varying_hparams(algorithm))
    fields, hps = header[:len(header) - n_hps], header[len(header) - n_hps:]
    t = Table(title=_trials_title(report, algorithm), title_style=title_style, show_lines=True)
    t.add_column("trial", no_wrap=True)
    t.add_column("result", overflow="fold")
    if hps:
        t.add_column("hyperparameters", overflow="fold")
    for row in rows:
        got = dict(zip(fields, row))
        result = [f"target domain {got.pop('target domain')}, seed {got.pop('seed')}",
                  f"round {got.pop('round')}, {got.pop('status')}"]
        trial = got.pop("trial")
        result += [f"{name} {value}" for name, value in got.items()]  # val_acc, the score, target_acc
        cells = [trial, "\n".join(result)]
        if hps:
            cells.append("\n".join(f"{name} = {value}" for name, value in zip(hps, row[len(fields):])))
        t.add_row(*cells)
    return t
