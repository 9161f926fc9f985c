"""The one atomic write of fedtune: every results, study, report and plot file goes through it.

The content is written to a hidden temporary file in the target's directory
(``.<name>.fedtune-<random>.tmp``: :func:`is_temp_name` recognises it, and the names of older
versions, ``.<name>.<random>.tmp``), given ordinary permissions (the umask's, not ``mkstemp``'s
0600), and then moved over the target with :func:`os.replace`. A process that dies mid-write leaves
the previous complete file in place (and at worst a stray hidden ``.tmp`` file, which readers
ignore and :func:`fedtune.results.store.clean_stray_temp_files` removes).

A write that the device or the folder refuses (full disk, quota, permissions, read-only file
system) is a :class:`ResultsWriteError` (a full device: :class:`StorageFullError`) whose message
names the file: one line on the command line (a :class:`~fedtune.errors.ResourceError`, and an
:class:`OSError` for code that handles those).

>>> import tempfile
>>> from pathlib import Path
>>> p = Path(tempfile.mkdtemp()) / "note.txt"
>>> atomic_write_text(p, "one")
PosixPath('...note.txt')
>>> atomic_write(p, lambda tmp: Path(tmp).write_text("two")).read_text()
'two'
>>> sorted(q.name for q in p.parent.iterdir())  # no temporary file left behind
['note.txt']
>>> is_temp_name(".note.txt.fedtune-a1b2c3d4.tmp"), is_temp_name("note.txt")
('note.txt', None)
"""

from __future__ import annotations

import base64
import errno as _errno
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fedtune.errors import ResourceError

__all__ = ["TEMP_MARKER", "ResultsWriteError", "StorageFullError", "atomic_write", "atomic_write_bytes",
           "atomic_write_text", "is_temp_name", "write_error", "write_error_in", "writes_to"]

TEMP_MARKER = ".fedtune-"
"""What names a temporary file of :func:`atomic_write`: ``.<target name>.fedtune-<8 random>.tmp``."""

# the random part: 8 characters of this alphabet (tempfile._RandomNameSequence's, mkstemp's before; now
# base32 of os.urandom, a-z and 2-7)
_RANDOM = r"[a-z0-9_]{8}"
_TEMP_NAME = re.compile(rf"^\.(?P<target>.+){re.escape(TEMP_MARKER)}{_RANDOM}\.tmp$")
# Before the marker (fedtune <= 0.1.0): ``.<name>.<random>.tmp``. Recognised only for the kinds of
# file the writer wrote (results, study/driver files, report, plots), so a user's hidden file is not.
_OLD_TEMP_NAME = re.compile(rf"^\.(?P<target>.+\.(?:parquet|json|md|png|npy|npz))\.{_RANDOM}\.tmp$")

_FULL = {_errno.ENOSPC: "no space left on device", _errno.EDQUOT: "disk quota exceeded"}
_REFUSED = {_errno.EACCES: "permission denied", _errno.EPERM: "operation not permitted",
            _errno.EROFS: "read-only file system"}


class ResultsWriteError(ResourceError, OSError):
    """A file of fedtune's could not be written: the folder refuses it (permissions, a read-only file
    system) or the device is full (:class:`StorageFullError`). The message names the file and the
    reason, then what :meth:`with_context` added; ``path`` is the file, ``errno`` the system's code.
    Every earlier file is intact (each write is atomic)."""

    def __init__(self, message: str, path: str | os.PathLike[str], code: int | None = None):
        OSError.__init__(self, code, message, str(path))
        self.message = message
        self.path = Path(path)

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[Any, ...]:  # pickles (a Ray trial's error) with its message
        return type(self), (self.message, self.path, self.errno)

    def with_context(self, text: str) -> ResultsWriteError:
        """The same error, its message followed by ``; <text>`` (what is intact, what to do)."""
        new = type(self)(f"{self.message}; {text}", self.path, self.errno)
        new.__cause__ = self.__cause__
        return new


class StorageFullError(ResultsWriteError):
    """The device holding a file of fedtune's is full (ENOSPC) or its quota is spent (EDQUOT)."""


def _errno_of(exc: BaseException) -> int | None:
    code = getattr(exc, "errno", None)
    if isinstance(code, int) and code:
        return code
    m = re.search(r"\[errno (\d+)\]", str(exc), re.IGNORECASE)  # Arrow's errors may carry it in the text only
    return int(m.group(1)) if m else None


def write_error(path: str | os.PathLike[str], exc: BaseException) -> ResultsWriteError | None:
    """``exc`` (raised while writing ``path``) as a :class:`ResultsWriteError` naming ``path``, when it
    says the device is full or the folder refuses the write; else None (another error stays itself).

    >>> str(write_error("/o/s/trials.parquet", OSError(28, "No space left on device")))
    "no space left on device writing '/o/s/trials.parquet'"
    >>> write_error("/o/x", ValueError("bad")) is None
    True
    """
    if isinstance(exc, ResultsWriteError):
        return exc
    if not isinstance(exc, OSError):
        return None
    code = _errno_of(exc)
    if code in _FULL:
        err: ResultsWriteError = StorageFullError(f"{_FULL[code]} writing '{path}'", path, code)
    elif code in _REFUSED:
        err = ResultsWriteError(f"cannot write '{path}': {_REFUSED[code]}", path, code)
    else:
        return None
    err.__cause__ = exc
    return err


