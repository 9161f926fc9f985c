"""The results store: every round of every trial as one row of an Arrow/Parquet table.

Layout under an output directory ``OUTPUT``::

    OUTPUT/<study>/rounds/<trial_id>.parquet   all round rows of one trial
    OUTPUT/<study>/trials.parquet              one summary row per trial
    OUTPUT/<study>/.trials.lock                flock guarding trials.parquet

Every file is written atomically: the table goes to a hidden temporary file in the same
directory (``.<name>.<random>.tmp``) which then replaces the target with :func:`os.replace`.
A process that dies mid-write therefore leaves the previous complete file in place (and at
worst a stray hidden ``.tmp`` file, which :func:`load` ignores). A trial's round file is
rewritten with *all* its rows each time new rows arrive, so re-running a trial with the same
``trial_id`` replaces its rows rather than duplicating them. ``trials.parquet`` is upserted
by ``trial_id`` under an exclusive ``fcntl.flock`` so several processes may write trials of
one study at once.

Round rows hold the core columns of :data:`ROUND_CORE_SCHEMA` plus open-ended extra columns
(``val_acc.<domain>``, ``target_acc.<domain>``, ``test_acc``, ``hp.<name>``, ``diag.<name>``,
...), whose types are inferred per file (see :func:`rows_to_table`).

>>> import tempfile
>>> store = ResultsStore(tempfile.mkdtemp(), "demo")
>>> rows = [{"trial_id": "t0", "round": r, "val_acc": 0.5 + r / 10, "hp.lr": 0.1}
...         for r in range(3)]
>>> _ = store.write_rounds("t0", rows)
>>> _ = store.write_trial(summarize_trial(rows, config={"trial_id": "t0"}, status="ok",
...                                       error=None, started_at=None, ended_at=None))
>>> load(store.study_dir).num_rows, load(store.study_dir, "trials").num_rows
(3, 1)
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import json
import math
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

__all__ = [
    "ROUND_CORE_SCHEMA",
    "TRIAL_CORE_SCHEMA",
    "ROUND_COLUMN_DOCS",
    "TRIAL_COLUMN_DOCS",
    "TABLES",
    "ResultsStore",
    "summarize_trial",
    "rows_to_table",
    "load",
    "schema_markdown",
]

TIMESTAMP = pa.timestamp("us", tz="UTC")

# (name, type, meaning). Every column is nullable: a column missing from a row is null.
_ROUND_COLUMNS: list[tuple[str, pa.DataType, str]] = [
    ("study", pa.string(), "Study name (directory under the output dir)."),
    ("trial_id", pa.string(), "Trial identifier, unique within the study."),
    ("algorithm", pa.string(), "Federated algorithm, e.g. `fedavg`."),
    ("client_method", pa.string(), "Local (client-side) training method."),
    ("server_rule", pa.string(), "Server aggregation rule."),
    ("dataset", pa.string(), "Dataset name."),
    ("setting", pa.string(), "Experimental setting, e.g. `fdg` or `fl`."),
    ("target_domain", pa.string(), "Held-out target domain; null when there is none."),
    ("seed", pa.int64(), "Random seed of the trial."),
    ("round", pa.int64(), "Communication round index."),
    ("train_loss", pa.float64(), "Mean client training loss of the round (NaN if diverged)."),
    ("val_acc", pa.float64(), "Validation accuracy on the *source* clients' validation splits (selection protocol `val`)."),
    ("target_acc", pa.float64(), "The reported accuracy: on the held-out target domain minus its oracle slice (and, in fda, the target client's labelled sample; in ufdg, the probe split); in fl, on all clients' test splits. Never used to choose anything."),
    ("target_val_acc", pa.float64(), "fda only: accuracy on the target client's validation split (`val_fraction` of its labelled sample; selection protocol `target-val`); never part of `val_acc`."),
    ("oracle_acc", pa.float64(), "Accuracy on the oracle slice (`oracle_fraction` of the target domain, stratified, fixed by `data_seed`; never part of `target_acc`), for selection protocol `oracle`; null in fl."),
    ("wall_s", pa.float64(), "Wall-clock seconds of the round."),
    ("client_s", pa.float64(), "Wall seconds of the round's fit phase (broadcast, client training on all actors, updates back)."),
    ("server_s", pa.float64(), "Seconds spent in server aggregation during the round."),
    ("status", pa.string(), "Round status: `ok`, or `diverged` on the round whose loss or weights turned NaN/Inf."),
    ("num_participants", pa.int64(), "Clients that took part in the round."),
    ("skipped_clients", pa.int64(), "Sampled clients that were skipped (failed, straggled)."),
    ("bytes_moved", pa.int64(), "Float32 weight bytes moved through the object store: one broadcast read by each actor plus one state per participant."),
]

_TRIAL_COLUMNS: list[tuple[str, pa.DataType, str]] = [
    *_ROUND_COLUMNS[:9],  # study .. seed
    ("status", pa.string(), "Trial status: `completed`, `diverged` (NaN/Inf loss or weights), `failed` (an error; see `error`), `interrupted` (Ctrl-C or SIGTERM); sweeps add `pruned`."),
    ("rounds_done", pa.int64(), "Number of rounds recorded."),
    ("final_val_acc", pa.float64(), "`val_acc` of the last round that has one."),
    ("final_target_acc", pa.float64(), "`target_acc` of the last round that has one."),
    ("best_val_acc", pa.float64(), "Highest finite `val_acc` over the rounds (the trial's score under selection `val`)."),
    ("best_round", pa.int64(), "Round with the highest `val_acc` (earliest on ties): the reported round under `val`."),
    (
        "target_acc_at_best_val",
        pa.float64(),
        "`target_acc` at `best_round`: honest, validation-selected target accuracy.",
    ),
    ("best_target_val_acc", pa.float64(), "fda: highest finite `target_val_acc` (the trial's score under selection `target-val`)."),
    ("target_val_round", pa.int64(), "fda: round with the highest `target_val_acc` (earliest on ties): the reported round under `target-val`."),
    ("target_acc_at_best_target_val", pa.float64(), "fda: `target_acc` at `target_val_round`."),
    ("final_oracle_acc", pa.float64(), "`oracle_acc` of the last evaluated round (the trial's score under selection `oracle`, which reports `final_target_acc`); null for a diverged trial."),
    (
        "total_wall_s",
        pa.float64(),
        "`ended_at - started_at` in seconds, else the sum of the rounds' `wall_s`.",
    ),
    ("started_at", TIMESTAMP, "When the trial started (UTC)."),
    ("ended_at", TIMESTAMP, "When the trial ended (UTC)."),
    ("error", pa.string(), "Error message of a failed trial; null otherwise."),
    ("config_json", pa.string(), "The trial's full configuration as sorted JSON."),
]

ROUND_CORE_SCHEMA: pa.Schema = pa.schema([pa.field(n, t) for n, t, _ in _ROUND_COLUMNS])
"""Required columns of a round row, in order (all nullable)."""

TRIAL_CORE_SCHEMA: pa.Schema = pa.schema([pa.field(n, t) for n, t, _ in _TRIAL_COLUMNS])
"""Required columns of a ``trials.parquet`` row, in order (all nullable)."""

ROUND_COLUMN_DOCS: dict[str, str] = {n: d for n, _, d in _ROUND_COLUMNS}
TRIAL_COLUMN_DOCS: dict[str, str] = {n: d for n, _, d in _TRIAL_COLUMNS}

TABLES: dict[str, pa.Schema] = {"rounds": ROUND_CORE_SCHEMA, "trials": TRIAL_CORE_SCHEMA}
"""Table names accepted by :func:`load`, with their core schemas."""

TRIALS_FILE = "trials.parquet"
LOCK_FILE = ".trials.lock"
ROUNDS_DIR = "rounds"

# Extra-column prefixes whose list/dict values are always stored as JSON strings.
_JSON_PREFIXES = ("hp.",)


# --------------------------------------------------------------------------- names


NAME_RULE = "a non-empty folder name without '/', '\\' or NUL that does not start with '.'"
"""What a study name or trial id may be (one path component, not hidden)."""


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


def _check_name(value: object, field: str) -> str:
    """Return ``value`` if it is usable as a single path component, else raise ConfigError (a
    ValueError) naming :data:`NAME_RULE`."""
    from fedtune.config import ConfigError

    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"invalid {field} {value!r}: allowed: {NAME_RULE}")
    bad = [s for s in ("/", "\\", os.sep, os.altsep, "\0") if s and s in value]
    if bad:
        raise ConfigError(
            f"invalid {field} {value!r}: {field} must not contain path separators or NUL; allowed: {NAME_RULE}"
        )
    if value.startswith("."):
        raise ConfigError(f"invalid {field} {value!r}: {field} must not start with '.'; allowed: {NAME_RULE}")
    return value


def check_output_dir(output: str | os.PathLike[str], option: str = "field 'output'") -> Path:
    """Refuse an output directory that is, or lies under, an existing non-directory (before anything
    runs, instead of failing when the first result is written). Returns ``Path(output)``."""
    from fedtune.config import ConfigError

    path = Path(output)
    for p in (path, *path.parents):
        if p.exists() and not p.is_dir():
            where = "is" if p == path else f"lies under '{p}', which is"
            raise ConfigError(f"{option}: '{output}' {where} a file, not a directory; allowed: a directory "
                              "(existing, or one that can be created)")
    return path


# --------------------------------------------------------------------------- values -> Arrow


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


def _to_json(v: Any) -> str:
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


def _is_number(v: Any) -> bool:
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
        and not name.startswith(_JSON_PREFIXES)
        and all(x is None or _is_number(x) for v in values if v is not None for x in v)
    ):
        return pa.array(
            [None if v is None else [None if x is None else float(x) for x in v] for v in values],
            pa.list_(pa.float64()),
        )
    return pa.array(
        [None if v is None else v if isinstance(v, str) else _to_json(v) for v in values],
        pa.string(),
    )


def _to_timestamp(v: Any, column: str = "timestamp") -> _dt.datetime | None:
    """datetime (naive = UTC), epoch seconds or ISO-8601 string -> aware UTC datetime."""
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
        return v.replace(tzinfo=_dt.timezone.utc) if v.tzinfo is None else v.astimezone(
            _dt.timezone.utc
        )
    if _kind(v) in ("int", "float"):
        return _dt.datetime.fromtimestamp(float(v), tz=_dt.timezone.utc)
    raise TypeError(f"column {column!r}: cannot convert {type(v).__name__} to a timestamp")


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
        if _is_number(v):
            return float(v)
        raise TypeError(f"column {column!r} is float64 but got {type(v).__name__} {v!r}")
    if pa.types.is_timestamp(typ):
        return _to_timestamp(v, column)
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
    names: set[str] = set()
    for row in rows:
        for k in row:
            if not isinstance(k, str):
                raise TypeError(f"column names must be strings, got {k!r}")
        names.update(row)
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
    return pa.array(
        [None if v is None else v if isinstance(v, str) else _to_json(v) for v in arr.to_pylist()],
        pa.string(),
    )


def _conform(table: pa.Table, core: pa.Schema) -> pa.Table:
    """Core columns first (added as nulls if missing, cast when possible), extras sorted."""
    arrays, fields = [], []
    for f in core:
        if f.name in table.column_names:
            col = table.column(f.name)
            if col.type != f.type:
                try:
                    col = col.cast(f.type)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
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


def _concat(tables: Sequence[pa.Table], core: pa.Schema) -> pa.Table:
    """Concatenate tables with differing schemas.

    Missing columns become null, int/float mixes become float64 (Arrow's permissive
    promotion); columns whose types cannot be unified (e.g. int vs string) become strings.
    """
    tables = [_conform(t, core) for t in tables]
    if not tables:
        return core.empty_table()
    try:
        out = pa.concat_tables(tables, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        types: dict[str, list[pa.DataType]] = {}
        for t in tables:
            for f in t.schema:
                types.setdefault(f.name, []).append(f.type)
        bad = set()
        for name, ts in types.items():
            try:
                pa.unify_schemas(
                    [pa.schema([pa.field(name, t)]) for t in ts], promote_options="permissive"
                )
            except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
                bad.add(name)
        fixed = []
        for t in tables:
            for name in bad & set(t.column_names):
                i = t.column_names.index(name)
                t = t.set_column(i, pa.field(name, pa.string()), _to_string_array(t.column(i)))
            fixed.append(t)
        out = pa.concat_tables(fixed, promote_options="permissive")
    return _conform(out, core)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _atomic_write(table: pa.Table, path: Path) -> Path:
    """Write ``table`` to a temp file next to ``path``, then atomically replace ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        pq.write_table(table, tmp)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; results are ordinary files
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


