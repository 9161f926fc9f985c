"""Hyperparameter studies on Ray Tune: search spaces, trainable, results callback, sweeps, reports.

``spaces`` (search-space YAML) · ``trainable`` (one run = one Tune trial) · ``callback`` (the Arrow
store's single writer) · ``plan`` (sweep options and searches, checked before Ray starts) ·
``optuna_search`` (the Optuna searcher and storage) · ``progress`` (the live view) · ``sweep`` (runs
a study; ``resume``, ``tune_env``, ``active`` help it) · ``report`` and its helpers (tables,
report.md, plots).
"""
