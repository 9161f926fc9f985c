"""Python rows to Arrow tables and back to disk: type inference, schema conforming, Parquet I/O.

Core columns are cast to their declared types (:mod:`fedtune.results.schema`); extra columns
get a type inferred from their values (:func:`rows_to_table`). Tables whose schemas differ
are concatenated with :func:`concat` (missing columns null, int/float mixes float64, clashing
types string). One Parquet file is written atomically (:func:`write_parquet`, through
:func:`fedtune.results.atomic.atomic_write_bytes`) and read through one open handle
(:func:`read_parquet`); an unreadable file is a :class:`CorruptResultsError` naming it, and a
readable one that is not a fedtune rounds/trials file (:data:`~fedtune.results.schema.REQUIRED_COLUMNS`)
a :class:`ForeignResultsError` (:func:`read_results`, :func:`check_table`).

>>> t = rows_to_table([{"round": 0, "hp.opt": "sgd"}, {"round": 1, "hp.opt": [1, 2]}])
>>> t.column("hp.opt").to_pylist()
['sgd', '[1, 2]']
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from fedtune.errors import DataError
from fedtune.results.atomic import atomic_write_bytes
from fedtune.results.schema import JSON_PREFIXES, REQUIRED_COLUMNS, ROUND_CORE_SCHEMA, TABLES
from fedtune.results.study_dir import ROUNDS_DIR, TRIALS_FILE

__all__ = ["CorruptResultsError", "ForeignResultsError", "rows_to_table", "conform", "concat", "read_parquet",
           "read_results", "check_table", "write_parquet", "is_readable", "to_json", "to_timestamp", "is_number"]

_ARROW_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError)


class CorruptResultsError(ValueError):
    """A results file cannot be read (truncated or not Parquet); the message names the file and
    what to do. ``path`` is the file."""

    def __init__(self, path: Path, cause: BaseException):
        self.path = Path(path)
        if self.path.parent.name == ROUNDS_DIR:
            what = ("delete it (or rename it to *.corrupt); `fedtune sweep --resume` then re-runs that trial "
                    "(a run is deterministic given its configuration, so it gives the same rows), or re-run "
                    "the `fedtune run` that wrote it")
        else:
            what = ("delete it (or rename it to *.corrupt); `fedtune sweep --resume` rebuilds the trial rows of "
                    "finished searches' trials it re-runs, and `fedtune run` re-writes its own row")
        super().__init__(f"results file '{self.path}' is unreadable ({type(cause).__name__}: "
                         f"{str(cause).splitlines()[0] if str(cause) else 'truncated or not Parquet'}); {what}")


class ForeignResultsError(DataError):
    """A readable Parquet file that is not a fedtune ``rounds`` or ``trials`` file (required columns
    missing or of another type): refused by every reader, never quarantined as corrupt nor
    overwritten. The message names the file, what is wrong and what such a file holds; ``path``
    is the file, ``table`` the kind it was read as."""

    def __init__(self, path: Path, table: str, problems: list[str]):
        self.path, self.table = Path(path), table
        where = (f"<study>/{ROUNDS_DIR}/<trial_id>.parquet" if table == "rounds" else f"<study>/{TRIALS_FILE}")
        need = ", ".join(f"{n} ({TABLES[table].field(n).type})" for n in REQUIRED_COLUMNS[table])
        super().__init__(f"'{self.path}' is not a fedtune {table} file: {'; '.join(problems)}; a {table} file "
                         f"({where}, written by fedtune run or fedtune sweep) has the columns {need}; move this "
                         "file out of the study folder")


# --------------------------------------------------------------------------- values


def _json_default(o: Any) -> Any:
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, (_dt.datetime, _dt.date)):
        return o.isoformat()
    if isinstance(o, (set, frozenset)):
        return sorted(o, key=repr)
    return str(o)


def to_json(v: Any) -> str:
    """``v`` as sorted JSON (NumPy values, dates and sets included; anything else as ``str``)."""
    return json.dumps(v, sort_keys=True, default=_json_default)


def _kind(v: Any) -> str | None:
    if v is None:
        return None
    if isinstance(v, (bool, np.bool_)):
        return "bool"
    if isinstance(v, (int, np.integer)):
        return "int"
    if isinstance(v, (float, np.floating)):
        return "float"
    if isinstance(v, str):
        return "str"
    if isinstance(v, (list, tuple, np.ndarray)):
        return "list"
    if isinstance(v, Mapping):
        return "dict"
    return "other"


def is_number(v: Any) -> bool:
    """True for a bool, int or float (Python or NumPy)."""
    return _kind(v) in ("bool", "int", "float")


def _infer_column(name: str, values: list[Any]) -> pa.Array:
    """Build an Arrow array for an extra column, inferring its type from the values.

    bool -> bool; int (+bool) -> int64; any float among numbers -> float64; lists of numbers
    -> list<float64> (except under ``hp.``); anything else, or str mixed with other kinds ->
    string (non-strings JSON-encoded); all-null -> null type.
    """
    kinds = {_kind(v) for v in values} - {None}
    if not kinds:
        return pa.nulls(len(values))
    if kinds == {"bool"}:
        return pa.array([None if v is None else bool(v) for v in values], pa.bool_())
    if kinds <= {"bool", "int"}:
        try:
            return pa.array([None if v is None else int(v) for v in values], pa.int64())
        except (OverflowError, pa.ArrowInvalid):
            kinds = {"float"}  # too big for int64: fall through to float64
    if kinds <= {"bool", "int", "float"}:
        return pa.array([None if v is None else float(v) for v in values], pa.float64())
    if (
        kinds == {"list"}
        and not name.startswith(JSON_PREFIXES)
        and all(x is None or is_number(x) for v in values if v is not None for x in v)
    ):
        return pa.array(
            [None if v is None else [None if x is None else float(x) for x in v] for v in values],
            pa.list_(pa.float64()),
        )
    return pa.array([None if v is None else v if isinstance(v, str) else to_json(v) for v in values], pa.string())


def to_timestamp(v: Any, column: str = "timestamp") -> _dt.datetime | None:
    """datetime (naive = UTC), epoch seconds or ISO-8601 string -> aware UTC datetime.

    >>> to_timestamp(0.0), to_timestamp("2024-05-01T12:00:00")
    (datetime.datetime(1970, 1, 1, 0, 0, tzinfo=datetime.timezone.utc), datetime.datetime(2024, 5, 1, 12, 0, tzinfo=datetime.timezone.utc))
    """
    if v is None:
        return None
    if isinstance(v, np.datetime64):
        v = v.astype("datetime64[us]").item()
    if isinstance(v, str):
        try:
            v = _dt.datetime.fromisoformat(v)
        except ValueError as e:
            raise ValueError(f"column {column!r}: cannot parse timestamp {v!r}") from e
    if isinstance(v, _dt.datetime):
        return v.replace(tzinfo=_dt.timezone.utc) if v.tzinfo is None else v.astimezone(_dt.timezone.utc)
    if _kind(v) in ("int", "float"):
        return _dt.datetime.fromtimestamp(float(v), tz=_dt.timezone.utc)
    raise TypeError(f"column {column!r}: cannot convert {type(v).__name__} to a timestamp")


def _column_names(rows: Sequence[Mapping[str, Any]]) -> set[str]:
    """Every key of ``rows`` (a column name: a string, else TypeError)."""
    names: set[str] = set()
    for row in rows:
        for k in row:
            if not isinstance(k, str):
                raise TypeError(f"column names must be strings, got {k!r}")
        names.update(row)
    return names


def _core_value(v: Any, typ: pa.DataType, column: str) -> Any:
    if v is None:
        return None
    if pa.types.is_string(typ):
        return v if isinstance(v, str) else str(v.item() if isinstance(v, np.generic) else v)
    if pa.types.is_int64(typ):
        k = _kind(v)
        if k in ("bool", "int"):
            return int(v)
        if k == "float":
            if math.isnan(v):
                return None
            if float(v).is_integer():
                return int(v)
        raise ValueError(f"column {column!r} is int64 but got {v!r}")
    if pa.types.is_float64(typ):
        if is_number(v):
            return float(v)
        raise TypeError(f"column {column!r} is float64 but got {type(v).__name__} {v!r}")
    if pa.types.is_timestamp(typ):
        return to_timestamp(v, column)
    return v


def rows_to_table(rows: Sequence[Mapping[str, Any]], core: pa.Schema = ROUND_CORE_SCHEMA) -> pa.Table:
    """Turn row dicts into a table: the ``core`` columns (cast to their declared types, missing
    ones null) followed by the extra columns sorted by name with inferred types.

    Rows may have differing key sets; absent keys are null. NaN/Inf floats are kept.

    >>> t = rows_to_table([{"round": 0, "hp.lr": 1, "diag.g": [1, 2.5]},
    ...                    {"round": 1.0, "hp.lr": 0.5, "test_acc": float("nan")}])
    >>> t.schema.field("round").type, t.schema.field("hp.lr").type, t.schema.field("diag.g").type
    (DataType(int64), DataType(double), ListType(list<item: double>))
    >>> t.column_names[len(ROUND_CORE_SCHEMA):]
    ['diag.g', 'hp.lr', 'test_acc']
    """
    names = _column_names(rows)
    arrays: list[pa.Array] = []
    fields: list[pa.Field] = []
    for f in core:
        values = [_core_value(r.get(f.name), f.type, f.name) for r in rows]
        arrays.append(pa.array(values, f.type))
        fields.append(f)
    for name in sorted(names - set(core.names)):
        arr = _infer_column(name, [r.get(name) for r in rows])
        arrays.append(arr)
        fields.append(pa.field(name, arr.type))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


# --------------------------------------------------------------------------- tables


def _to_string_array(arr: pa.ChunkedArray | pa.Array) -> pa.Array:
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if pa.types.is_string(arr.type):
        return arr
    if pa.types.is_null(arr.type):
        return pa.nulls(len(arr), pa.string())
    if not pa.types.is_nested(arr.type):
        try:
            return arr.cast(pa.string())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass
    return pa.array([None if v is None else v if isinstance(v, str) else to_json(v) for v in arr.to_pylist()],
                    pa.string())


def conform(table: pa.Table, core: pa.Schema) -> pa.Table:
    """Core columns first (added as nulls if missing, cast when possible), extras sorted."""
    arrays, fields = [], []
    for f in core:
        if f.name in table.column_names:
            col = table.column(f.name)
            if col.type != f.type:
                try:
                    col = col.cast(f.type)
                except _ARROW_ERRORS:
                    pass
            arrays.append(col)
            fields.append(pa.field(f.name, col.type))
        else:
            arrays.append(pa.nulls(table.num_rows, f.type))
            fields.append(f)
    for name in sorted(set(table.column_names) - set(core.names)):
        col = table.column(name)
        arrays.append(col)
        fields.append(pa.field(name, col.type))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def concat(tables: Sequence[pa.Table], core: pa.Schema) -> pa.Table:
    """Concatenate tables with differing schemas.

    Missing columns become null, int/float mixes become float64 (Arrow's permissive
    promotion); columns whose types cannot be unified (e.g. int vs string) become strings.

    >>> a = rows_to_table([{"hp.k": 3}]); b = rows_to_table([{"hp.k": "auto"}])
    >>> concat([a, b], ROUND_CORE_SCHEMA).column("hp.k").to_pylist()
    ['3', 'auto']
    """
    tables = [conform(t, core) for t in tables]
    if not tables:
        return core.empty_table()
    try:
        out = pa.concat_tables(tables, promote_options="permissive")
    except _ARROW_ERRORS:
        types: dict[str, list[pa.DataType]] = {}
        for t in tables:
            for f in t.schema:
                types.setdefault(f.name, []).append(f.type)
        bad = set()
        for name, ts in types.items():
            try:
                pa.unify_schemas([pa.schema([pa.field(name, t)]) for t in ts], promote_options="permissive")
            except _ARROW_ERRORS:
                bad.add(name)
        fixed = []
        for t in tables:
            for name in bad & set(t.column_names):
                i = t.column_names.index(name)
                t = t.set_column(i, pa.field(name, pa.string()), _to_string_array(t.column(i)))
            fixed.append(t)
        out = pa.concat_tables(fixed, promote_options="permissive")
    return conform(out, core)


# --------------------------------------------------------------------------- files


# How fedtune writes its Parquet files: no dictionary pages, no column statistics. The file reads back
# as the same table, schema and values (tests/results/test_parquet_write.py); on a rounds file of a
# few rows they only cost time (a write of 40 columns: 0.35 ms against 0.46 ms with both), and with
# Snappy the file stays small (12 kB at 200 rows, 27 kB at 1,000: 14 and 18 kB with both).
_PARQUET_OPTIONS = {"use_dictionary": False, "write_statistics": False}


def write_parquet(table: pa.Table, path: str | os.PathLike[str]) -> Path:
    """Atomically (re)write ``path`` with ``table`` (its folder is created); returns ``path``. The file
    is made in memory and written through one descriptor (:func:`~fedtune.results.atomic.atomic_write_bytes`)."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, **_PARQUET_OPTIONS)
    return atomic_write_bytes(path, sink.getvalue())


