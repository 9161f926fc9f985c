"""Algorithms = presets of (client method, server rule), and the registries behind them.

Adding a method or rule: write its class in a module of its own (a
:class:`~fedtune.algorithms.client.ClientMethod` whose step function goes through the one local
loop, or a :class:`~fedtune.algorithms.server.ServerRule` built on
:mod:`~fedtune.algorithms.aggregate`) and add one line to :data:`CLIENT_METHODS` or
:data:`SERVER_RULES` below: its name and where its class lives (``"module:Class"``); adding a
named algorithm: one :class:`Preset` line. Any client method composes with any server rule
(``--set client_method=... --set server_rule=...``).

The registries are lazy (:class:`Registry`): a name is resolved to its class, importing the
class's module, when it is first looked up. Client-method modules import torch; server rules
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
(True, 'fedtune.algorithms.sam:SAM')
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any

from fedtune.algorithms.base import HParam
from fedtune.errors import ConfigError, shown


class Registry(MutableMapping[str, type]):
    """Component name -> its class, given as ``"module:Class"`` and imported on first lookup.

    A mapping in declaration order: ``REGISTRY[name]`` (the class), ``name in REGISTRY``,
    iteration and :meth:`keys` (the names; neither imports anything), :meth:`values` /
    :meth:`items` (import every component). A class must carry the ``name`` it is registered
    under. ``REGISTRY[name] = cls`` (or ``= "module:Class"``) registers one at run time (a
    component defined in a test or a notebook); ``del REGISTRY[name]`` removes it."""

    def __init__(self, kind: str, places: dict[str, str]):
        self.kind = kind
        self._places = dict(places)
        self._classes: dict[str, type] = {}

    def where(self, name: str) -> str:
        """Where ``name``'s class lives, ``"module:Class"`` (KeyError for an unknown name)."""
        return self._places[name]

    def __getitem__(self, name: str) -> type:
        cls = self._classes.get(name)
        if cls is None:
            module, _, attr = self._places[name].partition(":")
            cls = self._checked(name, getattr(importlib.import_module(module), attr))
            self._classes[name] = cls
        return cls

    def __setitem__(self, name: str, value: type | str) -> None:
        if isinstance(value, str):
            self._classes.pop(name, None)
            self._places[name] = value
        else:
            self._classes[name] = self._checked(name, value)
            self._places[name] = f"{value.__module__}:{value.__qualname__}"

    def __delitem__(self, name: str) -> None:
        del self._places[name]
        self._classes.pop(name, None)

    def _checked(self, name: str, cls: type) -> type:
        if getattr(cls, "name", None) != name:
            raise RuntimeError(f"{self.kind} '{name}' is registered as {cls.__module__}:{cls.__qualname__}, whose "
                               f"name is {getattr(cls, 'name', None)!r}")
        return cls

    def __contains__(self, name: object) -> bool:
        return name in self._places

    def __iter__(self) -> Iterator[str]:
        return iter(self._places)

    def __len__(self) -> int:
        return len(self._places)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self._places!r})"


# One line per component: its name and where its class lives (torch-free to import).
CLIENT_METHODS = Registry("client method", {
    "sgd": "fedtune.algorithms.client:SGD",
    "simclr": "fedtune.algorithms.simclr:SimCLR",
    "gala-simclr": "fedtune.algorithms.simclr:GalaSimCLR",
    "prox": "fedtune.algorithms.prox:Prox",
    "sam": "fedtune.algorithms.sam:SAM",
    "gfm": "fedtune.algorithms.gfm:GFM",
    "gca": "fedtune.algorithms.gfm:GCA",
    "gala": "fedtune.algorithms.gala_client:GalaClient",
    "fedsr": "fedtune.algorithms.fedsr:FedSR",
    "scaffold": "fedtune.algorithms.scaffold:Scaffold",
    "feddyn": "fedtune.algorithms.feddyn:FedDyn",
    "moon": "fedtune.algorithms.moon:MOON",
    "fediir": "fedtune.algorithms.fediir:FedIIR",
    "fishr": "fedtune.algorithms.fishr:Fishr",
})
SERVER_RULES = Registry("server rule", {
    "fedavg": "fedtune.algorithms.server:FedAvg",
    "fedda": "fedtune.algorithms.fedgp:FedDA",
    "fedgp": "fedtune.algorithms.fedgp:FedGP",
    "target_only": "fedtune.algorithms.fedgp:TargetOnly",
    "gala": "fedtune.algorithms.gala:Gala",
    "fedomg": "fedtune.algorithms.fedomg:FedOMG",
    "fedga": "fedtune.algorithms.fedga:FedGA",
})