def _read(path: Path, columns: list[str] | None = None) -> pa.Table:
    """Read one Parquet file; an unreadable one (truncated, not Parquet) is a
    :class:`CorruptResultsError` naming it and what to do."""
    # Open the file once and read through that handle: opening the path twice (as
    # pq.read_table(str) may) can mix two versions of a file being replaced concurrently.
    try:
        with pa.OSFile(str(path), "rb") as f:
            return pq.ParquetFile(f).read(columns=columns)
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as exc:
        if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError)):
            raise
        raise CorruptResultsError(Path(path), exc) from None


def corrupt_files(path: str | os.PathLike[str], table: str = "rounds") -> list[Path]:
    """The files :func:`load` would read for ``table`` under ``path`` that cannot be read."""
    p = Path(path)
    files = [p] if p.is_file() else _files(p, table)
    bad = []
    for f in files:
        try:
            with pa.OSFile(str(f), "rb") as fh:
                pq.ParquetFile(fh).read()
        except (pa.ArrowInvalid, pa.ArrowIOError, OSError):
            bad.append(f)
    return bad


def quarantine(path: str | os.PathLike[str]) -> Path:
    """Rename an unreadable results file to ``<name>.corrupt`` (kept for inspection, ignored by
    :func:`load`); returns the new path."""
    p = Path(path)
    target = p.with_name(p.name + ".corrupt")
    os.replace(p, target)
    return target


