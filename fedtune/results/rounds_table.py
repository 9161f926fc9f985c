"""A trial's rounds table built one round at a time: :class:`RoundsTable`.

A run writes its rounds file whole after every round (atomically: a reader never sees half a
file). Converting every row to Arrow again each round made that write grow with the rounds
(16 µs a row: 3.3 ms a round at round 200, 16 ms at round 1,000, on the driver's path between
two rounds). :class:`RoundsTable` converts each row once and keeps the columns it built, so a
round costs one row's conversion and the Parquet write. Its table equals
:func:`~fedtune.results.arrow.rows_to_table` of all the rows, column order and types included
(``tests/results/test_rounds_table.py`` checks it on random rows): a column's type is inferred from the
kinds of its values, and when a new value's kind changes it (an int column meeting a float, a
column of nulls meeting its first value) the column is converted again from all its values.

Written by hand: Arrow has no append to a table with per-column type inference.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import pyarrow as pa

from fedtune.results.arrow import _column_names, _core_value, _infer_column
from fedtune.results.schema import ROUND_CORE_SCHEMA

MAX_CHUNKS = 16
"""Chunks a column may hold before they are joined into one (a table of many one-row chunks
writes and reads slower)."""


class RoundsTable:
    """Rows appended in order (:meth:`extend`), read back as one table (:meth:`table`).

    >>> t = RoundsTable()
    >>> t.extend([{"round": 1, "hp.lr": 1}]); t.extend([{"round": 2, "hp.lr": 0.5}])
    >>> t.table().column("hp.lr").type, t.num_rows
    (DataType(double), 2)
    """

    def __init__(self, core: pa.Schema = ROUND_CORE_SCHEMA):
        self.core = core
        self.num_rows = 0
        self._values: dict[str, list[Any]] = {}  # an extra column's Python values, every row
        self._chunks: dict[str, list[pa.Array]] = {f.name: [] for f in core}
        self._types: dict[str, pa.DataType] = {f.name: f.type for f in core}
        self._schema: pa.Schema | None = None  # the table's, until a column comes or changes type

    def extend(self, rows: Sequence[Mapping[str, Any]]) -> None:
        if not rows:
            return
        names = _column_names(rows)
        core = set(self.core.names)
        built: dict[str, pa.Array] = {}
        for f in self.core:  # converted first: a bad value raises before anything is kept
            built[f.name] = pa.array([_core_value(r.get(f.name), f.type, f.name) for r in rows], f.type)
        for name, arr in built.items():
            self._add(name, arr)
        for name in sorted((names | set(self._values)) - core):
            values = [r.get(name) for r in rows]
            if name not in self._values:  # a new column: null in the rows before
                self._values[name] = [None] * self.num_rows
            self._values[name].extend(values)
            part = _infer_column(name, values)
            have = self._types.get(name)
            if have is not None and part.type == have:
                self._add(name, part)
            elif have is not None and not pa.types.is_null(have) and pa.types.is_null(part.type):
                self._add(name, pa.nulls(len(values), have))  # nulls do not change a column's kinds
            else:  # a new column, or one whose type the new values change: all its values again
                whole = _infer_column(name, self._values[name])
                self._chunks[name], self._types[name] = [whole], whole.type
                self._schema = None
        self.num_rows += len(rows)

    def _add(self, name: str, arr: pa.Array) -> None:
        # one array per column: Parquet writes a column of many one-row chunks slower than the copy
        # (1.4 ms a write at any length against 1.7-2.4 ms with up to 16 chunks, 40 columns)
        have = self._chunks[name]
        self._chunks[name] = [pa.concat_arrays(have + [arr])] if have else [arr]

    def table(self) -> pa.Table:
        """The rows so far: the core columns in their order, then the extra columns by name."""
        if self._schema is None:
            core = set(self.core.names)
            names = list(self.core.names) + sorted(self._values)
            self._schema = pa.schema([self.core.field(n) if n in core else pa.field(n, self._types[n]) for n in names])
        columns = [c[0] if len(c) == 1 else pa.chunked_array(c, f.type)
                   for c, f in ((self._chunks[f.name], f) for f in self._schema)]
        return pa.Table.from_arrays(columns, schema=self._schema)


__all__ = ["RoundsTable"]
