"""THE way fedtune declares a bounded value and words its error.

Every user-settable value (a run field of :class:`~fedtune.config.FederatedRunConfig`, a client
method's or server rule's :class:`~fedtune.algorithms.base.HParam`, an option of
:class:`~fedtune.tune.study.options.SweepOptions`) declares its allowed values as one :class:`Bounds`, and
every check goes through :meth:`Bounds.check`, so a bad value reads the same wherever it was
given: ``<where>: <value> is not allowed | is out of range | is not a finite number; allowed: ...``.
Type conversion (a YAML string to an int, ...) stays with each caller, which knows its types;
:meth:`Bounds.check` takes the converted value. Written by hand: dataclass field metadata is the
declaration, and no maintained library words the error as fedtune's one-line messages do.

>>> Bounds(lo=0.0, lo_open=True).check("field 'local_lr'", 0.0)
Traceback (most recent call last):
...
fedtune.errors.ConfigError: field 'local_lr': 0.0 is out of range; allowed: > 0
>>> Bounds(choices=("sgd", "adam")).check("option '--x'", "sgd")
'sgd'
>>> Bounds(lo=1).text()
'>= 1'
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from fedtune.errors import ConfigError, shown


@dataclass(frozen=True)
class Bounds:
    """Allowed values: one of ``choices`` (when given), and for a number ``lo <= v <= hi``
    (``lo < v`` when ``lo_open``, ``v < hi`` when ``hi_open``), finite. ``None`` is accepted as "unset" by every check: a field
    that may not be unset says so in its type."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    choices: tuple[Any, ...] = ()
    note: str = ""  # said after the range: "-1: unlimited"
    hi_open: bool = False  # hi excluded: server_beta1 < 1

    def text(self) -> str:
        """The allowed range as the error messages print it: ``>= 0 and <= 1``, ``> 0``."""
        parts = []
        if self.lo is not None:
            parts.append(f"{'>' if self.lo_open else '>='} {self.lo:g}")
        if self.hi is not None:
            op = "<" if self.hi_open else "<="
            parts.append(f"{op} {self.hi:g}" if isinstance(self.hi, float) else f"{op} {self.hi}")
        return " and ".join(parts) + (f" ({self.note})" if self.note else "")

    def check(self, where: str, value: Any, *, extra_choices: bool = False) -> Any:
        """``value`` when allowed, else a :class:`~fedtune.errors.ConfigError` naming ``where``.

        ``extra_choices``: ``choices`` are allowed *besides* numbers in range (β = 0.5 or
        ``"auto"``), not instead of them."""
        if value is None:
            return value
        if self.choices and value in self.choices:
            return value
        if self.choices and not extra_choices:
            raise ConfigError(f"{where}: {shown(value)} is not allowed; allowed: {', '.join(map(str, self.choices))}")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"{where}: {shown(value)} is not a finite number")
            below = self.lo is not None and (value <= self.lo if self.lo_open else value < self.lo)
            above = self.hi is not None and (value >= self.hi if self.hi_open else value > self.hi)
            if below or above:
                raise ConfigError(f"{where}: {shown(value)} is out of range; allowed: {self.text()}")
        return value