def _read_once(path: Path, columns: list[str] | None = None) -> pa.Table:
    # Open the file once and read through that handle: opening the path twice (as
    # pq.read_table(str) may) can mix two versions of a file being replaced concurrently.
    with pa.OSFile(str(path), "rb") as f:
        return pq.ParquetFile(f).read(columns=columns)


def read_parquet(path: str | os.PathLike[str], columns: list[str] | None = None) -> pa.Table:
    """Read one Parquet file; an unreadable one (truncated, not Parquet) is a
    :class:`CorruptResultsError` naming it and what to do, one this user may not read a
    :class:`~fedtune.errors.DataError` naming it (a missing file stays FileNotFoundError)."""
    try:
        return _read_once(Path(path), columns)
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as exc:
        if isinstance(exc, PermissionError):
            raise DataError(f"results file '{path}' cannot be read: permission denied; allowed: a file this user "
                            "can read (see its owner and mode)") from None
        if isinstance(exc, (FileNotFoundError, IsADirectoryError)):
            raise
        raise CorruptResultsError(Path(path), exc) from None


def _fits(have: pa.DataType, want: pa.DataType) -> bool:
    if pa.types.is_null(have) or have == want:
        return True
    if pa.types.is_dictionary(have):
        have = have.value_type
    if pa.types.is_string(want):
        return pa.types.is_string(have) or pa.types.is_large_string(have) or str(have) == "string_view"
    if pa.types.is_int64(want):
        return pa.types.is_integer(have)
    return have == want


