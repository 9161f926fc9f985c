"""fedtune's error types: the floor every other module imports (it imports nothing of fedtune).

Each message names the field (or file, or resource) at fault and what is allowed, so the
command line can print it as one line without a traceback:

>>> raise ConfigError("field 'rounds': 0 is out of range; allowed: >= 1")
Traceback (most recent call last):
...
fedtune.errors.ConfigError: field 'rounds': 0 is out of range; allowed: >= 1
"""

from __future__ import annotations

import reprlib
from typing import Any

__all__ = ["ConfigError", "DataError", "PluginError", "ResourceError", "INPUT_ERRORS", "clipped", "shown"]


class ConfigError(ValueError):
    """A configuration field has a bad value. The message names the field and what is allowed."""


class DataError(ValueError):
    """A dataset cannot be built or read (unknown name, missing root, bad layout)."""


class PluginError(ConfigError):
    """A plugin (a user's own component, :mod:`fedtune.plugins`) cannot be imported or registered; the
    message names it, its own error and what to do."""


class ResourceError(RuntimeError):
    """The cluster cannot host the run as configured."""


INPUT_ERRORS: tuple[type[Exception], ...] = (ConfigError, DataError, PluginError)
"""The bad-input errors: raised inside a Ray actor they are re-raised as themselves (one line,
as on the local backend), and the command line prints them without a traceback."""


_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxlist, _SHOWN.maxtuple, _SHOWN.maxset = 3, 8, 8, 8
_SHOWN.maxdict, _SHOWN.maxstring, _SHOWN.maxother, _SHOWN.maxlong = 8, 120, 120, 60


def shown(value: Any, limit: int = 200) -> str:
    """``repr(value)`` as an error message may print it: at most ``limit`` characters, found in
    bounded time whatever the value (a list of a billion items, a huge string or number, a
    structure nested or shared many times over). Small values read as ``repr`` does.

    >>> shown([64, 64]), shown("sgd"), shown(list(range(10**6)))
    ('[64, 64]', "'sgd'", '[0, 1, 2, 3, 4, 5, 6, 7, ...]')
    >>> len(shown("x" * 10**6)) <= 200
    True
    """
    try:
        text = _SHOWN.repr(value)
    except Exception:  # noqa: BLE001 - a value whose __repr__ fails is still named
        text = f"<{type(value).__name__}>"
    return clipped(text, limit)


def clipped(text: str, limit: int = 200) -> str:
    """``text`` on one line and at most ``limit`` characters (``...`` marks a cut): a name or
    other text from the user, printed inside an error message.

    >>> clipped("a\\nb"), clipped("x" * 300, 10)
    ('a b', 'xxxxxxx...')
    """
    text = text[:4 * limit]  # split() below stays cheap on a huge text
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."
