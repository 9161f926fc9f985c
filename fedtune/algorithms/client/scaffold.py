"""SCAFFOLD's client (Karimireddy et al., ICML 2020, Algorithm 1, option II; docs/methods-baselines.md §11); the server control
variate ``c`` is :mod:`fedtune.algorithms.server.scaffold`'s.

Client ``i`` keeps its control variate ``c_i`` (``ctx.state``, a float32 tensor of the model's
parameters, zero at first) and receives ``c`` with the weights. Every local step corrects the
batch gradient by ``c − c_i``:

    y ← y − η_l (g_i(y) − c_i + c)

in fedtune through the run's local optimiser: the correction is added to the batch gradient
after ``backward`` (the gradient recorded for auto-β excludes it), then the optimiser adds its L2
weight decay ``λ y`` and momentum (or Adam) as for ``sgd``. The paper uses plain SGD
(``local_momentum: 0``, ``weight_decay: 0`` is Algorithm 1 exactly).

Option II: ``c_i⁺ = c_i − c + (x − y)/(K η_l)``, ``K`` the local steps taken. Under plain SGD,
``(x − y)/(K η_l)`` is the mean of the steps' directions ``g_k − c_i + c (+ λ y_k)``, so
``c_i⁺ = (1/K) Σ_k (g_k + λ y_k)``, the mean gradient of the (L2-regularised) local loss along
the path: fedtune computes it so (:class:`ControlVariateStep`), equal to the paper's formula under
plain SGD (up to float rounding) and still the mean gradient under momentum or Adam, where the
literal ``(x − y)/(K η_l)`` is about ``1/(1 − momentum)`` times too large (momentum 0.9: ten times,
and the ``c_i`` recursion then diverges). The client sends ``Δc_i = c_i⁺ − c_i`` as the extra
``scaffold_delta_c`` and keeps ``c_i⁺``. Round 1 (``c = c_i = 0``) adds nothing: bit for bit
``sgd``. A round that ends at a non-finite loss (the run diverged) leaves ``c_i`` as it was.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from torch import nn

from fedtune.algorithms.client.method import ClientContext, ClientMethod, ClientOutcome
from fedtune.algorithms.server.scaffold import SCAFFOLD_C, SCAFFOLD_DELTA_C
from fedtune.layout import FlatLayout

STATE_KEY = "scaffold_c_i"  # ctx.state: the client's control variate c_i, float32 [num_params]


def flat_param_views(model: nn.Module, flat: torch.Tensor) -> list[torch.Tensor]:
    """``flat`` (``[num_params]``, the parameter part of the flat weight vector) cut into one view
    per ``model.parameters()`` entry (writes to a view write ``flat``)."""
    named = list(model.named_parameters())
    layout = FlatLayout.of(model)
    slices = layout.param_slices()
    if [n for n, _ in named] != [n for n, _ in slices]:
        raise ValueError("model.parameters() and the flat layout disagree on the parameter order (tied parameters?)")
    if tuple(flat.shape) != (layout.num_params,):
        raise ValueError(f"a vector of shape {tuple(flat.shape)} for a model of {layout.num_params} parameters")
    return [flat[sl].view_as(p) for (_, p), (_, sl) in zip(named, slices)]


def trainable_views(model: nn.Module, flat: torch.Tensor) -> list[torch.Tensor]:
    """:func:`flat_param_views` of the parameters that train (``requires_grad``): aligned with the
    local optimiser's ``params``."""
    return [v for v, p in zip(flat_param_views(model, flat), model.parameters()) if p.requires_grad]


def payload_vector(ctx: ClientContext, key: str, num_params: int) -> torch.Tensor:
    """The payload array ``key`` as an own float32 tensor on the client's device."""
    if key not in ctx.payload:
        raise KeyError(f"{key!r} is not in the round's payload: the client method's server side sends it "
                       "(fedtune.algorithms.SERVER_SIDES)")
    value = np.array(ctx.payload[key], dtype=np.float32)  # own copy (payloads may be read-only)
    if value.shape != (num_params,):
        raise ValueError(f"payload {key!r} has shape {value.shape}, the model has {num_params} parameters")
    return torch.from_numpy(value).to(ctx.device)


class ControlVariateStep:
    """The ``after_backward`` of a SCAFFOLD step (:func:`~fedtune.algorithms.client.method.descend`):
    adds ``correction[j] = c − c_i`` to each parameter's batch gradient (skipped when the whole
    correction is zero) and sums the directions ``g + λ y`` of the steps (``λ`` the optimiser's
    L2 weight decay) for option II's :meth:`mean_gradient`."""

    def __init__(self, params: Sequence[torch.Tensor], correction: Sequence[torch.Tensor],
                 sums: Sequence[torch.Tensor], weight_decay: float, apply: bool):
        self.params, self.correction, self.sums = list(params), list(correction), list(sums)
        self.weight_decay, self.apply, self.steps = float(weight_decay), bool(apply), 0

    def __call__(self) -> None:
        with torch.no_grad():
            for p, corr, total in zip(self.params, self.correction, self.sums):
                if p.grad is None:
                    continue
                total.add_(p.grad)
                if self.weight_decay:
                    total.add_(p.detach(), alpha=self.weight_decay)
                if self.apply:
                    p.grad.add_(corr)
        self.steps += 1


class Scaffold(ClientMethod):
    name = "scaffold"

    def train(self, ctx: ClientContext) -> ClientOutcome:
        model, opt = ctx.model, self.start_round(ctx)
        num_params = FlatLayout.of(model).num_params
        c = payload_vector(ctx, SCAFFOLD_C, num_params)
        c_i = ctx.state.get(STATE_KEY)
        c_i = torch.zeros(num_params, device=ctx.device) if c_i is None else c_i.to(ctx.device, torch.float32)
        correction = c - c_i
        sums = torch.zeros(num_params, device=ctx.device)
        cv = ControlVariateStep(opt.params, trainable_views(model, correction), trainable_views(model, sums),
                                opt.weight_decay, apply=bool(correction.any()))
        out = self.cross_entropy_loop(ctx, opt, cv)
        delta = torch.zeros(num_params, device=ctx.device)
        if cv.steps > 0 and np.isfinite(out.loss):
            c_new = sums / cv.steps  # option II: c_i − c + (x − y)/(K η_l) under plain SGD
            delta = c_new - c_i
            ctx.state[STATE_KEY] = c_new
        out.extras = {**out.extras, SCAFFOLD_DELTA_C: delta.cpu().numpy()}
        out.metrics = {**out.metrics, "scaffold_correction_norm": float(torch.linalg.vector_norm(correction))}
        return out


__all__ = ["STATE_KEY", "ControlVariateStep", "Scaffold", "flat_param_views", "payload_vector", "trainable_views"]
