"""Reading and validating one search-space YAML file into a :class:`~fedtune.spaces.model.SearchSpace`.

:func:`read_space_file` reads a file with :func:`fedtune.yaml_safe.load_file` (``yaml.safe_load``
within size, nesting and alias-expansion limits); :func:`build_space` merges it into the space
derived from the declarations (:mod:`fedtune.spaces.derive`; not for a ``complete: true`` file), then checks the
result against the format described in :mod:`fedtune.spaces.lookup` and against the
algorithm it names: every key, every distribution and whether it fits the hyperparameter's
kind, every number, and every value the file can produce (range ends, defaults, choices,
fixed values, ``otherwise``), by building a :class:`~fedtune.config.FederatedRunConfig` with it.
Conditions must refer to a switch or to an unconditional ``categorical``/``fixed``
parameter, and every switch must be used. A server optimiser's hyperparameter (``server_beta1``
...) is tunable in every space, but only where ``server_optimizer`` takes values that use it:
conditioned ``when: {server_optimizer: [...]}`` on those, and left out (:data:`OMITTED`) of a
configuration whose optimiser does not. A condition on a ``fixed`` parameter may name values
it does not take (a knob pinned by ``--knobs own`` or a benchmark): it never holds, and a
parameter that would then be left out is dropped from the space. Every problem is a
:class:`~fedtune.errors.ConfigError` worded ``<file>: <key>: <problem>``.

>>> build_space({"algorithm": "fedavg", "params": {"local_lr": {"distribution": "fixed", "value": 0.1}}},
...             "inline.yaml", None).defaults()["local_lr"]
0.1
>>> build_space({"algorithm": "fedavg", "params": {"local_lr": {"distribution": "uniform", "low": 0.2,
...              "high": 0.1, "default": 0.1}}}, "inline.yaml", None)
Traceback (most recent call last):
...
fedtune.errors.ConfigError: inline.yaml: params.local_lr: low 0.2 > high 0.1
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

import yaml

from fedtune import yaml_safe
from fedtune.algorithms import SERVER_OPTIMIZERS, all_hparams
from fedtune.algorithms.presets import PRESETS
from fedtune.config import RENAMED_FIELDS, FederatedRunConfig, renamed_field_message
from fedtune.errors import ConfigError, clipped, shown
from fedtune.results.study_dir import SPACES_DIR, STUDY_FILE
from fedtune.spaces import derive
from fedtune.spaces.model import DISTRIBUTIONS, OMITTED, ParamSpec, SearchSpace, Switch, value_in

__all__ = ["build_space", "read_space_file"]

# Top-level keys of a file; the first four are passed on to every configuration.
_CONSTANT_KEYS = ("algorithm", "client_method", "server_rule", "setting")
_TOP_KEYS = (*_CONSTANT_KEYS, "description", "complete", "switches", "params")
_DIST_KEYS: dict[str, tuple[str, ...]] = {
    "uniform": ("low", "high", "default"),
    "loguniform": ("low", "high", "default"),
    "int": ("low", "high", "default", "log"),
    "categorical": ("choices", "default"),
    "fixed": ("value",),
}
_REQUIRED_KEYS: dict[str, tuple[str, ...]] = {
    "uniform": ("low", "high", "default"),
    "loguniform": ("low", "high", "default"),
    "int": ("low", "high", "default"),
    "categorical": ("choices", "default"),
    "fixed": ("value",),
}
_COMMON_KEYS = ("distribution", "when", "otherwise", "help")
_SWITCH_KEYS = ("choices", "default", "help")
# Which distributions fit which kind of hyperparameter (HParam.kind or a field's type).
_FITS: dict[str, tuple[str, ...]] = {
    "float": ("uniform", "loguniform", "categorical", "fixed"),
    "float_or_choice": ("uniform", "loguniform", "categorical", "fixed"),
    "int": ("int", "categorical", "fixed"),
    "bool": ("categorical", "fixed"),
    "choice": ("categorical", "fixed"),
}


def read_space_file(path: Path, expected: str | None = None) -> SearchSpace:
    """Read ``path`` (:func:`fedtune.yaml_safe.load_file`) and validate it (:func:`build_space`).

    ``expected``: the name the file was looked up by, which its ``algorithm`` must equal.
    Unreadable files and malformed YAML are ConfigErrors naming the file.
    """
    src = str(path)
    try:
        data = yaml_safe.load_file(path, src)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{src}: not valid YAML: {' '.join(str(exc).split())}") from None
    if isinstance(data, dict) and "complete" not in data and _is_study_copy(Path(path)):
        data = {**data, "complete": True}  # a study's copy written before spaces were derived: the whole space
    return build_space(data, src, expected)


def _is_study_copy(path: Path) -> bool:
    """Whether ``path`` is a study's own copy of a search space (``<study>/spaces/<name>.yaml``
    beside the study's ``study.json``). Copies written before spaces were derived from the
    declarations are whole spaces without ``complete: true``: read as written, so a resumed study
    samples what it sampled (never the declarations of a later fedtune)."""
    return path.parent.name == SPACES_DIR and (path.parent.parent / STUDY_FILE).is_file()


def _q(name: Any) -> str:
    """A name from the file, quoted and cut short for a message."""
    return f"'{clipped(str(name), 80)}'"


def _err(src: str, key: str, problem: str) -> ConfigError:
    return ConfigError(f"{src}: {clipped(key, 120)}: {problem}")


def _check_keys(src: str, key: str, got: Mapping[str, Any], allowed: tuple[str, ...], what: str) -> None:
    for k in got:
        if k not in allowed:
            close = difflib.get_close_matches(str(k), allowed, n=1, cutoff=0.6)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise _err(src, f"{key}.{k}" if key else str(k),
                       f"unknown key {_q(k)} {what}{hint}; allowed: {', '.join(allowed)}")


def _number(src: str, key: str, value: Any, *, integer: bool = False) -> float | int:
    """A YAML number (numeric text such as ``1e-3``, which YAML 1.1 reads as a string, too)."""
    num: float
    if isinstance(value, bool) or value is None or isinstance(value, (list, dict)):
        raise _err(src, key, f"expected a{'n integer' if integer else ' number'}, got {shown(value)}")
    try:
        num = float(value)
    except (TypeError, ValueError):
        raise _err(src, key, f"expected a{'n integer' if integer else ' number'}, got {shown(value)}") from None
    if not math.isfinite(num):
        raise _err(src, key, f"expected a finite number, got {shown(value)}")
    if integer:
        if not num.is_integer():
            raise _err(src, key, f"expected an integer, got {shown(value)}")
        return int(num)
    return num


def _field_kind(hint: Any) -> str:
    """``float | None`` -> "float", ``int`` -> "int", ... (what distributions fit a field)."""
    if get_origin(hint) in (Union, types.UnionType):
        hint = next(a for a in get_args(hint) if a is not type(None))
    return {float: "float", int: "int", bool: "bool"}.get(hint, "choice")


class _Algorithm:
    """What an algorithm allows: its tunable names, their kinds, defaults and a value check."""

    def __init__(self, src: str, constants: dict[str, Any]) -> None:
        self.src = src
        self.constants = constants
        try:
            cfg = FederatedRunConfig.from_dict(dict(constants))
        except ConfigError as exc:
            key = next((k for k in _CONSTANT_KEYS if f"'{k}'" in str(exc)), "algorithm")
            raise _err(src, key, str(exc)) from None
        self.resolved = cfg.resolved
        self.specs = self.resolved.hparam_specs()
        self.owners = all_hparams()
        hints = get_type_hints(FederatedRunConfig)
        self.fields = {f.name: f for f in dataclasses.fields(FederatedRunConfig)}
        self.kinds: dict[str, str] = {n: _field_kind(hints[n]) for n, f in self.fields.items() if f.metadata.get("hp")}
        self.defaults: dict[str, Any] = {n: getattr(cfg, n) for n in self.kinds}
        for name, spec in self.specs.items():
            self.kinds[name] = spec.kind
            self.defaults[name] = spec.default
        # The server optimisers' hyperparameters -> the optimisers that use them (registry order);
        # tunable with every algorithm, without a default here: left out where not used.
        self.optimizer_users: dict[str, tuple[str, ...]] = {}
        for opt in SERVER_OPTIMIZERS:
            for h in SERVER_OPTIMIZERS.spec(opt).hparams:
                self.optimizer_users[h.name] = (*self.optimizer_users.get(h.name, ()), opt)
                self.kinds[h.name] = h.kind

    def describe(self) -> str:
        r = self.resolved
        return (f"algorithm '{r.algorithm}' (client method {r.client_method.name}, "
                f"server rule {r.server_rule.name})")

    def check_name(self, name: str) -> None:
        if name in self.kinds:
            return
        key = f"params.{name}"
        if name in self.owners:
            raise _err(self.src, key, f"{_q(name)} is a hyperparameter of {self.owners[name][0]}, "
                                      f"which {self.describe()} does not use; it has: {', '.join(self.kinds)}")
        if name in RENAMED_FIELDS:
            raise _err(self.src, key, renamed_field_message(name))
        if name in self.fields:
            raise _err(self.src, key, f"{_q(name)} is a run setting, not a tunable hyperparameter; "
                                      f"set it in the study's base configuration; tunable: {', '.join(self.kinds)}")
        close = difflib.get_close_matches(name, list(self.kinds), n=2, cutoff=0.6)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise _err(self.src, key, f"unknown hyperparameter {_q(name)}{hint}; {self.describe()} has: "
                                  f"{', '.join(self.kinds)}")

    def check_value(self, name: str, key: str, value: Any, what: str) -> Any:
        """The canonical value a run would use, or ConfigError naming file/key/problem."""
        # A server optimiser's hyperparameter is checked with the first optimiser that uses it.
        users = self.optimizer_users.get(name)
        with_optimizer = {"server_optimizer": users[0]} if users else {}
        try:
            cfg = FederatedRunConfig.from_dict({**self.constants, **with_optimizer, name: value})
        except ConfigError as exc:
            raise _err(self.src, key, f"{what} {shown(value)} is not allowed for {_q(name)}: {exc}") from None
        return cfg.params[name] if name in self.specs or users else getattr(cfg, name)


MAX_CHOICES = 1000
"""Most values of a ``categorical`` parameter or a switch (each is checked by building a config)."""


def _scalar_list(src: str, key: str, value: Any) -> list[Any]:
    if not isinstance(value, list) or not value:
        raise _err(src, key, f"expected a non-empty list of values, got {shown(value)}")
    if len(value) > MAX_CHOICES:
        raise _err(src, key, f"{len(value)} values; allowed: at most {MAX_CHOICES} (for more, sample a range: "
                             f"uniform, loguniform or int)")
    for v in value:
        if isinstance(v, (list, dict)):
            raise _err(src, key, f"choices must be plain values (numbers, strings, true/false), got {shown(v)}")
    seen: set[Any] = set()
    for v in value:  # value_in's equality (1 == 1.0, but not True), one look-up per value
        same = ("number", v) if isinstance(v, (int, float)) and not isinstance(v, bool) else (type(v), v)
        if same in seen:
            raise _err(src, key, f"{shown(v)} is listed twice")
        seen.add(same)
    return value


def build_space(data: Any, src: str, expected: str | None) -> SearchSpace:
    """Validate a parsed YAML document ``data`` (read from ``src``) into a :class:`SearchSpace`;
    ``expected`` as in :func:`read_space_file`. Unless the document says ``complete: true``, it is
    an override of the space derived from the declarations (:mod:`fedtune.spaces.derive`)."""
    constants, description, complete = _top_level(data, src, expected)
    origins: dict[str, str] = {}
    if not complete:
        constants = derive.derived_constants(constants)
    algo = _Algorithm(src, constants)
    raw_switches, raw_params = _sections(data, src, complete)
    if not complete:
        merged = derive.merge(derive.derive(constants), raw_switches, raw_params)
        raw_params, origins = merged.params, merged.origins
        raw_switches, file_switches = merged.switches, set(raw_switches)
        description = description or _preset_description(constants["algorithm"])
    else:
        file_switches = set(raw_switches)
    switches = _build_switches(src, algo, raw_switches, raw_params)
    params: dict[str, ParamSpec] = {}
    for name, body in raw_params.items():
        params[str(name)] = _build_param(src, algo, str(name), body)
    resolved, used = _resolve_conditions(src, algo, switches, params, file_switches)
    switches = {n: s for n, s in switches.items() if n in used}  # a derived switch no condition uses: dropped
    return SearchSpace(algorithm=constants["algorithm"], source=src, constants=constants, switches=switches,
                       params=resolved, description=description,
                       origins={n: o for n, o in origins.items() if n in resolved or n in switches})


def _preset_description(algorithm: str) -> str:
    return PRESETS[algorithm].description


def _top_level(data: Any, src: str, expected: str | None) -> tuple[dict[str, Any], str, bool]:
    """The file's top-level keys checked: its constants (``algorithm`` first among them), its
    description and whether it is ``complete`` (the whole space: nothing derived)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{src}: a search space must be a YAML mapping with keys "
                          f"{', '.join(_TOP_KEYS)}; got {type(data).__name__}")
    _check_keys(src, "", data, _TOP_KEYS, "at the top level")
    complete = data.get("complete", False)
    if not isinstance(complete, bool):
        raise _err(src, "complete", f"expected true or false, got {shown(complete)}")
    for k in ("algorithm", "params") if complete else ("algorithm",):
        if k not in data:
            raise _err(src, k, f"missing required key '{k}'" + (" (a complete space lists every parameter)"
                                                                 if k == "params" else ""))
    constants: dict[str, Any] = {}
    for k in _CONSTANT_KEYS:
        if data.get(k) is not None:
            if not isinstance(data[k], str):
                raise _err(src, k, f"expected a name, got {shown(data[k])}")
            constants[k] = data[k]
    algorithm = constants.get("algorithm")
    if algorithm is None:
        raise _err(src, "algorithm", "missing the algorithm's name")
    if expected is not None and algorithm != expected:
        raise _err(src, "algorithm", f"{_q(algorithm)} does not match the file's name {_q(expected)}")
    description = data.get("description") or ""
    if not isinstance(description, str):
        raise _err(src, "description", f"expected text, got {shown(description)}")
    return constants, description, complete


