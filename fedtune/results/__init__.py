"""The results of fedtune: every round of every trial as one row of an Arrow/Parquet table.

The rooms of this package:

- :mod:`~fedtune.results.schema`: the columns (types, meaning, the identity columns);
- :mod:`~fedtune.results.arrow`: rows to Arrow tables (type inference), concatenation, one
  Parquet file written atomically or read (:class:`CorruptResultsError`; a Parquet file that is not
  fedtune's: :class:`ForeignResultsError`);
- :mod:`~fedtune.results.store`: :class:`ResultsStore` (a study's files, the trials-file lock),
  :func:`load`, :func:`corrupt_files`, :func:`quarantine`, :func:`clean_stray_temp_files`, the
  checks before a command runs (:func:`check_output_dir`, :func:`check_study_dir`);
- :mod:`~fedtune.results.summary`: :func:`summarize_trial`, a trial's ``trials.parquet`` row;
- :mod:`~fedtune.results.selection`: the model-selection protocol;
- the floor: :mod:`~fedtune.results.atomic` (the one atomic write; a write the disk or the folder
  refuses is a :class:`ResultsWriteError`, a full disk a :class:`StorageFullError`),
  :mod:`~fedtune.results.study_dir` (every file name of a study),
  :mod:`~fedtune.results.status` (the status words).

Everything public is importable from here (``from fedtune.results import ResultsStore, load``).
The names load on first use, so a process that only needs the floor (the status words, the file
names: the coordinator and client actors) does not import pyarrow.

>>> import tempfile
>>> from fedtune.results import ResultsStore, load, summarize_trial
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

import importlib
from typing import Any

# public name -> the module of this package that owns it
_OWNERS = {
    **dict.fromkeys(("CorruptResultsError", "ForeignResultsError", "rows_to_table"), "arrow"),
    **dict.fromkeys(("ResultsWriteError", "StorageFullError"), "atomic"),
    **dict.fromkeys(("IDENTITY_COLUMNS", "REQUIRED_COLUMNS", "ROUND_COLUMN_DOCS", "ROUND_CORE_SCHEMA", "TABLES",
                     "TIMESTAMP", "TRIAL_COLUMN_DOCS", "TRIAL_CORE_SCHEMA", "schema_markdown"), "schema"),
    **dict.fromkeys(("LOCK_TIMEOUT_S", "NAME_RULE", "TEMP_MIN_AGE_S", "ResultsStore", "TrialsLockTimeout",
                     "check_name", "check_output_dir", "check_study_dir", "check_writable", "clean_stray_temp_files",
                     "corrupt_files", "is_study_dir", "load", "quarantine"), "store"),
    **dict.fromkeys(("LOCK_FILE", "ROUNDS_DIR", "TRIALS_FILE"), "study_dir"),
    "summarize_trial": "summary",
}

__all__ = sorted(_OWNERS)


def __getattr__(name: str) -> Any:
    owner = _OWNERS.get(name)
    if owner is None:
        raise AttributeError(f"module 'fedtune.results' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"fedtune.results.{owner}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_OWNERS))
