"""Where Ray Tune keeps a study's experiments and the trials' checkpoints (``--storage-path``).

By default Tune's storage is ``<study>/tune`` on the driver's disk. On a cluster whose trials run
on other nodes, ``--storage-path`` puts it on storage every node reaches (a shared directory, or
a URI of a pyarrow file system such as ``s3://bucket/dir``): Tune uploads each checkpoint there,
so a trial whose node is lost (a spot preemption) restarts on another node from its last
checkpoint (``--max-failures``). The Optuna database and the Arrow store stay on the driver's
disk either way (docs/cluster.md says why).
"""

from __future__ import annotations

from pathlib import Path

from fedtune.errors import ConfigError

__all__ = ["STORAGE_SCHEMES", "check_storage_path", "restorable"]


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


def restorable(location: str | Path) -> bool:
    """Tune can restore the experiment at ``location`` (a local path or a storage URI): it has
    Tune's ``tuner.pkl`` and an experiment snapshot (a driver killed before the first snapshot
    left nothing to restore: the search starts again, continuing the same Optuna study)."""
    from ray import tune

    text = str(location)
    if not tune.Tuner.can_restore(text):
        return False
    if "://" not in text:
        return any(Path(text).glob("experiment_state-*.json"))
    import pyarrow.fs

    fs, path = pyarrow.fs.FileSystem.from_uri(text)
    infos = fs.get_file_info(pyarrow.fs.FileSelector(path, allow_not_found=True))
    return any(Path(i.path).name.startswith("experiment_state-") for i in infos)