def _sections(data: dict[str, Any], src: str, complete: bool) -> tuple[dict[Any, Any], dict[Any, Any]]:
    """The file's ``switches`` (maybe empty) and ``params`` (not empty where given; an override may
    leave it out) mappings."""
    raw_switches = data.get("switches") or {}
    if not isinstance(raw_switches, dict):
        raise _err(src, "switches", f"expected a mapping of name: {{choices, default}}, got {shown(raw_switches)}")
    if not complete and "params" not in data:
        return raw_switches, {}
    raw_params = data["params"]
    if not isinstance(raw_params, dict) or not raw_params:
        hint = "" if complete else " (an override that changes no parameter leaves 'params' out)"
        raise _err(src, "params", f"expected a non-empty mapping of hyperparameter: {{distribution, ...}}, "
                                  f"got {shown(raw_params)}{hint}")
    return raw_switches, raw_params


def _build_switches(src: str, algo: _Algorithm, raw_switches: dict[Any, Any],
                    raw_params: dict[Any, Any]) -> dict[str, Switch]:
    """Every switch of the file, checked: a plain name no hyperparameter or field has, its choices
    and its default among them."""
    switches: dict[str, Switch] = {}
    for name, body in raw_switches.items():
        key = f"switches.{name}"
        if not isinstance(name, str) or not name.isidentifier():
            raise _err(src, key, "a switch name must be a plain identifier")
        if name in raw_params or name in algo.kinds or name in algo.owners or name in algo.fields:
            raise _err(src, key, f"{_q(name)} is a hyperparameter or field name; give the switch another name")
        if not isinstance(body, dict):
            raise _err(src, key, f"expected a mapping with keys {', '.join(_SWITCH_KEYS)}, got {shown(body)}")
        _check_keys(src, key, body, _SWITCH_KEYS, "in a switch")
        for k in ("choices", "default"):
            if k not in body:
                raise _err(src, key, f"missing required key '{k}'")
        choices = tuple(_scalar_list(src, f"{key}.choices", body["choices"]))
        if not value_in(body["default"], choices):
            raise _err(src, f"{key}.default", f"{shown(body['default'])} is not among the choices {shown(list(choices))}")
        switches[name] = Switch(name, choices, body["default"], str(body.get("help") or ""))
    return switches


