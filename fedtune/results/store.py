"""The results store of a study: where its Parquet files are, how they are written and read.

Under an output directory ``OUTPUT`` (file names from :mod:`fedtune.results.study_dir`)::

    OUTPUT/<study>/rounds/<trial_id>.parquet   all round rows of one trial
    OUTPUT/<study>/trials.parquet              one summary row per trial
    OUTPUT/<study>/.trials.lock                file lock guarding trials.parquet

Every file is written atomically (:func:`fedtune.results.arrow.write_parquet`): a process
that dies mid-write leaves the previous complete file in place (and at worst a stray hidden
``.tmp`` file, which :func:`load` ignores and :func:`clean_stray_temp_files` removes). A write the
device or the folder refuses (a full disk, permissions) is a
:class:`~fedtune.results.atomic.ResultsWriteError` naming the file (a full device:
:class:`~fedtune.results.atomic.StorageFullError`). A trial's round file is rewritten with *all* its
rows each time new rows arrive, so re-running a trial with the same ``trial_id`` replaces its
rows rather than duplicating them. ``trials.parquet`` is upserted by ``trial_id`` under an
exclusive :class:`filelock.FileLock` (any OS; it gives up after ``lock_timeout_s`` with an
error naming the lock file), so several processes may write trials of one study at once.
Readers take no lock. Readers read only fedtune's files: a Parquet file without the
:data:`~fedtune.results.schema.REQUIRED_COLUMNS` of its table is a
:class:`~fedtune.results.arrow.ForeignResultsError` naming it (:func:`load`, :func:`corrupt_files`,
the upsert of ``trials.parquet``).

Before a command writes into a folder, :func:`check_output_dir` (its output folder) and
:func:`check_study_dir` (a study folder to read) refuse what cannot work, in one line.
"""

from __future__ import annotations

import os
import stat
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from filelock import FileLock, Timeout

from fedtune.errors import ConfigError
from fedtune.results.arrow import (CorruptResultsError, ForeignResultsError, check_table, concat, conform, read_parquet,
                                   read_results, rows_to_table, write_parquet)
from fedtune.results.atomic import TEMP_MARKER, ResultsWriteError, StorageFullError, is_temp_name, writes_to
from fedtune.results.rounds_table import RoundsTable
from fedtune.results.schema import ROUND_CORE_SCHEMA, TABLES, TRIAL_CORE_SCHEMA
from fedtune.results.study_dir import (CORRUPT_SUFFIX, PLOTS_DIR, ROUNDS_DIR, STUDY_FILE, TRIALS_FILE, StudyDir,
                                       check_name, check_path_text, read_study)

__all__ = ["LOCK_TIMEOUT_S", "TEMP_MIN_AGE_S", "ResultsStore", "TrialsLockTimeout",
           "check_output_dir", "check_writable", "check_study_dir", "is_study_dir", "load", "corrupt_files",
           "quarantine", "clean_stray_temp_files"]

LOCK_TIMEOUT_S = 300.0
"""How long a writer of ``trials.parquet`` waits for the study's lock before giving up."""


# --------------------------------------------------------------------------- names


def _create_probe(folder: Path) -> None:
    """Create and remove a file in ``folder`` (an OSError says why it cannot be written)."""
    fd, name = tempfile.mkstemp(prefix=f".write-probe{TEMP_MARKER}", suffix=".tmp", dir=folder)
    os.close(fd)
    os.unlink(name)


def _reason(exc: OSError) -> str:
    return os.strerror(exc.errno).lower() if exc.errno else (str(exc) or type(exc).__name__)


def check_writable(folder: str | os.PathLike[str], what: str) -> None:
    """Refuse (ConfigError, ``what`` first) an existing ``folder`` this process cannot create a file
    in, by creating and removing one: ``os.access`` says yes to root whatever the mode bits, and
    knows nothing of read-only mounts or ACLs."""
    try:
        _create_probe(Path(folder))
    except OSError as exc:
        raise ConfigError(f"{what}: creating a file in '{folder}' failed: {_reason(exc)}; allowed: a folder "
                          "this user can write") from None


