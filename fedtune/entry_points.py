"""Installed packages' plugins: the entry points of group ``fedtune.plugins``, loaded once per process.

A package that ships fedtune components declares them in its ``pyproject.toml``::

    [project.entry-points."fedtune.plugins"]
    my_methods = "my_methods"              # a module: importing it registers its components
    clipped = "my_methods:Clipped"         # or one component (a class carrying its spec, a spec, a preset)

fedtune loads them on the first use of a registry in every process (the driver, Ray Tune's trial
processes, the coordinator and client actors), as pytest loads the ``pytest11`` entry points of the
packages installed beside it. An entry point that fails to load is one warning line naming it and
its error; the others still load. Written by hand over :mod:`importlib.metadata` (pluggy, pytest's
plugin manager, is a hook-calling framework fedtune has no hooks for).

The floor of the house: this module imports nothing of fedtune, so the registries of every layer
(:mod:`fedtune.algorithms`, :mod:`fedtune.data.registry`) can load the entry points on first use.
"""

from __future__ import annotations

import importlib.metadata
import threading
import warnings
from dataclasses import dataclass
from typing import Any

GROUP = "fedtune.plugins"
"""The entry-point group of fedtune's plugins."""


@dataclass(frozen=True)
class LoadedEntryPoint:
    """One entry point of :data:`GROUP` as this process loaded it: its ``name``, its ``value``
    (``"module"`` or ``"module:attr"``), the ``distribution`` that declares it (name and version) and
    the loaded ``obj`` (a module or the attribute), or ``error`` (one line) when it failed."""

    name: str
    value: str
    distribution: str | None
    version: str | None
    obj: Any = None
    error: str | None = None


_lock = threading.RLock()
_loaded: list[LoadedEntryPoint] | None = None


def load_entry_points() -> list[LoadedEntryPoint]:
    """Every installed entry point of :data:`GROUP`, each imported once per process (the first call
    loads them, in name order; later calls return the same list). A failing one is warned about
    (:class:`PluginWarning`, one line naming it) and kept with its ``error``; the rest still load.
    Re-entrant: a plugin module that uses a registry while it is imported sees the list so far."""
    global _loaded
    with _lock:
        if _loaded is not None:
            return _loaded
        _loaded = []
        for ep in sorted(importlib.metadata.entry_points(group=GROUP), key=lambda e: (e.name, e.value)):
            dist = getattr(ep, "dist", None)
            name = getattr(dist, "name", None) if dist is not None else None
            version = getattr(dist, "version", None) if dist is not None else None
            try:
                obj = ep.load()
            except Exception as exc:  # noqa: BLE001 - any failure of a third party's import is reported, not raised
                error = f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:300]
                warnings.warn(f"fedtune plugin entry point {ep.name!r} ({ep.value}, from {name or 'an unknown package'}) "
                              f"failed to load and is skipped: {error}", PluginWarning, stacklevel=2)
                _loaded.append(LoadedEntryPoint(ep.name, ep.value, name, version, error=error))
                continue
            _loaded.append(LoadedEntryPoint(ep.name, ep.value, name, version, obj=obj))
        return _loaded


def forget_entry_points() -> None:
    """Load the entry points again on the next use (tests that install or remove a distribution)."""
    global _loaded
    with _lock:
        _loaded = None


class PluginWarning(UserWarning):
    """A plugin could not be loaded and was skipped (the message names it)."""


__all__ = ["GROUP", "LoadedEntryPoint", "PluginWarning", "forget_entry_points", "load_entry_points"]
