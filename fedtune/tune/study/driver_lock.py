"""One driver per study: the lock a running ``fedtune sweep`` holds on its study folder.

Two ``fedtune sweep`` processes on the same study (same ``--name`` and ``--output``, or a
``--resume`` while the study still runs) would both ask Optuna for trials, run one trial twice
and write the same round file from two processes. The first driver takes an exclusive
``filelock`` lock on ``<study>/.driver.lock`` and writes who it is to ``<study>/driver.json``; a
second one is refused at once with a line naming the first.

The lock is the operating system's (``flock`` on POSIX, through :mod:`filelock`): it belongs to
the holder's open file, so a driver that is killed (``kill -9``, a crash, a lost node) leaves no
stuck lock; ``driver.json`` left behind by such a driver is only information and is replaced by
the next one. ``flock`` is local to one machine: on a shared folder (NFS) it may not exclude a
driver started on another machine, which ``driver.json``'s host names when it is seen.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone

from filelock import FileLock, Timeout

from fedtune.errors import ConfigError
from fedtune.results.atomic import atomic_write_text, writes_to
from fedtune.results.study_dir import StudyDir

__all__ = ["StudyBusy", "study_driver"]


class StudyBusy(ConfigError):
    """Another ``fedtune sweep`` is driving the study."""


def _holder(files: StudyDir) -> str:
    """Who holds the lock, in words, from ``driver.json`` (best effort: it may be mid-write)."""
    try:
        info = json.loads(files.driver.read_text())
        return (f"pid {info.get('pid')} on host {info.get('host')}, started {info.get('started_at')}: "
                f"{info.get('command')}")
    except (OSError, ValueError, AttributeError):
        return "a process that has not yet said who it is"


@contextmanager
def study_driver(study_dir: str | os.PathLike[str], command: str = "fedtune sweep", *,
                 create: bool = True) -> Iterator[None]:
    """Hold the study's driver lock while the block runs; raise :class:`StudyBusy` (one line naming
    the running driver) at once when another process holds it. Creates the study folder, unless
    ``create`` is false: then a missing folder takes no lock (the block reports it).

    >>> import tempfile
    >>> from pathlib import Path
    >>> d = Path(tempfile.mkdtemp()) / "s"
    >>> with study_driver(d, "first"):
    ...     try:
    ...         with study_driver(d, "second"):
    ...             pass
    ...     except StudyBusy as exc:
    ...         print(str(exc).split(" (")[0])
    study 's' is already being run by another fedtune sweep
    >>> with study_driver(d, "third"):  # released at the end of the block
    ...     print(json.loads((d / "driver.json").read_text())["command"])
    third
    """
    files = StudyDir(study_dir)
    if not create and not files.root.is_dir():
        yield
        return
    with writes_to(files.root):  # a full or read-only disk: one line naming the folder
        files.root.mkdir(parents=True, exist_ok=True)
    # thread_local=False: the lock is the process's, whichever thread releases it.
    lock = FileLock(str(files.driver_lock), timeout=0, thread_local=False)
    try:
        with writes_to(files.driver_lock):
            lock.acquire(timeout=0)
    except Timeout:
        raise StudyBusy(f"study '{files.root.name}' is already being run by another fedtune sweep "
                        f"({_holder(files)}); a study has one driver at a time: wait for that one to end, or stop "
                        f"it (Ctrl-C or kill -TERM) and continue with --resume --name {files.root.name} "
                        f"--output {files.root.parent}") from None
    try:
        info = {"pid": os.getpid(), "host": socket.gethostname(), "command": command,
                "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        atomic_write_text(files.driver, json.dumps(info))
        yield
    finally:
        try:
            files.driver.unlink()
        except OSError:
            pass
        lock.release()
