"""Algorithms = presets of (client method, server rule), and the registries behind them.

Adding a method or rule: write its class in a module of its own (a
:class:`~fedtune.algorithms.client.method.ClientMethod` whose step function goes through the one local
loop, or a :class:`~fedtune.algorithms.server.rule.ServerRule` built on
:mod:`~fedtune.algorithms.server.aggregate`) and declare it once in
:mod:`fedtune.algorithms.declarations` (its hyperparameters, flags and ``"module:Class"``);
a named algorithm is one :class:`~fedtune.algorithms.base.Preset` there. The registries here
are built from those declarations. Any client method composes with any server rule
(``--set client_method=... --set server_rule=...``).

The registries are lazy (:class:`Registry`): a name's declaration is read without importing
anything, and its class is imported when it is first looked up. Client-method modules import torch; server rules
are NumPy only. Importing this package imports neither, so the coordinator, which looks up only
its server rule (``cfg.resolved.server_rule``: :class:`Resolved` resolves each class on first
access), never imports torch.

>>> resolve_names("fedavg")
('sgd', 'fedavg')
>>> resolve_names("fedsam", server_rule="fedomg")   # the paper's FedSAM+OMG
('sam', 'fedomg')
>>> resolve_names("fedgala", setting="ufdg")        # FedGaLA's unsupervised form
('gala-simclr', 'gala')
>>> "sam" in CLIENT_METHODS, CLIENT_METHODS.where("sam")   # no import yet
(True, 'fedtune.algorithms.client.sam:SAM')
"""

from __future__ import annotations

import dataclasses
import importlib
import types
import warnings
from collections.abc import Iterable, Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any, NoReturn

from fedtune.algorithms.base import (ClientMethodSpec, ComponentSpec, HParam, InRunTunerSpec, Preset, RunConfig,
                                     ServerOptimizerSpec, ServerRuleSpec, ServerSideSpec)
from fedtune.algorithms.declarations import CLIENT_METHOD_SPECS, SERVER_RULE_SPECS
from fedtune.algorithms.optimizer_declarations import SERVER_OPTIMIZER_SPECS
from fedtune.algorithms.presets import PRESETS
from fedtune.algorithms.tuner_declarations import IN_RUN_TUNER_SPECS
from fedtune.entry_points import PluginWarning, load_entry_points
from fedtune.errors import ConfigError, shown
from fedtune.old_names import old_name_error


class Registry(MutableMapping[str, type]):
    """Component name -> its class, declared by a spec (:mod:`fedtune.algorithms.declarations`)
    whose ``where`` (``"module:Class"``) is imported on first lookup.

    A mapping in declaration order: ``REGISTRY[name]`` (the class), ``name in REGISTRY``,
    iteration and :meth:`keys` (the names; neither imports anything), :meth:`spec` (the
    declaration, torch-free), :meth:`values` / :meth:`items` (import every component). A class
    must carry the ``name`` it is registered under. ``REGISTRY[name] = spec`` registers a
    declared component at run time, ``REGISTRY[name] = cls`` one whose class carries its
    declaration as ``cls.spec`` (a component defined in a test or a notebook); ``del
    REGISTRY[name]`` removes it."""

    def __init__(self, kind: str, specs: Iterable[Any]):
        self.kind = kind
        self._specs: dict[str, Any] = {}
        for spec in specs:
            self._specs[spec.name] = spec
        self._classes: dict[str, type] = {}

    def spec(self, name: str) -> Any:
        """The declaration of ``name`` (KeyError for an unknown name); imports nothing."""
        load_plugin_entry_points()
        return self._specs[name]

    def specs(self) -> list[Any]:
        """Every declaration, in registry order; imports nothing."""
        load_plugin_entry_points()
        return list(self._specs.values())

    def where(self, name: str) -> str:
        """Where ``name``'s class lives, ``"module:Class"`` (KeyError for an unknown name)."""
        load_plugin_entry_points()
        return self._specs[name].where

    def __getitem__(self, name: str) -> type:
        load_plugin_entry_points()
        cls = self._classes.get(name)
        if cls is None:
            module, _, attr = self._specs[name].where.partition(":")
            cls = self._checked(name, getattr(importlib.import_module(module), attr))
            self._classes[name] = cls
        return cls

    def __setitem__(self, name: str, value: Any) -> None:
        if isinstance(value, type):
            spec = getattr(value, "spec", None)
            if spec is None or getattr(spec, "name", None) != name:
                raise RuntimeError(f"{self.kind} '{name}': a class registered at run time carries its declaration "
                                   f"as its 'spec' attribute, named '{name}'")
            self._classes[name] = self._checked(name, value)
            self._specs[name] = spec
        else:
            if getattr(value, "name", None) != name:
                raise RuntimeError(f"{self.kind} '{name}': its declaration is named {getattr(value, 'name', None)!r}")
            self._classes.pop(name, None)
            self._specs[name] = value

    def __delitem__(self, name: str) -> None:
        del self._specs[name]
        self._classes.pop(name, None)

    def _checked(self, name: str, cls: type) -> type:
        if getattr(cls, "name", None) != name:
            raise RuntimeError(f"{self.kind} '{name}' is registered as {cls.__module__}:{cls.__qualname__}, whose "
                               f"name is {getattr(cls, 'name', None)!r}")
        return cls

    def __contains__(self, name: object) -> bool:
        load_plugin_entry_points()
        return name in self._specs

    def __iter__(self) -> Iterator[str]:
        load_plugin_entry_points()
        return iter(list(self._specs))

    def __len__(self) -> int:
        load_plugin_entry_points()
        return len(self._specs)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {list(self._specs)!r})"


