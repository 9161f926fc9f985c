"""Client hooks: what a server rule (or in-run tuning, FedEx) asks every participant to do around
its local training.

A server rule may need more from a client than its trained weights: FedGA the validation loss
of the received and of the trained model (:mod:`fedtune.algorithms.client.fedga`), FedDA/FedGP's
auto-β the raw per-batch steps (:mod:`fedtune.algorithms.client.step_records`). The rule's declaration
names the hooks a config needs (:meth:`~fedtune.algorithms.base.ServerRuleSpec.hooks`); the worker
builds each once and calls it around every client's round, knowing none of them by name:

0. ``round_overrides(client_id, round, payload)``: field values this client's round trains with
   instead of the run's (FedEx's drawn configuration); the worker trains it with the client
   method built for them;
1. ``before_seed(client_id)``: before the client's round is seeded (an evaluation here draws
   from no seeded stream, so it cannot shift the training's random numbers);
2. ``before_train(ctx)``: the round's :class:`~fedtune.algorithms.client.method.ClientContext` is built
   (a hook may set ``ctx.record_step``);
3. ``after_train(ctx, outcome)``: after the method trained; returns arrays added to the client's
   ``extras`` (what reaches the rule's :meth:`~fedtune.algorithms.server.rule.ServerRule.aggregate`).

PyTorch code (a hook sees the model); the coordinator never imports it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch import nn

from fedtune.algorithms.base import RunConfig
from fedtune.algorithms.client.method import ClientContext, ClientOutcome


@dataclass(frozen=True)
class ClientRecord:
    """One logical client of a worker as a hook sees it."""

    client_id: int
    role: str  # "source" | "target"
    num_train: int  # training examples
    num_val: int = 0  # validation examples


@dataclass
class WorkerView:
    """What a worker offers its hooks: the run's config, the model (holding the client's weights
    during its round) and its flat layout, the worker's clients, and ``evaluate(client_id, split)``
    -> ``(loss, accuracy)`` of the model as it is now on that client's split (eval mode, no grad,
    un-augmented; NaN for an empty split)."""

    cfg: RunConfig
    model: nn.Module
    layout: Any  # fedtune.layout.FlatLayout
    clients: tuple[ClientRecord, ...]
    evaluate: Callable[[int, str], tuple[float, float]]


class ClientHook:
    """Base class: every step does nothing. A hook is built once per worker, ``Hook(view)``;
    its constructor may refuse a run that cannot go (a ConfigError before round 1)."""

    def __init__(self, view: WorkerView):
        self.view = view

    def round_overrides(self, client_id: int, round: int, payload: dict[str, np.ndarray]) -> dict[str, Any]:  # noqa: A002
        """Fields (by name, as ``FederatedRunConfig.replace`` takes them) this client's round trains
        with instead of the run's values; none by default."""
        return {}

    def before_seed(self, client_id: int) -> None:
        """Before the client's round is seeded."""

    def before_train(self, ctx: ClientContext) -> None:
        """After the round's context is built, before the client method trains."""

    def after_train(self, ctx: ClientContext, outcome: ClientOutcome) -> dict[str, np.ndarray]:
        """After training: arrays to add to the client's extras."""
        return {}


def load_hooks(places: tuple[str, ...], view: WorkerView) -> list[ClientHook]:
    """The hooks at ``places`` (``"module:Class"``, from the rule's declaration), built for ``view``."""
    hooks = []
    for place in places:
        module, _, attr = place.partition(":")
        hooks.append(getattr(importlib.import_module(module), attr)(view))
    return hooks


__all__ = ["ClientHook", "ClientRecord", "WorkerView", "load_hooks"]
