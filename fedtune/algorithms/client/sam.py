"""SAM (FedSAM) client method: sharpness-aware local steps.

``sam`` (SAM, Foret et al. 2021; FedSAM, Caldarola et al. 2022): per batch, the ascent
``ε = ρ ∇L(θ) / ‖∇L(θ)‖`` (one global norm over all trainable parameters), the gradient at
``θ + ε``, and a step *from* ``θ`` with the local optimiser (:class:`LocalSGD`: momentum and
weight decay exactly as ``sgd``; weight decay acts on ``θ``, not on ``θ + ε``).
``diag.sam_sharpness`` is the round's mean of ``L(θ + ε) − L(θ)`` on the batch: SAM's own
sharpness, the worst-case loss rise over the ball ``‖δ‖ ≤ ρ`` in its first-order solution
``δ = ε`` (Foret et al. 2021), free because SAM evaluates both losses. It is not the GFM
paper's flatness ``F_ρ`` (Cha et al.: the *mean* rise over random directions on the sphere,
docs/methods-protocol.md §6); the worst case bounds that mean from above, usually by far.
FedProx, the other regularised local SGD, is :mod:`fedtune.algorithms.client.prox`.

Batch-norm running statistics in SAM: the first forward pass (at ``θ``) updates them as in plain
SGD; the second pass (at ``θ + ε``) normalises with its own batch statistics (train mode, as
every SAM implementation does) but the model's buffers are restored afterwards, so running stats
move exactly once per step, from the unperturbed weights (:func:`frozen_buffers`).

``sam_rho`` is ONE :class:`HParam` object (:data:`SAM_RHO`) shared with GFM
(:mod:`fedtune.algorithms.client.gfm`); its default 0.02 is the GFM paper's ρ (its "γ").
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from fedtune.algorithms.client.method import ClientContext, ClientMethod, ClientOutcome, RecordStep
from fedtune.algorithms.declarations import SAM_RHO
from fedtune.algorithms.client.optim import LocalSGD
from fedtune.algorithms.client.precision import autocast_off



# ------------------------------------------------------------------------------------------------
def sam_perturbation(grads: Sequence[torch.Tensor | None], rho: float) -> list[torch.Tensor | None]:
    """SAM's ascent step ``ε = ρ g / ‖g‖`` with ``‖g‖`` the norm over *all* tensors together.

    ``None`` entries (parameters without a gradient) stay ``None``. A zero gradient gives ``ε = 0``
    (the norm is guarded by ``1e-12``, as in the reference implementation).

    >>> import torch
    >>> [e.tolist() for e in sam_perturbation([torch.tensor([3.0]), torch.tensor([4.0])], 0.5)]
    [[0.30000001192092896], [0.4000000059604645]]
    """
    present = [g for g in grads if g is not None]
    if not present:
        return [None] * len(grads)
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.detach()) for g in present]))
    scale = float(rho) / (norm + 1e-12)
    return [None if g is None else g.detach() * scale.to(g.dtype) for g in grads]


@contextlib.contextmanager
def frozen_buffers(model: nn.Module | None) -> Iterator[None]:
    """Run forward (and backward) passes without changing ``model``'s buffers (batch-norm running
    mean/var and ``num_batches_tracked``): they are copied before and restored in place after, bit
    for bit. The passes still normalise with batch statistics in train mode. Finish the backward
    pass inside the block: autograd may have saved the buffers, and restoring them bumps their
    version counter."""
    if model is None:
        yield
        return
    saved = [(b, b.detach().clone()) for b in model.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for b, copy in saved:
                b.copy_(copy)


@dataclass
class SamStep:
    """Losses of one SAM step: ``loss`` at ``θ`` (what the round reports), ``perturbed_loss`` at
    ``θ + ε`` (NaN when the step stopped at a non-finite ``loss``)."""

    loss: float
    perturbed_loss: float

    @property
    def finite(self) -> bool:
        return math.isfinite(self.loss) and math.isfinite(self.perturbed_loss)

    @property
    def reported_loss(self) -> float:
        """What the round reports for this step: ``loss``, or the perturbed loss when that alone
        is not finite (either way non-finite when the step is not :attr:`finite`)."""
        return self.perturbed_loss if math.isfinite(self.loss) and not math.isfinite(self.perturbed_loss) else self.loss


def sam_step(optimizer: LocalSGD, closure: Callable[[], torch.Tensor], rho: float, *,
             model: nn.Module | None = None,
             record_step: RecordStep | None = None,
             ) -> SamStep:
    """One SAM step on ``optimizer.params``: gradient of ``closure()`` at ``θ``, ``ε`` from
    :func:`sam_perturbation`, gradient at ``θ + ε`` (with ``model``'s buffers frozen, see
    :func:`frozen_buffers`), ``θ`` restored exactly, then ``optimizer.step()`` with that gradient.

    ``closure`` recomputes the loss from the current parameters (it is called twice). Nothing is
    changed when the first loss is not finite. ``record_step`` (the client's
    ``ctx.record_step``) receives the gradient at the *unperturbed* ``θ``: the batch gradient
    plain SGD would step on, which is the sample auto-β's estimators need (docs/methods-seeds.md §2). With plain SGD (no momentum/decay) the update is
    ``θ' = θ − lr ∇L(θ + ρ ∇L(θ)/‖∇L(θ)‖)``.
    """
    params = optimizer.params
    loss = closure()
    value = float(loss.detach())
    if not math.isfinite(value):
        return SamStep(value, math.nan)
    with autocast_off(loss.device.type):
        grads = torch.autograd.grad(loss, params, allow_unused=True)
    if record_step is not None:
        record_step(params, grads)
    eps = sam_perturbation(grads, rho)
    saved = [p.detach().clone() for p in params]
    with torch.no_grad():
        for p, e in zip(params, eps):
            if e is not None:
                p.add_(e)
    with frozen_buffers(model):  # restored after the backward pass, which may read them
        perturbed = closure()
        perturbed_value = float(perturbed.detach())
        with autocast_off(perturbed.device.type):
            perturbed_grads = torch.autograd.grad(perturbed, params, allow_unused=True)
    with torch.no_grad():
        for p, s in zip(params, saved):
            p.copy_(s)
    if not math.isfinite(perturbed_value):
        return SamStep(value, perturbed_value)
    for p, g in zip(params, perturbed_grads):
        p.grad = g
    optimizer.step()
    return SamStep(value, perturbed_value)


def cross_entropy_closure(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Callable[[], torch.Tensor]:
    """``() -> cross_entropy(model(x), y)`` for :func:`sam_step` (recomputed at the current weights)."""
    return lambda: F.cross_entropy(model(x), y)


class SamDescent:
    """SAM's step function body on the cross-entropy of a batch ``(x, y)``: ``descent(x, y)``
    runs :func:`sam_step` (recording the unperturbed batch gradient with ``record_step``) and
    returns the loss the round reports (:attr:`SamStep.reported_loss`); it sums
    ``L(θ + ε) − L(θ)`` over its finite steps for the ``sam_sharpness`` metric. Used by FedSAM on
    the client's batches and by GFM on their augmentations."""

    def __init__(self, optimizer: LocalSGD, model: nn.Module, rho: float, record_step: RecordStep):
        self.optimizer, self.model, self.rho, self.record_step = optimizer, model, float(rho), record_step
        self.sharpness_sum = 0.0

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> float:
        step = sam_step(self.optimizer, cross_entropy_closure(self.model, x, y), self.rho, model=self.model,
                        record_step=self.record_step)
        if step.finite:
            self.sharpness_sum += step.perturbed_loss - step.loss
        return step.reported_loss

    def metrics(self, steps: int) -> dict[str, float]:
        """``{"sam_sharpness": mean L(θ + ε) − L(θ) over the round's steps}``."""
        return {"sam_sharpness": self.sharpness_sum / max(steps, 1)}


# ------------------------------------------------------------------------------------------------
class SAM(ClientMethod):
    name = "sam"
    reads = {"rho": SAM_RHO}

    def train(self, ctx: ClientContext) -> ClientOutcome:
        sam = SamDescent(self.start_round(ctx), ctx.model, self.rho, ctx.record_step)
        return self.local_loop(ctx, sam, sam.metrics)
