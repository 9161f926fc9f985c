"""Studies written before a module moved still resume: the old module paths their pickles name.

Ray Tune pickles its experiment state (``tuner.pkl``, the searcher's state) with plain
:mod:`pickle`, which names every class by the module it was defined in. When fedtune moves a
module, a study started before the move fails to unpickle on ``--resume`` (``fedtune.tune.spaces_model
moved: use fedtune.spaces.model``). :func:`old_module_names` makes each old path in
:data:`fedtune.old_names.MOVED_MODULES` name its new module, only while a study is restored and
fitted, and removes them afterwards: nothing else in fedtune ever imports a name by its old path.
The new module is imported only when a pickle asks the old path for a name (importing all of them
up front cost a fresh sweep driver ~5 CPU-seconds: torch, MLflow and W&B among them).
Written by hand: :mod:`pickle` has no rename table of its own, and Ray Tune calls ``pickle.loads`` itself.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
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


def _alias(old: str, new: str) -> types.ModuleType:
    """A stand-in module for ``old`` whose names are ``new``'s, imported on first use (PEP 562)."""
    alias = types.ModuleType(old, f"{old} moved to {new}: its names, while a study is restored.")

    def __getattr__(name: str):
        if name.startswith("__"):  # tools that walk sys.modules (__file__, __path__) import nothing
            raise AttributeError(name)
        module = importlib.import_module(new)
        try:
            return getattr(module, name)
        except AttributeError:
            raise AttributeError(f"{old} (now {new}) has no name {name!r}") from None

    alias.__getattr__ = __getattr__  # type: ignore[method-assign]
    return alias


@contextmanager
def old_module_names() -> Iterator[None]:
    """Within the block, ``import``/unpickling of an old path in
    :data:`~fedtune.old_names.MOVED_MODULES` gives its new module's names (the new module is imported
    when the first name is read); paths that exist again (or were already there) are left alone.

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
        sys.modules[old] = _alias(old, new)
        added.append(old)
    try:
        yield
    finally:
        for old in added:
            sys.modules.pop(old, None)
