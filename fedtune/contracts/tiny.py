"""The tiny runs the contract checks make: 4 clients, half of them sampled each round (so a
client's state waits for it across rounds), 2 local steps of 8 examples, an MLP with one hidden
layer of 8 on rect4's 2-D points (rotated-digits for a client method that needs images or augments
them), 4 rounds on the local backend: the smallest run that trains.

A :class:`Form` is one run of a component: an algorithm, its (client method, server rule) pair in
one setting, a server optimiser and hyperparameter values. The rows two runs are compared by are
:func:`metrics`: every loss, accuracy and diagnostic but the timings.

>>> preset_of("prox", "fedomg"), preset_of("sam", "fedomg"), preset_of("simclr", "fedavg")
('fedavg', 'fedsam-omg', 'simclr')
>>> Form("fedavg", "sgd", "fedavg", "fl", "adam").id
'fedavg-fl-adam'
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedtune.algorithms import CLIENT_METHODS, SERVER_OPTIMIZERS, Resolved, resolve_names
from fedtune.algorithms.declarations import GFM_INTERVAL
from fedtune.algorithms.presets import PRESETS
from fedtune.config import FederatedRunConfig
from fedtune.runtime.driver import FederatedRun, build_plan

__all__ = ["PREFERRED", "TINY", "EXERCISE", "ROUNDS", "Form", "dataset_for", "tiny_config", "preferred_setting",
           "preset_forms", "preset_of", "component_form", "metrics", "first_difference", "rounds", "carried",
           "validated"]

PREFERRED = ("fl", "fda", "ufdg", "fdg")
"""The setting a form runs in, cheapest first: fl, then fda, ufdg, fdg."""

TINY: dict[str, Any] = {"num_clients": 4, "participation": 0.5, "local_steps": 2, "batch_size": 8, "model": "mlp",
                        "mlp_hidden": [8], "eval_every": 2, "backend": "local"}
"""rect4's 2-D points and an MLP with one hidden layer of 8: the smallest run that trains."""

ROUNDS = 4

EXERCISE: dict[str, Any] = {"simclr_proj_dim": 4, "fedsr_z_dim": 4, "gfm_interval": TINY["local_steps"],
                            "fishr_anneal_iters": TINY["local_steps"], "fedadg_noise": 4, "fedadg_latent": 8,
                            "fedadg_disc_width": 8}
"""Hyperparameter values that make a 2-step, 4-round run exercise its method: small widths, and what
happens every few steps (an augmenter update, the end of a warm-up) inside the run. A value is set
only where the run's components declare the name."""


def dataset_for(client_method: str) -> str:
    """rect4, or rotated-digits for a client method that needs images or augments them (one with an
    augmenter: it declares the augmenter's update interval)."""
    spec = CLIENT_METHODS.spec(client_method)
    return "rotated-digits" if spec.needs_images or GFM_INTERVAL in spec.hparams else "rect4"


def tiny_config(out: str | Path, algorithm: str, setting: str | None, *, client_method: str | None = None,
                server_rule: str | None = None, **kw: Any) -> FederatedRunConfig:
    """A tiny valid run of ``algorithm`` (and overrides) in ``setting``, writing under ``out``."""
    pair = resolve_names(algorithm, client_method, server_rule, setting)
    declared = {*Resolved(algorithm, *pair).hparam_specs(),
                *(h.name for h in SERVER_OPTIMIZERS.spec(kw.get("server_optimizer", "sgd")).hparams)}
    values: dict[str, Any] = {**TINY, "algorithm": algorithm, "setting": setting, "dataset": dataset_for(pair[0]),
                              "rounds": ROUNDS, "output": str(out),
                              **{k: v for k, v in EXERCISE.items() if k in declared}}
    if client_method is not None:
        values["client_method"] = client_method
    if server_rule is not None:
        values["server_rule"] = server_rule
    return FederatedRunConfig.from_dict({**values, **kw})


def preferred_setting(algorithm: str, client_method: str | None = None, server_rule: str | None = None) -> str | None:
    """The first of :data:`PREFERRED` the pair runs in (None: none)."""
    for setting in PREFERRED:
        if setting in Resolved(algorithm, *resolve_names(algorithm, client_method, server_rule, setting)).settings:
            return setting
    return None


def preset_of(client_method: str, server_rule: str) -> str:
    """The preset of this pair (its supervised or unsupervised form), else fedavg (with overrides)."""
    for name, p in PRESETS.items():
        if server_rule == p.server_rule and client_method in (p.client_method, p.unsupervised_client_method):
            return name
    return "fedavg"


