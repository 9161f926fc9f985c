"""Every file name of a study, in one place, and the study file (``study.json``) itself.

A study named ``NAME`` lives in ``OUTPUT/NAME/``::

    study.json                 options, selection, algorithms, targets, searches, seed runs
    spaces/<file>.yaml         the study's own copy of its search spaces (resume reads these)
    optuna.db                  Optuna's SQLite storage (one Optuna study per search)
    tune/<search>/             Ray Tune experiment folders (checkpoints, for resume)
    trials.parquet             one summary row per trial (fedtune.results)
    .trials.lock               file lock guarding trials.parquet
    .driver.lock, driver.json  the lock a running ``fedtune sweep`` holds (one driver per study), and who holds it
    rounds/<trial_id>.parquet  every round of one trial
    report.md                  ``fedtune report``'s tables
    plots/*.png                ``fedtune report``'s figures

A results file that cannot be read is renamed ``<name>.corrupt`` (kept, ignored by readers).

>>> import tempfile
>>> d = StudyDir(tempfile.mkdtemp())
>>> d.rounds_file("t1").relative_to(d.root).as_posix(), d.trials.name, d.optuna_db.name
('rounds/t1.parquet', 'trials.parquet', 'optuna.db')
>>> write_study(d.root, {"options": {"rounds": 3}})
>>> read_study(d.root)["options"]
{'rounds': 3}
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedtune.errors import ConfigError, shown
from fedtune.results.atomic import atomic_write_text

__all__ = ["STUDY_FILE", "OPTUNA_FILE", "TUNE_DIR", "SPACES_DIR", "TRIALS_FILE", "LOCK_FILE", "DRIVER_LOCK_FILE", "DRIVER_FILE", "ROUNDS_DIR",
           "REPORT_FILE", "PLOTS_DIR", "CORRUPT_SUFFIX", "StudyDir", "read_study", "read_study_if_any",
           "write_study", "latest_study", "studies_in", "NAME_MAX_BYTES", "NAME_RULE", "PATH_PART_MAX_BYTES",
           "check_name", "check_path_text", "name_problem"]

STUDY_FILE = "study.json"
OPTUNA_FILE = "optuna.db"
TUNE_DIR = "tune"
SPACES_DIR = "spaces"
TRIALS_FILE = "trials.parquet"
LOCK_FILE = ".trials.lock"
DRIVER_LOCK_FILE = ".driver.lock"
DRIVER_FILE = "driver.json"
ROUNDS_DIR = "rounds"
REPORT_FILE = "report.md"
PLOTS_DIR = "plots"
CORRUPT_SUFFIX = ".corrupt"

NAME_MAX_BYTES = 200
"""The longest study name (or trial id), in UTF-8 bytes: a folder name (at most 255 bytes on common
file systems) with room left for the names fedtune derives from it."""

PATH_PART_MAX_BYTES = 255
"""The longest folder or file name, in UTF-8 bytes, that common file systems (ext4, APFS, NTFS) take."""

NAME_RULE = (f"a non-empty folder name of at most {NAME_MAX_BYTES} bytes without '/', '\\' or NUL that does not "
             "start with '.'")
"""What a study name or trial id may be (one path component, not hidden, not too long)."""


def check_name(value: object, field: str) -> str:
    """Return ``value`` if it is usable as a single path component, else raise ConfigError (a
    ValueError) naming :data:`NAME_RULE`.

    >>> check_name("study-1", "name")
    'study-1'
    >>> check_name(".hidden", "name")
    Traceback (most recent call last):
    ...
    fedtune.errors.ConfigError: invalid name '.hidden': name must not start with '.'; allowed: a non-empty folder name of at most 200 bytes without '/', '\\' or NUL that does not start with '.'
    >>> check_name("x" * 300, "name")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    fedtune.errors.ConfigError: invalid name 'xxx...: name is 300 bytes long; allowed: ...
    """
    problem = name_problem(value)
    if problem is not None:
        raise ConfigError(f"invalid {field} {shown(value, 60)}: {problem.replace('it ', f'{field} ', 1)}; "
                          f"allowed: {NAME_RULE}")
    return value


def name_problem(value: object) -> str | None:
    """Why ``value`` is no study name or trial id (:data:`NAME_RULE`), in words; None when it is one.

    >>> name_problem("a/b"), name_problem("ok")
    ('it must not contain path separators or NUL', None)
    """
    if not isinstance(value, str) or not value.strip():
        return "it is empty or not text"
    if any(s and s in value for s in ("/", "\\", os.sep, os.altsep, "\0")):
        return "it must not contain path separators or NUL"
    if value.startswith("."):
        return "it must not start with '.'"
    size = len(value.encode("utf-8", "surrogatepass"))
    return f"it is {size} bytes long" if size > NAME_MAX_BYTES else None


def check_path_text(path: str | os.PathLike[str], what: str) -> Path:
    """Refuse (ConfigError, ``what`` first) a path no file system takes whatever exists: one holding
    NUL, or a folder or file name in it longer than :data:`PATH_PART_MAX_BYTES` bytes. Returns
    ``Path(path)``.

    >>> check_path_text("out/" + "y" * 300, "option '--output'")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    fedtune.errors.ConfigError: option '--output': the name 'yyy... in it is 300 bytes long; allowed: ...
    """
    text = os.fspath(path)
    if "\0" in str(text):
        raise ConfigError(f"{what}: {shown(text)} holds a NUL character; allowed: a path without NUL")
    for part in Path(text).parts:
        size = len(part.encode("utf-8", "surrogatepass"))
        if size > PATH_PART_MAX_BYTES:
            raise ConfigError(f"{what}: the name {shown(part, 40)} in it is {size} bytes long; "
                              f"allowed: folder and file names of at most {PATH_PART_MAX_BYTES} bytes")
    return Path(text)


def _under(name: str) -> property:
    """A :class:`StudyDir` property: the path ``name`` under the study's root."""
    return property(lambda self: self.root / name, doc=f"``<study>/{name}``")


