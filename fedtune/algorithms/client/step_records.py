"""Auto-β's client hook: every participant records its raw per-batch steps (docs/methods-seeds.md §2).

FedDA/FedGP with ``gp_beta: auto`` estimate the target's step variance and each source's distance
from the steps plain SGD would have taken on each batch, ``−lr_T · ∇_b`` (parameters only, in the
flat layout's parameter order), whatever the client's optimiser does with that gradient (momentum,
weight decay, FedProx's term, SAM's perturbation, FedGaLA's gate). Every client's steps are taken
at the target's learning rate ``lr_T = local_lr · target_lr_scale``: a source's mean is then
``s_i = (lr_T/lr_S) · mean_b(−lr_S ∇_b)``, on the target's scale (seed 002, C.3). The target
returns ``extras["step_updates"]`` ``[B, P]`` (row b = batch b's step), every source
``extras["mean_step_update"]`` ``[P]``.

Momentum is why the samples are not the θ differences: consecutive momentum steps are
correlated and ramp up to ``1/(1 − m)`` times the gradient step, so variance and distance
estimates built from them are off by more than 10× at m = 0.9 (:mod:`benchmarks.auto_beta_momentum`).
"""

from __future__ import annotations

import numpy as np
import torch

from fedtune.algorithms.client.method import ClientContext, ClientOutcome
from fedtune.algorithms.client.steps import local_steps
from fedtune.algorithms.client.hooks import ClientHook, WorkerView
from fedtune.errors import ConfigError
from fedtune.models import MAX_MODEL_PARAMS


class StepRecorder:
    """Records one client's raw per-batch steps; the client method calls it as
    ``ctx.record_step(params, grads)`` with the batch gradient of its data loss at θ before the
    step (:class:`~fedtune.algorithms.client.method.ClientContext`).

    ``keep_rows=True`` (the FDA target): :meth:`extras` gives ``step_updates`` ``[B, P]``.
    ``keep_rows=False`` (a source): only ``mean_step_update`` ``[P]``, the mean of the per-batch
    steps (the source's per-step displacement ``s_i`` in the same units)."""

    def __init__(self, model, layout, lr: float, keep_rows: bool = True):
        slot = {s.name: s for s in layout.slots if s.is_param}
        self.where = {id(p): (slot[n].offset, slot[n].size) for n, p in model.named_parameters() if n in slot}
        self.P, self.lr, self.keep_rows = layout.num_params, float(lr), keep_rows
        self.rows: list[np.ndarray] = []
        self.total = np.zeros(self.P, np.float64)
        self.count = 0

    def __call__(self, params, grads) -> None:
        row = np.zeros(self.P, np.float32)
        view = torch.from_numpy(row)
        with torch.no_grad():
            for p, g in zip(params, grads):
                if g is None:
                    continue
                off, size = self.where[id(p)]
                view[off:off + size].copy_(g.detach().reshape(-1))
        row *= np.float32(-self.lr)
        if self.keep_rows:
            self.rows.append(row)
        self.total += row
        self.count += 1

    def result(self) -> np.ndarray:
        """``[B, P]`` float32: the recorded per-batch steps (``[0, P]`` if none)."""
        if not self.rows:
            return np.zeros((0, self.P), np.float32)
        return np.ascontiguousarray(np.stack(self.rows), dtype=np.float32)

    def mean(self) -> np.ndarray:
        """``[P]`` float32: the mean per-batch step (zeros if none)."""
        return (self.total / max(self.count, 1)).astype(np.float32)

    def extras(self) -> dict[str, np.ndarray]:
        if self.keep_rows:
            return {"step_updates": self.result()}
        return {"mean_step_update": self.mean()}


class StepRecords(ClientHook):
    """Gives every client's round a :class:`StepRecorder` (rows kept for the target only) and
    returns its extras. Refuses, before round 1, a target whose round has fewer than 2 steps (the
    rule's ValueError in round 1 otherwise) or whose rows would pass
    :data:`~fedtune.models.MAX_MODEL_PARAMS` floats (local_steps = 10**6 would fill memory mid-run)."""

    def __init__(self, view: WorkerView):
        super().__init__(view)
        self.roles = {c.client_id: c.role for c in view.clients}
        self._recorder: StepRecorder | None = None
        cfg, num_params = view.cfg, view.layout.num_params
        for client in view.clients:
            if client.role != "target":
                continue
            n, steps = client.num_train, local_steps(client.num_train, cfg)
            if steps < 2:  # local_steps=1 is refused with the config; here batch_size >= the target's data
                raise ConfigError(
                    f"field 'batch_size': the server rule estimates the target client's step variance from its "
                    f"per-step updates and needs at least 2 local steps per round, but batch_size {cfg.batch_size} "
                    f"covers the target's {n} training examples in 1 step per epoch with local_epochs="
                    f"{cfg.local_epochs}; allowed: batch_size < {n}, local_epochs >= 2 or local_steps >= 2")
            floats = steps * num_params
            if floats > MAX_MODEL_PARAMS:
                raise ConfigError(
                    f"field 'local_steps': the target client records every local step for the server rule "
                    f"({steps} steps x {num_params} parameters = {floats * 4 / 2**30:.1f} GiB a round); "
                    f"allowed: at most {MAX_MODEL_PARAMS} floats: lower local_steps or local_epochs, or raise batch_size")

    def before_train(self, ctx: ClientContext) -> None:
        self._recorder = ctx.record_step = StepRecorder(
            self.view.model, self.view.layout, self.view.cfg.target_lr, keep_rows=ctx.role == "target")

    def after_train(self, ctx: ClientContext, outcome: ClientOutcome) -> dict[str, np.ndarray]:
        recorder, self._recorder = self._recorder, None
        return recorder.extras() if recorder is not None else {}


__all__ = ["StepRecorder", "StepRecords"]
