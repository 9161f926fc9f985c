"""Contracts of what a component declares, checked without training: every hyperparameter
(:func:`check_hparam`), a hyperparameter of a component the run does not use (:func:`check_unused`)
and a preset's parts (:func:`check_preset_parts`).

A hyperparameter's values are drawn from its declaration: its default, its choices and its closed
bounds validate (and read back as themselves); a value outside its bounds, of the wrong kind or
not among its choices is one :class:`~fedtune.errors.ConfigError` line that starts with
``field 'NAME' (OWNERS): `` and says what is allowed; a value the declaration allows but that no
bound limits (a float with no lower bound at -1) validates or is one ConfigError line (a cross-field
check may refuse it), never a traceback; a search distribution lies inside the bounds.

>>> h = HParam("clip", 1.0, "clip norm", lo=0.0, lo_open=True)
>>> [v for v, _ in bad_values(h)][:3], good_values(h), probe_values(h)
(['not-a-number', True, [1]], [1.0], [10000.0, 1e-06])
>>> search_problems(HParam("c", 1.0, "c", lo=0.0, search={"distribution": "uniform", "low": -1, "high": 2,
...                                                        "default": 1}))
["search low -1: field 'c' (search): -1.0 is out of range; allowed: >= 0"]
"""

from __future__ import annotations

from typing import Any

from fedtune.algorithms import CLIENT_METHODS, SERVER_OPTIMIZERS, SERVER_RULES, Resolved, all_hparams
from fedtune.algorithms.base import HParam
from fedtune.algorithms.presets import PRESETS
from fedtune.config import FederatedRunConfig
from fedtune.contracts.result import (HYPERPARAMETERS, ONE_LINE_ERRORS, PRESET_PARTS, CheckResult, config_error_line,
                                      exception_line, failed, passed)
from fedtune.errors import ConfigError

__all__ = ["REGISTRIES", "bad_values", "good_values", "probe_values", "range_text", "search_problems",
           "owner_fields", "check_hparam", "check_unused", "check_preset_parts"]

REGISTRIES = {"client method": (CLIENT_METHODS, "client_method"), "server rule": (SERVER_RULES, "server_rule"),
              "server optimizer": (SERVER_OPTIMIZERS, "server_optimizer")}
"""Each kind of component: its registry and the run field that names it."""


def range_text(h: HParam) -> str:
    parts = []
    if h.lo is not None:
        parts.append(f"{'>' if h.lo_open else '>='} {h.lo:g}")
    if h.hi is not None:
        parts.append(f"{'<' if h.hi_open else '<='} {h.hi:g}")
    return " and ".join(parts)


def bad_values(h: HParam) -> list[tuple[Any, str]]:
    """Values ``h`` refuses, from its declaration, each with what its error must say is allowed."""
    if h.kind == "choice":
        allowed = "allowed: " + ", ".join(map(str, h.choices))
        return [("-".join(map(str, h.choices)), allowed), (1.5, allowed), (None, allowed)]
    if h.kind == "bool":
        return [("maybe", "expected true or false"), (1, "expected true or false"), ("true", "expected true or false")]
    number = {"float": "a number", "int": "an integer",
              "float_or_choice": "a number or one of " + ", ".join(map(str, h.choices))}[h.kind]
    out: list[tuple[Any, str]] = [("not-a-number", f"expected {number}"), (True, f"expected {number}"),
                                  ([1], f"expected {number}")]
    if h.kind == "int" and isinstance(h.default, int):
        out.append((h.default + 0.5, "expected an integer"))
    if h.lo is not None:
        out.append((h.lo if h.lo_open else h.lo - 1, f"out of range; allowed: {range_text(h)}"))
    if h.hi is not None:
        out.append((h.hi if h.hi_open else h.hi + 1, f"out of range; allowed: {range_text(h)}"))
    if h.kind != "int":
        out += [(float("nan"), "not a finite number"), (float("inf"), "not a finite number")]
    return out


def good_values(h: HParam) -> list[Any]:
    """Values ``h`` takes: its default, its choices, its closed bounds."""
    out = [h.default, *h.choices]
    if h.kind == "bool":
        out += [True, False]
    if h.lo is not None and not h.lo_open:
        out.append(h.lo)
    if h.hi is not None and not h.hi_open:
        out.append(h.hi)
    unique: list[Any] = []
    for value in out:  # True and 1 are two values here
        if not any(type(value) is type(u) and value == u for u in unique):
            unique.append(value)
    return unique


