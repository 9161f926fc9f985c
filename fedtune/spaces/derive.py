"""A search space derived from the declarations, and a file's override merged into it.

Every component declares how a search space samples each of its hyperparameters
(``HParam.search``, :mod:`fedtune.algorithms.declarations`), and :mod:`fedtune.spaces.shared`
declares the knobs every algorithm shares. The space of a named algorithm P (client method C,
server rule R, after the file's ``client_method`` / ``server_rule`` / ``setting``) is, in this order
(the order Optuna samples in, so it decides the sampled values and the trial ids):

1. C's hyperparameters, then R's (declaration order, each name once): its ``search`` if declared,
   else ``{distribution: fixed, value: ...}`` at P's own default (:attr:`Preset.defaults`, FedSR's
   uniform client weighting) or the hyperparameter's default;
2. P's ``own_shared`` knobs not named yet (FedOMG's ``global_lr``), then the shared knobs
   ``local_lr, local_optimizer, local_momentum, weight_decay, global_lr`` not named yet
   (:data:`~fedtune.spaces.shared.SHARED_KNOBS`; ``global_lr``'s default is R's
   ``default_global_lr``);
3. ``server_optimizer`` and the server optimisers' hyperparameters
   (:data:`~fedtune.spaces.shared.SERVER_OPTIMIZER_BLOCK`), each conditioned
   ``when: {server_optimizer: [the optimisers that use it]}``.

Its switches are R's ``search_switches`` (FedDA/FedGP's ``gp_beta_mode``); a derived switch that no
condition uses any more (an override removed the condition) is dropped. When the pair runs in one
setting only (FedDA, FedGP, target-only: fda; SimCLR: ufdg) the space's constants carry it.

A file's entries are merged into the derived ones (:func:`merge_entry`): each key it gives replaces
the derived key; a ``distribution`` other than the derived one drops the derived distribution's
keys (``low``, ``high``, ``default``, ``log``, ``choices``, ``value``) and keeps ``when``,
``otherwise`` and ``help``; ``when: null`` removes the derived condition and its ``otherwise``. A
name the derivation does not have (a budget field such as ``local_steps``) comes after the derived
ones, in file order, and must be tunable for the pair. Switches merge the same way. A reading the
merged space fixes (``fedadg_variant: bai``, :attr:`~fedtune.algorithms.base.HParam.implies`) then
sets the derived entries of the knobs it implies that the file does not name (:func:`_apply_readings`).

>>> names = list(derive({"algorithm": "fedprox"}).params)
>>> names[:4], names[-7:-5]
(['prox_mu', 'client_weighting', 'local_lr', 'local_optimizer'], ['server_optimizer', 'server_momentum'])
>>> derive({"algorithm": "fedomg"}).params["global_lr"]["default"]
0.05
>>> merge_entry({"distribution": "uniform", "low": 0.0, "high": 1.0, "default": 0.5, "help": "kappa"},
...             {"distribution": "fixed", "value": 0.3})
{'distribution': 'fixed', 'help': 'kappa', 'value': 0.3}
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fedtune.algorithms import (CLIENT_METHODS, SERVER_OPTIMIZERS, SERVER_RULES, all_hparams, resolve_names,
                                supported_settings)
from fedtune.algorithms.presets import PRESETS
from fedtune.spaces.shared import SERVER_OPTIMIZER, SERVER_OPTIMIZER_BLOCK, SHARED_KNOBS

__all__ = ["Derived", "derive", "derived_constants", "merge", "merge_entry"]

_DIST_KEYS = ("low", "high", "default", "log", "choices", "value")
SHARED = "shared"
FILE = "file"


@dataclass
class Derived:
    """A derived space in the file format: ``switches`` and ``params`` entries (name -> entry, in
    order) and, per name, where it comes from (``origins``: ``declared: client method prox``,
    ``shared``, ...)."""

    switches: dict[str, dict[str, Any]] = field(default_factory=dict)
    params: dict[str, dict[str, Any]] = field(default_factory=dict)
    origins: dict[str, str] = field(default_factory=dict)


def _names(constants: Mapping[str, Any]) -> tuple[Any, Any, Any] | None:
    """(preset, client method spec, server rule spec) of ``constants``; None for unknown names
    (the config's own check then says which)."""
    algorithm = constants.get("algorithm")
    if algorithm not in PRESETS:
        return None
    cm, sr = resolve_names(algorithm, constants.get("client_method"), constants.get("server_rule"),
                           constants.get("setting"))
    if cm not in CLIENT_METHODS or sr not in SERVER_RULES:
        return None
    return PRESETS[algorithm], CLIENT_METHODS.spec(cm), SERVER_RULES.spec(sr)


def derived_constants(constants: Mapping[str, Any]) -> dict[str, Any]:
    """``constants`` plus ``setting`` where the pair runs in exactly one setting and none is given.

    >>> derived_constants({"algorithm": "fedgp"}), derived_constants({"algorithm": "fedavg"})
    ({'algorithm': 'fedgp', 'setting': 'fda'}, {'algorithm': 'fedavg'})
    """
    out = dict(constants)
    named = _names(constants)
    if named is None or constants.get("setting") is not None:
        return out
    settings = supported_settings(*named)
    if len(settings) == 1:
        out["setting"] = settings[0]
    return out


def derive(constants: Mapping[str, Any]) -> Derived:
    """The space the declarations give the algorithm of ``constants`` (module docstring); empty
    for unknown names. ``constants`` should already hold :func:`derived_constants`' setting."""
    out = Derived()
    named = _names(constants)
    if named is None:
        return out
    preset, client, rule = named
    own_defaults = dict(preset.defaults)
    for kind, comp in (("client method", client), ("server rule", rule)):
        for h in comp.hparams:
            if h.name in out.params:
                continue
            if h.search is not None:
                out.params[h.name], out.origins[h.name] = copy.deepcopy(dict(h.search)), f"declared: {kind} {comp.name}"
            elif h.name in own_defaults:
                out.params[h.name] = {"distribution": "fixed", "value": own_defaults[h.name]}
                out.origins[h.name] = f"preset {preset.name}'s default"
            else:
                out.params[h.name] = {"distribution": "fixed", "value": h.default}
                out.origins[h.name] = f"declared: {kind} {comp.name}, fixed (no search)"
    for name, body in (rule.search_switches or {}).items():
        out.switches[name], out.origins[name] = copy.deepcopy(dict(body)), f"declared: server rule {rule.name}"
    for name in (*preset.own_shared, *SHARED_KNOBS):
        if name not in out.params and name in SHARED_KNOBS:  # (server_optimizer comes with its block)
            body = copy.deepcopy(SHARED_KNOBS[name])
            if name == "global_lr":
                body["default"] = rule.default_global_lr
            out.params[name], out.origins[name] = body, SHARED
    out.params["server_optimizer"], out.origins["server_optimizer"] = copy.deepcopy(SERVER_OPTIMIZER), SHARED
    owners = all_hparams()
    for name in SERVER_OPTIMIZER_BLOCK:
        users = [opt for opt in SERVER_OPTIMIZERS if any(h.name == name for h in SERVER_OPTIMIZERS.spec(opt).hparams)]
        h = owners[name][1]
        body = copy.deepcopy(dict(h.search or {"distribution": "fixed", "value": h.default}))
        out.params[name] = {**body, "when": {"server_optimizer": users}}
        out.origins[name] = f"declared: server optimizer {', '.join(users)}"
    return out


def merge_entry(base: Mapping[str, Any], override: Any) -> Any:
    """One derived entry with a file's entry merged in (module docstring); an override that is not
    a mapping is returned as it is, for the file's check to name."""
    if not isinstance(override, Mapping):
        return override
    out = dict(base)
    if "distribution" in override and override["distribution"] != base.get("distribution"):
        out = {k: v for k, v in out.items() if k not in _DIST_KEYS}
    if "when" in override and override["when"] is None:
        out.pop("when", None)
        out.pop("otherwise", None)
    out.update({k: v for k, v in override.items() if not (k == "when" and v is None)})
    return out


def _changed(override: Any) -> str:
    return f" + file ({', '.join(str(k) for k in override)})" if isinstance(override, Mapping) else " + file"


def merge(derived: Derived, switches: Mapping[Any, Any], params: Mapping[Any, Any]) -> Derived:
    """``derived`` with a file's ``switches`` and ``params`` merged in: derived names first (in
    their order), then the file's new ones (in file order)."""
    out = Derived(origins=dict(derived.origins))
    for section, base, given in (("switches", derived.switches, switches), ("params", derived.params, params)):
        merged: dict[Any, Any] = getattr(out, section)
        for name, body in base.items():
            if name in given:
                merged[name] = merge_entry(body, given[name])
                out.origins[name] += _changed(given[name])
            else:
                merged[name] = body
        for name, body in given.items():
            if name not in base:
                merged[name] = body
                out.origins[str(name)] = FILE
    _apply_readings(out, params)
    return out


def _apply_readings(space: Derived, given: Mapping[Any, Any]) -> None:
    """A reading the space fixes (a choice that :attr:`~fedtune.algorithms.base.HParam.implies`
    knobs: ``fedadg_variant: bai``) sets the derived entries of those knobs the file does not name:
    a fixed one's value, a sampled one's default; a sampled reading leaves them out of the space,
    for each trial's config to set from the reading it drew.

    >>> space = merge(derive({"algorithm": "fedadg"}), {}, {"fedadg_variant": {"distribution": "fixed", "value": "bai"}})
    >>> space.params["fedadg_order"]["value"], space.params["fedadg_alpha"]["default"], space.origins["fedadg_order"]
    ('model_first', 0.15, 'fedadg_variant=bai')
    """
    owners = all_hparams()
    for name, body in list(space.params.items()):
        h = owners[name][1] if name in owners else None
        if h is None or not h.implies or not isinstance(body, Mapping):
            continue
        value = body.get("value") if body.get("distribution") == "fixed" else None
        if value is None:
            for implied in {k for _, pairs in h.implies for k, _ in pairs} - set(given):
                space.params.pop(implied, None)
                space.origins.pop(implied, None)
            continue
        for implied, v in dict(h.implies).get(value, ()) if isinstance(value, str) else ():
            entry = space.params.get(implied)
            if implied in given or not isinstance(entry, Mapping):
                continue
            key = "value" if entry.get("distribution") == "fixed" else "default"
            space.params[implied] = {**entry, key: v}
            space.origins[implied] = f"{name}={value}"
