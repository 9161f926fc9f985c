"""Federated Fishr client method: Fishr (Ramé, Dancette, Cord, ICML 2022) as the FedOMG paper writes
it for federated clients (its Eq. 4; docs/methods-baselines.md §9).

The classifier is the model's last linear layer. On a batch of ``B`` examples with classifier
inputs ``z_i`` and cross-entropy residuals ``e_i = softmax(logits_i) − onehot(y_i)``, the
per-example gradients of the classifier are ``g_i = e_i ⊗ [z_i, 1]`` (weight, bias; closed form, no
backpack) and their variance is Eq. 4's ``a_u = (1/B) Σ_i (g_i − ḡ)²``, ``ḡ`` their batch mean,
computed without forming the ``B``×``C``×``D`` per-example tensor::

    var_W = (e∘e)ᵀ(z∘z)/B − (eᵀz/B)²,        var_b = mean_i e_i² − (mean_i e_i)²

Each client smooths its variance across its steps (and rounds: ``ctx.state["fishr.ema"]``) with
Fishr's per-domain moving average, bias factor included (``MovingAverage(ema,
oneminusema_correction=True)`` of github.com/alexrame/fishr, ``domainbed/lib/misc.py``)::

    s ← ema · s + (1 − ema) · a_u      (s from 0, kept detached)
    v_u = s / (1 − ema)                 (carries a_u's gradient with weight 1)

and each local step minimises ``CE + fishr_penalty · dist(v_u, v̄)``, the penalty differentiated
through the per-example gradients (it trains the featurizer and the classifier), with ``v̄`` the
server's mean of the clients' variances (:mod:`fedtune.algorithms.server.fishr`,
``payload["fishr_mean_variance"]``) and ``dist`` ``mean_k (v_u,k − v̄_k)²`` (``fishr_distance:
mean``, Fishr's code, ``l2_between_dicts``) or ``Σ_k`` (``sum``, the ``‖·‖²`` of FedOMG's Eq. 4 and
Fishr's paper). ``fishr_ema = 0`` is Eq. 4 without smoothing.

Warm-up (Fishr's ``penalty_anneal_iters``): the penalty weight is 0 before iteration
``fishr_anneal_iters``, where step ``s`` (from 0) of round ``r`` (rounds start at 1) is iteration
``(r − 1) · S + s``, ``S`` the client's steps per round: the received model has ``(r − 1) · S``
iterations behind it; at the switch (when ``fishr_anneal_iters > 0``) the local optimiser is
rebuilt, as Fishr resets Adam. The variance and its moving average are computed at every step, the
penalty off included. In round 1 there is no ``v̄`` yet and no penalty.

The client returns its last ``v_u`` (``extras["fishr_variance"]``). ``fishr_penalty = 0`` computes
none of this: plain ``sgd``, bit for bit. The reported training loss is the cross-entropy; the
distance (unweighted, mean over the steps where it was computed against a ``v̄``) is the
``diag.fishr_penalty_term`` column. fp16 is refused (the per-example gradients are taken without
the loss scaler).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch.nn import functional as F

from fedtune.algorithms.base import RunConfig
from fedtune.algorithms.client.method import ClientContext, ClientMethod, ClientOutcome, descend
from fedtune.algorithms.client.steps import local_steps
from fedtune.algorithms.declarations import FISHR_ANNEAL_ITERS, FISHR_DISTANCE, FISHR_EMA, FISHR_PENALTY
from fedtune.algorithms.client.fediir import ce_residual, classifier_layer, features_and_logits
from fedtune.algorithms.server.fishr import MEAN_KEY, VARIANCE_KEY


STATE_KEY = "fishr.ema"
"""``ctx.state`` entry: the client's moving-average state ``s`` (float64 NumPy [K])."""


def iterations_behind(round: int, steps_per_round: int) -> int:
    """The optimiser steps the model received in ``round`` (from 1) has behind it, ``(round − 1) · S``:
    the iteration count of the round's first step (docs/methods-baselines.md §9.4).

    >>> iterations_behind(1, 3), iterations_behind(2, 3)
    (0, 3)
    """
    return max(int(round) - 1, 0) * int(steps_per_round)


