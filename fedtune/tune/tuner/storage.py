"""Where Ray Tune keeps a study's experiments and the trials' checkpoints (``--storage-path``).

By default Tune's storage is ``<study>/tune`` on the driver's disk. On a cluster whose trials run
on other nodes, ``--storage-path`` puts it on storage every node reaches (a shared directory, or
a URI of a pyarrow file system such as ``s3://bucket/dir``): Tune uploads each checkpoint there,
so a trial whose node is lost (a spot preemption) restarts on another node from its last
checkpoint (``--max-failures``). The Optuna database and the Arrow store stay on the driver's
disk either way (docs/cluster.md says why).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fedtune.errors import ConfigError

__all__ = ["STATE_PREFIX", "STORAGE_SCHEMES", "check_storage_path", "experiments_in", "local_storage_dir", "restorable",
           "set_aside_unreadable_state"]


def _abs(path: str) -> str:
    return str(Path(path).expanduser().resolve())


STORAGE_SCHEMES = ("file", "s3", "gs", "gcs", "hdfs", "viewfs", "abfs", "abfss", "az")
"""URI schemes ``--storage-path`` accepts (those of pyarrow's file systems, which Ray Tune uses)."""


def check_storage_path(value: str) -> str:
    """Check ``--storage-path`` and return it normalised: a URI of a pyarrow file system
    (``s3://bucket/dir``, ...) or a local directory (made absolute; it must be mounted at the same
    path on every node, which Tune checks when the study starts).

    >>> check_storage_path("s3://lab-bucket/fedtune")
    's3://lab-bucket/fedtune'
    >>> check_storage_path("ftp://host/x")
    Traceback (most recent call last):
    ...
    fedtune.errors.ConfigError: option '--storage-path': scheme 'ftp' is not allowed; allowed: a directory \
shared by every node (e.g. /mnt/nfs/fedtune) or a URI with scheme file, s3, gs, gcs, hdfs, viewfs, abfs, abfss, az
    """
    text = str(value).strip()
    allowed = ("a directory shared by every node (e.g. /mnt/nfs/fedtune) or a URI with scheme "
               + ", ".join(STORAGE_SCHEMES))
    if not text:
        raise ConfigError(f"option '--storage-path': empty; allowed: {allowed}")
    if "://" in text:
        scheme = text.split("://", 1)[0].lower()
        if scheme not in STORAGE_SCHEMES:
            raise ConfigError(f"option '--storage-path': scheme '{scheme}' is not allowed; allowed: {allowed}")
        if scheme == "file":
            return "file://" + str(_abs(text[len("file://"):]))
        return text.rstrip("/")
    return _abs(text)


def local_storage_dir(storage_path: str) -> str | None:
    """The local folder of a normalised ``--storage-path`` (a directory, or a ``file://`` URI); None
    for a remote URI (``s3://...``), whose writability only the remote store can tell.

    >>> local_storage_dir("file:///mnt/nfs/x"), local_storage_dir("/mnt/nfs/x"), local_storage_dir("s3://b/x")
    ('/mnt/nfs/x', '/mnt/nfs/x', None)
    """
    if storage_path.startswith("file://"):
        return storage_path[len("file://"):]
    return None if "://" in storage_path else storage_path


def restorable(location: str | Path) -> bool:
    """Tune can restore the experiment at ``location`` (a local path or a storage URI): it has
    Tune's ``tuner.pkl`` and an experiment snapshot (a driver killed before the first snapshot
    left nothing to restore: the search starts again, continuing the same Optuna study)."""
    from ray import tune  # lazy: keeps ray out of this module's import

    text = str(location)
    if not tune.Tuner.can_restore(text):
        return False
    if "://" not in text:
        return any(Path(text).glob("experiment_state-*.json"))
    import pyarrow.fs  # lazy: keeps pyarrow, numpy out of this module's import

    fs, path = pyarrow.fs.FileSystem.from_uri(text)
    infos = fs.get_file_info(pyarrow.fs.FileSelector(path, allow_not_found=True))
    return any(Path(i.path).name.startswith("experiment_state-") for i in infos)


STATE_PREFIX = "experiment_state-"
"""How Tune names an experiment snapshot: ``experiment_state-<driver session>.json``, one per driver
session (each ``--resume`` starts one), beside that session's ``searcher-state-<session>.pkl``,
``search_gen_state-<session>.json`` and ``callback-states-<session>.pkl``. Tune restores the newest."""


def _fs_and_path(location: str | Path) -> tuple[Any, str]:
    import pyarrow.fs  # lazy: keeps pyarrow, numpy out of this module's import

    text = str(location)
    if "://" in text:
        return pyarrow.fs.FileSystem.from_uri(text)
    return pyarrow.fs.LocalFileSystem(), text


def experiments_in(tune_storage: str | Path) -> list[str]:
    """The Tune experiments (folders) under a study's Tune storage (a local path or a URI)."""
    import pyarrow.fs  # lazy: keeps pyarrow, numpy out of this module's import

    fs, path = _fs_and_path(tune_storage)
    infos = fs.get_file_info(pyarrow.fs.FileSelector(path, allow_not_found=True))
    base = str(tune_storage).rstrip("/")
    return sorted(f"{base}/{Path(i.path).name}" for i in infos if i.type == pyarrow.fs.FileType.Directory)


def _unreadable(fs: Any, path: str) -> str | None:
    """Why the experiment snapshot ``path`` cannot be read (truncated, not JSON, no trials), or None."""
    try:
        with fs.open_input_stream(path) as f:
            doc = json.loads(f.readall())
    except (OSError, ValueError) as exc:  # JSONDecodeError, UnicodeDecodeError: a cut or garbled file
        return f"{type(exc).__name__}: {' '.join(str(exc).split())[:120]}"
    if not isinstance(doc, dict) or not isinstance(doc.get("trial_data"), list):
        return "it holds no trial data"
    return None


def set_aside_unreadable_state(location: str | Path) -> list[str]:
    """Before Tune restores the experiment at ``location``: while its newest snapshot
    (:data:`STATE_PREFIX`) cannot be read (a full disk cut it, a killed copy left half of it), that
    driver session's files are renamed to ``*.corrupt``, so Tune restores the session before it
    (Ray keeps one snapshot per driver session, none of the same session); with none left,
    :func:`restorable` is False and the search's fit starts again on its Optuna study (finished
    trials are kept; trials that were running are closed as orphaned when it ends). Without this,
    Tune logs the JSON error and silently starts the experiment anew, its new trials without the
    study's fixed options. Returns one line per snapshot set aside."""
    import pyarrow.fs  # lazy: keeps pyarrow, numpy out of this module's import

    fs, path = _fs_and_path(location)
    notes: list[str] = []
    while True:
        infos = fs.get_file_info(pyarrow.fs.FileSelector(path, allow_not_found=True))
        names = sorted(Path(i.path).name for i in infos if i.type == pyarrow.fs.FileType.File)
        states = [n for n in names if n.startswith(STATE_PREFIX) and n.endswith(".json")]
        if not states:
            return notes
        newest = states[-1]
        why = _unreadable(fs, f"{path}/{newest}")
        if why is None:
            return notes
        session = newest[len(STATE_PREFIX):-len(".json")]
        for name in names:
            if name.endswith((f"-{session}.json", f"-{session}.pkl")):
                fs.move(f"{path}/{name}", f"{path}/{name}.corrupt")
        older = states[-2] if len(states) > 1 else None
        then = (f"Tune restores the snapshot before it ({older})" if older else
                "no earlier snapshot: the search's Tune fit starts again on its Optuna study (finished trials are "
                "kept; the trials that were running are closed as orphaned when it ends)")
        notes.append(f"Tune's experiment snapshot '{location}/{newest}' cannot be read ({why}; a full disk or a killed "
                     f"copy cuts it): set aside as {newest}.corrupt with its driver session's files; {then}")
