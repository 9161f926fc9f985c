"""The tabular benchmark's table and the backend that answers trials from it.

:func:`build_table` reads the round rows of fedtune studies (a grid run by
:func:`fedtune.tune.tabular.grid.run_grid`, or any study whose trials vary the named knobs) into one
table, a row per (algorithm, dataset, target domain, seed, configuration, round) with the
configuration as sorted JSON of the knobs' ``hp.*`` values, and the round's ``val_acc``,
``target_acc`` and ``num_participants``. :class:`TabularBenchmark` answers a trial from it: the
rows of the first ``rounds`` rounds the real run recorded.
"""

from __future__ import annotations

import json
import math
import os
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.parquet as pq

from fedtune.errors import ConfigError, DataError, clipped, shown
from fedtune.results import selection

__all__ = ["Cell", "TabularBenchmark", "build_table"]

POOL = "+"
COLUMNS = ("algorithm", "dataset", "target_domain", "seed", "config", "round", "val_acc", "target_acc",
           "num_participants")
KEYS = COLUMNS[:6]
"""The columns that say which run and round a row is: never null."""
PROTOCOLS = tuple(p for p in selection.PROTOCOLS if selection.SCORE[p] in COLUMNS)
"""The selection protocols the table can answer: those whose score column it holds (``val``)."""


class Cell(NamedTuple):
    """Where a configuration is scored: one dataset, held-out target domain and seed."""

    dataset: str
    target_domain: str
    seed: int


def config_key(config: Mapping[str, Any]) -> str:
    """A configuration's key in the table: sorted JSON of its knobs' values."""
    return json.dumps({k: config[k] for k in sorted(config)}, sort_keys=True)


def build_table(study_dirs: Sequence[str | os.PathLike[str]], knobs: Sequence[str]) -> pa.Table:
    """One row per round of every trial in ``study_dirs`` (fedtune study folders, or an output folder
    holding several), its configuration the trial's ``hp.<knob>`` values for the ``knobs`` its
    algorithm has. A (configuration, cell) run twice keeps the later file's rows (one run per key).
    Raises ValueError naming a knob no row has."""
    from fedtune.results.store import load  # lazy: keeps more of pyarrow out of this module's import

    rows: dict[tuple, dict[int, dict[str, Any]]] = defaultdict(dict)
    tables = [load(d) for d in study_dirs]
    missing = [k for k in knobs if not any(f"hp.{k}" in t.column_names for t in tables)]
    if missing:
        raise ValueError(f"no round row of {', '.join(map(str, study_dirs))} has hp.{missing[0]}; the grid's knobs "
                         f"are {list(knobs)}")
    for table in tables:
        for r in table.to_pylist():  # a knob its algorithm does not have (hp.* null) is not in its key
            key = (r["algorithm"], r["dataset"], r["target_domain"], int(r["seed"]),
                   config_key({k: r[f"hp.{k}"] for k in knobs if r.get(f"hp.{k}") is not None}))
            rows[key][int(r["round"])] = {"val_acc": r.get("val_acc"), "target_acc": r.get("target_acc"),
                                          "num_participants": r.get("num_participants")}
    out: dict[str, list[Any]] = {c: [] for c in COLUMNS}
    for key in sorted(rows):
        for rnd in sorted(rows[key]):
            for c, v in zip(COLUMNS[:5], key):
                out[c].append(v)
            out["round"].append(rnd)
            for c in ("val_acc", "target_acc", "num_participants"):
                out[c].append(rows[key][rnd][c])
    return pa.table(out)


