"""Hyperparameter declarations shared by client methods and server rules."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from fedtune.bounds import Bounds
from fedtune.errors import ConfigError, shown

T = TypeVar("T")


@dataclass(frozen=True)
class HParam(Generic[T]):
    """A hyperparameter a component declares: default, allowed values, meaning.

    ``kind`` is ``float``, ``int``, ``bool`` or ``choice`` (``choices`` lists the values;
    ``float_or_choice`` accepts a number in range or one of ``choices``, e.g. β = 0.5 or "auto").
    ``lo_open=True`` makes ``lo`` exclusive (``sam_rho > 0``), ``hi_open=True`` makes ``hi``
    exclusive (``server_beta1 < 1``). ``variant=True`` marks a choice
    between a paper and its authors' code that changes results (FedGaLA's gate sign, FedOMG's
    solver, ...): every report says which value ran.

    A component reads its values once, typed, when it is built: ``self.kappa = OMG_KAPPA.of(cfg)``
    (the value the config holds, already checked by :meth:`check` when it was validated, else
    the default).

    >>> RHO = HParam("r", 1.0, "radius", lo=0.0, lo_open=True)
    >>> RHO.check("0.5", "test")
    0.5
    >>> RHO.check(0, "test")
    Traceback (most recent call last):
    ...
    fedtune.errors.ConfigError: field 'r' (test): 0.0 is out of range; allowed: > 0
    """

    name: str
    default: T
    help: str
    kind: str = "float"
    lo: float | None = None
    hi: float | None = None
    choices: tuple[Any, ...] = ()
    variant: bool = False
    lo_open: bool = False
    hi_open: bool = False

    @property
    def bounds(self) -> Bounds:
        return Bounds(lo=self.lo, hi=self.hi, lo_open=self.lo_open, choices=self.choices, hi_open=self.hi_open)

    def check(self, value: Any, owner: str) -> T:
        """``value`` converted to this hyperparameter's kind, or a ConfigError naming the field and
        ``owner`` (the component(s) declaring it) with the allowed values."""
        where = f"field '{self.name}' ({owner})"
        if self.kind in ("choice", "float_or_choice") and value in self.choices:
            return value
        if self.kind == "choice":
            return self.bounds.check(where, value)  # not a choice: the error
        if self.kind == "bool":
            if isinstance(value, bool):
                return value  # type: ignore[return-value]
            raise ConfigError(f"{where}: expected true or false, got {shown(value)}")
        try:
            if isinstance(value, bool):
                raise TypeError
            num = int(value) if self.kind == "int" else float(value)
        except (TypeError, ValueError, OverflowError):
            allowed = (f"a number or one of {', '.join(map(str, self.choices))}" if self.choices else
                       f"a{'n integer' if self.kind == 'int' else ' number'}")
            raise ConfigError(f"{where}: expected {allowed}, got {shown(value)}") from None
        if self.kind == "int" and float(value) != num:
            raise ConfigError(f"{where}: expected an integer, got {shown(value)}")
        return self.bounds.check(where, num, extra_choices=True)

    def of(self, cfg: Any) -> T:
        """This hyperparameter's value in ``cfg`` (a validated
        :class:`~fedtune.config.FederatedRunConfig`): the one set, else the default."""
        return cfg.params.get(self.name, self.default)