def check_table(table: pa.Table | pa.Schema, kind: str, path: str | os.PathLike[str]) -> None:
    """Raise :class:`ForeignResultsError` naming ``path`` when ``table`` (or its schema) lacks a column
    of :data:`~fedtune.results.schema.REQUIRED_COLUMNS` ``[kind]`` or has one of another type."""
    schema = table if isinstance(table, pa.Schema) else table.schema
    core = TABLES[kind]
    missing = [n for n in REQUIRED_COLUMNS[kind] if n not in schema.names]
    problems = [f"missing columns {', '.join(repr(n) for n in missing)}"] if missing else []
    for n in REQUIRED_COLUMNS[kind]:
        if n in schema.names and not _fits(schema.field(n).type, core.field(n).type):
            problems.append(f"column '{n}' is {schema.field(n).type}; allowed: {core.field(n).type}")
    if problems:
        raise ForeignResultsError(Path(path), kind, problems)


def read_results(path: str | os.PathLike[str], kind: str) -> pa.Table:
    """:func:`read_parquet` of a ``rounds`` or ``trials`` file (``kind``), checked by
    :func:`check_table`: a Parquet file of anything else is a :class:`ForeignResultsError`."""
    table = read_parquet(path)
    check_table(table, kind, path)
    return table


def is_readable(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` reads as a Parquet file."""
    try:
        _read_once(Path(path))
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError):
        return False
    return True