def _resolve_conditions(src: str, algo: _Algorithm, switches: dict[str, Switch], params: dict[str, ParamSpec],
                        file_switches: set[Any]) -> tuple[dict[str, ParamSpec], set[str]]:
    """``params`` with every ``when`` condition checked and its values made canonical, and the
    switches the conditions use; a condition refers to a switch or to an unconditional categorical /
    fixed parameter, and every switch the file declares is used by one."""
    used: set[str] = set()
    resolved: dict[str, ParamSpec] = {}
    for name, p in params.items():
        if not p.when:
            resolved[name] = p
            continue
        when: dict[str, tuple[Any, ...]] = {}
        for ref, allowed in p.when.items():
            when[ref] = _condition(src, algo, switches, params, f"params.{name}.when.{ref}", ref, list(allowed))
            used.add(ref)
        never = any(params[ref].distribution == "fixed" and not value_in(params[ref].value, allowed)
                    for ref, allowed in when.items() if ref in params)
        if never and p.fallback is OMITTED:
            continue  # its condition never holds and it is left out: not a parameter of this space
        resolved[name] = dataclasses.replace(p, when=when)
    for name in switches:
        if name not in used and name in file_switches:
            raise _err(src, f"switches.{name}", "no parameter's 'when' uses this switch")
    _check_optimizer_params(src, algo, params, resolved)
    return resolved, used