# The registries, built from the declarations (torch-free to import).
CLIENT_METHODS = Registry("client method", CLIENT_METHOD_SPECS)
SERVER_RULES = Registry("server rule", SERVER_RULE_SPECS)

# The server side of a client method that keeps state on the server (FedGaLA's last global move,
# Scaffold's server control variate, FedDyn's h, FedIIR's mean gradient, Fishr's mean variance): keyed by the client
# method's name, NumPy only (fedtune.algorithms.server.side); declared with the client method
# (``ClientMethodSpec.server_side``). A client method without one has none.
SERVER_SIDES = Registry("client method's server side", (
    ServerSideSpec(s.name, s.server_side) for s in CLIENT_METHOD_SPECS if s.server_side))

# Server optimisers on the step of any server rule (fedtune.algorithms.server.optimizer, NumPy
# only): the config's ``server_optimizer``; ``sgd`` is the rule's own step.
SERVER_OPTIMIZERS = Registry("server optimizer", SERVER_OPTIMIZER_SPECS)

# In-run tuners of the clients' knobs (fedtune.algorithms.tuner_declarations; the coordinator's half
# fedtune.algorithms.server.tuner.InRunTuner, NumPy only): FedEx. Each is on when its switch field is
# not 0 (fedex_configs); their hyperparameters are run fields (fedtune.config.tuner_fields).
IN_RUN_TUNERS = Registry("in-run tuner", IN_RUN_TUNER_SPECS)

# The client's local optimisers (fedtune.algorithms.client.optim) and compute precisions
# (fedtune.algorithms.client.precision): the config's allowed values, named here without importing torch.
LOCAL_OPTIMIZERS = ("sgd", "adam")
PRECISIONS = ("fp32", "bf16", "fp16")

ALL_SETTINGS = ("fdg", "fl", "fda", "ufdg")


# ------------------------------------------------------------------------ components from outside fedtune
# Who put each name in a registry: fedtune's own declarations, or the plugin (a module, an entry
# point) that registered it (fedtune.plugins.register), for the one-line error of a name taken twice.
_BUILT_IN = "fedtune"
_OWNERS: dict[tuple[str, str], str] = {
    **{(r.kind, n): _BUILT_IN for r in (CLIENT_METHODS, SERVER_RULES, SERVER_OPTIMIZERS, IN_RUN_TUNERS)
       for n in r._specs},
    **{("algorithm", n): _BUILT_IN for n in PRESETS}}
_KIND_OF_SPEC = ((ClientMethodSpec, CLIENT_METHODS, "fedtune.algorithms.client.method", "ClientMethod"),
                 (ServerRuleSpec, SERVER_RULES, "fedtune.algorithms.server.rule", "ServerRule"),
                 (ServerOptimizerSpec, SERVER_OPTIMIZERS, "fedtune.algorithms.server.optimizer", "ServerOptimizer"))
