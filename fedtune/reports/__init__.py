"""``fedtune report``: what a study found, as tables, ``report.md`` and PNG plots.

``report`` (:func:`~fedtune.reports.report.make_report` reads a study directory and builds its
:class:`~fedtune.reports.report.Report`) · ``stats`` (per-trial summaries, the selected trials,
table cells and paired gaps) · ``model`` (what a report holds and what its tables say) ·
``render`` (``report.md`` and the console tables) · ``plots`` (the PNGs) · ``importances``
(the study's Optuna storage as the report reads it, and Optuna's parameter importances).

The selection protocol itself is :mod:`fedtune.results.selection`'s; this package reads a
study's files (:mod:`fedtune.results`, the Optuna storage URL included:
:mod:`fedtune.results.optuna_url`) and never imports the sweep layer, :mod:`fedtune.tune`.
"""
