"""A tabular benchmark of tuning strategies, built from fedtune's own records (issue 31 item 4).

As FedHPO-Bench's tabular mode: the full grid of a search space is run once (every configuration,
every target domain, several seeds; :mod:`fedtune.tune.tabular.grid`), its round rows become one
Parquet table (:func:`~fedtune.tune.tabular.table.build_table`), and a tuning strategy is then
evaluated against the table in seconds: :class:`~fedtune.tune.tabular.table.TabularBenchmark`
answers a trial (a configuration and a number of rounds) with the rows the real run recorded, and
:mod:`fedtune.tune.tabular.strategies` drives fedtune's own samplers and Optuna's pruners over it,
charging every round a strategy runs (rounds x participants) and reporting the regret of the
configuration it would select under honest selection against the grid's own selection.

``python benchmarks/tabular_hpo.py`` builds the grid and prints every strategy's curve.
"""

from fedtune.tune.tabular.strategies import STRATEGIES, Strategy, simulate
from fedtune.tune.tabular.table import TabularBenchmark, build_table

__all__ = ["STRATEGIES", "Strategy", "TabularBenchmark", "build_table", "simulate"]
