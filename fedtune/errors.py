"""fedtune's error types: the floor every other module imports (it imports nothing of fedtune).

Each message names the field (or file, or resource) at fault and what is allowed, so the
command line can print it as one line without a traceback:

>>> raise ConfigError("field 'rounds': 0 is out of range; allowed: >= 1")
Traceback (most recent call last):
...
fedtune.errors.ConfigError: field 'rounds': 0 is out of range; allowed: >= 1
"""

from __future__ import annotations

__all__ = ["ConfigError", "DataError", "ResourceError", "INPUT_ERRORS"]


class ConfigError(ValueError):
    """A configuration field has a bad value. The message names the field and what is allowed."""


class DataError(ValueError):
    """A dataset cannot be built or read (unknown name, missing root, bad layout)."""


class ResourceError(RuntimeError):
    """The cluster cannot host the run as configured."""


INPUT_ERRORS: tuple[type[Exception], ...] = (ConfigError, DataError)
"""The bad-input errors: raised inside a Ray actor they are re-raised as themselves (one line,
as on the local backend), and the command line prints them without a traceback."""