# --------------------------------------------------------------------------- the store


class ResultsStore:
    """The Parquet results of one study under an output directory.

    >>> import tempfile
    >>> store = ResultsStore(tempfile.mkdtemp(), "s1")
    >>> store.write_rounds("a", [{"round": 0, "val_acc": 0.3}]).name
    'a.parquet'
    >>> store.write_trial({"trial_id": "a", "status": "ok"}).name
    'trials.parquet'
    >>> store.trial_ids()
    ['a']
    >>> ResultsStore("/tmp", "a/b")
    Traceback (most recent call last):
    ...
    fedtune.config.ConfigError: invalid name 'a/b': name must not contain path separators or NUL; allowed: a non-empty folder name without '/', '\\' or NUL that does not start with '.'
    """

    def __init__(self, output: str | os.PathLike[str], study: str) -> None:
        self.study: str = _check_name(study, "name")
        self.output: Path = Path(output)
        self.study_dir: Path = self.output / study
        self.rounds_dir: Path = self.study_dir / ROUNDS_DIR

    def __repr__(self) -> str:
        return f"ResultsStore({str(self.output)!r}, {self.study!r})"

    @property
    def trials_path(self) -> Path:
        """``<study_dir>/trials.parquet``."""
        return self.study_dir / TRIALS_FILE

    def rounds_path(self, trial_id: str) -> Path:
        """``<rounds_dir>/<trial_id>.parquet``."""
        return self.rounds_dir / f"{_check_name(trial_id, 'trial_id')}.parquet"

    def _fill_ids(self, row: Mapping[str, Any], trial_id: str) -> dict[str, Any]:
        out = dict(row)
        for key, want in (("study", self.study), ("trial_id", trial_id)):
            got = out.get(key)
            if got is None:
                out[key] = want
            elif got != want:
                raise ValueError(f"row has {key}={got!r} but is being written as {key}={want!r}")
        return out

    def write_rounds(self, trial_id: str, rows: Sequence[Mapping[str, Any]]) -> Path:
        """Atomically (re)write all rows so far of ``trial_id``; returns the file's path.

        ``study`` and ``trial_id`` are filled in where a row lacks them (a different value is
        a ValueError). Passing fewer rows than before replaces the old rows.

        >>> import tempfile
        >>> store = ResultsStore(tempfile.mkdtemp(), "s")
        >>> p = store.write_rounds("t", [{"round": 0}, {"round": 1}])
        >>> p = store.write_rounds("t", [{"round": 0}])
        >>> load(p).num_rows
        1
        """
        path = self.rounds_path(trial_id)
        table = rows_to_table([self._fill_ids(r, trial_id) for r in rows], ROUND_CORE_SCHEMA)
        return _atomic_write(table, path)

    def write_trial(self, row: Mapping[str, Any]) -> Path:
        """Upsert one trial row (by ``trial_id``) into ``trials.parquet``; returns its path.

        Runs read / drop / append / atomic replace under an exclusive ``fcntl.flock`` on
        ``<study_dir>/.trials.lock``, so concurrent writers of one study are safe.

        >>> import tempfile
        >>> store = ResultsStore(tempfile.mkdtemp(), "s")
        >>> _ = store.write_trial({"trial_id": "t", "status": "running"})
        >>> _ = store.write_trial({"trial_id": "t", "status": "ok"})
        >>> load(store.trials_path, "trials").column("status").to_pylist()
        ['ok']
        """
        trial_id = row.get("trial_id")
        _check_name(trial_id, "trial_id")
        new = rows_to_table([self._fill_ids(row, trial_id)], TRIAL_CORE_SCHEMA)
        self.study_dir.mkdir(parents=True, exist_ok=True)
        with open(self.study_dir / LOCK_FILE, "a+b") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                tables = []
                if self.trials_path.exists():
                    old = _read(self.trials_path)
                    keep = pc.invert(
                        pc.fill_null(
                            pc.equal(old.column("trial_id"), pa.scalar(trial_id)), False
                        )
                    )
                    tables.append(old.filter(keep))
                tables.append(new)
                return _atomic_write(_concat(tables, TRIAL_CORE_SCHEMA), self.trials_path)
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def trial_ids(self) -> list[str]:
        """Sorted ids of every trial with a round file or a row in ``trials.parquet``."""
        ids: set[str] = set()
        if self.rounds_dir.is_dir():
            ids.update(p.stem for p in self.rounds_dir.glob("*.parquet") if not p.name.startswith("."))
        if self.trials_path.exists():
            col = _read(self.trials_path, ["trial_id"]).column("trial_id")
            ids.update(v for v in col.to_pylist() if v is not None)
        return sorted(ids)


