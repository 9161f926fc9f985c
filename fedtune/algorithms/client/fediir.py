"""FedIIR client method (Guo et al., "Out-of-distribution Generalization of Federated Learning via
Implicit Invariant Relationships", ICML 2023; docs/methods-baselines.md §8).

The classifier is the model's last linear layer, ``w`` its weight and bias. With ``ḡ`` the
server's running mean classifier gradient (:mod:`fedtune.algorithms.server.fediir`, received in
``payload["fediir_grad_mean"]``; 0 before the server has one), each local step minimises, on a
batch::

    CE(f(x), y) + fediir_penalty · Σ_w ‖∇_w CE(f(x), y) − ḡ_w‖²

the penalty differentiated through the gradient (``create_graph``), so it trains the featurizer
as well as the classifier (the authors' ``FedIIR.update``, github.com/YamingGuo98/FedIIR,
``domainbed/algorithms.py``).

The client also returns the statistic the server needs: before training, at the received model θ,
the sum of its per-batch classifier gradients over one epoch of batches (the authors'
``mean_grad``: one pass over each sampled client's loader before local training), in closed form
``∇_W CE = eᵀz/B``, ``∇_b CE = mean_i e_i``, ``e = softmax − onehot``, ``z`` the classifier's input.
That pass draws the batches the round then trains on (a copy of the round's generator: at most one
epoch, and no more than ``local_steps``), in training mode, and leaves the model, its batch-norm
statistics and every random stream as they were.

``fediir_penalty = 0`` computes none of this: plain ``sgd``, bit for bit, and no report (the
server's ḡ stays unchanged). The reported training loss is the cross-entropy; the penalty (unweighted,
mean over steps) is the ``diag.fediir_penalty_term`` column. fp16 is refused (the inner gradient is
taken without the loss scaler).

Departure (docs/methods-baselines.md §8): the authors compute the round's mean gradient at θ^r before
the round's local training (a second exchange per round); here the clients report it with their
update, so round r trains against the ḡ of rounds < r (one round later than the authors; in round
0 against ḡ = 0).
"""

from __future__ import annotations

import contextlib
import math

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from fedtune.algorithms.client.method import ClientContext, ClientMethod, ClientOutcome, batches, descend
from fedtune.algorithms.client.steps import batches_per_epoch, local_steps
from fedtune.algorithms.declarations import FEDIIR_PENALTY
from fedtune.algorithms.server.fediir import BATCHES_KEY, GRAD_SUM_KEY, MEAN_KEY
from fedtune.algorithms.client.precision import autocast



def classifier_layer(model: nn.Module) -> nn.Linear:
    """The model's classifier: its last ``nn.Linear`` in module order (cnn, mlp and torchvision's
    ``fc``, ``classifier[-1]``, ``heads.head``), whose input is the encoder features
    (:func:`fedtune.models.encode`) for every model fedtune builds (FedIIR, Fishr, MOON, FedADG)."""
    found = None
    for module in model.modules():
        if isinstance(module, nn.Linear):
            found = module
    if found is None:
        raise TypeError(f"no linear classifier (nn.Linear) on a {type(model).__name__}")
    return found