def _check_optimizer_params(src: str, algo: _Algorithm, params: dict[str, ParamSpec],
                            resolved: dict[str, ParamSpec]) -> None:
    """Every server optimiser's hyperparameter of the space is sampled only with optimisers that
    use it: its ``when`` lists only those, or (unconditioned on the optimiser) every value the
    file's ``server_optimizer`` takes is one."""
    so = params.get("server_optimizer")
    for name, p in resolved.items():
        users = algo.optimizer_users.get(name)
        if users is None:
            continue
        if "server_optimizer" in p.when:
            key, values = f"params.{name}.when.server_optimizer", p.when["server_optimizer"]
        elif so is not None:
            values = so.choices if so.distribution == "categorical" else (so.value,)
            key, values = f"params.{name}", (*values, so.fallback) if so.when else values
        else:
            raise _err(src, f"params.{name}", f"{_q(name)} is a hyperparameter of server_optimizer "
                                              f"{', '.join(users)}; add server_optimizer to this file and "
                                              f"condition it: when: {{server_optimizer: [{', '.join(users)}]}}")
        for v in values:
            if v not in users:
                raise _err(src, key, f"server_optimizer {shown(v)} does not use {_q(name)}; allowed: "
                                     f"{', '.join(users)}")


def _condition(src: str, algo: _Algorithm, switches: dict[str, Switch], params: dict[str, ParamSpec], key: str,
               ref: str, values: list[Any]) -> tuple[Any, ...]:
    """The canonical values of one condition ``ref: values`` (at ``key``), each one ``ref`` can take."""
    if ref in switches:
        options = switches[ref].choices
        canon = values
    elif ref in params and params[ref].distribution in ("categorical", "fixed") and not params[ref].when:
        options = params[ref].choices if params[ref].distribution == "categorical" else (params[ref].value,)
        canon = [algo.check_value(ref, key, v, "condition value") for v in values]
    elif ref in params:
        raise _err(src, key, f"a condition may refer to a switch or to an unconditional categorical "
                             f"or fixed parameter; {_q(ref)} is {params[ref].distribution}"
                             f"{' and conditional' if params[ref].when else ''}")
    else:
        known = list(switches) + [n for n, q in params.items() if q.distribution in ("categorical", "fixed")]
        raise _err(src, key, f"{_q(ref)} is neither a switch nor a parameter of this file; "
                             f"conditions may use: {', '.join(known) or 'nothing (declare a switch)'}")
    for v, c in zip(values, canon):
        if params.get(ref) is not None and params[ref].distribution == "fixed":
            continue  # checked above (check_value); a pinned knob's other values: never holds
        if not value_in(c, tuple(options)):
            raise _err(src, key, f"{shown(v)} is never taken by {_q(ref)}; its values: {shown(list(options))}")
    return tuple(canon)