# --------------------------------------------------------------------------- summaries


def _finite(v: Any) -> bool:
    return _is_number(v) and math.isfinite(float(v))


def summarize_trial(
    rows: Sequence[Mapping[str, Any]],
    *,
    config: Mapping[str, Any],
    status: str,
    error: str | None,
    started_at: _dt.datetime | float | str | None,
    ended_at: _dt.datetime | float | str | None,
) -> dict[str, Any]:
    """Build the ``trials.parquet`` row of a trial from its round rows (which may be empty).

    Identity columns (study, trial_id, algorithm, ...) come from the last round row, else
    from ``config``. Rows are ordered by ``round`` (duplicates: the last one wins). The
    reported round and score of each selection protocol come from
    :func:`fedtune.selection.choose_round`: ``best_round`` / ``best_val_acc`` /
    ``target_acc_at_best_val`` (``val``: the highest finite ``val_acc``, earliest on ties, and
    the target accuracy *at that round*), ``target_val_round`` / ``best_target_val_acc`` /
    ``target_acc_at_best_target_val`` (``target-val``, fda) and ``final_oracle_acc``
    (``oracle``: the last evaluated round). ``final_*`` are the values of the last round that
    has one (NaN included, so a diverged trial ends in NaN).
    ``hp.*`` columns of the rows (and ``hp.*`` keys or an ``hp`` dict of ``config``) are
    copied over; ``config_json`` is ``config`` as sorted JSON.

    >>> rows = [{"round": 0, "val_acc": 0.5, "target_acc": 0.4},
    ...         {"round": 1, "val_acc": 0.7, "target_acc": 0.3},
    ...         {"round": 2, "val_acc": 0.6, "target_acc": 0.9}]
    >>> s = summarize_trial(rows, config={"trial_id": "t"}, status="ok", error=None,
    ...                     started_at=0.0, ended_at=12.5)
    >>> s["best_round"], s["target_acc_at_best_val"], s["final_target_acc"], s["total_wall_s"]
    (1, 0.3, 0.9, 12.5)
    """
    by_round: dict[Any, Mapping[str, Any]] = {}
    unnumbered: list[Mapping[str, Any]] = []
    for r in rows:
        if r.get("round") is None:
            unnumbered.append(r)
        else:
            by_round[int(r["round"])] = r
    ordered = [by_round[k] for k in sorted(by_round)] + unnumbered

    out: dict[str, Any] = {}
    for name in TRIAL_CORE_SCHEMA.names[:9]:  # study .. seed
        value = None
        for r in reversed(ordered):
            if r.get(name) is not None:
                value = r[name]
                break
        out[name] = value if value is not None else config.get(name)

    def last(col: str) -> Any:
        for r in reversed(ordered):
            if r.get(col) is not None:
                return float(r[col])
        return None

    from fedtune import selection

    val = selection.choose_round(ordered, "val")
    tval = selection.choose_round(ordered, "target-val")
    oracle = selection.choose_round(ordered, "oracle")

    start, end = _to_timestamp(started_at, "started_at"), _to_timestamp(ended_at, "ended_at")
    if start is not None and end is not None:
        total = (end - start).total_seconds()
    else:
        walls = [float(r["wall_s"]) for r in ordered if _finite(r.get("wall_s"))]
        total = float(sum(walls)) if walls else None

    def score(c: selection.Choice, v: float) -> float | None:
        return None if c.round is None or math.isnan(v) else v

    out.update(
        status=status,
        rounds_done=len(ordered),
        final_val_acc=last("val_acc"),
        final_target_acc=last("target_acc"),
        best_val_acc=score(val, val.score),
        best_round=val.round,
        target_acc_at_best_val=score(val, val.target_acc),
        best_target_val_acc=score(tval, tval.score),
        target_val_round=tval.round,
        target_acc_at_best_target_val=score(tval, tval.target_acc),
        final_oracle_acc=score(oracle, oracle.score),
        total_wall_s=total,
        started_at=start,
        ended_at=end,
        error=error,
        config_json=_to_json(dict(config)),
    )

    hps: dict[str, Any] = {}
    if isinstance(config.get("hp"), Mapping):
        hps.update({f"hp.{k}": v for k, v in config["hp"].items()})
    hps.update({k: v for k, v in config.items() if isinstance(k, str) and k.startswith("hp.")})
    for r in ordered:
        hps.update({k: v for k, v in r.items() if k.startswith("hp.") and v is not None})
    out.update(hps)
    return out