COMPONENT_HELP = ("a ClientMethod, ServerRule or ServerOptimizer subclass carrying its declaration as 'spec' "
                  "(from fedtune import ...), such a declaration, or a Preset")


def owner_of(kind: str, name: str) -> str | None:
    """Who registered ``name`` as a ``kind`` ("client method", ..., "algorithm"): ``"fedtune"`` for a
    built-in, the plugin's description for one from outside, None when nobody has."""
    return _OWNERS.get((kind, name))


def register_component(component: Any, owner: str) -> tuple[str, str]:
    """Put a component from outside fedtune in its registry (``owner`` names who registers it, for
    messages); returns ``(kind, name)``. ``component`` is a subclass of ClientMethod, ServerRule or
    ServerOptimizer carrying its declaration as ``spec`` (an empty ``spec.where`` is filled in from the
    class, a ``name`` the class does not set itself from the spec), a declaration alone (its class imported from
    ``spec.where`` on first use), or a :class:`Preset`. Registering the same component again is a
    no-op; a name that fedtune or another plugin already has, a class whose base does not match its
    spec, or a hyperparameter declared differently elsewhere is one ConfigError naming both sides.
    Imports nothing (the class's base is checked by name, so torch stays out of this process)."""
    if isinstance(component, Preset):
        return _register_preset(component, owner)
    cls = component if isinstance(component, type) else None
    spec = getattr(component, "spec", None) if cls is not None else component
    kinds = [k for k in _KIND_OF_SPEC if isinstance(spec, k[0])]
    if not kinds:
        what = f"class {cls.__module__}.{cls.__qualname__} has no 'spec' declaration" if cls is not None and spec is None \
            else f"{shown(component, 80)} is not a fedtune component"
        raise ConfigError(f"{owner}: {what}; allowed: {COMPONENT_HELP}")
    _, registry, base_module, base = kinds[0]
    if cls is not None:
        if not any(c.__module__ == base_module and c.__name__ == base for c in cls.__mro__):
            raise ConfigError(f"{owner}: {cls.__qualname__} declares a {registry.kind} (a {type(spec).__name__}) but "
                              f"does not subclass {base}; allowed: a subclass of fedtune.{base}")
        if not spec.where:
            spec = dataclasses.replace(spec, where=f"{cls.__module__}:{cls.__qualname__}")
            cls.spec = spec  # the registry keeps the class's own declaration: it says where the class lives
        if "name" not in vars(cls):  # its own, not a base class's (a subclass of SGD is not "sgd")
            cls.name = spec.name
        elif cls.name != spec.name:
            raise ConfigError(f"{owner}: {cls.__qualname__}.name is {shown(cls.name)} but its spec is named "
                              f"{shown(spec.name)}; give them one name")
    elif not spec.where or ":" not in spec.where:
        raise ConfigError(f"{owner}: {registry.kind} {shown(spec.name)} declares no place for its class (where: "
                          f"{shown(spec.where)}); allowed: 'module:Class', or register the class itself")
    taken = _OWNERS.get((registry.kind, spec.name))
    if taken is not None:
        if registry._specs.get(spec.name) == spec and (cls is None or registry._classes.get(spec.name) in (None, cls)):
            return registry.kind, spec.name  # the same component again (a module imported twice)
        where = "fedtune's built-in" if taken == _BUILT_IN else f"already registered by {taken}"
        raise ConfigError(f"{owner}: {registry.kind} {shown(spec.name)} is {where} "
                          f"({registry._specs[spec.name].where}); allowed: a name of its own")
    _check_new_hparams(spec, f"{registry.kind} {spec.name} ({owner})")
    registry[spec.name] = cls if cls is not None else spec
    if isinstance(spec, ClientMethodSpec) and spec.server_side:
        SERVER_SIDES[spec.name] = ServerSideSpec(spec.name, spec.server_side)
    _OWNERS[(registry.kind, spec.name)] = owner
    return registry.kind, spec.name


def _check_new_hparams(spec: ComponentSpec, owner: str) -> None:
    known = all_hparams()
    for h in spec.hparams:
        if not isinstance(h, HParam):
            raise ConfigError(f"{owner}: hyperparameter {shown(h, 60)} is not a fedtune.HParam")
        if h.name in known and known[h.name][1] != h:
            raise ConfigError(f"{owner}: hyperparameter {h.name!r} is declared differently by {known[h.name][0]}; "
                              f"allowed: another name, or share that component's HParam object")