def _build_param(src: str, algo: _Algorithm, name: str, body: Any) -> ParamSpec:
    key = f"params.{name}"
    algo.check_name(name)
    if not isinstance(body, dict):
        raise _err(src, key, f"expected a mapping such as {{distribution: uniform, low: 0.0, high: 1.0, "
                             f"default: 0.5}}, got {shown(body)}")
    if "distribution" not in body:
        raise _err(src, key, f"missing required key 'distribution' (one of {', '.join(DISTRIBUTIONS)})")
    dist = body["distribution"]
    if dist not in DISTRIBUTIONS:
        raise _err(src, f"{key}.distribution", f"unknown distribution {shown(dist)}; allowed: {', '.join(DISTRIBUTIONS)}")
    _check_keys(src, key, body, (*_COMMON_KEYS, *_DIST_KEYS[dist]), f"for distribution {_q(dist)}")
    for k in _REQUIRED_KEYS[dist]:
        if k not in body:
            raise _err(src, key, f"missing required key '{k}' for distribution {_q(dist)}")
    kind = algo.kinds[name]
    if dist not in _FITS[kind]:
        kind_text = {"int": "an integer", "bool": "a true/false", "choice": "a named-choice"}.get(kind, "a real-valued")
        raise _err(src, f"{key}.distribution", f"{_q(dist)} does not fit {_q(name)}, {kind_text} hyperparameter; "
                                               f"allowed: {', '.join(_FITS[kind])}")

    spec: dict[str, Any] = {"name": name, "distribution": dist, "help": str(body.get("help") or "")}
    if dist in ("uniform", "loguniform", "int"):
        spec.update(_range(src, algo, name, dist, body))
    elif dist == "categorical":
        choices = _scalar_list(src, f"{key}.choices", body["choices"])
        canon = tuple(algo.check_value(name, f"{key}.choices", c, "choice") for c in choices)
        if not value_in(body["default"], tuple(choices)):
            raise _err(src, f"{key}.default", f"default {shown(body['default'])} is not among the choices {shown(choices)}")
        default = algo.check_value(name, f"{key}.default", body["default"], "default")
        spec.update(choices=canon, default=default)
    else:
        value = body["value"]
        if isinstance(value, (list, dict)):
            raise _err(src, f"{key}.value", f"expected a single value, got {shown(value)}")
        spec.update(value=algo.check_value(name, f"{key}.value", value, "value"))

    when = body.get("when")
    if when is not None:
        if not isinstance(when, dict) or not when:
            raise _err(src, f"{key}.when", f"expected a mapping of switch or parameter: value(s), got {shown(when)}")
        spec["when"] = {str(ref): tuple(v if isinstance(v, list) else [v]) for ref, v in when.items()}
    if "otherwise" in body:
        if when is None:
            raise _err(src, f"{key}.otherwise", "'otherwise' needs a 'when' condition")
        if name in algo.optimizer_users:
            raise _err(src, f"{key}.otherwise", f"{_q(name)} is left out where its condition fails (a run whose "
                                                f"server_optimizer does not use it refuses it); remove 'otherwise'")
        spec["fallback"] = algo.check_value(name, f"{key}.otherwise", body["otherwise"], "otherwise")
    else:
        spec["fallback"] = OMITTED if name in algo.optimizer_users else algo.defaults[name]
    return ParamSpec(**spec)


