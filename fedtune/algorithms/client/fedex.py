"""FedEx's client half (Khodak et al., 2021): the participant trains with the configuration the
server drew for it and scores the trained model on its own validation split. The server half,
and what FedEx is: :mod:`fedtune.algorithms.server.fedex`.

A :class:`~fedtune.algorithms.client.hooks.ClientHook` that every participant runs when
``fedex_configs`` > 0 (:meth:`fedtune.algorithms.Resolved.client_hooks`):

* :meth:`FedExHook.round_overrides` reads the round's broadcast (``fedex.configs``,
  ``fedex.assignment``) and gives the worker the knobs' values for this client's round; the
  worker trains it with the client method built for those values (a validated copy of the
  config, :meth:`~fedtune.config.FederatedRunConfig.replace`);
* with ``fedex_diff`` :meth:`FedExHook.before_seed` scores the received model (the authors'
  ``before``), outside the seeded stream;
* :meth:`FedExHook.after_train` scores the trained model (the authors' ``after``: error, or
  cross-entropy with ``fedex_objective: loss``) and sends ``fedex.index``, ``fedex.after``,
  ``fedex.before`` (NaN without ``fedex_diff``) and ``fedex.weight`` (the split's size, the
  authors' ``len(Yval)``) as extras, which the coordinator takes before the server rule sees the reply.

The fda target client trains with the run's own values and sends nothing (FedEx tunes the
source clients, whose validation splits select models; the target's labels stay unused).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fedtune.algorithms.client.hooks import ClientHook, WorkerView
from fedtune.algorithms.client.method import ClientContext, ClientOutcome
from fedtune.algorithms.server.fedex import client_knob_hparams, knob_ranges


class FedExHook(ClientHook):
    def __init__(self, view: WorkerView):
        super().__init__(view)

        cfg = view.cfg
        ranges = knob_ranges(cfg.fedex_knobs, client_knob_hparams(cfg))  # the server's knobs, in its order
        self.knobs = tuple(r.name for r in ranges)
        self.ints = {r.name for r in ranges if r.kind == "int"}
        self.diff = bool(cfg.fedex_diff)
        self.loss = cfg.fedex_objective == "loss"
        self.roles = {c.client_id: c.role for c in view.clients}
        self.val_sizes = {c.client_id: c.num_val for c in view.clients}
        self._index: dict[int, int] = {}
        self._before: dict[int, float] = {}

    def _score(self, client_id: int) -> float:
        loss, acc = self.view.evaluate(client_id, "val")
        return float(loss) if self.loss else 1.0 - float(acc)

    def round_overrides(self, client_id: int, round: int, payload: dict[str, np.ndarray]) -> dict[str, Any]:  # noqa: A002
        self._index.pop(client_id, None)
        if self.roles.get(client_id) != "source" or "fedex.assignment" not in payload:
            return {}
        index = int(payload["fedex.assignment"][client_id])
        if index < 0:
            return {}
        self._index[client_id] = index
        row = payload["fedex.configs"][index]
        return {name: round_half(v) if name in self.ints else float(v) for name, v in zip(self.knobs, row)}

    def before_seed(self, client_id: int) -> None:
        if self.diff and self.roles.get(client_id) == "source":
            self._before[client_id] = self._score(client_id)

    def after_train(self, ctx: ClientContext, outcome: ClientOutcome) -> dict[str, np.ndarray]:
        index = self._index.pop(ctx.client_id, None)
        if index is None:
            return {}
        before = self._before.pop(ctx.client_id, math.nan)
        size = self.val_sizes[ctx.client_id]
        after = self._score(ctx.client_id) if size else math.nan
        return {"fedex.index": np.array([index], dtype=np.int64), "fedex.after": np.array([after]),
                "fedex.before": np.array([before]), "fedex.weight": np.array([float(size)])}


def round_half(value: float) -> int:
    """An integer knob's value from the broadcast float (exact for the integers it holds)."""
    return int(math.floor(float(value) + 0.5))


__all__ = ["FedExHook"]