def check_output_dir(output: str | os.PathLike[str], option: str = "field 'output'",
                     study: str | None = None) -> Path:
    """Refuse, before anything runs (instead of failing when the first result is written), an output
    directory that is, or lies under, an existing non-directory, or that cannot be written: a file is
    created and removed in the study folder ``output/study`` and its ``rounds/`` where they exist,
    else in the nearest folder of ``output`` (or ``output/study``) that exists. ``option`` names the
    option or field in the message. Returns ``Path(output)``."""
    path = check_path_text(output, option)  # NUL, a name too long: before any file-system call
    if study is not None:
        check_name(study, "name")
    for p in (path, *path.parents):
        if p.exists() and not p.is_dir():
            where = "is" if p == path else f"lies under '{p}', which is"
            raise ConfigError(f"{option}: '{output}' {where} a file, not a directory; allowed: a directory "
                              "(existing, or one that can be created)")
    base = path / study if study else path
    folders = [d for d in (base / ROUNDS_DIR, base) if d.is_dir()] if study else []
    if not folders:
        folders = [next(p for p in (base, *base.parents) if p.exists())]  # "." (or "/") at the latest
    for folder in folders:
        try:
            _create_probe(folder)
        except OSError as exc:
            raise ConfigError(f"{option}: '{output}' cannot be written: creating a file in '{folder}' failed: "
                              f"{_reason(exc)}; allowed: a directory this user can write (existing, or one "
                              "that can be created)") from None
    return path


def is_study_dir(path: str | os.PathLike[str]) -> bool:
    """True for a folder holding a study: ``study.json`` (``fedtune sweep``), ``rounds/`` or
    ``trials.parquet`` (``fedtune run`` and the Tuner API write no ``study.json``)."""
    p = Path(path)
    return (p / STUDY_FILE).is_file() or (p / ROUNDS_DIR).is_dir() or (p / TRIALS_FILE).is_file()


def check_study_dir(path: str | os.PathLike[str], what: str = "study folder") -> Path:
    """Refuse (ConfigError naming ``path``) a path that is not a study folder (:func:`is_study_dir`):
    missing, a file, a folder without a study's files (an output folder holding studies is named
    as such, with its studies), or one whose only study file is a ``study.json`` that is not a
    sweep's. Returns ``Path(path)``."""
    p = check_path_text(path, what)
    made_by = (f"a study folder is OUTPUT/STUDY as fedtune sweep ({STUDY_FILE}) or fedtune run "
               f"({ROUNDS_DIR}/, {TRIALS_FILE}) writes it")
    if not p.exists():
        raise ConfigError(f"{what} '{p}' does not exist; allowed: {made_by}")
    if not p.is_dir():
        raise ConfigError(f"{what} '{p}' is a file, not a fedtune study folder; allowed: {made_by}")
    if not is_study_dir(p):
        inside = sorted(d.name for d in p.iterdir() if d.is_dir() and not d.name.startswith(".") and is_study_dir(d))
        hint = (f"; it is an output folder holding the studies {', '.join(inside)}: give one of them, e.g. "
                f"'{p / inside[0]}'") if inside else ""
        raise ConfigError(f"'{p}' is not a fedtune study folder: it holds no {STUDY_FILE}, {ROUNDS_DIR}/ or "
                          f"{TRIALS_FILE}{hint}; allowed: {made_by}")
    if not (p / ROUNDS_DIR).is_dir() and not (p / TRIALS_FILE).is_file():
        read_study(p)  # only a study.json: it must be a sweep's (a ConfigError naming it otherwise)
    return p


# --------------------------------------------------------------------------- writing


class TrialsLockTimeout(TimeoutError):
    """The lock of a study's ``trials.parquet`` stayed held by another process too long. ``path``
    is the lock file."""

    def __init__(self, path: Path, timeout_s: float):
        self.path = Path(path)
        super().__init__(f"could not lock '{self.path}' within {timeout_s:g} s: another process has been "
                         f"writing {TRIALS_FILE} of this study that long (a hung fedtune run or sweep?); "
                         "stop it, or retry once it has finished (if none is running, delete the lock file)")


@contextmanager
def _exclusive(path: Path, timeout_s: float) -> Iterator[None]:
    lock = FileLock(str(path), timeout=timeout_s)
    try:
        with writes_to(path):  # a read-only or full study folder: one line naming the lock file
            lock.acquire()
    except Timeout:
        raise TrialsLockTimeout(path, timeout_s) from None
    try:
        yield
    finally:
        lock.release()


