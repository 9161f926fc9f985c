"""Who is building an image cache, and how long another process waits for it.

The builder of a cache entry holds ``<stem>.lock`` (``flock``: released by the OS when its holder
dies) and keeps ``<stem>.owner`` up to date: its pid, host, start time and images decoded so far
(rewritten at most once a second while it decodes). A process that finds the lock taken waits,
says once in a while whom it waits for (the ``fedtune`` logger), and gives up with one
:class:`~fedtune.errors.DataError` line naming the holder when the build has made no progress for
``wait_s`` seconds: a builder that was suspended (``Ctrl-Z``, ``SIGSTOP``) or hung mid-decode keeps
its lock, since it is not dead, and would otherwise block every other run forever.

>>> describe_owner({"pid": 7, "host": "elsewhere", "started": 0, "decoded": 3, "total": 10})
'pid 7 on host elsewhere (started 1970-01-01 00:00:00 UTC, 3 of 10 images decoded)'
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from fedtune.errors import DataError
from fedtune.results.atomic import atomic_write_text

DEFAULT_WAIT_S = 600.0  # the default of the run-config field cache_wait_s
_NOTE_EVERY_S = 30.0


def write_owner(path: Path, *, decoded: int, total: int, started: float) -> None:
    """Record this process as the builder of ``path``'s cache (atomic: a temporary file, then rename)."""
    atomic_write_text(path, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": started,
                                        "decoded": int(decoded), "total": int(total), "time": time.time()}))


def read_owner(path: Path) -> dict[str, Any] | None:
    """The builder's record, or None (no builder recorded, or a record being replaced)."""
    try:
        owner = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return owner if isinstance(owner, dict) else None


def _process_state(pid: Any, host: Any) -> str:
    """``, stopped (suspended)`` when ``pid`` on this host is stopped; ``, not running on this
    host`` when it does not exist here; else nothing (another host, or running)."""
    if host != socket.gethostname() or not isinstance(pid, int):
        return ""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "" if not Path("/proc/self").exists() else ", not running on this host"
    return ", stopped (suspended)" if state in ("T", "t") else ""


def describe_owner(owner: dict[str, Any] | None) -> str:
    """``pid P on host H (started T, k of N images decoded)``: the builder, in a message."""
    if not owner:
        return "another process (it has not recorded itself)"
    started = datetime.fromtimestamp(float(owner.get("started", 0)), timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    return (f"pid {owner.get('pid')} on host {owner.get('host')} (started {started}, {owner.get('decoded')} of "
            f"{owner.get('total')} images decoded{_process_state(owner.get('pid'), owner.get('host'))})")


class BuildProgress:
    """The builder's side: ``<stem>.owner`` written at the start, then at most once a second as
    chunks of images finish (called from the decoding threads), removed when the build ends."""

    def __init__(self, path: Path, total: int):
        self.path, self.total, self.started = path, int(total), time.time()
        self.decoded, self._written = 0, 0.0
        self._lock = threading.Lock()
        write_owner(path, decoded=0, total=total, started=self.started)

    def add(self, images: int) -> None:
        with self._lock:
            self.decoded += images
            now = time.monotonic()
            if now - self._written >= 1.0:
                self._written = now
                write_owner(self.path, decoded=self.decoded, total=self.total, started=self.started)

    def close(self) -> None:
        self.path.unlink(missing_ok=True)


def acquire_build_lock(lock_path: Path, owner_path: Path, *, wait_s: float, what: str):
    """The entry's lock (a held ``filelock.FileLock``), once its holder, if any, lets go. While
    another process holds it: a note every 30 s naming the holder; a :class:`DataError` once the
    holder's recorded progress has not moved for ``wait_s`` seconds. ``what``: the cache, in words."""
    from filelock import FileLock, Timeout  # lazy: keeps filelock out of this module's import

    lock = FileLock(str(lock_path))
    poll = max(0.05, min(2.0, wait_s / 10))
    seen: Any = object()
    stalled_since = time.monotonic()
    next_note = stalled_since + min(_NOTE_EVERY_S, wait_s / 2)
    log = logging.getLogger("fedtune")
    while True:
        try:
            lock.acquire(timeout=poll, poll_interval=min(0.05, poll))
            return lock
        except Timeout:
            pass
        owner = read_owner(owner_path)
        progress = None if owner is None else (owner.get("pid"), owner.get("host"), owner.get("decoded"))
        now = time.monotonic()
        if progress != seen:
            seen, stalled_since = progress, now
        if now - stalled_since >= wait_s:
            raise DataError(
                f"{what} is locked by {describe_owner(owner)}, whose build has made no progress for "
                f"{wait_s:g} s; resume or end that process (its lock goes with it), or raise cache_wait_s "
                f"(field 'cache_wait_s') to wait longer; lock file: {str(lock_path)!r}")
        if now >= next_note:
            next_note = now + _NOTE_EVERY_S
            log.warning("fedtune: waiting for %s, being built by %s; giving up after %g s without progress",
                        what, describe_owner(owner), wait_s)


def remove_stale_temporaries(directory: Path, *, holding: str | None = None) -> list[Path]:
    """Remove the temporary files builders that were killed left in ``directory``: a temporary file
    of an entry whose lock nobody holds (``holding``: the stem whose lock this process holds).
    Returns what was removed."""
    from filelock import FileLock, Timeout  # lazy: keeps filelock out of this module's import

    removed = []
    for tmp in sorted(directory.glob(".*.tmp*")):
        stem = tmp.name[1:].split(".", 1)[0]
        if stem != holding:
            lock = FileLock(str(directory / f"{stem}.lock"))
            try:
                lock.acquire(timeout=0)
            except (Timeout, OSError):
                continue  # its builder is alive (or the lock cannot be taken): leave it
            lock.release()
        tmp.unlink(missing_ok=True)
        removed.append(tmp)
    return removed

