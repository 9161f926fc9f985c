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

from fedtune.errors import ConfigError
from fedtune.results.atomic import atomic_write_text

__all__ = ["STUDY_FILE", "OPTUNA_FILE", "TUNE_DIR", "SPACES_DIR", "TRIALS_FILE", "LOCK_FILE", "DRIVER_LOCK_FILE", "DRIVER_FILE", "ROUNDS_DIR",
           "REPORT_FILE", "PLOTS_DIR", "CORRUPT_SUFFIX", "StudyDir", "read_study", "read_study_if_any",
           "write_study", "latest_study", "studies_in"]

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


class StudyDir:
    """The paths of one study's files (nothing is created or read here)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"StudyDir({str(self.root)!r})"

    @property
    def study_json(self) -> Path:
        return self.root / STUDY_FILE

    @property
    def optuna_db(self) -> Path:
        return self.root / OPTUNA_FILE

    @property
    def tune_dir(self) -> Path:
        return self.root / TUNE_DIR

    @property
    def spaces_dir(self) -> Path:
        return self.root / SPACES_DIR

    @property
    def trials(self) -> Path:
        return self.root / TRIALS_FILE

    @property
    def trials_lock(self) -> Path:
        return self.root / LOCK_FILE

    @property
    def driver_lock(self) -> Path:
        return self.root / DRIVER_LOCK_FILE

    @property
    def driver(self) -> Path:
        return self.root / DRIVER_FILE

    @property
    def rounds_dir(self) -> Path:
        return self.root / ROUNDS_DIR

    def rounds_file(self, trial_id: str) -> Path:
        return self.rounds_dir / f"{trial_id}.parquet"

    @property
    def report_md(self) -> Path:
        return self.root / REPORT_FILE

    @property
    def plots_dir(self) -> Path:
        return self.root / PLOTS_DIR


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