@dataclass(frozen=True)
class Form:
    """One tiny run of a component: ``algorithm`` with its pair in ``setting``, ``server_optimizer``
    and hyperparameter ``params`` (name, value) pairs. FedGaLA has two forms: gala in fl,
    gala-simclr in ufdg."""

    algorithm: str
    client_method: str
    server_rule: str
    setting: str
    server_optimizer: str = "sgd"
    params: tuple[tuple[str, Any], ...] = ()

    @property
    def id(self) -> str:
        extra = "".join(f"-{v}" for _, v in self.params)
        return f"{self.algorithm}-{self.setting}" + (f"-{self.server_optimizer}" if self.server_optimizer != "sgd"
                                                     else "") + extra

    def config(self, out: str | Path, **kw: Any) -> FederatedRunConfig:
        """The form's tiny config (``kw``: more fields); a client method or server rule is named only
        where the algorithm does not resolve to it by itself."""
        own = resolve_names(self.algorithm, setting=self.setting)
        names = {"client_method": self.client_method if self.client_method != own[0] else None,
                 "server_rule": self.server_rule if self.server_rule != own[1] else None}
        if self.server_optimizer != "sgd":
            kw.setdefault("server_optimizer", self.server_optimizer)
        if self.params:
            kw.setdefault("params", dict(self.params))
        return tiny_config(out, self.algorithm, self.setting, **names, **kw)


def preset_forms(names: Iterable[str] | None = None) -> list[Form]:
    """Each preset of ``names`` (default: every one), once per distinct pair it resolves to, each in
    its preferred setting."""
    forms = []
    for name in PRESETS if names is None else names:
        seen = set()
        for setting in PREFERRED:
            pair = resolve_names(name, setting=setting)
            if pair not in seen and setting in Resolved(name, *pair).settings:
                seen.add(pair)
                forms.append(Form(name, *pair, setting))
    return forms


def component_form(kind: str, name: str) -> Form | None:
    """The form a component's runs check: a client method under FedAvg (its own preset when it has
    one), a server rule over local SGD, a server optimiser on FedAvg; None when the component runs in
    no setting that way."""
    if kind == "server optimizer":
        return Form("fedavg", "sgd", "fedavg", "fl", name)
    client, rule = (name, "fedavg") if kind == "client method" else ("sgd", name)
    algorithm = preset_of(client, rule)
    setting = preferred_setting(algorithm, client, rule)
    return None if setting is None else Form(algorithm, client, rule, setting)


def metrics(rows: list[dict]) -> list[tuple]:
    """What a round computed: losses, accuracies and every diagnostic but timings (NaN as None)."""
    out = []
    for r in rows:
        keys = sorted(k for k in r if k in ("train_loss", "val_acc", "target_acc", "num_participants")
                      or (k.startswith("diag.") and not k.endswith("_s")))
        out.append(tuple((k, None if isinstance(r[k], float) and math.isnan(r[k]) else r[k]) for k in keys))
    return out


def first_difference(a: list[dict], b: list[dict], first_round: int = 1) -> str:
    """Where two runs' :func:`metrics` first differ: ``round 3: train_loss 0.69 vs 0.71`` (empty when
    they do not)."""
    for i, (x, y) in enumerate(zip(metrics(a), metrics(b))):
        if x != y:
            dx, dy = dict(x), dict(y)
            key = next((k for k in sorted(set(dx) | set(dy)) if dx.get(k, "-") != dy.get(k, "-")), "?")
            return f"round {first_round + i}: {key} {dx.get(key, 'missing')!r} vs {dy.get(key, 'missing')!r}"
    return "" if len(a) == len(b) else f"{len(a)} rounds vs {len(b)}"


def rounds(fr: FederatedRun, n: int) -> list[Any]:
    """``n`` more rounds of a started run (their :class:`~fedtune.runtime.coordinator.RoundResult`)."""
    return [fr.step() for _ in range(n)]


def carried(state: dict[str, Any]) -> list[str]:
    """What a run's state carries from round to round beyond the weights."""
    parts = ["clients"] if any(state.get("clients", {}).values()) else []
    parts += [part for part in ("side", "rule") if state.get(part)]
    return parts + (["optimizer"] if (state.get("optimizer") or {}).get("state") else [])


def validated(values: dict[str, Any]) -> FederatedRunConfig:
    """A config as a run checks it before anything starts: its fields, then its data plan (on the
    dataset :func:`dataset_for` its client method)."""
    client = FederatedRunConfig.from_dict(values).resolved.client_method_name
    cfg = FederatedRunConfig.from_dict({"dataset": dataset_for(client), "num_clients": 4, "backend": "local",
                                        **values})
    build_plan(cfg)
    return cfg
