"""What a contract check returns: :class:`CheckResult` (the check, passed / failed / skipped, one
line of why, one line of what to fix), the check names, and one line of an exception.

>>> r = CheckResult("client method clip", DETERMINISM, FAILED, "round 1 differs", "seed what it draws")
>>> r.passed, r.line()
(False, 'client method clip: determinism failed: round 1 differs (fix: seed what it draws)')
>>> merged("client method clip", COMPOSITION, [passed("with fedavg", COMPOSITION, "trains"),
...        failed("with fedomg", COMPOSITION, "NaN", "fix it")]).reason
'with fedomg: NaN (1 of 2 failed)'
"""

from __future__ import annotations

import traceback
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from fedtune.errors import ConfigError, clipped

__all__ = ["CheckResult", "PASSED", "FAILED", "SKIPPED", "CHECKS", "HYPERPARAMETERS", "ONE_LINE_ERRORS",
           "PRESET_PARTS", "COMPOSITION", "FIRST_STEP", "DETERMINISM", "RESUME", "CLIENT_STATE", "RAY",
           "passed", "failed", "skipped", "merged", "exception_line", "config_error_line"]

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"

HYPERPARAMETERS = "hyperparameters"
ONE_LINE_ERRORS = "one-line errors"
PRESET_PARTS = "preset parts"
COMPOSITION = "composition"
FIRST_STEP = "finite first step"
DETERMINISM = "determinism"
RESUME = "checkpoint and resume"
CLIENT_STATE = "keeps_client_state"
RAY = "ray = local"
CHECKS = (HYPERPARAMETERS, ONE_LINE_ERRORS, PRESET_PARTS, COMPOSITION, FIRST_STEP, DETERMINISM, RESUME,
          CLIENT_STATE, RAY)
"""Every check's name, in the order a table lists them."""

_PACKAGE = Path(__file__).resolve().parents[1]
_REASON = 300  # characters of a reason or a fix (one table cell)


@dataclass(frozen=True)
class CheckResult:
    """One check of one component: ``component`` (``"client method feddecorr"``, or the combination
    a composition check ran), ``check`` (one of :data:`CHECKS`), ``status`` (``passed``, ``failed``,
    ``skipped``), ``reason`` (one line: what was found) and ``fix`` (one line: what to change;
    empty when it passed)."""

    component: str
    check: str
    status: str
    reason: str
    fix: str = ""

    @property
    def passed(self) -> bool:
        return self.status == PASSED

    @property
    def failed(self) -> bool:
        return self.status == FAILED

    def line(self) -> str:
        """The result in one line (an assertion message, a log)."""
        fix = f" (fix: {self.fix})" if self.fix and not self.passed else ""
        return f"{self.component}: {self.check} {self.status}: {self.reason}{fix}"


def _one(text: str) -> str:
    return clipped(" ".join(str(text).split()), _REASON)


def passed(component: str, check: str, reason: str) -> CheckResult:
    return CheckResult(component, check, PASSED, _one(reason))


def failed(component: str, check: str, reason: str, fix: str) -> CheckResult:
    return CheckResult(component, check, FAILED, _one(reason), _one(fix))


def skipped(component: str, check: str, reason: str) -> CheckResult:
    return CheckResult(component, check, SKIPPED, _one(reason))


def merged(component: str, check: str, results: Iterable[CheckResult], what: str = "combinations") -> CheckResult:
    """One row of ``check`` for ``component`` from the results of its parts: passed when every part
    passed (the reason counts them), else the first failure's reason (prefixed by its part) and fix."""
    results = list(results)
    bad = [r for r in results if r.failed]
    if not bad:
        shown_parts = [r for r in results if r.passed]
        return passed(component, check, f"{len(shown_parts)} {what} hold" + (
            f"; {sum(r.status == SKIPPED for r in results)} skipped" if len(shown_parts) < len(results) else ""))
    first = bad[0]
    prefix = f"{first.component}: " if first.component != component else ""
    return failed(component, check, f"{prefix}{first.reason} ({len(bad)} of {len(results)} failed)", first.fix)


def exception_line(exc: BaseException) -> str:
    """``Type: message (file.py:LINE in function)``: an exception in one line, where it was raised
    in the user's code (the innermost frame outside fedtune, else the innermost frame)."""
    frames = traceback.extract_tb(exc.__traceback__)
    outside = [f for f in frames if _PACKAGE not in Path(f.filename).resolve().parents]
    frame = (outside or frames or [None])[-1]
    where = f" ({Path(frame.filename).name}:{frame.lineno} in {frame.name})" if frame is not None else ""
    return f"{type(exc).__name__}: {_one(str(exc)) or '(no message)'}{where}"


def config_error_line(exc: BaseException) -> str | None:
    """Why ``exc`` is not a one-line :class:`~fedtune.errors.ConfigError` (None when it is one)."""
    if not isinstance(exc, ConfigError):
        return f"raises {exception_line(exc)}, not a one-line ConfigError"
    text = str(exc)
    if not text or "\n" in text:
        return f"raises a ConfigError of {len(text.splitlines())} lines, not one: {_one(text)}"
    return None
