"""Studies written before a module moved still resume: the old module paths their pickles name.

Ray Tune pickles its experiment state (``tuner.pkl``, the searcher's state) with plain
:mod:`pickle`, which names every class by the module it was defined in. When fedtune moves a
module, a study started before the move fails to unpickle on ``--resume`` (``fedtune.tune.spaces_model
moved: use fedtune.spaces.model``). :func:`old_module_names` makes each old path in
:data:`fedtune.old_names.MOVED_MODULES` name its new module, only while a study is restored and
fitted, and removes them afterwards: nothing else in fedtune ever imports a name by its old path.
Written by hand: :mod:`pickle` has no rename table of its own, and Ray Tune calls ``pickle.loads`` itself.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from fedtune.old_names import MOVED_MODULES


def _is_module(name: str) -> bool:
    """Whether ``name`` is a module of its own: imported already, or found by a real finder (an
    old path only reaches :class:`fedtune.old_names.OldNamesFinder`, which raises its one line)."""
    if name in sys.modules:
        return True
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:
        return False


@contextmanager
def old_module_names() -> Iterator[None]:
    """Within the block, ``import``/unpickling of an old path in
    :data:`~fedtune.old_names.MOVED_MODULES` gives its new module; paths that exist again (or were
    already there) are left alone.

    >>> import pickle
    >>> from fedtune.spaces.model import Switch
    >>> old = pickle.dumps(Switch, protocol=0).replace(b"fedtune.spaces.model", b"fedtune.tune.spaces_model")
    >>> with old_module_names():
    ...     pickle.loads(old) is Switch
    True
    >>> "fedtune.tune.spaces_model" in sys.modules
    False
    >>> pickle.loads(old)
    Traceback (most recent call last):
    ...
    ImportError: fedtune.tune.spaces_model moved: use fedtune.spaces.model
    """
    added = []
    for old, new in MOVED_MODULES.items():
        if _is_module(old):
            continue  # the old path is a module (again): never shadow it
        sys.modules[old] = importlib.import_module(new)
        added.append(old)
    try:
        yield
    finally:
        for old in added:
            sys.modules.pop(old, None)