_DB_FULL = ("database or disk is full", "disk full")  # SQLite's SQLITE_FULL; MySQL's "The table is full"
_DB_REFUSED = ("attempt to write a readonly database", "readonly database")


def write_error_in(exc: BaseException, path: str | os.PathLike[str]) -> ResultsWriteError | None:
    """The first error in ``exc``'s chain (its causes and contexts) that says a device is full or a
    folder refuses writes, as a :class:`ResultsWriteError`: an :class:`OSError` (:func:`write_error`,
    naming its own file when it has one, else ``path``) or a database's own words for it (SQLite's
    "database or disk is full", "attempt to write a readonly database"), naming ``path`` (the
    database). None when nothing in the chain says so.

    >>> import sqlite3
    >>> try:
    ...     try:
    ...         raise sqlite3.OperationalError("database or disk is full")
    ...     except sqlite3.OperationalError as e:
    ...         raise RuntimeError("An exception is raised during the commit") from e
    ... except RuntimeError as e:
    ...     str(write_error_in(e, "/o/s/optuna.db"))
    "no space left on device writing '/o/s/optuna.db'"
    """
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen and len(seen) < 16:
        seen.add(id(e))
        if isinstance(e, ResultsWriteError):
            return e
        if isinstance(e, OSError):
            err = write_error(getattr(e, "filename", None) or path, e)
            if err is not None:
                return err
        text = str(e).lower()
        if any(words in text for words in _DB_FULL):
            return StorageFullError(f"{_FULL[_errno.ENOSPC]} writing '{path}'", path, _errno.ENOSPC)
        if any(words in text for words in _DB_REFUSED):
            return ResultsWriteError(f"cannot write '{path}': {_REFUSED[_errno.EROFS]}", path, _errno.EROFS)
        e = e.__cause__ or e.__context__
    return None


@contextmanager
def writes_to(path: str | os.PathLike[str]) -> Iterator[None]:
    """Within the block, an error of writing ``path`` that :func:`write_error` recognises is raised as
    that :class:`ResultsWriteError`."""
    try:
        yield
    except OSError as exc:
        err = write_error(path, exc)
        if err is None or err is exc:
            raise
        raise err from exc


def is_temp_name(name: str) -> str | None:
    """The target's name when ``name`` is a temporary file of :func:`atomic_write` (this version's
    or an older one's), else None."""
    m = _TEMP_NAME.match(name) or _OLD_TEMP_NAME.match(name)
    return m.group("target") if m else None


_OPEN_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)


def _open_temp(path: Path) -> tuple[int, str]:
    """Create the temporary file of ``path`` (its folder too when missing) and open it for writing:
    a new name (``mkstemp``'s way: ``O_EXCL``, another name when taken), mode 0o666 less the umask
    (what any new file gets; ``mkstemp``'s 0600 then a ``chmod`` cost three more system calls)."""
    for _ in range(100):
        part = base64.b32encode(os.urandom(5)).decode("ascii").lower()  # 8 of [a-z2-7]
        tmp = str(path.parent / f".{path.name}{TEMP_MARKER}{part}.tmp")
        try:
            return os.open(tmp, _OPEN_FLAGS, 0o666), tmp
        except FileExistsError:
            continue
        except FileNotFoundError:  # the folder is missing (only then: no mkdir on every write)
            path.parent.mkdir(parents=True, exist_ok=True)
    raise FileExistsError(_errno.EEXIST, "no free temporary file name", str(path.parent))


def atomic_write(path: str | os.PathLike[str], write: Callable[[str], Any]) -> Path:
    """Call ``write(tmp_path)`` to fill a temporary file next to ``path``, then atomically move it
    to ``path`` (its folder is created). ``write`` must write to exactly ``tmp_path``, whose name
    ends in ``.tmp``: give writers that go by the extension the format (``savefig(tmp,
    format="png")``) or an open file (``np.save(f, a)`` adds ``.npy`` to a name). On any error the temporary file is removed and the
    error propagates (a full device or a refused write as a :class:`ResultsWriteError` naming
    ``path``); ``path`` keeps its previous content. Returns ``path``."""
    path = Path(path)
    with writes_to(path):
        fd, tmp = _open_temp(path)
        os.close(fd)
        try:
            write(tmp)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    return path


def _write_all(fd: int, data: Any) -> None:
    """Write all of ``data`` (a buffer) to the descriptor ``fd``."""
    view = memoryview(data).cast("B")
    while view:
        view = view[os.write(fd, view):]


def atomic_write_bytes(path: str | os.PathLike[str], data: Any) -> Path:
    """:func:`atomic_write` of ``data`` (bytes or any buffer: an Arrow ``Buffer``) through the one
    descriptor that created the temporary file: no second open by a writer given its name (with
    pyarrow's file system layer, 0.3 ms of a rounds file's write)."""
    path = Path(path)
    with writes_to(path):
        fd, tmp = _open_temp(path)
        try:
            try:
                _write_all(fd, data)
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    return path


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """:func:`atomic_write` of a UTF-8 text file."""
    return atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