def probe_values(h: HParam) -> list[Any]:
    """Values the declaration allows that no bound limits, or just inside an open bound: -1 and 0 for
    a number without a lower bound, 10000 for one without an upper bound, a hair above an open lower
    bound. Each must validate or be refused in one line (by a cross-field check), never a traceback."""
    if h.kind not in ("float", "int", "float_or_choice"):
        return []
    number = int if h.kind == "int" else float
    out: list[Any] = [number(-1), number(0)] if h.lo is None else []
    if h.hi is None:
        out.append(number(10_000) if h.lo is None or h.lo < 10_000 else number(2 * h.lo))
    if h.kind != "int" and h.lo is not None and h.lo_open:
        out.append(h.lo + max(abs(h.lo), 1.0) * 1e-6)
    return out


def search_problems(h: HParam) -> list[str]:
    """What in ``h``'s search distribution lies outside its bounds (empty: nothing, or no search)."""
    search = dict(h.search or {})
    if not search:
        return []
    dist = search.get("distribution")
    keys = {"loguniform": ("low", "high", "default"), "uniform": ("low", "high", "default"),
            "int": ("low", "high", "default"), "fixed": ("value",), "categorical": ("default",)}.get(dist)
    if keys is None:
        return [f"search distribution {dist!r} is not one of loguniform, uniform, int, categorical, fixed"]
    values = [(k, search[k]) for k in keys if k in search and search[k] is not None]
    values += [(f"choice {c!r}", c) for c in search.get("choices", ())]
    out = []
    for key, value in values:
        try:
            h.check(value, "search")
        except ConfigError as exc:
            out.append(f"search {key} {value!r}: {exc}")
    if dist in ("loguniform", "uniform", "int") and not out and search.get("low") is not None \
            and search.get("high") is not None and search["low"] > search["high"]:
        out.append(f"search low {search['low']!r} is above high {search['high']!r}")
    if dist == "loguniform" and not out and search.get("low") is not None and search["low"] <= 0:
        out.append(f"search loguniform low {search['low']!r} is not > 0")
    return out


def owner_fields(name: str, owner: tuple[str, str] | None = None) -> dict[str, str]:
    """The config fields that bring in the component declaring ``name``: ``owner`` (kind, component
    name), else the first component that declares it."""
    if owner is not None:
        return {REGISTRIES[owner[0]][1]: owner[1]}
    for registry, key in REGISTRIES.values():
        for spec in registry.specs():
            if any(h.name == name for h in spec.hparams):
                return {key: spec.name}
    raise KeyError(f"no component declares hyperparameter {name!r}")


def check_hparam(name: str, owner: tuple[str, str] | None = None) -> CheckResult:
    """Every value of hyperparameter ``name`` the module docstring lists, in a run of fedavg with its
    component (``owner``, else the first that declares it)."""
    owners, h = all_hparams()[name]
    base = {"algorithm": "fedavg", **owner_fields(name, owner)}
    who = f"hyperparameter {name}"
    try:
        h.check(h.default, owners)
    except ConfigError as exc:
        return failed(who, HYPERPARAMETERS, f"its default {h.default!r} is refused by its own declaration: {exc}",
                      f"give {name} a default inside its bounds/choices, or widen them")
    problems = search_problems(h)
    if problems:
        return failed(who, HYPERPARAMETERS, problems[0], f"keep {name}'s search distribution inside its bounds")
    for value in good_values(h):
        problem = _good(base, name, h, value)
        if problem is not None:
            return failed(who, HYPERPARAMETERS, problem[0], problem[1])
    for value in probe_values(h):
        problem = _probe(base, name, value)
        if problem is not None:
            return failed(who, HYPERPARAMETERS, problem, f"declare {name}'s bounds (lo=..., hi=...) or refuse the "
                                                         "value with a one-line fedtune.ConfigError naming the field")
    cases = bad_values(h)
    for value, allowed in cases:
        problem = _bad(base, name, owners, value, allowed)
        if problem is not None:
            return failed(who, HYPERPARAMETERS, problem, "raise fedtune.ConfigError in one line naming the field "
                                                         "and the allowed values (HParam.check does)")
    return passed(who, HYPERPARAMETERS, f"{len(good_values(h))} allowed values validate, {len(cases)} refused values "
                                        f"are one line each" + ("; its search lies inside its bounds" if h.search else ""))


def _good(base: dict[str, Any], name: str, h: HParam, value: Any) -> tuple[str, str] | None:
    """(what is wrong, what to fix) with a value ``h`` allows; None when it validates as itself."""
    try:
        cfg = FederatedRunConfig.from_dict({**base, name: value})
    except Exception as exc:  # noqa: BLE001 - any failure is the finding
        fix = (f"declare bounds or choices of {name} that leave {value!r} out, or accept it"
               if isinstance(exc, ConfigError) and "\n" not in str(exc) else
               f"refuse {value!r} with one fedtune.ConfigError line naming field '{name}', or declare bounds that "
               "leave it out")
        return f"value {value!r}, which its declaration allows, is refused: {exception_line(exc)}", fix
    got = h.of(cfg)
    if cfg.params.get(name) != value or got != value:
        return f"value {value!r} reads back as {got!r}", f"keep {name}'s value as the config was given it"
    return None