# --------------------------------------------------------------------------- reading


def _files(path: Path, table: str) -> list[Path]:
    def visible(ps: Iterable[Path]) -> list[Path]:
        return sorted(p for p in ps if p.is_file() and not p.name.startswith("."))

    def of_study(d: Path) -> list[Path]:
        if table == "rounds":
            return visible((d / ROUNDS_DIR).glob("*.parquet"))
        return visible([d / TRIALS_FILE])

    if (path / ROUNDS_DIR).is_dir() or (path / TRIALS_FILE).is_file():
        return of_study(path)  # a study directory
    studies = sorted(d for d in path.iterdir() if d.is_dir() and not d.name.startswith("."))
    found = [f for d in studies for f in of_study(d)]
    if found or table == "trials":
        return found
    return visible(path.glob("*.parquet"))  # e.g. a study's rounds/ directory itself


def load(path: str | os.PathLike[str], table: str = "rounds") -> pa.Table:
    """Load the ``rounds`` or ``trials`` table of a study dir, of an output dir holding
    several studies, or of a single ``.parquet`` file (a file named ``trials.parquet`` is
    read as the trials table whatever ``table`` says).

    All matching files are concatenated: columns missing from a file are null, int/float
    mixes become float64, other type clashes become strings. Core columns come first in
    schema order, then the extra columns sorted by name. A directory with no matching file
    gives an empty table with the core schema.

    >>> import tempfile
    >>> out = tempfile.mkdtemp()
    >>> _ = ResultsStore(out, "a").write_rounds("t", [{"round": 0, "hp.lr": 1}])
    >>> _ = ResultsStore(out, "b").write_rounds("t", [{"round": 0, "hp.mu": 0.5}])
    >>> t = load(out)
    >>> t.num_rows, t.column("hp.lr").to_pylist(), t.column("hp.mu").to_pylist()
    (2, [1, None], [None, 0.5])
    >>> load(out, "bogus")
    Traceback (most recent call last):
    ...
    ValueError: table must be one of ['rounds', 'trials'], got 'bogus'
    """
    if table not in TABLES:
        raise ValueError(f"table must be one of {sorted(TABLES)}, got {table!r}")
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"no such results path: {str(p)!r}")
    if p.is_file():
        core = TRIAL_CORE_SCHEMA if p.name == TRIALS_FILE else TABLES[table]
        return _conform(_read(p), core)
    core = TABLES[table]
    return _concat([_read(f) for f in _files(p, table)], core)


