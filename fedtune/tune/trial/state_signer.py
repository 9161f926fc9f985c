"""``StateSigner``: the Tune callback that signs a study's Ray Tune state as Tune writes it, so that an
interrupted study (Ctrl-C, SIGTERM, even SIGKILL) resumes without ``--trust-study-files``
(:mod:`fedtune.tune.common.state_signatures` says what is signed and why).

Tune writes its experiment state to a staging folder on the driver at the end of a loop step and
copies it to the experiment folder in the background; ``on_step_end`` runs right after that write,
in the same thread, and signs the staged files (those that changed), so every version Tune can copy
is signed before it is copied. ``tuner.pkl`` (written straight to the experiment) is signed at the
first step; a checkpoint's pickles when Tune reports it (the trial wrote them just before); a failed
trial's ``error.pkl`` when it fails (from the staging copy); the staged state once more when the
experiment ends (Tune's last state is written before ``on_experiment_end``). Files already in the
experiment folder are never signed as they lie: one planted there is refused by the next resume.
A driver killed between Tune's write and this callback's (the same loop step, microseconds) leaves
a file ``--resume`` refuses, naming it: its owner resumes with ``--trust-study-files``.

It is pickled into ``tuner.pkl`` with the other callbacks: it carries no state (never the key).
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

from ray.tune import Callback

from fedtune.tune.common.state_signatures import ExperimentSignatures

__all__ = ["StateSigner"]


class StateSigner(Callback):
    """Signs the Tune experiment's pickle-bearing files as Tune writes them (module docstring)."""

    def __init__(self) -> None:
        self._books: dict[str, ExperimentSignatures] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._books = {}

    def _book(self, trials: list[Any]) -> tuple[ExperimentSignatures, Any] | None:
        """The signatures of the experiment ``trials`` belong to (a new book signs ``tuner.pkl``, which
        this driver's Tuner wrote, or found signed when it restored the experiment). Nothing else is
        signed as it lies in the experiment folder: only what this driver's Tune wrote."""
        if not trials:
            return None
        storage = trials[0].storage
        where = f"{storage.storage_filesystem.type_name}:{storage.experiment_fs_path}"
        book = self._books.get(where)
        if book is None:
            book = self._books[where] = ExperimentSignatures(storage.experiment_fs_path, fs=storage.storage_filesystem)
            try:
                book.sign_stored("tuner.pkl")
            except FileNotFoundError:
                pass
        return book, storage

    def on_step_end(self, iteration: int, trials: list[Any], **info: Any) -> None:
        found = self._book(trials)
        if found is not None:
            book, storage = found
            book.sign_staging(storage.experiment_driver_staging_path)
            book.save()

    def on_checkpoint(self, iteration: int, trials: list[Any], trial: Any, checkpoint: Any, **info: Any) -> None:
        found = self._book(trials)
        if found is None:
            return
        book, storage = found
        try:
            under = PurePosixPath(checkpoint.path).relative_to(PurePosixPath(book.path)).as_posix()
        except ValueError:  # a checkpoint outside the experiment: Tune restores none from there
            return
        book.sign_tree(under)
        book.save()

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        found = self._book(trials)
        local = trial.pickled_error_file
        if found is None or not local:
            return
        book, _ = found
        book.sign_local(f"{trial.storage.trial_dir_name}/{PurePosixPath(local).name}", local)
        book.save()

    def on_experiment_end(self, trials: list[Any], **info: Any) -> None:
        found = self._book(trials)
        if found is None:
            return
        book, storage = found
        book.sign_staging(storage.experiment_driver_staging_path)
        book.save()