def gradient_variance(z: torch.Tensor, logits: torch.Tensor, y: torch.Tensor, bias: bool) -> torch.Tensor:
    """The variance over the batch of the per-example gradients of the cross-entropy with respect to
    a linear classifier on ``z`` (weight flattened, then bias), differentiable."""
    e = ce_residual(logits, y)
    b = z.shape[0]
    mean_w = e.t() @ z / b
    parts = [((e * e).t() @ (z * z) / b - mean_w * mean_w).flatten()]
    if bias:
        parts.append((e * e).mean(dim=0) - e.mean(dim=0) ** 2)
    return torch.cat(parts)


def smoothed(previous: torch.Tensor, variance: torch.Tensor, ema: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Fishr's moving average with its ``1/(1 − ema)`` factor: ``(v, s)`` with ``s = ema · previous +
    (1 − ema) · variance`` (the new state, detached) and ``v = s / (1 − ema)`` (with ``variance``'s
    gradient)."""
    state = ema * previous + (1.0 - ema) * variance
    return state / (1.0 - ema), state.detach()


def variance_distance(v: torch.Tensor, mean: torch.Tensor, form: str) -> torch.Tensor:
    """``mean_k (v_k − mean_k)²`` (``mean``) or ``Σ_k`` (``sum``)."""
    sq = (v - mean) ** 2
    return sq.mean() if form == "mean" else sq.sum()


class Fishr(ClientMethod):
    name = "fishr"

    def __init__(self, cfg: RunConfig):
        super().__init__(cfg)
        self.penalty, self.ema = float(FISHR_PENALTY.of(cfg)), float(FISHR_EMA.of(cfg))
        self.anneal, self.distance = int(FISHR_ANNEAL_ITERS.of(cfg)), FISHR_DISTANCE.of(cfg)

    def train(self, ctx: ClientContext) -> ClientOutcome:
        model = ctx.model
        if self.penalty == 0.0:
            return self.cross_entropy_loop(ctx, self.start_round(ctx))
        layer = classifier_layer(model)
        size = sum(p.numel() for p in layer.parameters())
        dtype = torch.promote_types(layer.weight.dtype, torch.float32)  # the variances: float32 at least
        received = ctx.payload.get(MEAN_KEY)
        mean = None if received is None else torch.as_tensor(np.asarray(received), dtype=dtype, device=ctx.device)
        if mean is not None and mean.numel() != size:
            raise ValueError(f"Fishr: the server's mean variance has {mean.numel()} entries, the classifier {size}")
        prev = ctx.state.get(STATE_KEY)
        run = {"state": torch.zeros(size, dtype=dtype, device=ctx.device) if prev is None else
               torch.as_tensor(np.asarray(prev), dtype=dtype, device=ctx.device),
               "opt": self.start_round(ctx), "v": None, "penalty": 0.0, "counted": 0,
               "it": iterations_behind(ctx.round, local_steps(ctx.num_examples, self.cfg))}

        def step(x: torch.Tensor, y: torch.Tensor) -> float:
            it, run["it"] = run["it"], run["it"] + 1
            if it == self.anneal != 0:
                run["opt"] = self.start_round(ctx)  # Fishr resets its optimiser when the penalty starts
            active = mean is not None and it >= self.anneal
            z, logits = features_and_logits(model, layer, x)
            ce = F.cross_entropy(logits, y)
            zf, lf = z.to(dtype), logits.to(dtype)
            if not active:
                zf, lf = zf.detach(), lf.detach()
            v, state = smoothed(run["state"], gradient_variance(zf, lf, y, layer.bias is not None), self.ema)
            objective = ce
            if active:
                dist = variance_distance(v, mean, self.distance)
                objective = ce + self.penalty * dist
            value = descend(run["opt"], objective, ctx.record_step)
            if not math.isfinite(value):
                return value
            run["state"], run["v"] = state, v.detach()
            if active:
                run["penalty"], run["counted"] = run["penalty"] + float(dist.detach()), run["counted"] + 1
            return float(ce.detach())

        out = self.local_loop(ctx, step, lambda steps: {
            "fishr_penalty_term": run["penalty"] / run["counted"] if run["counted"] else 0.0})
        if run["v"] is not None:
            ctx.state[STATE_KEY] = run["state"].double().cpu().numpy()
            out.extras = {**out.extras, VARIANCE_KEY: run["v"].double().cpu().numpy()}
        return out


__all__ = ["Fishr", "STATE_KEY",
           "gradient_variance", "iterations_behind", "smoothed", "variance_distance"]
