"""Hyperparameter declarations shared by client methods and server rules."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class HParam:
    """A hyperparameter a component declares: default, allowed values, meaning.

    ``kind`` is ``float``, ``int``, ``bool`` or ``choice`` (``choices`` lists the values;
    ``float_or_choice`` accepts a number in range or one of ``choices``, e.g. β = 0.5 or "auto").
    ``variant=True`` marks a choice between a paper and its authors' code that changes results
    (FedGaLA's gate sign, FedOMG's solver, ...): every report says which value ran.
    """

    name: str
    default: Any
    help: str
    kind: str = "float"
    lo: float | None = None
    hi: float | None = None
    choices: tuple[Any, ...] = ()
    variant: bool = False

    def check(self, value: Any, owner: str) -> Any:
        from fedtune.errors import ConfigError, shown

        where = f"field '{self.name}' ({owner})"
        if self.kind in ("choice", "float_or_choice") and value in self.choices:
            return value
        if self.kind == "choice":
            raise ConfigError(f"{where}: {shown(value)} is not allowed; allowed: {', '.join(map(str, self.choices))}")
        if self.kind == "bool":
            if isinstance(value, bool):
                return value
            raise ConfigError(f"{where}: expected true or false, got {shown(value)}")
        try:
            num = int(value) if self.kind == "int" else float(value)
        except (TypeError, ValueError):
            allowed = f"a number or one of {', '.join(map(str, self.choices))}" if self.choices else f"a{'n integer' if self.kind == 'int' else ' number'}"
            raise ConfigError(f"{where}: expected {allowed}, got {shown(value)}") from None
        if self.kind == "int" and float(value) != num:
            raise ConfigError(f"{where}: expected an integer, got {shown(value)}")
        if (self.lo is not None and num < self.lo) or (self.hi is not None and num > self.hi):
            rng = " and ".join(p for p in (f">= {self.lo:g}" if self.lo is not None else "",
                                             f"<= {self.hi:g}" if self.hi is not None else "") if p)
            raise ConfigError(f"{where}: {shown(value)} is out of range; allowed: {rng}")
        return num
