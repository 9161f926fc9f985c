"""Algorithms = presets of (client method, server rule), and the registries behind them.

Adding a method or rule: write its class in its family's module (a
:class:`~fedtune.algorithms.client.ClientMethod` whose step function goes through the one local
loop, or a :class:`~fedtune.algorithms.server.ServerRule` built on
:mod:`~fedtune.algorithms.aggregate`) and list it below; adding a named algorithm: one
:class:`Preset` line. Any client method composes with any server rule
(``--set client_method=... --set server_rule=...``).

>>> resolve_names("fedavg")
('sgd', 'fedavg')
>>> resolve_names("fedsam", server_rule="fedomg")   # the paper's FedSAM+OMG
('sam', 'fedomg')
>>> resolve_names("fedgala", setting="ufdg")        # FedGaLA's unsupervised form
('gala-simclr', 'gala')
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fedtune.algorithms.base import HParam
from fedtune.algorithms.client import SGD, ClientContext, ClientMethod, ClientOutcome
from fedtune.algorithms.fedgp import (FedDA, FedGP, TargetOnly, align_source_magnitude, auto_beta, auto_beta_estimates,
                                      fedgp_combine, proj_plus, proj_plus_per_tensor)
from fedtune.algorithms.simclr import GalaSimCLR, SimCLR
from fedtune.algorithms.sam import SAM, Prox
from fedtune.algorithms.gfm import GCA, GFM
from fedtune.algorithms.gala import Gala, GalaClient
from fedtune.algorithms.fedomg import FedOMG, fedomg_direction, gram_matrix, omg_objective, solve_omg_exact, solve_omg_sgd
from fedtune.algorithms.aggregate import combine, fedavg_buffers, fedavg_step, fedavg_weights, weighted_sum
from fedtune.algorithms.server import AggregateResult, FedAvg, RoundInfo, ServerRule

# One line per component (keep it that way: adding one is one import and one line here).
CLIENT_METHODS: dict[str, type[ClientMethod]] = {c.name: c for c in (
    SGD,
    SimCLR,
    GalaSimCLR,
    Prox,
    SAM,
    GFM,
    GCA,
    GalaClient,
)}
SERVER_RULES: dict[str, type[ServerRule]] = {r.name: r for r in (
    FedAvg,
    FedDA,
    FedGP,
    TargetOnly,
    Gala,
    FedOMG,
)}

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
)}


def own_knobs(algorithm: str) -> tuple[str, ...]:
    """The hyperparameters that are ``algorithm``'s own: those of its client method (and its
    unsupervised one) and its server rule, plus the shared fields its paper tunes as its own
    (:attr:`Preset.own_shared`). Everything else (local_lr, momentum, weight decay, the server step
    of a plain weighted mean) is shared by every algorithm. ``fedtune sweep --knobs own`` searches
    only these and fixes the rest at one value for every method.

    >>> own_knobs("fedavg"), own_knobs("fedprox"), own_knobs("fedomg")
    ((), ('prox_mu',), ('omg_kappa', 'omg_solver', 'omg_rescale', 'global_lr'))
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
    algorithm: str
    client_method: type[ClientMethod]
    server_rule: type[ServerRule]
    settings: tuple[str, ...]

    def hparam_specs(self) -> dict[str, HParam]:
        return {h.name: h for h in (*self.client_method.hparams, *self.server_rule.hparams)}

    def hyperparameters(self, cfg: Any) -> dict[str, Any]:
        return {name: cfg.param(name) for name in self.hparam_specs()}


def resolve_names(algorithm: str, client_method: str | None = None, server_rule: str | None = None,
                  setting: str | None = None) -> tuple[str, str]:
    preset = PRESETS[algorithm]
    default_client = preset.client_method
    if setting == "ufdg" and preset.unsupervised_client_method:
        default_client = preset.unsupervised_client_method
    return client_method or default_client, server_rule or preset.server_rule


def supported_settings(preset: Preset, client: type[ClientMethod], rule: type[ServerRule]) -> tuple[str, ...]:
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
    """The classes behind ``cfg.algorithm`` (+ overrides); raises ConfigError on bad names.

    Resolves afresh on every call; a :class:`~fedtune.config.FederatedRunConfig` keeps the answer
    as ``cfg.resolved`` (ask it there)."""
    check_algorithm_names(cfg)
    cm, sr = resolve_names(cfg.algorithm, cfg.client_method, cfg.server_rule, getattr(cfg, "setting", None))
    client, rule = CLIENT_METHODS[cm], SERVER_RULES[sr]
    return Resolved(cfg.algorithm, client, rule, supported_settings(PRESETS[cfg.algorithm], client, rule))


def check_algorithm_names(cfg: Any) -> None:
    from fedtune.errors import ConfigError, shown

    if cfg.algorithm not in PRESETS:
        raise ConfigError(f"field 'algorithm': {shown(cfg.algorithm)} is unknown; allowed: {', '.join(PRESETS)}")
    if cfg.client_method is not None and cfg.client_method not in CLIENT_METHODS:
        raise ConfigError(f"field 'client_method': {shown(cfg.client_method)} is unknown; allowed: "
                          f"{', '.join(CLIENT_METHODS)}")
    if cfg.server_rule is not None and cfg.server_rule not in SERVER_RULES:
        raise ConfigError(f"field 'server_rule': {shown(cfg.server_rule)} is unknown; allowed: {', '.join(SERVER_RULES)}")


def all_hparams() -> dict[str, tuple[str, HParam]]:
    """Every component hyperparameter: name -> (owners, spec). A name means one thing everywhere:
    components may share a hyperparameter (GFM and SAM share ``sam_rho``) only with one spec."""
    out: dict[str, tuple[str, HParam]] = {}
    for kind, registry in (("client method", CLIENT_METHODS), ("server rule", SERVER_RULES)):
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


__all__ = [
    "AggregateResult", "RoundInfo", "ClientContext", "ClientMethod", "ClientOutcome", "CLIENT_METHODS", "FedAvg", "HParam",
    "PRESETS", "Preset", "Resolved", "SERVER_RULES", "SGD", "ServerRule", "all_hparams", "check_algorithm_names",
    "own_knobs",
    "combine", "fedavg_buffers", "fedavg_step", "fedavg_weights", "resolve", "resolve_names", "weighted_sum",
    "FedDA", "FedGP", "TargetOnly", "align_source_magnitude", "auto_beta", "auto_beta_estimates", "fedgp_combine",
    "proj_plus", "proj_plus_per_tensor",
    "FedOMG", "fedomg_direction", "gram_matrix", "omg_objective", "solve_omg_exact", "solve_omg_sgd",
]