def _register_preset(preset: Preset, owner: str) -> tuple[str, str]:
    taken = _OWNERS.get(("algorithm", preset.name))
    if taken is not None:
        if PRESETS.get(preset.name) == preset:
            return "algorithm", preset.name
        where = "fedtune's built-in" if taken == _BUILT_IN else f"already registered by {taken}"
        raise ConfigError(f"{owner}: algorithm {shown(preset.name)} is {where}; allowed: a name of its own")
    for field_name, registry in (("client_method", CLIENT_METHODS), ("server_rule", SERVER_RULES)):
        if getattr(preset, field_name) not in registry:
            raise ConfigError(f"{owner}: algorithm {preset.name!r} pairs {registry.kind} "
                              f"{shown(getattr(preset, field_name))}, which is not registered; register it first")
    PRESETS[preset.name] = preset
    _OWNERS[("algorithm", preset.name)] = owner
    return "algorithm", preset.name


_entry_points_seen = 0


def load_plugin_entry_points() -> None:
    """Installed packages' plugins (:mod:`fedtune.entry_points`), on the first use of a registry: a
    module registers its components as it is imported; a component an entry point names is
    registered here. One that cannot be registered is one warning line naming it; the rest stay."""
    global _entry_points_seen
    loaded = load_entry_points()
    while _entry_points_seen < len(loaded):
        ep = loaded[_entry_points_seen]
        _entry_points_seen += 1
        if ep.obj is None or isinstance(ep.obj, types.ModuleType) or _is_dataset(ep.obj):
            continue
        try:
            register_component(ep.obj, f"plugin entry point {ep.name!r} ({ep.distribution or 'unknown package'})")
        except ConfigError as exc:
            warnings.warn(f"{exc}; skipped", PluginWarning, stacklevel=3)


def _is_dataset(obj: Any) -> bool:
    """A dataset plugin (fedtune.data.registry.DatasetSpec, which that registry takes), told by its
    type's name: importing the data registry here would put torch within the coordinator's reach."""
    return any(c.__name__ == "DatasetSpec" and c.__module__ == "fedtune.data.registry" for c in type(obj).__mro__)


def own_knobs(algorithm: str) -> tuple[str, ...]:
    """The hyperparameters that are ``algorithm``'s own: those of its client method (and its
    unsupervised one) and its server rule, plus the shared fields its paper tunes as its own
    (:attr:`Preset.own_shared`). Everything else (local_lr, momentum, weight decay, the server step
    of a plain weighted mean) is shared by every algorithm. ``fedtune sweep --knobs own`` searches
    only these and fixes the rest at one value for every method.

    >>> own_knobs("fedavg"), own_knobs("fedprox"), own_knobs("fedomg")
    (('client_weighting',), ('prox_mu', 'client_weighting'), ('omg_kappa', 'omg_solver', 'omg_rescale', 'global_lr'))
    """
    p = PRESETS[algorithm]
    names: list[str] = []
    specs = [CLIENT_METHODS.spec(p.client_method), SERVER_RULES.spec(p.server_rule)]
    if p.unsupervised_client_method:
        specs.insert(1, CLIENT_METHODS.spec(p.unsupervised_client_method))
    for spec in specs:
        for h in spec.hparams:
            if h.name not in names:
                names.append(h.name)
    return tuple(names) + tuple(n for n in p.own_shared if n not in names)