CACHED_TRIALS = 64
"""Trials whose converted rounds a store keeps (:meth:`ResultsStore.write_rounds`), the most recently written."""


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
    fedtune.errors.ConfigError: invalid name 'a/b': name must not contain path separators or NUL; allowed: a non-empty folder name of at most 200 bytes without '/', '\\' or NUL that does not start with '.'
    """

    def __init__(self, output: str | os.PathLike[str], study: str, *, lock_timeout_s: float = LOCK_TIMEOUT_S) -> None:
        self.study: str = check_name(study, "name")
        self.output: Path = Path(output)
        self.files = StudyDir(self.output / study)
        self.study_dir: Path = self.files.root
        self.rounds_dir: Path = self.files.rounds_dir
        self.lock_timeout_s = lock_timeout_s
        # trial id -> (the rows last written, their table): the next write of the same rows and more
        # converts only the new rows (fedtune.results.rounds_table); the most recent trials only
        self._rounds: dict[str, tuple[list[Mapping[str, Any]], Any]] = {}

    def __repr__(self) -> str:
        return f"ResultsStore({str(self.output)!r}, {self.study!r})"

    @property
    def trials_path(self) -> Path:
        """``<study_dir>/trials.parquet``."""
        return self.files.trials

    def rounds_path(self, trial_id: str) -> Path:
        """``<rounds_dir>/<trial_id>.parquet``."""
        return self.files.rounds_file(check_name(trial_id, "trial_id"))

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
        rows = list(rows)
        written, built = self._rounds.pop(trial_id, ((), None))
        # the rows written before, the very same objects, and more: only those convert
        if built is None or len(rows) < len(written) or any(a is not b for a, b in zip(written, rows)):
            built, written = RoundsTable(ROUND_CORE_SCHEMA), []
        built.extend([self._fill_ids(r, trial_id) for r in rows[len(written):]])
        out = write_parquet(built.table(), path)  # raises: the cache is dropped, the next write starts over
        self._rounds[trial_id] = (rows, built)
        while len(self._rounds) > CACHED_TRIALS:
            self._rounds.pop(next(iter(self._rounds)))
        return out

    def write_trial(self, row: Mapping[str, Any]) -> Path:
        """Upsert one trial row (by ``trial_id``) into ``trials.parquet``; returns its path.

        Runs read / drop / append / atomic replace under an exclusive file lock on
        ``<study_dir>/.trials.lock``, so concurrent writers of one study are safe; waiting
        longer than ``lock_timeout_s`` for it is a :class:`TrialsLockTimeout` naming the file.

        >>> import tempfile
        >>> store = ResultsStore(tempfile.mkdtemp(), "s")
        >>> _ = store.write_trial({"trial_id": "t", "status": "running"})
        >>> _ = store.write_trial({"trial_id": "t", "status": "ok"})
        >>> load(store.trials_path, "trials").column("status").to_pylist()
        ['ok']
        """
        trial_id = row.get("trial_id")
        check_name(trial_id, "trial_id")
        new = rows_to_table([self._fill_ids(row, trial_id)], TRIAL_CORE_SCHEMA)
        with writes_to(self.study_dir):
            self.study_dir.mkdir(parents=True, exist_ok=True)
        with _exclusive(self.files.trials_lock, self.lock_timeout_s):
            tables = []
            if self.trials_path.exists():
                old = read_results(self.trials_path, "trials")  # never replace a file that is not ours
                keep = pc.invert(pc.fill_null(pc.equal(old.column("trial_id"), pa.scalar(trial_id)), False))
                tables.append(old.filter(keep))
            tables.append(new)
            return write_parquet(concat(tables, TRIAL_CORE_SCHEMA), self.trials_path)

    def trial_ids(self) -> list[str]:
        """Sorted ids of every trial with a round file or a row in ``trials.parquet``."""
        ids: set[str] = set()
        if self.rounds_dir.is_dir():
            ids.update(p.stem for p in self.rounds_dir.glob("*.parquet") if not p.name.startswith("."))
        if self.trials_path.exists():
            col = read_results(self.trials_path, "trials").column("trial_id")
            ids.update(v for v in col.to_pylist() if v is not None)
        return sorted(ids)


# --------------------------------------------------------------------------- reading


def _files(path: Path, table: str) -> list[Path]:
    def visible(ps: Iterable[Path]) -> list[Path]:
        return sorted(p for p in ps if p.is_file() and not p.name.startswith("."))

    def of_study(d: Path) -> list[Path]:
        if table == "rounds":
            return visible(StudyDir(d).rounds_dir.glob("*.parquet"))
        return visible([StudyDir(d).trials])

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
    gives an empty table with the core schema. Hidden files (the atomic writer's temporary files,
    ``.trials.lock``) and ``*.corrupt`` files are not read; a Parquet file without the
    :data:`~fedtune.results.schema.REQUIRED_COLUMNS` of its table is a :class:`ForeignResultsError`
    naming it (never read as rows of nulls). A folder that holds no results at all (no study
    folder, no study beneath it, no ``.parquet`` file: a typo, the wrong folder) is a ConfigError
    saying so and what a results folder holds; a study that has written no row of ``table``
    yet gives an empty table with the core schema.

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
        kind = "trials" if p.name == TRIALS_FILE else table
        return conform(read_results(p, kind), TABLES[kind])
    core = TABLES[table]
    files = _files(p, table)
    if not files and not _holds_results(p):
        raise ConfigError(f"no fedtune results in '{p}': it holds no study folder and no .parquet file; allowed: a "
                          f"study folder (OUTPUT/STUDY with {ROUNDS_DIR}/, {TRIALS_FILE} or {STUDY_FILE}, as fedtune "
                          "run and fedtune sweep write it), an output folder holding studies, a study's "
                          f"{ROUNDS_DIR}/ folder, or one .parquet file")
    return concat([read_results(f, table) for f in files], core)


def _holds_results(path: Path) -> bool:
    """Whether the folder ``path`` is a results folder :func:`load` reads: a study (:func:`is_study_dir`),
    an output folder holding one, a study's ``rounds/`` folder, or a folder of ``.parquet`` files."""
    if is_study_dir(path) or (path.name == ROUNDS_DIR and is_study_dir(path.parent)):
        return True
    return any(is_study_dir(d) for d in path.iterdir() if d.is_dir()) or any(path.glob("*.parquet"))