# The server side of a client method that keeps state on the server (FedGaLA's last global move,
# Scaffold's server control variate, FedDyn's h, FedIIR's mean gradient, Fishr's mean variance): keyed by the client
# method's name, NumPy only (fedtune.algorithms.server_side). A client method without one has none.
SERVER_SIDES = Registry("client method's server side", {
    "scaffold": "fedtune.algorithms.scaffold_server:ScaffoldServer",
    "feddyn": "fedtune.algorithms.feddyn_server:FedDynServer",
    "gala": "fedtune.algorithms.gala_move:GlobalMove",
    "gala-simclr": "fedtune.algorithms.gala_move:SimclrGlobalMove",
    "fediir": "fedtune.algorithms.fediir_server:FedIIRServer",
    "fishr": "fedtune.algorithms.fishr_server:FishrServer",
})

# Server optimisers on the step of any server rule (fedtune.algorithms.server_optimizer, NumPy
# only): the config's ``server_optimizer``; ``sgd`` is the rule's own step.
SERVER_OPTIMIZERS = Registry("server optimizer", {
    "sgd": "fedtune.algorithms.server_optimizer:ServerOptimizer",
    "avgm": "fedtune.algorithms.server_optimizer:FedAvgM",
    "adam": "fedtune.algorithms.server_optimizer:FedAdam",
    "yogi": "fedtune.algorithms.server_optimizer:FedYogi",
    "adagrad": "fedtune.algorithms.server_optimizer:FedAdagrad",
})

# The client's local optimisers (fedtune.algorithms.optim) and compute precisions
# (fedtune.algorithms.precision): the config's allowed values, named here without importing torch.
LOCAL_OPTIMIZERS = ("sgd", "adam")
PRECISIONS = ("fp32", "bf16", "fp16")

ALL_SETTINGS = ("fdg", "fl", "fda", "ufdg")


@dataclass(frozen=True)
class Preset:
    """A named algorithm: a client method, a server rule, the settings it is meant for."""

    name: str
    client_method: str
    server_rule: str
    settings: tuple[str, ...]
    description: str
    # Client method used instead in the unsupervised ``ufdg`` setting (FedGaLA: SimCLR + gating).
    unsupervised_client_method: str | None = None
    # Shared fields this algorithm's paper tunes as its own (FedOMG: its server step scales d, η_g).
    own_shared: tuple[str, ...] = ()
    # This algorithm's defaults for hyperparameters of its client method or server rule, where its
    # authors' code differs from the component's default (FedSR, FedIIR: the uniform mean of the
    # models, ``client_weighting: uniform``). A run of the preset whose pair declares the name and
    # leaves it unset gets this value in its ``params`` (:meth:`Resolved.preset_defaults`).
    defaults: tuple[tuple[str, Any], ...] = ()


PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset("fedavg", "sgd", "fedavg", ("fdg", "fl", "fda"), "FedAvg (McMahan et al.): local SGD, weighted mean of updates"),
    Preset("fedomg", "sgd", "fedomg", ("fdg", "fl"), "FedOMG (Nguyen et al.): local SGD, on-server matching gradient d = g_FL + κ‖g_FL‖ Γ*g/‖Γ*g‖ (omg_kappa, omg_solver, omg_rescale)",
           own_shared=("global_lr",)),
    Preset("fedda", "sgd", "fedda", ("fda",), "FedDA (Jiang et al.): Σ α_i[(1−β_i)Δ_T + β_i Δ_i] (gp_beta fixed or auto, gp_align)"),
    Preset("fedgp", "sgd", "fedgp", ("fda",), "FedGP (Jiang et al.): Σ α_i[(1−β_i)Δ_T + β_i Proj₊(Δ_T|Δ_i)] per tensor (gp_beta fixed or auto, gp_align)"),
    Preset("target-only", "sgd", "target_only", ("fda",), "target-only baseline: θ ← θ + Δ_T of the FDA target client, sources ignored"),
    Preset("fedprox", "prox", "fedavg", ("fdg", "fl", "fda"), "FedProx (Li et al.): local SGD + prox_mu/2 ||θ − θ_global||², FedAvg"),
    Preset("fedsam", "sam", "fedavg", ("fdg", "fl", "fda"), "FedSAM (Caldarola et al.): SAM local steps (sam_rho), FedAvg"),
    Preset("gfm", "gfm", "fedavg", ("fdg", "fl"), "GFM: SAM steps on global-model-constrained adversarial augmentations (sam_rho, gfm_*), FedAvg"),
    Preset("gca", "gca", "fedavg", ("fdg", "fl"), "GCA (GFM ablation): local SGD on the constrained adversarial augmentations (gfm_*), FedAvg"),
    Preset("simclr", "simclr", "fedavg", ("ufdg",), "FedAvg of SimCLR encoders (unsupervised), linear-probe evaluation"),
    Preset("fedgala", "gala", "gala", ("fdg", "fl"), "FedGaLA (Pourpanah et al.): locally gated SGD (gala_tau, gala_gate descent|literal) + global alignment at FedAvg scale (gala_iters, gala_mix, gala_weights per-tensor|whole)",
           unsupervised_client_method="gala-simclr"),
    Preset("fedsr", "fedsr", "fedavg", ("fdg", "fl"), "FedSR (Nguyen et al.): probabilistic representation z, CE + fedsr_l2r E‖z‖² + fedsr_cmi KL(p(z|x) ‖ r(z|y)) (fedsr_z_dim), FedAvg's uniform mean (the authors')",
           defaults=(("client_weighting", "uniform"),)),
    Preset("fedsam-omg", "sam", "fedomg", ("fdg", "fl"), "FedSAM+OMG (FedOMG paper's combination): SAM local steps (sam_rho) under FedOMG's matching gradient",
           own_shared=("global_lr",)),
    Preset("fedsr-omg", "fedsr", "fedomg", ("fdg", "fl"), "FedSR+OMG (FedOMG paper's combination)",
           own_shared=("global_lr",)),
    Preset("fedga", "sgd", "fedga", ("fdg", "fl"), "FedGA (Zhang et al.): local SGD, aggregation weights moved each round towards the clients with larger validation generalization gaps (fedga_step, fedga_decay, fedga_center, fedga_metric, fedga_init)"),
    Preset("scaffold", "scaffold", "fedavg", ("fdg", "fl"), "SCAFFOLD (Karimireddy et al.): local steps on g − c_i + c (control variates, option II), server c += |S|/N mean Δc_i, FedAvg (global_lr = η_g)"),
    Preset("feddyn", "feddyn", "fedavg", ("fdg", "fl"), "FedDyn (Acar et al.): local loss − ⟨∇L_k(θ_k^(t−1)), θ⟩ + feddyn_alpha/2 ‖θ − θ_global‖², server θ = mean − h/α (feddyn_mean rule|uniform)"),
    Preset("moon", "moon", "fedavg", ("fdg", "fl"), "MOON (Li et al.): CE + moon_mu · model-contrastive loss on the encoder features (z towards the global model's, away from the client's previous model's; moon_temperature), FedAvg"),
    Preset("fediir", "fediir", "fedavg", ("fdg", "fl"), "FedIIR (Guo et al.): CE + fediir_penalty ‖∇_classifier CE − ḡ‖², ḡ the server's EMA (fediir_ema) of the clients' mean classifier gradient, FedAvg's uniform mean (the authors')",
           defaults=(("client_weighting", "uniform"),)),
    Preset("fediir-omg", "fediir", "fedomg", ("fdg", "fl"), "FedIIR+OMG (FedOMG paper's combination)",
           own_shared=("global_lr",)),
    Preset("fishr", "fishr", "fedavg", ("fdg", "fl"), "Fishr (Ramé et al.; federated as FedOMG Eq. 4): CE + fishr_penalty ‖Var[per-example classifier gradients] − clients' mean‖² (fishr_ema, fishr_anneal_iters, fishr_distance), FedAvg"),
)}


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
    for comp in (CLIENT_METHODS.get(p.client_method), CLIENT_METHODS.get(p.unsupervised_client_method or ""),
                 SERVER_RULES.get(p.server_rule)):
        for h in getattr(comp, "hparams", ()) or ():
            if h.name not in names:
                names.append(h.name)
    return tuple(names) + tuple(n for n in p.own_shared if n not in names)