def _refusal(base: dict[str, Any], name: str, value: Any) -> Exception | None:
    """What building the config ``base`` with ``name: value`` raises; None where it is accepted."""
    try:
        FederatedRunConfig.from_dict({**base, name: value})
    except Exception as exc:  # noqa: BLE001 - the caller judges it: anything but one ConfigError line is a finding
        return exc
    return None


def _probe(base: dict[str, Any], name: str, value: Any) -> str | None:
    exc = _refusal(base, name, value)
    why = None if exc is None else config_error_line(exc)
    return None if why is None else f"value {value!r}, which its declaration allows, {why}"


def _bad(base: dict[str, Any], name: str, owners: str, value: Any, allowed: str) -> str | None:
    exc = _refusal(base, name, value)
    if exc is None:
        return f"value {value!r} is accepted; its declaration allows no such value"
    why = config_error_line(exc)
    if why is not None:
        return f"value {value!r} {why}"
    text = str(exc)
    if not text.startswith(f"field '{name}' ({owners}): ") or allowed not in text:
        return f"value {value!r} is refused as {text!r}, which does not name field '{name}' and '{allowed}'"
    return None


def check_unused(name: str) -> CheckResult:
    """Hyperparameter ``name`` set in a run of a preset that does not use its component: one
    ConfigError line ``field 'NAME' is a hyperparameter of ... does not use ...``."""
    _, h = all_hparams()[name]
    who = f"hyperparameter {name}"
    unused = next((p for p in PRESETS if name not in Resolved(p, PRESETS[p].client_method,
                                                              PRESETS[p].server_rule).hparam_specs()), None)
    if unused is None:
        return passed(who, ONE_LINE_ERRORS, "every algorithm uses it")
    try:
        FederatedRunConfig.from_dict({"algorithm": unused, name: h.default})
    except Exception as exc:  # noqa: BLE001 - any failure but the one line is the finding
        why = config_error_line(exc)
        text = str(exc)
        if why is None and text.startswith(f"field '{name}' is a hyperparameter of ") and "does not use" in text:
            return passed(who, ONE_LINE_ERRORS, f"refused in one line in a run of {unused}")
        return failed(who, ONE_LINE_ERRORS, f"in a run of {unused}: {why or text}",
                      "declare it in its component's spec (hparams) so the config refuses it where unused")
    return failed(who, ONE_LINE_ERRORS, f"accepted in a run of {unused}, which does not use it",
                  "declare it in its component's spec (hparams), not as a field of its own")


def check_preset_parts(name: str) -> CheckResult:
    """A preset is registered parts, declared for the settings they run in, its own defaults are its
    pair's hyperparameters and valid, and its ``own_shared`` knobs are run fields."""
    who = f"algorithm {name}"
    p = PRESETS[name]
    if p.client_method not in CLIENT_METHODS or p.server_rule not in SERVER_RULES:
        return failed(who, PRESET_PARTS, f"its client method {p.client_method} or server rule {p.server_rule} is "
                                         "not registered", "register its parts before the preset")
    resolved = Resolved(name, p.client_method, p.server_rule)
    if resolved.settings != p.settings:
        return failed(who, PRESET_PARTS, f"it declares settings {', '.join(p.settings) or 'none'} but its parts run "
                                         f"in {', '.join(resolved.settings) or 'none'}",
                      f"declare Preset(settings={resolved.settings!r})")
    if p.unsupervised_client_method:
        unsupervised = p.unsupervised_client_method
        if CLIENT_METHODS.spec(unsupervised).supervised or \
                Resolved(name, unsupervised, p.server_rule).settings != ("ufdg",):
            return failed(who, PRESET_PARTS, f"its unsupervised client method {unsupervised} does not run in "
                                             "ufdg alone", "name an unsupervised client method (supervised=False)")
    specs = resolved.hparam_specs()
    for key, value in p.defaults:
        try:
            ok = key in specs and specs[key].check(value, name) == value
        except ConfigError as exc:
            return failed(who, PRESET_PARTS, f"its default {key}={value!r} is refused: {exc}",
                          "give the preset defaults its parts allow")
        if not ok:
            return failed(who, PRESET_PARTS, f"its default {key} is no hyperparameter of its pair",
                          "set only its client method's and server rule's hyperparameters")
    extra = set(p.own_shared) - set(FederatedRunConfig.field_names())
    if extra:
        return failed(who, PRESET_PARTS, f"own_shared names {', '.join(sorted(extra))}, no run field",
                      "name run fields (`fedtune fields`)")
    return passed(who, PRESET_PARTS, f"{p.client_method} + {p.server_rule}, settings {', '.join(p.settings)}")
