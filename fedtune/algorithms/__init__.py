"""Algorithms = presets of (client method, server rule), and the registries behind them.

Adding a method or rule: write its class in ``client.py`` / ``server.py`` and list it below;
adding a named algorithm: one :class:`Preset` line. Any client method composes with any server
rule (``--set client_method=... --set server_rule=...``).

>>> resolve_names("fedavg")
('sgd', 'fedavg')
>>> [p.name for p in PRESETS.values()]
['fedavg']
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fedtune.algorithms.base import HParam
from fedtune.algorithms.client import SGD, ClientContext, ClientMethod, ClientOutcome
from fedtune.algorithms.server import (
    AggregateResult,
    FedAvg,
    RoundInfo,
    ServerRule,
    fedavg_buffers,
    fedavg_step,
    fedavg_weights,
    weighted_sum,
)

# One line per component (keep it that way: adding one is one import and one line here).
CLIENT_METHODS: dict[str, type[ClientMethod]] = {c.name: c for c in (
    SGD,
)}
SERVER_RULES: dict[str, type[ServerRule]] = {r.name: r for r in (
    FedAvg,
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


PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset("fedavg", "sgd", "fedavg", ("fdg", "fl", "fda"), "FedAvg (McMahan et al.): local SGD, weighted mean of updates"),
)}


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
    """The classes behind ``cfg.algorithm`` (+ overrides); raises ConfigError on bad names."""
    check_algorithm_names(cfg)
    cm, sr = resolve_names(cfg.algorithm, cfg.client_method, cfg.server_rule, getattr(cfg, "setting", None))
    client, rule = CLIENT_METHODS[cm], SERVER_RULES[sr]
    return Resolved(cfg.algorithm, client, rule, supported_settings(PRESETS[cfg.algorithm], client, rule))


def check_algorithm_names(cfg: Any) -> None:
    from fedtune.config import ConfigError

    if cfg.algorithm not in PRESETS:
        raise ConfigError(f"field 'algorithm': '{cfg.algorithm}' is unknown; allowed: {', '.join(PRESETS)}")
    if cfg.client_method is not None and cfg.client_method not in CLIENT_METHODS:
        raise ConfigError(f"field 'client_method': '{cfg.client_method}' is unknown; allowed: {', '.join(CLIENT_METHODS)}")
    if cfg.server_rule is not None and cfg.server_rule not in SERVER_RULES:
        raise ConfigError(f"field 'server_rule': '{cfg.server_rule}' is unknown; allowed: {', '.join(SERVER_RULES)}")


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
    "fedavg_buffers", "fedavg_step", "fedavg_weights", "resolve", "resolve_names", "weighted_sum",
]