@dataclass(frozen=True)
class Resolved:
    """What a config runs: its algorithm and the names of its client method and server rule.

    The declarations (:attr:`client_spec`, :attr:`rule_spec`) import nothing; each class is looked
    up (its module imported) when first asked for: the coordinator asks only for
    :attr:`server_rule` and so never imports a client method (nor torch)."""

    algorithm: str
    client_method_name: str
    server_rule_name: str

    @property
    def client_method(self) -> Any:
        """The client method's class (a :class:`~fedtune.algorithms.client.method.ClientMethod` subclass)."""
        return CLIENT_METHODS[self.client_method_name]

    @property
    def server_rule(self) -> Any:
        """The server rule's class (a :class:`~fedtune.algorithms.server.rule.ServerRule` subclass)."""
        return SERVER_RULES[self.server_rule_name]

    @property
    def client_spec(self) -> ClientMethodSpec:
        """The client method's declaration (torch-free)."""
        return CLIENT_METHODS.spec(self.client_method_name)

    @property
    def rule_spec(self) -> ServerRuleSpec:
        """The server rule's declaration."""
        return SERVER_RULES.spec(self.server_rule_name)

    @property
    def settings(self) -> tuple[str, ...]:
        """The settings this pair runs in (:func:`supported_settings`)."""
        return supported_settings(PRESETS[self.algorithm], self.client_spec, self.rule_spec)

    def hparam_specs(self) -> dict[str, HParam]:
        return {h.name: h for h in (*self.client_spec.hparams, *self.rule_spec.hparams)}

    def effective_global_lr(self, cfg: RunConfig) -> float:
        """The server learning rate a run with ``cfg`` uses: ``cfg.global_lr`` if set, else the server
        optimiser's :attr:`~fedtune.algorithms.base.ServerOptimizerSpec.default_lr` (FedAdam, FedYogi,
        FedAdagrad: 1e-3, Adam's step size), else the rule's
        :attr:`~fedtune.algorithms.base.ServerRuleSpec.default_global_lr` (the one source)."""
        if cfg.global_lr is not None:
            return float(cfg.global_lr)
        own = SERVER_OPTIMIZERS.spec(getattr(cfg, "server_optimizer", "sgd")).default_lr
        return float(own) if own is not None else float(self.rule_spec.default_global_lr)

    def preset_defaults(self) -> dict[str, Any]:
        """The algorithm's own defaults (:attr:`Preset.defaults`) for the hyperparameters this pair
        declares: a run of the preset that leaves one unset runs this value (the config puts it in
        its ``params``); one the pair does not declare (an overridden rule) is left out.

        >>> Resolved("fedsr", "fedsr", "fedavg").preset_defaults()
        {'client_weighting': 'uniform'}
        >>> Resolved("fedsr", "fedsr", "fedomg").preset_defaults()   # FedOMG weighs by examples, as its authors
        {}
        """
        specs = self.hparam_specs()
        return {name: value for name, value in PRESETS[self.algorithm].defaults if name in specs}

    def implied_defaults(self, params: dict[str, Any]) -> dict[str, Any]:
        """What the readings named in ``params`` set (:attr:`HParam.implies`; a choice left unset
        counts at its default), for the hyperparameters this pair declares; the config puts each
        one in ``params`` where the run leaves it unset.

        >>> Resolved("fedadg", "fedadg", "fedavg").implied_defaults({"fedadg_variant": "authors_vlcs"})["fedadg_gen_loss"]
        'frozen'
        >>> Resolved("fedadg", "fedadg", "fedavg").implied_defaults({})
        {}
        """
        specs = self.hparam_specs()
        out: dict[str, Any] = {}
        for h in specs.values():
            value = params.get(h.name, h.default)
            for name, implied in dict(h.implies).get(value, ()) if isinstance(value, str) else ():
                if name in specs:
                    out[name] = implied
        return out

    def hyperparameters(self, cfg: RunConfig) -> dict[str, Any]:
        """Every hyperparameter of the pair: its value in ``cfg`` (set, else the default)."""
        return {h.name: h.of(cfg) for h in self.hparam_specs().values()}

    def client_hooks(self, cfg: RunConfig) -> tuple[str, ...]:
        """Where the client hooks live that every participant of a run with ``cfg`` runs: the
        server rule's (:meth:`~fedtune.algorithms.base.ServerRuleSpec.hooks`), then its in-run
        tuner's (:attr:`~fedtune.algorithms.base.InRunTunerSpec.client_hooks`)."""
        tuner = in_run_tuner_spec(cfg)
        return self.rule_spec.hooks(cfg) + (tuner.client_hooks if tuner is not None else ())

    def in_run_tuner(self, cfg: RunConfig) -> Any:
        """The coordinator's in-run tuner of a run with ``cfg`` (an
        :class:`~fedtune.algorithms.server.tuner.InRunTuner`), None without one (NumPy only)."""
        tuner = in_run_tuner_spec(cfg)
        return IN_RUN_TUNERS[tuner.name].from_config(cfg) if tuner is not None else None


