"""The model of a search space: :class:`SearchSpace`, its :class:`ParamSpec` and :class:`Switch`.

A :class:`SearchSpace` is what :func:`fedtune.spaces.lookup.load_space` returns once a YAML file
has been read and validated (:mod:`fedtune.spaces.yaml_files`; the file format is described in
:mod:`fedtune.spaces.lookup`). This module owns what a validated space *does*: its default
configuration and default point, the Ray Tune ``param_space`` (conditional parameters as
``tune.sample_from``) and the Optuna define-by-run function. It reads no file and imports
neither YAML nor the algorithms; Ray and Optuna are only touched when a sampler is asked for.

>>> strip_switches({"switch.gp_beta_mode": "auto", "gp_beta": "auto"})
{'gp_beta': 'auto'}
>>> value_in(1, (True,)), value_in(1, (1.0,))
(False, True)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DISTRIBUTIONS",
    "OMITTED",
    "SWITCH_PREFIX",
    "ParamSpec",
    "SearchSpace",
    "Switch",
    "strip_switches",
    "value_in",
]

DISTRIBUTIONS: tuple[str, ...] = ("uniform", "loguniform", "int", "categorical", "fixed")
"""The distributions a parameter may use."""

SWITCH_PREFIX = "switch."
"""Sampled configurations carry switch ``x`` under the key ``switch.x``."""

_LEGACY_KEYS = ("fedtune.validated_config",)
# Trial configurations of studies written before the components were declared torch-free carry the
# driver's validated form under this key; it is not a field of a run.


class _Omitted:
    """The type of :data:`OMITTED` (one instance; pickles and copies as that instance)."""

    _one: _Omitted | None = None

    def __new__(cls) -> _Omitted:
        if cls._one is None:
            cls._one = super().__new__(cls)
        return cls._one

    def __repr__(self) -> str:
        return "<left out>"

    def __reduce__(self) -> str:
        return "OMITTED"


OMITTED = _Omitted()
"""The fallback of a conditional parameter that has no value of its own when its condition
fails: a server optimiser's hyperparameter (``server_beta1`` ...) whose optimiser was not
chosen, which a run refuses. It is left out of :meth:`SearchSpace.defaults` and of the Optuna
define-by-run constants; Ray's ``tune.sample_from`` must return a value, so there the key
carries this marker and :func:`strip_switches` removes it."""


def value_in(value: Any, allowed: tuple[Any, ...]) -> bool:
    """``value in allowed`` without 1 == True == 1.0 confusions between bools and numbers."""
    return any(type(value) is type(a) and value == a or (
        isinstance(value, (int, float)) and isinstance(a, (int, float))
        and not isinstance(value, bool) and not isinstance(a, bool) and value == a) for a in allowed)


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
    file, else the algorithm's default, else :data:`OMITTED`: left out).
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

    def to_entry(self) -> dict[str, Any]:
        """This parameter as one ``params`` entry of a complete file (``otherwise`` spelled out)."""
        entry: dict[str, Any] = {"distribution": self.distribution}
        if self.distribution in ("uniform", "loguniform", "int"):
            entry.update(low=self.low, high=self.high, default=self.default)
            if self.log:
                entry["log"] = True
        elif self.distribution == "categorical":
            entry.update(choices=list(self.choices), default=self.default)
        else:
            entry["value"] = self.value
        if self.when:
            entry["when"] = {ref: list(values) for ref, values in self.when.items()}
            if self.fallback is not OMITTED:
                entry["otherwise"] = self.fallback
        if self.help:
            entry["help"] = self.help
        return entry

    def holds(self, context: Mapping[str, Any]) -> bool:
        """Whether the condition holds for ``context`` (switch / parameter name -> value)."""
        return all(value_in(context.get(ref), allowed) for ref, allowed in self.when.items())

    def ray_domain(self) -> Any:
        """The unconditional Ray Tune sampler (or the constant, for ``fixed``).

        ``int`` ranges are inclusive here and in the file, while ``tune.randint`` excludes
        its upper end, so ``high + 1`` is passed on.
        """
        from ray import tune  # lazy: keeps ray out of this module's import

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
        # lazy: keeps ray, pyarrow out of this module's import
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
    """A validated search space of one algorithm; :mod:`fedtune.spaces.lookup` describes the file format.

    ``constants`` holds ``algorithm`` and any ``client_method`` / ``server_rule`` /
    ``setting`` of the file (or derived: the one setting a pair runs in): they are part of every
    configuration the space produces. ``source``: the file's path, or the algorithm's name for a
    space with no file (derived from the declarations alone; ``load_space(source)`` reads it again).
    """

    algorithm: str
    source: str
    constants: Mapping[str, Any]
    switches: Mapping[str, Switch]
    params: Mapping[str, ParamSpec]
    description: str = ""
    # Where each parameter and switch comes from (``declared: server rule fedomg``, ``shared``,
    # ``shared + file (low, high)``, ``file``: :mod:`fedtune.spaces.derive`); empty for a complete file.
    origins: Mapping[str, str] = field(default_factory=dict, compare=False)

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
        value), conditions evaluated with the switches' defaults. Ready for ``FederatedRunConfig``.

        >>> from fedtune.spaces.lookup import load_space
        >>> load_space("fedavg").defaults()["local_lr"]
        0.05
        """
        out: dict[str, Any] = dict(self.constants)
        context = {s.name: s.default for s in self.switches.values()}
        for p in self._ordered():
            value = p.initial if p.holds(context) else p.fallback
            if value is OMITTED:
                continue
            out[p.name] = value
            context[p.name] = value
        return out

    def to_document(self) -> dict[str, Any]:
        """The space as a complete search-space document (``complete: true``: read again, nothing is
        derived from the declarations): what a study's ``spaces/`` snapshot holds and
        ``fedtune spaces show NAME --yaml`` prints. Reading it back gives this space.

        >>> from fedtune.spaces.lookup import load_space
        >>> doc = load_space("fedgp").to_document()
        >>> doc["complete"], doc["setting"], doc["params"]["gp_beta"]["when"]
        (True, 'fda', {'gp_beta_mode': ['fixed']})
        """
        doc: dict[str, Any] = {**self.constants, "complete": True}
        if self.description:
            doc["description"] = self.description
        if self.switches:
            doc["switches"] = {s.name: {"choices": list(s.choices), "default": s.default,
                                        **({"help": s.help} if s.help else {})} for s in self.switches.values()}
        doc["params"] = {p.name: p.to_entry() for p in self.params.values()}
        return doc

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

        >>> from fedtune.spaces.lookup import load_space
        >>> type(load_space("fedavg").tune_space()["local_lr"]).__name__
        'Float'
        """
        from ray import tune  # lazy: keeps ray out of this module's import

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
        fallback of each parameter whose condition fails (none for one left out, :data:`OMITTED`). OptunaSearch merges the suggested
        values with this returned dict into the trial's config (Ray 2.60's contract: the
        function returns ``None`` or a dict of constants).
        """
        constants: dict[str, Any] = dict(self.constants)
        context: dict[str, Any] = {}
        for s in self.switches.values():
            context[s.name] = trial.suggest_categorical(s.key, list(s.choices))
        for p in self._ordered():
            if not p.holds(context):
                if p.fallback is not OMITTED:
                    constants[p.name] = p.fallback
                    context[p.name] = p.fallback
                continue
            value = p.suggest(trial)
            context[p.name] = value
            if not p.sampled:
                constants[p.name] = value
        return constants



def strip_switches(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` without its ``switch.*`` keys, the parameters left out (:data:`OMITTED`) and an
    older study's private keys: what a :class:`~fedtune.config.FederatedRunConfig` accepts.

    >>> strip_switches({"switch.mode": "a", "local_lr": 0.1, "server_beta1": OMITTED})
    {'local_lr': 0.1}
    """
    return {k: v for k, v in config.items()
            if not (isinstance(k, str) and (k.startswith(SWITCH_PREFIX) or k in _LEGACY_KEYS)) and v is not OMITTED}