# --------------------------------------------------------------------------- docs


def schema_markdown() -> str:
    """A Markdown description of the core round and trial columns, for the README.

    >>> print(schema_markdown().splitlines()[4])
    | `study` | string | Study name (directory under the output dir). |
    """

    def table(cols: list[tuple[str, pa.DataType, str]]) -> list[str]:
        lines = ["| column | type | meaning |", "|---|---|---|"]
        lines += [f"| `{n}` | {t} | {d} |" for n, t, d in cols]
        return lines

    parts = [
        "### Round rows (`<study>/rounds/<trial_id>.parquet`)",
        "",
        *table(_ROUND_COLUMNS),
        "",
        "Extra columns follow the core ones, sorted by name, with inferred types: "
        "`val_acc.<domain>`, `target_acc.<domain>`, `test_acc`, ... (float64); "
        "`hp.<name>` (one per hyperparameter: int64, float64, bool or string; "
        "lists and dicts as JSON strings); `diag.<name>` (float64 or list<float64>). "
        "A column mixing ints and floats is float64; one mixing strings with other values "
        "is string. NaN/Inf are stored as such.",
        "",
        "### Trial rows (`<study>/trials.parquet`, one per `trial_id`)",
        "",
        *table(_TRIAL_COLUMNS),
        "",
        "Trial rows also carry the trial's `hp.<name>` columns.",
    ]
    return "\n".join(parts) + "\n"