def _range(src: str, algo: _Algorithm, name: str, dist: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """``low``, ``high``, ``log`` and ``default`` of a ``uniform``/``loguniform``/``int`` parameter, checked."""
    key = f"params.{name}"
    integer = dist == "int"
    low = _number(src, f"{key}.low", body["low"], integer=integer)
    high = _number(src, f"{key}.high", body["high"], integer=integer)
    log = body.get("log", False)
    if not isinstance(log, bool):
        raise _err(src, f"{key}.log", f"expected true or false, got {shown(log)}")
    if low > high:
        raise _err(src, key, f"low {shown(low)} > high {shown(high)}")
    if low == high:
        raise _err(src, key, f"low == high == {shown(low)}; use distribution: fixed for a single value")
    if dist == "loguniform" and low <= 0:
        raise _err(src, f"{key}.low", f"loguniform needs low > 0, got {shown(low)}")
    if dist == "int" and log and low < 1:
        raise _err(src, f"{key}.low", f"int with log: true needs low >= 1, got {shown(low)}")
    low = algo.check_value(name, f"{key}.low", low, "low")
    high = algo.check_value(name, f"{key}.high", high, "high")
    default = _number(src, f"{key}.default", body["default"], integer=integer)
    if not low <= default <= high:
        raise _err(src, f"{key}.default", f"default {shown(default)} is outside the range [{shown(low)}, {shown(high)}]")
    default = algo.check_value(name, f"{key}.default", default, "default")
    return {"low": low, "high": high, "log": log, "default": default}