def corrupt_files(path: str | os.PathLike[str], table: str = "rounds") -> list[Path]:
    """The files :func:`load` would read for ``table`` under ``path`` that cannot be read (truncated,
    not Parquet: :func:`quarantine` them). A readable file that is not a fedtune file of that table
    is no corruption to repair but a :class:`ForeignResultsError` naming it: it is neither moved nor
    re-run, and its owner decides."""
    p = Path(path)
    kind = "trials" if p.is_file() and p.name == TRIALS_FILE else table
    bad = []
    for f in [p] if p.is_file() else _files(p, table):
        try:
            table_ = read_parquet(f)
        except CorruptResultsError:
            bad.append(f)
            continue
        except FileNotFoundError:  # gone since it was listed
            continue
        check_table(table_, kind, f)
    return bad


def quarantine(path: str | os.PathLike[str]) -> Path:
    """Rename an unreadable results file to ``<name>.corrupt`` (kept for inspection, ignored by
    :func:`load`); returns the new path."""
    p = Path(path)
    target = p.with_name(p.name + CORRUPT_SUFFIX)
    with writes_to(target):
        os.replace(p, target)
    return target


TEMP_MIN_AGE_S = 60.0
"""How long ago a stray temporary file must have last changed for :func:`clean_stray_temp_files` to
remove it by default: a younger one may belong to a write still in progress (another process)."""


def clean_stray_temp_files(study_dir: str | os.PathLike[str], *, min_age_s: float = TEMP_MIN_AGE_S) -> list[Path]:
    """Remove the temporary files the atomic writer left in a study (a process killed during a write:
    ``.<name>.fedtune-<random>.tmp``, or an older version's ``.<name>.<random>.tmp``, see
    :func:`fedtune.results.atomic.is_temp_name`) from the study folder, ``rounds/`` and ``plots/``;
    only regular files unchanged for ``min_age_s`` seconds, so a write in progress keeps its file.
    No other file is touched. Returns the removed paths, sorted; a missing folder gives ``[]``.

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> _ = (d / ".trials.parquet.fedtune-abcd1234.tmp").write_bytes(b"PAR1")
    >>> _ = (d / "notes.tmp").write_text("mine")
    >>> [p.name for p in clean_stray_temp_files(d, min_age_s=0)], sorted(p.name for p in d.iterdir())
    (['.trials.parquet.fedtune-abcd1234.tmp'], ['notes.tmp'])
    """
    root = Path(study_dir)
    now = time.time()
    removed = []
    for folder in (root, root / ROUNDS_DIR, root / PLOTS_DIR):
        if not folder.is_dir():
            continue
        for f in folder.iterdir():
            if not f.name.startswith(".") or is_temp_name(f.name) is None:
                continue
            try:
                st = f.lstat()
            except FileNotFoundError:
                continue
            if not stat.S_ISREG(st.st_mode) or now - st.st_mtime < min_age_s:
                continue
            with writes_to(f):
                f.unlink(missing_ok=True)
            removed.append(f)
    return sorted(removed)