def in_run_tuner_spec(cfg: RunConfig) -> InRunTunerSpec | None:
    """The declaration of the in-run tuner a run with ``cfg`` tunes with (its switch field not 0),
    None without one; two switched on at once is one ConfigError naming both."""
    on = [spec for spec in IN_RUN_TUNERS.specs() if spec.is_on(cfg)]
    if len(on) > 1:
        raise ConfigError(f"field '{on[1].switch}': a run tunes with one in-run tuner, and {on[0].switch} "
                          f"{getattr(cfg, on[0].switch)!r} already turns on {on[0].title}; allowed: "
                          f"{' or '.join(f'{t.switch} 0' for t in on)}")
    return on[0] if on else None


def resolve_names(algorithm: str, client_method: str | None = None, server_rule: str | None = None,
                  setting: str | None = None) -> tuple[str, str]:
    preset = PRESETS[algorithm]
    default_client = preset.client_method
    if setting == "ufdg" and preset.unsupervised_client_method:
        default_client = preset.unsupervised_client_method
    return client_method or default_client, server_rule or preset.server_rule


def supported_settings(preset: Preset, client: ClientMethodSpec, rule: ServerRuleSpec) -> tuple[str, ...]:
    """The settings the pair (``client``, ``rule``: their declarations) runs in under ``preset``."""
    allowed = set(preset.settings)
    if client.name == preset.unsupervised_client_method and rule.name == preset.server_rule:
        allowed = {"ufdg"}
    elif client.name != preset.client_method or rule.name != preset.server_rule:
        allowed = set(ALL_SETTINGS)  # a custom pair: what its parts support
    if client.supervised:
        allowed.discard("ufdg")
    else:
        allowed &= {"ufdg"}
    if rule.needs_target_client:
        allowed &= {"fda"}
    if rule.needs_supervised_client:
        allowed.discard("ufdg")
    return tuple(s for s in ALL_SETTINGS if s in allowed)


def resolve(cfg: RunConfig) -> Resolved:
    """The names behind ``cfg.algorithm`` (+ overrides), each class resolved on first use; raises
    ConfigError on bad names.

    Resolves afresh on every call; a :class:`~fedtune.config.FederatedRunConfig` keeps the answer
    as ``cfg.resolved`` (ask it there)."""
    check_algorithm_names(cfg)
    cm, sr = resolve_names(cfg.algorithm, cfg.client_method, cfg.server_rule, getattr(cfg, "setting", None))
    return Resolved(cfg.algorithm, cm, sr)


def check_algorithm_names(cfg: RunConfig) -> None:
    if cfg.algorithm not in PRESETS:
        raise ConfigError(f"field 'algorithm': {shown(cfg.algorithm)} is unknown; allowed: {', '.join(PRESETS)}")
    if cfg.client_method is not None and cfg.client_method not in CLIENT_METHODS:
        raise ConfigError(f"field 'client_method': {shown(cfg.client_method)} is unknown; allowed: "
                          f"{', '.join(CLIENT_METHODS)}")
    if cfg.server_rule is not None and cfg.server_rule not in SERVER_RULES:
        raise ConfigError(f"field 'server_rule': {shown(cfg.server_rule)} is unknown; allowed: {', '.join(SERVER_RULES)}")


def all_hparams() -> dict[str, tuple[str, HParam]]:
    """Every component hyperparameter: name -> (owners, spec). A name means one thing everywhere:
    components may share a hyperparameter (GFM and SAM share ``sam_rho``) only with one spec.
    Reads the declarations only (imports no component)."""
    out: dict[str, tuple[str, HParam]] = {}
    for kind, registry in (("client method", CLIENT_METHODS), ("server rule", SERVER_RULES),
                           ("server optimizer", SERVER_OPTIMIZERS)):
        for comp in registry.specs():
            for h in comp.hparams:
                owner = f"{kind} {comp.name}"
                if h.name in out:
                    if out[h.name][1] != h:
                        raise RuntimeError(f"hyperparameter '{h.name}' is declared differently by {out[h.name][0]} "
                                           f"and {owner}; share one HParam object")
                    owner = f"{out[h.name][0]}, {owner}"
                out[h.name] = (owner, h)
    return out


def __getattr__(name: str) -> NoReturn:
    """A name this package exported before the house-keeping raises one line naming its new spelling."""
    raise old_name_error(__name__, name)