@dataclass(frozen=True)
class Resolved:
    """What a config runs: its algorithm and the names of its client method and server rule.

    Each class is looked up (its module imported) when first asked for: the coordinator asks
    only for :attr:`server_rule` and so never imports a client method (nor torch)."""

    algorithm: str
    client_method_name: str
    server_rule_name: str

    @property
    def client_method(self) -> Any:
        """The client method's class (a :class:`~fedtune.algorithms.client.ClientMethod` subclass)."""
        return CLIENT_METHODS[self.client_method_name]

    @property
    def server_rule(self) -> Any:
        """The server rule's class (a :class:`~fedtune.algorithms.server.ServerRule` subclass)."""
        return SERVER_RULES[self.server_rule_name]

    @property
    def settings(self) -> tuple[str, ...]:
        """The settings this pair runs in (:func:`supported_settings`)."""
        return supported_settings(PRESETS[self.algorithm], self.client_method, self.server_rule)

    def hparam_specs(self) -> dict[str, HParam]:
        return {h.name: h for h in (*self.client_method.hparams, *self.server_rule.hparams)}

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

    def hyperparameters(self, cfg: Any) -> dict[str, Any]:
        """Every hyperparameter of the pair: its value in ``cfg`` (set, else the default)."""
        return {h.name: h.of(cfg) for h in self.hparam_specs().values()}


def resolve_names(algorithm: str, client_method: str | None = None, server_rule: str | None = None,
                  setting: str | None = None) -> tuple[str, str]:
    preset = PRESETS[algorithm]
    default_client = preset.client_method
    if setting == "ufdg" and preset.unsupervised_client_method:
        default_client = preset.unsupervised_client_method
    return client_method or default_client, server_rule or preset.server_rule


def supported_settings(preset: Preset, client: Any, rule: Any) -> tuple[str, ...]:
    """The settings the pair (``client``, ``rule``: their classes) runs in under ``preset``."""
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
    return tuple(s for s in ALL_SETTINGS if s in allowed)


def resolve(cfg: Any) -> Resolved:
    """The names behind ``cfg.algorithm`` (+ overrides), each class resolved on first use; raises
    ConfigError on bad names.

    Resolves afresh on every call; a :class:`~fedtune.config.FederatedRunConfig` keeps the answer
    as ``cfg.resolved`` (ask it there)."""
    check_algorithm_names(cfg)
    cm, sr = resolve_names(cfg.algorithm, cfg.client_method, cfg.server_rule, getattr(cfg, "setting", None))
    return Resolved(cfg.algorithm, cm, sr)


def check_algorithm_names(cfg: Any) -> None:
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
    Imports every component (client methods: torch)."""
    out: dict[str, tuple[str, HParam]] = {}
    for kind, registry in (("client method", CLIENT_METHODS), ("server rule", SERVER_RULES),
                           ("server optimizer", SERVER_OPTIMIZERS)):
        for comp in registry.values():
            for h in comp.hparams:
                owner = f"{kind} {comp.name}"
                if h.name in out:
                    if out[h.name][1] != h:
                        raise RuntimeError(f"hyperparameter '{h.name}' is declared differently by {out[h.name][0]} "
                                           f"and {owner}; share one HParam object")
                    owner = f"{out[h.name][0]}, {owner}"
                out[h.name] = (owner, h)
    return out