class TabularBenchmark:
    """Answers trials from a table of :func:`build_table` (or its Parquet file)."""

    def __init__(self, table: pa.Table | str | os.PathLike[str]):
        """A table or its Parquet file; a file that cannot be read, a table without rows, without
        :data:`COLUMNS`, with a null key or a configuration that is not JSON: one DataError line."""
        source = "the tabular table" if isinstance(table, pa.Table) else f"tabular table '{table}'"
        if not isinstance(table, pa.Table):
            table = _read(table, source)
        _check(table, source)
        self._runs: dict[tuple[str, Cell, str], list[dict[str, Any]]] = defaultdict(list)
        for r in table.to_pylist():
            self._runs[(r["algorithm"], Cell(r["dataset"], r["target_domain"], int(r["seed"])), r["config"])].append(
                {"round": int(r["round"]), "val_acc": r["val_acc"], "target_acc": r["target_acc"],
                 "num_participants": int(r["num_participants"] or 0)})
        for rows in self._runs.values():
            rows.sort(key=lambda x: x["round"])
        self._configs: dict[str, set[str]] = defaultdict(set)
        self._cells: dict[str, set[Cell]] = defaultdict(set)
        for algorithm, cell, config in self._runs:
            self._configs[algorithm].add(config)
            self._cells[algorithm].add(cell)

    def algorithms(self) -> list[str]:
        return sorted(self._configs)

    def check(self, space: str, cell: Cell | None = None, protocol: str = "val") -> None:
        """ConfigError, one line, unless every algorithm of ``space`` has runs in the table, in
        ``cell`` when given, and ``protocol`` is one the table answers (:data:`PROTOCOLS`)."""
        for algorithm in self.parts(space):
            if algorithm not in self._configs:
                raise ConfigError(f"space {shown(space, 80)}: the table has no run of algorithm "
                                  f"{shown(algorithm, 60)}; allowed: {', '.join(self.algorithms())}, or several "
                                  f"joined by '{POOL}'")
        if cell is not None and cell not in self.cells(space):
            cells = ", ".join(str(tuple(c)) for c in self.cells(space)) or "none (no cell holds every algorithm)"
            raise ConfigError(f"cell {shown(tuple(cell), 80)}: the table has no run of {space} there; allowed: "
                              f"{clipped(cells, 200)}")
        if protocol not in PROTOCOLS:
            raise ConfigError(f"protocol {shown(protocol, 40)}: the table holds no "
                              f"{selection.SCORE.get(protocol, 'score')} column to choose by; allowed: "
                              f"{', '.join(PROTOCOLS)}")

    # A space name is one algorithm, or several joined by "+" (POOL): one study over their union,
    # the algorithm a categorical knob and each algorithm's knobs conditional on it ("fedprox.prox_mu").
    @staticmethod
    def parts(space: str) -> list[str]:
        return space.split(POOL)

    def cells(self, space: str) -> list[Cell]:
        cells = set.intersection(*(self._cells[a] for a in self.parts(space)))
        return sorted(cells)

    def configs(self, space: str) -> list[dict[str, Any]]:
        """The grid's configurations (knob -> value; a pooled space's name their ``algorithm``)."""
        parts = self.parts(space)
        if len(parts) > 1:
            return [{"algorithm": a, **c} for a in parts for c in self.configs(a)]
        return [json.loads(c) for c in sorted(self._configs[space])]

    def axes(self, space: str) -> dict[str, list[Any]]:
        """Each knob's values in the grid, sorted; a pooled space: ``algorithm``, then each
        algorithm's knobs as ``<algorithm>.<knob>``."""
        parts = self.parts(space)
        if len(parts) > 1:
            return {"algorithm": parts, **{f"{a}.{k}": v for a in parts for k, v in self.axes(a).items()}}
        values: dict[str, set[Any]] = defaultdict(set)
        for config in self.configs(space):
            for k, v in config.items():
                values[k].add(v)
        return {k: sorted(v) for k, v in sorted(values.items())}

    def rounds(self, space: str, cell: Cell) -> int:
        """The grid's full budget in rounds: the most any run of the cell recorded (a diverged run ends early)."""
        return max(len(self._runs[(a, cell, c)]) for a in self.parts(space) for c in self._configs[a])

    def answer(self, space: str, cell: Cell, config: Mapping[str, Any], rounds: int | None = None) -> list[dict[str, Any]]:
        """The first ``rounds`` round rows (all when None) the real run of ``config`` recorded.
        KeyError naming the configuration when the grid has no such run."""
        algorithm = space
        if len(self.parts(space)) > 1:
            algorithm, config = config["algorithm"], {k: v for k, v in config.items() if k != "algorithm"}
        key = (algorithm, cell, config_key(config))
        if key not in self._runs:
            raise KeyError(f"the table has no run of {algorithm} {config_key(config)} in {cell}")
        rows = self._runs[key]
        return rows if rounds is None else rows[:rounds]

    def cost(self, space: str, cell: Cell) -> int:
        """The grid's compute in the cell: every configuration's rounds x participants."""
        return sum(r["num_participants"] for a in self.parts(space) for c in self._configs[a]
                   for r in self._runs[(a, cell, c)])

    def grid_choice(self, space: str, cell: Cell, protocol: str = "val") -> tuple[dict[str, Any] | None, float]:
        """The grid's own selection: the configuration whose run scores highest under ``protocol``
        (:func:`fedtune.results.selection.choose_round`, the first in :meth:`configs` order on
        ties), and its reported target accuracy."""
        self.check(space, cell, protocol)
        best: tuple[float, dict[str, Any]] | None = None
        target = math.nan
        for config in self.configs(space):
            choice = selection.choose_round(self.answer(space, cell, config), protocol)
            if math.isfinite(choice.score) and (best is None or choice.score > best[0]):
                best, target = (choice.score, config), choice.target_acc
        return (best[1] if best else None), target


def _read(path: str | os.PathLike[str], source: str) -> pa.Table:
    """The Parquet file of a table; one DataError line when it is missing or unreadable."""
    try:
        return pq.read_table(path)
    except FileNotFoundError:
        raise DataError(f"{source} does not exist; allowed: a Parquet file of build_table "
                        "(pyarrow.parquet.write_table(build_table(...), path))") from None
    except (pa.ArrowException, OSError) as exc:
        first = (str(exc).splitlines() or [""])[0]
        raise DataError(f"{source} is unreadable ({type(exc).__name__}: {shown(first, 120)}); allowed: a Parquet "
                        "file of build_table: build it again from the grid's studies") from None


def _check(table: pa.Table, source: str) -> None:
    """A table :class:`TabularBenchmark` can answer from: :data:`COLUMNS`, rows, no null key, each
    configuration a JSON object (one DataError line naming what is wrong)."""
    made = f"a table of build_table (columns {', '.join(COLUMNS)})"
    missing = [c for c in COLUMNS if c not in table.column_names]
    if missing:
        raise DataError(f"{source} has no column {', '.join(missing)}; allowed: {made}")
    if table.num_rows == 0:
        raise DataError(f"{source} has no rows; allowed: {made} from studies with round rows")
    for name in KEYS:
        column = table.column(name)
        if column.null_count:
            raise DataError(f"{source}: column {name} has {column.null_count} null value(s); allowed: {made}")
        if name in ("seed", "round") and not pa.types.is_integer(column.type):
            raise DataError(f"{source}: column {name} holds {column.type}, not integers; allowed: {made}")
    for config in set(table.column("config").to_pylist()):
        try:
            ok = isinstance(json.loads(config), dict)
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise DataError(f"{source}: configuration {shown(config, 80)} is not a JSON object of knob values; "
                            f"allowed: {made}")