class StudyDir:
    """The paths of one study's files (nothing is created or read here)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"StudyDir({str(self.root)!r})"

    study_json = _under(STUDY_FILE)
    optuna_db = _under(OPTUNA_FILE)
    tune_dir = _under(TUNE_DIR)
    spaces_dir = _under(SPACES_DIR)
    trials = _under(TRIALS_FILE)
    trials_lock = _under(LOCK_FILE)
    driver_lock = _under(DRIVER_LOCK_FILE)
    driver = _under(DRIVER_FILE)
    rounds_dir = _under(ROUNDS_DIR)
    report_md = _under(REPORT_FILE)
    plots_dir = _under(PLOTS_DIR)

    def rounds_file(self, trial_id: str) -> Path:
        return self.rounds_dir / f"{trial_id}.parquet"


def read_study_if_any(study_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """``study.json`` of ``study_dir`` as a dict; ``{}`` when there is none (a study written by
    ``fedtune run`` or the Tuner API has no study file). Unreadable JSON is a ConfigError."""
    path = StudyDir(study_dir).study_json
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as exc:
        raise ConfigError(f"{path}: cannot read the study file: {str(exc)[:200]}") from None
    return data if isinstance(data, dict) else {}


def read_study(study_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """``study.json`` of a ``fedtune sweep`` study; a missing or foreign file is a ConfigError."""
    path = StudyDir(study_dir).study_json
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as exc:
        raise ConfigError(f"{path}: cannot read the study file: {str(exc)[:200]}") from None
    if not isinstance(data, dict) or "options" not in data:
        raise ConfigError(f"{path}: not a fedtune sweep study file (no 'options')")
    return data


def write_study(study_dir: str | os.PathLike[str], data: Mapping[str, Any]) -> None:
    """Atomically (re)write ``study.json``."""
    atomic_write_text(StudyDir(study_dir).study_json, json.dumps(data, indent=2, sort_keys=True, default=str))


def latest_study(output: str | os.PathLike[str]) -> str | None:
    """Name of the most recently started sweep study in ``output`` (by ``study.json``'s
    ``started_at``), or None."""
    best: tuple[str, str] | None = None
    root = Path(output)
    if not root.is_dir():
        return None
    for p in root.glob(f"*/{STUDY_FILE}"):
        try:
            started = str(json.loads(p.read_text()).get("started_at", ""))
        except (OSError, ValueError):
            continue
        if best is None or started > best[0]:
            best = (started, p.parent.name)
    return best[1] if best else None


def studies_in(output: str | os.PathLike[str]) -> list[str]:
    """Sorted names of the sweep studies (folders with a ``study.json``) in ``output``."""
    root = Path(output)
    return sorted(p.parent.name for p in root.glob(f"*/{STUDY_FILE}")) if root.is_dir() else []
