"""Studies written before a module moved still resume: the old module paths their pickles name.

Ray Tune pickles its experiment state (``tuner.pkl``, the searcher's state) with plain
:mod:`pickle`, which names every class by the module it was defined in. When fedtune moves a
module, a study started before the move fails to unpickle on ``--resume`` (``No module named
'fedtune.tune.spaces_model'``). :func:`old_module_names` makes each old path in :data:`MOVED`
name its new module, only while a study is restored and fitted, and removes them afterwards:
nothing else in fedtune ever imports a name by its old path. Written by hand: :mod:`pickle`
has no rename table of its own, and Ray Tune calls ``pickle.loads`` itself.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager

MOVED: dict[str, str] = {
    # fedtune 0.1, house-keeping (#18): search spaces and reports left tune/
    "fedtune.tune.spaces": "fedtune.spaces.lookup",
    "fedtune.tune.spaces_model": "fedtune.spaces.model",
    "fedtune.tune.spaces_yaml": "fedtune.spaces.yaml_files",
    "fedtune.tune.optuna_url": "fedtune.results.optuna_url",
    "fedtune.tune.report": "fedtune.reports.report",
    "fedtune.tune.report_model": "fedtune.reports.model",
    "fedtune.tune.report_stats": "fedtune.reports.stats",
    "fedtune.tune.report_render": "fedtune.reports.render",
    "fedtune.tune.plots": "fedtune.reports.plots",
    "fedtune.tune.importances": "fedtune.reports.importances",
}
"""Old module path -> the module that holds its classes now (same class names)."""


@contextmanager
def old_module_names() -> Iterator[None]:
    """Within the block, ``import``/unpickling of an old path in :data:`MOVED` gives its new
    module; paths that exist again (or were already there) are left alone.

    >>> import pickle
    >>> from fedtune.spaces.model import Switch
    >>> old = pickle.dumps(Switch, protocol=0).replace(b"fedtune.spaces.model", b"fedtune.tune.spaces_model")
    >>> with old_module_names():
    ...     pickle.loads(old) is Switch
    True
    >>> "fedtune.tune.spaces_model" in sys.modules
    False
    """
    added = []
    for old, new in MOVED.items():
        if old in sys.modules or importlib.util.find_spec(old) is not None:
            continue  # the old path is a module (again): never shadow it
        sys.modules[old] = importlib.import_module(new)
        added.append(old)
    try:
        yield
    finally:
        for old in added:
            sys.modules.pop(old, None)
