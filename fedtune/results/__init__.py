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

Every name is imported from its module (``from fedtune.results.store import ResultsStore, load``):
this package re-exports nothing, so a process that only needs the floor (the status words, the
file names: the coordinator and client actors) does not import pyarrow. Users read results with
``fedtune.load`` (the public face); a name this package exported before the house-keeping of
issue 18 (``fedtune.results.load``) raises one line naming its new spelling (:mod:`fedtune.old_names`).

>>> import tempfile
>>> from fedtune.results.store import ResultsStore, load
>>> from fedtune.results.summary import summarize_trial
>>> store = ResultsStore(tempfile.mkdtemp(), "demo")
>>> rows = [{"trial_id": "t0", "round": r, "val_acc": 0.5 + r / 10, "hp.lr": 0.1}
...         for r in range(3)]
>>> _ = store.write_rounds("t0", rows)
>>> _ = store.write_trial(summarize_trial(rows, config={"trial_id": "t0"}, status="ok",
...                                       error=None, started_at=None, ended_at=None))
>>> load(store.study_dir).num_rows, load(store.study_dir, "trials").num_rows
(3, 1)
"""

from typing import NoReturn

from fedtune.old_names import old_name_error


def __getattr__(name: str) -> NoReturn:
    """A name this package exported before issue 18 raises one line naming its new spelling."""
    raise old_name_error(__name__, name)
