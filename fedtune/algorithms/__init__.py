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
    ServerRule,
    fedavg_buffers,
    fedavg_step,
    fedavg_weights,
    weighted_sum,
)

CLIENT_METHODS: dict[str, type[ClientMethod]] = {c.name: c for c in (SGD,)}
SERVER_RULES: dict[str, type[ServerRule]] = {r.name: r for r in (FedAvg,)}

ALL_SETTINGS = ("fdg", "fl", "fda", "ufdg")


@dataclass(frozen=True)
class Preset:
    """A named algorithm: a client method, a server rule, the settings it is meant for."""

    name: str
    client_method: str
    server_rule: str
    settings: tuple[str, ...]
    description: str


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


def resolve_names(algorithm: str, client_method: str | None = None, server_rule: str | None = None) -> tuple[str, str]:
    preset = PRESETS[algorithm]
    return client_method or preset.client_method, server_rule or preset.server_rule


def supported_settings(preset: Preset, client: type[ClientMethod], rule: type[ServerRule]) -> tuple[str, ...]:
    allowed = set(preset.settings)
    if client.name != preset.client_method or rule.name != preset.server_rule:
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
    cm, sr = resolve_names(cfg.algorithm, cfg.client_method, cfg.server_rule)
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
    """Every component hyperparameter: name -> (owner, spec). Names are unique across components."""
    out: dict[str, tuple[str, HParam]] = {}
    for kind, registry in (("client method", CLIENT_METHODS), ("server rule", SERVER_RULES)):
        for comp in registry.values():
            for h in comp.hparams:
                out[h.name] = (f"{kind} {comp.name}", h)
    return out


__all__ = [
    "AggregateResult", "ClientContext", "ClientMethod", "ClientOutcome", "CLIENT_METHODS", "FedAvg", "HParam",
    "PRESETS", "Preset", "Resolved", "SERVER_RULES", "SGD", "ServerRule", "all_hparams", "check_algorithm_names",
    "fedavg_buffers", "fedavg_step", "fedavg_weights", "resolve", "resolve_names", "weighted_sum",
]