def features_and_logits(model: nn.Module, layer: nn.Linear, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(z, logits)`` of one forward pass: ``z`` the input of ``layer`` (the classifier), ``logits``
    the model's output (``layer(z)``)."""
    seen: list[torch.Tensor] = []
    handle = layer.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    try:
        logits = model(x)
    finally:
        handle.remove()
    return seen[-1], logits


def ce_residual(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``e = softmax(logits) − onehot(y)`` ``[B, C]``: the gradient of each example's cross-entropy
    with respect to its logits."""
    return torch.softmax(logits, dim=1) - F.one_hot(y, logits.shape[1]).to(logits.dtype)


def linear_ce_gradient(z: torch.Tensor, logits: torch.Tensor, y: torch.Tensor, bias: bool) -> torch.Tensor:
    """The gradient of the batch-mean cross-entropy with respect to a linear classifier on ``z``,
    flattened weight then bias: ``[(eᵀz/B).flatten(), mean_i e_i]``."""
    e = ce_residual(logits, y)
    parts = [(e.t() @ z).flatten() / z.shape[0]]
    if bias:
        parts.append(e.mean(dim=0))
    return torch.cat(parts)


@contextlib.contextmanager
def side_effect_free(model: nn.Module, device: torch.device):
    """Run a pass that leaves ``model``'s buffers (batch-norm statistics) and the random streams
    (torch's, and the device's) as they were."""
    saved = [b.detach().clone() for b in model.buffers()]
    devices = []
    if device.type == "cuda":
        devices = [device.index if device.index is not None else torch.cuda.current_device()]
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        with torch.no_grad():
            for b, old in zip(model.buffers(), saved):
                b.copy_(old)


def round_gradient_sum(ctx: ClientContext, layer: nn.Linear) -> tuple[np.ndarray, int]:
    """The sum over the round's first epoch of batches (at most ``local_steps``) of the batch-mean
    classifier gradient at the received model, and the number of batches; drawn from a copy of
    ``ctx.generator`` (the round then trains on the same batches), no side effect on the model."""
    model, cfg = ctx.model, ctx.cfg
    n = ctx.num_examples
    count = min(local_steps(n, cfg), batches_per_epoch(n, cfg.batch_size))
    gen = torch.Generator()
    gen.set_state(ctx.generator.get_state())
    total = torch.zeros(sum(p.numel() for p in layer.parameters()), dtype=torch.float64, device=ctx.device)
    done = 0
    model.train()
    with side_effect_free(model, ctx.device), torch.no_grad():
        for idx in batches(n, cfg.batch_size, count, gen):
            x, y = ctx.data.batch(idx, ctx.augment, gen)
            with autocast(ctx.device, ctx.precision):
                z, logits = features_and_logits(model, layer, x)
            total += linear_ce_gradient(z.double(), logits.double(), y, layer.bias is not None)
            done += 1
    return total.cpu().numpy(), done


def split_like(flat: np.ndarray | None, params: list[torch.Tensor]) -> list[torch.Tensor]:
    """``flat`` (the server's ḡ, weight then bias) cut into tensors shaped as ``params``; zeros when None."""
    if flat is None:
        return [torch.zeros_like(p) for p in params]
    vec = torch.as_tensor(np.asarray(flat), dtype=params[0].dtype, device=params[0].device)
    size = sum(p.numel() for p in params)
    if vec.numel() != size:
        raise ValueError(f"FedIIR: the server's mean gradient has {vec.numel()} entries, the classifier {size}")
    return [part.view_as(p) for part, p in zip(torch.split(vec, [p.numel() for p in params]), params)]


def gradient_penalty(ce: torch.Tensor, params: list[torch.Tensor], mean: list[torch.Tensor]) -> torch.Tensor:
    """``Σ_w ‖∇_w ce − ḡ_w‖²`` over ``params``, differentiable (``create_graph``)."""
    grads = torch.autograd.grad(ce, params, create_graph=True)
    return sum(((g - m) ** 2).sum() for g, m in zip(grads, mean))


class FedIIR(ClientMethod):
    name = "fediir"
    reads = {"penalty": FEDIIR_PENALTY}

    def train(self, ctx: ClientContext) -> ClientOutcome:
        model, weight = ctx.model, self.penalty
        if weight == 0.0:
            return self.cross_entropy_loop(ctx, self.start_round(ctx))
        layer = classifier_layer(model)
        params = list(layer.parameters())
        grad_sum, count = round_gradient_sum(ctx, layer)
        mean = split_like(ctx.payload.get(MEAN_KEY), params)
        opt = self.start_round(ctx)
        total = [0.0]

        def step(x: torch.Tensor, y: torch.Tensor) -> float:
            ce = F.cross_entropy(model(x), y)
            penalty = gradient_penalty(ce, params, mean)
            value = descend(opt, ce + weight * penalty, ctx.record_step)
            total[0] += float(penalty.detach())
            return float(ce.detach()) if math.isfinite(value) else value

        out = self.local_loop(ctx, step, lambda steps: {"fediir_penalty_term": total[0] / max(steps, 1)})
        out.extras = {**out.extras, GRAD_SUM_KEY: grad_sum, BATCHES_KEY: np.array(count, dtype=np.int64)}
        return out


__all__ = ["FedIIR", "ce_residual", "classifier_layer", "features_and_logits", "gradient_penalty",
           "linear_ce_gradient", "round_gradient_sum", "side_effect_free", "split_like"]
