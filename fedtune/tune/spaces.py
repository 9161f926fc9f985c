"""Search spaces: YAML files saying which hyperparameters a study samples, and how.

One file per algorithm, ``search_spaces/<algorithm>.yaml``, read with ``yaml.safe_load``::

    algorithm: fedgp               # required: a named algorithm (`fedtune algorithms`)
    setting: fda                   # optional: client_method / server_rule / setting, passed on
    description: FedGP, ...        # optional free text
    switches:                      # optional: sampled choices that only steer conditions
      gp_beta_mode: {choices: [fixed, auto], default: fixed}
    params:                        # required: hyperparameter name -> how to sample it
      local_lr:   {distribution: loguniform, low: 0.005, high: 0.2, default: 0.05}
      gp_beta:    {distribution: uniform, low: 0.0, high: 1.0, default: 0.5,
                   when: {gp_beta_mode: fixed}, otherwise: auto}
      gp_align:   {distribution: categorical, choices: [true, false], default: true}
      global_lr:  {distribution: fixed, value: 1.0}

Distributions and their keys (every sampled parameter needs a ``default``):

* ``uniform`` / ``loguniform``: ``low``, ``high`` (``low < high``; loguniform needs
  ``low > 0``), ``default`` in ``[low, high]``; float hyperparameters only.
* ``int``: integer ``low``, ``high`` (both inclusive), ``default``, optional ``log: true``
  (then ``low >= 1``); integer hyperparameters only.
* ``categorical``: ``choices`` (a non-empty list without repeats), ``default`` among them.
* ``fixed``: ``value`` (the study never varies it).

Every parameter may also carry ``help`` (free text) and a condition: ``when`` maps a switch,
or an unconditional ``categorical``/``fixed`` parameter of the same file, to one allowed
value or a list of them (all entries must hold). When the condition fails the parameter
takes ``otherwise`` if given, else the algorithm's own default, so every sampled
configuration names every parameter of the file.

Switches are *not* hyperparameters of a run: they appear in sampled configurations under
the key ``switch.<name>`` (:data:`SWITCH_PREFIX`) so that Optuna can learn from them, and
:func:`strip_switches` removes them before a configuration becomes a
:class:`~fedtune.config.RunConfig`. A switch no condition uses is an error.

Names a file may tune: the ``hp=True`` fields of :class:`~fedtune.config.RunConfig`
(``local_lr``, ``global_lr``, ...) and the hyperparameters (``HParam``) of the algorithm's
client method and server rule. Every value a file can produce (range ends, defaults,
choices, fixed values, ``otherwise``) is checked by building a ``RunConfig`` with it, so
the allowed ranges are exactly the ones a run enforces. All errors are
:class:`~fedtune.config.ConfigError` naming the file, the key and the problem, raised
before anything launches.

Where a name is looked up (:func:`load_space`): an existing path is read as is; a bare
name ``fedomg`` is looked up as ``search_spaces/fedomg.yaml`` first under the current
directory, then in the repository's own ``search_spaces/`` folder, and the file's
``algorithm`` must then equal that name.

>>> space = load_space("fedavg")
>>> space.algorithm, sorted(space.defaults())[:3]
('fedavg', ['algorithm', 'global_lr', 'local_lr'])
>>> strip_switches({"switch.gp_beta_mode": "auto", "gp_beta": "auto"})
{'gp_beta': 'auto'}
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

import yaml

from fedtune.config import ConfigError, RunConfig

__all__ = [
    "DISTRIBUTIONS",
    "SPACES_DIR",
    "SWITCH_PREFIX",
    "ParamSpec",
    "SearchSpace",
    "Switch",
    "list_spaces",
    "load_space",
    "search_space",
    "strip_switches",
]

DISTRIBUTIONS: tuple[str, ...] = ("uniform", "loguniform", "int", "categorical", "fixed")
"""The distributions a parameter may use."""

SWITCH_PREFIX = "switch."
"""Sampled configurations carry switch ``x`` under the key ``switch.x``."""

_REPO_SPACES = Path(__file__).resolve().parents[2] / "search_spaces"  # a source checkout / editable install
_WHEEL_SPACES = Path(__file__).resolve().parents[1] / "search_spaces"  # `pip install .`: shipped as package data
SPACES_DIR: Path = _REPO_SPACES if _REPO_SPACES.is_dir() else _WHEEL_SPACES
"""fedtune's own search spaces (the repository's ``search_spaces/``, packaged as ``fedtune/search_spaces``)."""

# Top-level keys of a file; the first four are passed on to every configuration.
_CONSTANT_KEYS = ("algorithm", "client_method", "server_rule", "setting")
_TOP_KEYS = (*_CONSTANT_KEYS, "description", "switches", "params")
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
_UNSET: Any = object()


# --------------------------------------------------------------------------- data classes


@dataclass(frozen=True)
class Switch:
    """A sampled choice that only steers ``when`` conditions (not a run hyperparameter)."""

    name: str
    choices: tuple[Any, ...]
    default: Any
    help: str = ""

    @property
    def key(self) -> str:
        """The key of this switch in sampled configurations: ``switch.<name>``."""
        return SWITCH_PREFIX + self.name


@dataclass(frozen=True)
class ParamSpec:
    """How one hyperparameter is sampled (values already checked against the algorithm).

    ``when`` maps a switch or parameter name to the tuple of values under which this
    parameter is sampled; ``fallback`` is what it takes otherwise (``otherwise`` from the
    file, else the algorithm's default).
    """

    name: str
    distribution: str
    default: Any = None
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    choices: tuple[Any, ...] = ()
    value: Any = None
    when: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    fallback: Any = None
    help: str = ""

    @property
    def sampled(self) -> bool:
        """True unless the distribution is ``fixed``."""
        return self.distribution != "fixed"

    @property
    def initial(self) -> Any:
        """The default value when sampled, the value when fixed."""
        return self.value if self.distribution == "fixed" else self.default

    def holds(self, context: Mapping[str, Any]) -> bool:
        """Whether the condition holds for ``context`` (switch / parameter name -> value)."""
        return all(_member(context.get(ref), allowed) for ref, allowed in self.when.items())

    def ray_domain(self) -> Any:
        """The unconditional Ray Tune sampler (or the constant, for ``fixed``).

        ``int`` ranges are inclusive here and in the file, while ``tune.randint`` excludes
        its upper end, so ``high + 1`` is passed on.
        """
        from ray import tune

        if self.distribution == "uniform":
            return tune.uniform(self.low, self.high)
        if self.distribution == "loguniform":
            return tune.loguniform(self.low, self.high)
        if self.distribution == "int":
            make = tune.lograndint if self.log else tune.randint
            return make(int(self.low), int(self.high) + 1)
        if self.distribution == "categorical":
            return tune.choice(list(self.choices))
        return self.value

    def suggest(self, trial: Any) -> Any:
        """Sample this parameter from an Optuna trial (``fixed``: return the value)."""
        if self.distribution == "uniform":
            return trial.suggest_float(self.name, self.low, self.high)
        if self.distribution == "loguniform":
            return trial.suggest_float(self.name, self.low, self.high, log=True)
        if self.distribution == "int":
            return trial.suggest_int(self.name, int(self.low), int(self.high), log=self.log)
        if self.distribution == "categorical":
            return trial.suggest_categorical(self.name, list(self.choices))
        return self.value


class _ConditionalSample:
    """``tune.sample_from`` body of a conditional parameter (a class, so it pickles).

    Ray resolves plain samplers first and calls this with the (partially resolved) config;
    a condition on a value not sampled yet raises Ray's ``RecursiveDependencyError`` so Ray
    retries it on its next resolution pass. Sampling uses the sampler's own global NumPy
    random state (as Ray's samplers do).
    """

    def __init__(self, spec: ParamSpec, refs: Mapping[str, str]) -> None:
        self.spec = spec
        self.refs = dict(refs)  # condition name -> key in the config
        self.domain = spec.ray_domain()

    def __call__(self, config: Mapping[str, Any]) -> Any:
        from ray.tune.search.sample import Domain
        from ray.tune.search.variant_generator import RecursiveDependencyError

        node: Any = config
        if any(k not in node for k in self.refs.values()) and isinstance(node.get("config"), Mapping):
            node = node["config"]  # called with the whole experiment spec
        context = {}
        for name, key in self.refs.items():
            value = node[key]
            if isinstance(value, Domain):
                raise RecursiveDependencyError(f"'{self.spec.name}' depends on '{key}', not sampled yet")
            context[name] = value
        if not self.spec.holds(context):
            return self.spec.fallback
        return self.domain.sample() if self.spec.sampled else self.spec.value

    def __repr__(self) -> str:
        return f"<{self.spec.name} when {dict(self.spec.when)} else {self.spec.fallback!r}>"


@dataclass(frozen=True)
class SearchSpace:
    """A validated search space of one algorithm; see the module docstring for the file format.

    ``constants`` holds ``algorithm`` and any ``client_method`` / ``server_rule`` /
    ``setting`` of the file: they are part of every configuration the space produces.
    """

    algorithm: str
    source: str
    constants: Mapping[str, Any]
    switches: Mapping[str, Switch]
    params: Mapping[str, ParamSpec]
    description: str = ""

    # -- views -------------------------------------------------------------------------
    @property
    def has_conditions(self) -> bool:
        """True when some parameter has a ``when`` condition."""
        return any(p.when for p in self.params.values())

    def _ordered(self) -> list[ParamSpec]:
        """Unconditional parameters first (file order), then the conditional ones."""
        ps = list(self.params.values())
        return [p for p in ps if not p.when] + [p for p in ps if p.when]

    def defaults(self) -> dict[str, Any]:
        """The default configuration: constants plus every parameter's default (or fixed
        value), conditions evaluated with the switches' defaults. Ready for ``RunConfig``.

        >>> load_space("fedavg").defaults()["local_lr"]
        0.05
        """
        out: dict[str, Any] = dict(self.constants)
        context = {s.name: s.default for s in self.switches.values()}
        for p in self._ordered():
            value = p.initial if p.holds(context) else p.fallback
            out[p.name] = value
            context[p.name] = value
        return out

    def default_point(self) -> dict[str, Any]:
        """The defaults of what is sampled (switches under ``switch.<name>``), for a
        searcher's ``points_to_evaluate``; parameters whose condition fails are left out."""
        out: dict[str, Any] = {s.key: s.default for s in self.switches.values()}
        context = {s.name: s.default for s in self.switches.values()}
        for p in self._ordered():
            if not p.holds(context):
                continue
            context[p.name] = p.initial
            if p.sampled:
                out[p.name] = p.default
        return out

    def tune_space(self) -> dict[str, Any]:
        """A Ray Tune ``param_space``: ``tune.uniform`` / ``tune.loguniform`` /
        ``tune.randint`` (or ``tune.lograndint``) / ``tune.choice`` per sampled parameter,
        constants for ``fixed`` ones and for ``algorithm`` etc., ``tune.choice`` for each
        switch (key ``switch.<name>``) and ``tune.sample_from`` for conditional parameters.

        Ray's ``BasicVariantGenerator`` resolves ``sample_from``; OptunaSearch does not, so
        with Optuna use :meth:`optuna_define_by_run` (it covers every space).

        >>> type(load_space("fedavg").tune_space()["local_lr"]).__name__
        'Float'
        """
        from ray import tune

        space: dict[str, Any] = dict(self.constants)
        for s in self.switches.values():
            space[s.key] = tune.choice(list(s.choices))
        for p in self._ordered():
            if p.when:
                refs = {ref: (self.switches[ref].key if ref in self.switches else ref) for ref in p.when}
                space[p.name] = tune.sample_from(_ConditionalSample(p, refs))
            else:
                space[p.name] = p.ray_domain()
        return space

    def optuna_define_by_run(self, trial: Any) -> dict[str, Any]:
        """Optuna define-by-run function for ``ray.tune.search.optuna.OptunaSearch(space=...)``.

        Suggests every switch (as ``switch.<name>``) and every sampled parameter whose
        condition holds; returns the constants: ``algorithm`` etc., ``fixed`` values and the
        fallback of each parameter whose condition fails. OptunaSearch merges the suggested
        values with this returned dict into the trial's config (Ray 2.60's contract: the
        function returns ``None`` or a dict of constants).
        """
        constants: dict[str, Any] = dict(self.constants)
        context: dict[str, Any] = {}
        for s in self.switches.values():
            context[s.name] = trial.suggest_categorical(s.key, list(s.choices))
        for p in self._ordered():
            if not p.holds(context):
                constants[p.name] = p.fallback
                context[p.name] = p.fallback
                continue
            value = p.suggest(trial)
            context[p.name] = value
            if not p.sampled:
                constants[p.name] = value
        return constants


# --------------------------------------------------------------------------- public helpers


def strip_switches(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` without its ``switch.*`` keys (what a :class:`RunConfig` accepts).

    >>> strip_switches({"switch.mode": "a", "local_lr": 0.1})
    {'local_lr': 0.1}
    """
    return {k: v for k, v in config.items() if not (isinstance(k, str) and k.startswith(SWITCH_PREFIX))}


def _search_dirs() -> list[Path]:
    dirs: list[Path] = []
    for d in (Path.cwd() / "search_spaces", SPACES_DIR):
        if d.resolve() not in [x.resolve() for x in dirs]:
            dirs.append(d)
    return dirs


def list_spaces() -> list[str]:
    """Names of the search spaces found by name lookup (current directory, then built-in).

    >>> "fedavg" in list_spaces()
    True
    """
    names = {p.stem for d in _search_dirs() if d.is_dir() for p in d.glob("*.yaml")}
    return sorted(names)


def search_space(algorithm: str) -> dict[str, Any]:
    """The Ray Tune ``param_space`` of an algorithm's search space:
    ``load_space(algorithm).tune_space()``.

    >>> sorted(search_space("fedavg"))[:2]
    ['algorithm', 'global_lr']
    """
    return load_space(algorithm).tune_space()


def load_space(path_or_name: str | os.PathLike[str]) -> SearchSpace:
    """Read and validate a search space: a YAML path, or an algorithm name looked up as
    ``search_spaces/<name>.yaml`` (see the module docstring). Raises ConfigError naming
    the file, the key and the problem.

    >>> load_space("no-such-algorithm")
    Traceback (most recent call last):
    ...
    fedtune.config.ConfigError: no search space named 'no-such-algorithm' ...
    """
    text = os.fspath(path_or_name)
    as_path = Path(text)
    expected: str | None = None
    if as_path.is_file():
        path = as_path
    elif os.sep in text or "/" in text or as_path.suffix in (".yaml", ".yml"):
        raise ConfigError(f"search space file '{text}' does not exist")
    else:
        expected = text
        found = [d / f"{text}.yaml" for d in _search_dirs() if (d / f"{text}.yaml").is_file()]
        if not found:
            where = " or ".join(f"'{d}'" for d in _search_dirs())
            raise ConfigError(
                f"no search space named '{text}' (looked for {text}.yaml in {where}); "
                f"available: {', '.join(list_spaces()) or 'none'}")
        path = found[0]
    src = str(path)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{src}: not valid YAML: {' '.join(str(exc).split())}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{src}: cannot read the file: {exc}") from None
    return _build(data, src, expected)


# --------------------------------------------------------------------------- validation


def _err(src: str, key: str, problem: str) -> ConfigError:
    return ConfigError(f"{src}: {key}: {problem}")


def _member(value: Any, allowed: tuple[Any, ...]) -> bool:
    """``value in allowed`` without 1 == True == 1.0 confusions between bools and numbers."""
    return any(type(value) is type(a) and value == a or (
        isinstance(value, (int, float)) and isinstance(a, (int, float))
        and not isinstance(value, bool) and not isinstance(a, bool) and value == a) for a in allowed)


def _check_keys(src: str, key: str, got: Mapping[str, Any], allowed: tuple[str, ...], what: str) -> None:
    for k in got:
        if k not in allowed:
            close = difflib.get_close_matches(str(k), allowed, n=1, cutoff=0.6)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise _err(src, f"{key}.{k}" if key else str(k),
                       f"unknown key '{k}' {what}{hint}; allowed: {', '.join(allowed)}")


def _number(src: str, key: str, value: Any, *, integer: bool = False) -> float | int:
    """A YAML number (numeric text such as ``1e-3``, which YAML 1.1 reads as a string, too)."""
    num: float
    if isinstance(value, bool) or value is None or isinstance(value, (list, dict)):
        raise _err(src, key, f"expected a{'n integer' if integer else ' number'}, got {value!r}")
    try:
        num = float(value)
    except (TypeError, ValueError):
        raise _err(src, key, f"expected a{'n integer' if integer else ' number'}, got {value!r}") from None
    if not math.isfinite(num):
        raise _err(src, key, f"expected a finite number, got {value!r}")
    if integer:
        if not num.is_integer():
            raise _err(src, key, f"expected an integer, got {value!r}")
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
        from fedtune.algorithms import all_hparams, resolve

        self.src = src
        self.constants = constants
        try:
            cfg = RunConfig.from_dict(dict(constants))
        except ConfigError as exc:
            key = next((k for k in _CONSTANT_KEYS if f"'{k}'" in str(exc)), "algorithm")
            raise _err(src, key, str(exc)) from None
        self.resolved = resolve(cfg)
        self.specs = self.resolved.hparam_specs()
        self.owners = all_hparams()
        hints = get_type_hints(RunConfig)
        self.fields = {f.name: f for f in dataclasses.fields(RunConfig)}
        self.kinds: dict[str, str] = {n: _field_kind(hints[n]) for n, f in self.fields.items() if f.metadata.get("hp")}
        self.defaults: dict[str, Any] = {n: getattr(cfg, n) for n in self.kinds}
        for name, spec in self.specs.items():
            self.kinds[name] = spec.kind
            self.defaults[name] = spec.default

    def describe(self) -> str:
        r = self.resolved
        return (f"algorithm '{r.algorithm}' (client method {r.client_method.name}, "
                f"server rule {r.server_rule.name})")

    def check_name(self, name: str) -> None:
        if name in self.kinds:
            return
        key = f"params.{name}"
        if name in self.owners:
            raise _err(self.src, key, f"'{name}' is a hyperparameter of {self.owners[name][0]}, "
                                      f"which {self.describe()} does not use; it has: {', '.join(self.kinds)}")
        if name in self.fields:
            raise _err(self.src, key, f"'{name}' is a run setting, not a tunable hyperparameter; "
                                      f"set it in the study's base configuration; tunable: {', '.join(self.kinds)}")
        close = difflib.get_close_matches(name, list(self.kinds), n=2, cutoff=0.6)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise _err(self.src, key, f"unknown hyperparameter '{name}'{hint}; {self.describe()} has: "
                                  f"{', '.join(self.kinds)}")

    def check_value(self, name: str, key: str, value: Any, what: str) -> Any:
        """The canonical value a run would use, or ConfigError naming file/key/problem."""
        try:
            cfg = RunConfig.from_dict({**self.constants, name: value})
        except ConfigError as exc:
            raise _err(self.src, key, f"{what} {value!r} is not allowed for '{name}': {exc}") from None
        return cfg.params[name] if name in self.specs else getattr(cfg, name)


def _scalar_list(src: str, key: str, value: Any) -> list[Any]:
    if not isinstance(value, list) or not value:
        raise _err(src, key, f"expected a non-empty list of values, got {value!r}")
    for v in value:
        if isinstance(v, (list, dict)):
            raise _err(src, key, f"choices must be plain values (numbers, strings, true/false), got {v!r}")
    for i, v in enumerate(value):
        if any(_member(v, (w,)) for w in value[:i]):
            raise _err(src, key, f"{v!r} is listed twice")
    return value


def _build(data: Any, src: str, expected: str | None) -> SearchSpace:
    if not isinstance(data, dict):
        raise ConfigError(f"{src}: a search space must be a YAML mapping with keys "
                          f"{', '.join(_TOP_KEYS)}; got {type(data).__name__}")
    _check_keys(src, "", data, _TOP_KEYS, "at the top level")
    for k in ("algorithm", "params"):
        if k not in data:
            raise _err(src, k, f"missing required key '{k}'")
    constants: dict[str, Any] = {}
    for k in _CONSTANT_KEYS:
        if data.get(k) is not None:
            if not isinstance(data[k], str):
                raise _err(src, k, f"expected a name, got {data[k]!r}")
            constants[k] = data[k]
    algorithm = constants.get("algorithm")
    if algorithm is None:
        raise _err(src, "algorithm", "missing the algorithm's name")
    if expected is not None and algorithm != expected:
        raise _err(src, "algorithm", f"'{algorithm}' does not match the file's name '{expected}'")
    description = data.get("description") or ""
    if not isinstance(description, str):
        raise _err(src, "description", f"expected text, got {description!r}")
    algo = _Algorithm(src, constants)

    raw_switches = data.get("switches") or {}
    if not isinstance(raw_switches, dict):
        raise _err(src, "switches", f"expected a mapping of name: {{choices, default}}, got {raw_switches!r}")
    raw_params = data["params"]
    if not isinstance(raw_params, dict) or not raw_params:
        raise _err(src, "params", f"expected a non-empty mapping of hyperparameter: {{distribution, ...}}, "
                                  f"got {raw_params!r}")

    switches: dict[str, Switch] = {}
    for name, body in raw_switches.items():
        key = f"switches.{name}"
        if not isinstance(name, str) or not name.isidentifier():
            raise _err(src, key, "a switch name must be a plain identifier")
        if name in raw_params or name in algo.kinds or name in algo.owners or name in algo.fields:
            raise _err(src, key, f"'{name}' is a hyperparameter or field name; give the switch another name")
        if not isinstance(body, dict):
            raise _err(src, key, f"expected a mapping with keys {', '.join(_SWITCH_KEYS)}, got {body!r}")
        _check_keys(src, key, body, _SWITCH_KEYS, "in a switch")
        for k in ("choices", "default"):
            if k not in body:
                raise _err(src, key, f"missing required key '{k}'")
        choices = tuple(_scalar_list(src, f"{key}.choices", body["choices"]))
        if not _member(body["default"], choices):
            raise _err(src, f"{key}.default", f"{body['default']!r} is not among the choices {list(choices)}")
        switches[name] = Switch(name, choices, body["default"], str(body.get("help") or ""))

    params: dict[str, ParamSpec] = {}
    for name, body in raw_params.items():
        params[str(name)] = _build_param(src, algo, str(name), body)

    # Conditions: refer to a switch or to an unconditional categorical / fixed parameter.
    used: set[str] = set()
    resolved: dict[str, ParamSpec] = {}
    for name, p in params.items():
        if not p.when:
            resolved[name] = p
            continue
        when: dict[str, tuple[Any, ...]] = {}
        for ref, allowed in p.when.items():
            key = f"params.{name}.when.{ref}"
            values = list(allowed)
            if ref in switches:
                options = switches[ref].choices
                canon = values
            elif ref in params and params[ref].distribution in ("categorical", "fixed") and not params[ref].when:
                options = params[ref].choices if params[ref].distribution == "categorical" else (params[ref].value,)
                canon = [algo.check_value(ref, key, v, "condition value") for v in values]
            elif ref in params:
                raise _err(src, key, f"a condition may refer to a switch or to an unconditional categorical "
                                     f"or fixed parameter; '{ref}' is {params[ref].distribution}"
                                     f"{' and conditional' if params[ref].when else ''}")
            else:
                known = list(switches) + [n for n, q in params.items() if q.distribution in ("categorical", "fixed")]
                raise _err(src, key, f"'{ref}' is neither a switch nor a parameter of this file; "
                                     f"conditions may use: {', '.join(known) or 'nothing (declare a switch)'}")
            for v, c in zip(values, canon):
                if not _member(c, tuple(options)):
                    raise _err(src, key, f"{v!r} is never taken by '{ref}'; its values: {list(options)}")
            when[ref] = tuple(canon)
            used.add(ref)
        resolved[name] = dataclasses.replace(p, when=when)
    for name in switches:
        if name not in used:
            raise _err(src, f"switches.{name}", "no parameter's 'when' uses this switch")

    return SearchSpace(algorithm=algorithm, source=src, constants=constants, switches=switches,
                       params=resolved, description=description)


def _build_param(src: str, algo: _Algorithm, name: str, body: Any) -> ParamSpec:
    key = f"params.{name}"
    algo.check_name(name)
    if not isinstance(body, dict):
        raise _err(src, key, f"expected a mapping such as {{distribution: uniform, low: 0.0, high: 1.0, "
                             f"default: 0.5}}, got {body!r}")
    if "distribution" not in body:
        raise _err(src, key, f"missing required key 'distribution' (one of {', '.join(DISTRIBUTIONS)})")
    dist = body["distribution"]
    if dist not in DISTRIBUTIONS:
        raise _err(src, f"{key}.distribution", f"unknown distribution {dist!r}; allowed: {', '.join(DISTRIBUTIONS)}")
    _check_keys(src, key, body, (*_COMMON_KEYS, *_DIST_KEYS[dist]), f"for distribution '{dist}'")
    for k in _REQUIRED_KEYS[dist]:
        if k not in body:
            raise _err(src, key, f"missing required key '{k}' for distribution '{dist}'")
    kind = algo.kinds[name]
    if dist not in _FITS[kind]:
        kind_text = {"int": "an integer", "bool": "a true/false", "choice": "a named-choice"}.get(kind, "a real-valued")
        raise _err(src, f"{key}.distribution", f"'{dist}' does not fit '{name}', {kind_text} hyperparameter; "
                                               f"allowed: {', '.join(_FITS[kind])}")

    spec: dict[str, Any] = {"name": name, "distribution": dist, "help": str(body.get("help") or "")}
    if dist in ("uniform", "loguniform", "int"):
        integer = dist == "int"
        low = _number(src, f"{key}.low", body["low"], integer=integer)
        high = _number(src, f"{key}.high", body["high"], integer=integer)
        log = body.get("log", False)
        if not isinstance(log, bool):
            raise _err(src, f"{key}.log", f"expected true or false, got {log!r}")
        if low > high:
            raise _err(src, key, f"low {low!r} > high {high!r}")
        if low == high:
            raise _err(src, key, f"low == high == {low!r}; use distribution: fixed for a single value")
        if dist == "loguniform" and low <= 0:
            raise _err(src, f"{key}.low", f"loguniform needs low > 0, got {low!r}")
        if dist == "int" and log and low < 1:
            raise _err(src, f"{key}.low", f"int with log: true needs low >= 1, got {low!r}")
        low = algo.check_value(name, f"{key}.low", low, "low")
        high = algo.check_value(name, f"{key}.high", high, "high")
        default = _number(src, f"{key}.default", body["default"], integer=integer)
        if not low <= default <= high:
            raise _err(src, f"{key}.default", f"default {default!r} is outside the range [{low!r}, {high!r}]")
        default = algo.check_value(name, f"{key}.default", default, "default")
        spec.update(low=low, high=high, log=log, default=default)
    elif dist == "categorical":
        choices = _scalar_list(src, f"{key}.choices", body["choices"])
        canon = tuple(algo.check_value(name, f"{key}.choices", c, "choice") for c in choices)
        if not _member(body["default"], tuple(choices)):
            raise _err(src, f"{key}.default", f"default {body['default']!r} is not among the choices {choices}")
        default = algo.check_value(name, f"{key}.default", body["default"], "default")
        spec.update(choices=canon, default=default)
    else:
        value = body["value"]
        if isinstance(value, (list, dict)):
            raise _err(src, f"{key}.value", f"expected a single value, got {value!r}")
        spec.update(value=algo.check_value(name, f"{key}.value", value, "value"))

    when = body.get("when")
    if when is not None:
        if not isinstance(when, dict) or not when:
            raise _err(src, f"{key}.when", f"expected a mapping of switch or parameter: value(s), got {when!r}")
        spec["when"] = {str(ref): tuple(v if isinstance(v, list) else [v]) for ref, v in when.items()}
    if "otherwise" in body:
        if when is None:
            raise _err(src, f"{key}.otherwise", "'otherwise' needs a 'when' condition")
        spec["fallback"] = algo.check_value(name, f"{key}.otherwise", body["otherwise"], "otherwise")
    else:
        spec["fallback"] = algo.defaults[name]
    return ParamSpec(**spec)
