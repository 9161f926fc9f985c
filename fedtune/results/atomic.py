"""The one atomic write of fedtune: every results, study, report and plot file goes through it.

The content is written to a hidden temporary file in the target's directory
(``.<name>.<random>.tmp``), given ordinary permissions (the umask's, not ``mkstemp``'s 0600), and
then moved over the target with :func:`os.replace`. A process that dies mid-write leaves the
previous complete file in place (and at worst a stray hidden ``.tmp`` file, which readers ignore).

>>> import tempfile
>>> from pathlib import Path
>>> p = Path(tempfile.mkdtemp()) / "note.txt"
>>> atomic_write_text(p, "one")
PosixPath('...note.txt')
>>> atomic_write(p, lambda tmp: Path(tmp).write_text("two")).read_text()
'two'
>>> sorted(q.name for q in p.parent.iterdir())  # no temporary file left behind
['note.txt']
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["atomic_write", "atomic_write_text"]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str | os.PathLike[str], write: Callable[[str], Any]) -> Path:
    """Call ``write(tmp_path)`` to fill a temporary file next to ``path``, then atomically move it
    to ``path`` (its folder is created). ``write`` must write to exactly ``tmp_path``, whose name
    ends in ``.tmp``: give writers that go by the extension the format (``savefig(tmp,
    format="png")``) or an open file (``np.save(f, a)`` adds ``.npy`` to a name). On any error the temporary file is removed and the
    error propagates; ``path`` keeps its previous content. Returns ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """:func:`atomic_write` of a UTF-8 text file."""
    return atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
