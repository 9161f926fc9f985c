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

import importlib
from collections.abc import Iterable, Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any, NoReturn

from fedtune.algorithms.base import ClientMethodSpec, HParam, Preset, RunConfig, ServerRuleSpec, ServerSideSpec
from fedtune.algorithms.declarations import CLIENT_METHOD_SPECS, SERVER_RULE_SPECS
from fedtune.algorithms.optimizer_declarations import SERVER_OPTIMIZER_SPECS
from fedtune.algorithms.presets import PRESETS
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
        return self._specs[name]

    def specs(self) -> list[Any]:
        """Every declaration, in registry order; imports nothing."""
        return list(self._specs.values())

    def where(self, name: str) -> str:
        """Where ``name``'s class lives, ``"module:Class"`` (KeyError for an unknown name)."""
        return self._specs[name].where

    def __getitem__(self, name: str) -> type:
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
        return name in self._specs

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
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

# The client's local optimisers (fedtune.algorithms.client.optim) and compute precisions
# (fedtune.algorithms.client.precision): the config's allowed values, named here without importing torch.
LOCAL_OPTIMIZERS = ("sgd", "adam")
PRECISIONS = ("fp32", "bf16", "fp16")

ALL_SETTINGS = ("fdg", "fl", "fda", "ufdg")


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
        server rule's (:meth:`~fedtune.algorithms.base.ServerRuleSpec.hooks`), then in-run tuning's
        (FedEx, ``fedex_configs`` > 0: :mod:`fedtune.algorithms.client.fedex`)."""
        fedex = ("fedtune.algorithms.client.fedex:FedExHook",) if getattr(cfg, "fedex_configs", 0) else ()
        return self.rule_spec.hooks(cfg) + fedex

    def in_run_tuner(self, cfg: RunConfig) -> Any:
        """The coordinator's in-run tuner of a run with ``cfg``
        (:class:`~fedtune.algorithms.server.fedex.FedExServer`), None without one (NumPy only)."""
        if not getattr(cfg, "fedex_configs", 0):
            return None
        from fedtune.algorithms.server.fedex import fedex_server

        return fedex_server(cfg)


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
