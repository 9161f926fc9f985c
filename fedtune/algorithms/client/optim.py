"""The client-side optimisers: torch's own update math through its functional API.

:class:`LocalSGD` is ``torch.optim.SGD`` (momentum, weight decay), :class:`LocalAdam` the
client's ``torch.optim.Adam`` (DomainBed's optimiser: L2 weight decay, betas 0.9/0.999) and
:class:`FunctionalAdam` ``torch.optim.Adam``/``AdamW`` with external gradients (GFM's
augmenter), all through ``torch.optim.sgd.sgd`` / ``torch.optim.adam.adam``: the same math and
kernels, bit for bit, without ``torch.optim.Optimizer``, whose first use imports
``torch._dynamo`` (about 2.3 s of CPU in every fresh actor process, i.e. on every run's first
round). :func:`local_optimizer` is the one place a run's local optimiser is built from its
config (``local_optimizer``, ``local_lr``, ``local_momentum``, ``weight_decay``). Both local
optimisers are rebuilt every round (their state does not outlive the round), step a chosen
subset of tensors (:meth:`LocalSGD.step_tensors`, FedGaLA's gate) and expose ``param_groups``
so ``torch.amp.GradScaler`` can unscale their gradients (``precision: fp16``). The names a
config may give (``local_optimizer``) are :data:`fedtune.algorithms.LOCAL_OPTIMIZERS`.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import torch
from torch.optim.adam import adam
from torch.optim.sgd import sgd

from fedtune.algorithms import LOCAL_OPTIMIZERS
from fedtune.algorithms.base import RunConfig


class LocalSGD:
    """``torch.optim.SGD``'s update (momentum, weight decay, no dampening or Nesterov) on
    ``params`` (those with ``requires_grad``); the momentum buffers live as long as the object
    (one round: the runtime builds a new one every round)."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float, momentum: float = 0.0, weight_decay: float = 0.0):
        self.params = [p for p in params if p.requires_grad]
        self.lr, self.momentum, self.weight_decay = float(lr), float(momentum), float(weight_decay)
        self.buffers: list = [None] * len(self.params)

    scaler = None  # a torch.amp.GradScaler when the round runs in fp16 (descend uses it)

    @property
    def param_groups(self) -> list[dict]:
        """What ``torch.amp.GradScaler.unscale_`` reads."""
        return [{"params": self.params}]

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        """Step every parameter that has a gradient."""
        self.step_tensors([i for i, p in enumerate(self.params) if p.grad is not None])

    def step_tensors(self, indices: Sequence[int]) -> None:
        """Step ``params[i]`` for ``i`` in ``indices`` (each with a gradient); the others, and
        their momentum buffers, are left as they are."""
        if not indices:
            return
        bufs = [self.buffers[i] for i in indices]
        with torch.no_grad():
            sgd([self.params[i] for i in indices], [self.params[i].grad for i in indices], bufs,
                weight_decay=self.weight_decay, momentum=self.momentum, lr=self.lr, dampening=0.0,
                nesterov=False, maximize=False, foreach=False)
        for i, b in zip(indices, bufs):
            self.buffers[i] = b


class LocalAdam(LocalSGD):
    """``torch.optim.Adam`` (L2 ``weight_decay`` added to the gradient, as DomainBed's Adam;
    ``betas`` 0.9/0.999, ``eps`` 1e-8, no AMSGrad) on ``params``, with :class:`LocalSGD`'s
    interface: ``step`` / ``step_tensors`` step the tensors that have a gradient; a tensor left
    out keeps its moments and step count unchanged."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float, weight_decay: float = 0.0, *,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):
        super().__init__(params, lr, 0.0, weight_decay)
        self.betas, self.eps = (float(betas[0]), float(betas[1])), float(eps)
        self.exp_avgs = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in self.params]
        self.exp_avg_sqs = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in self.params]
        self.steps = [torch.zeros((), dtype=torch.float32) for _ in self.params]

    def step_tensors(self, indices: Sequence[int]) -> None:
        if not indices:
            return
        with torch.no_grad():
            adam([self.params[i] for i in indices], [self.params[i].grad for i in indices],
                 [self.exp_avgs[i] for i in indices], [self.exp_avg_sqs[i] for i in indices], [],
                 [self.steps[i] for i in indices], foreach=False, amsgrad=False, beta1=self.betas[0],
                 beta2=self.betas[1], lr=self.lr, weight_decay=self.weight_decay, eps=self.eps, maximize=False)


def local_optimizer_settings(cfg: RunConfig) -> dict[str, Any]:
    """The run's local optimiser as keyword arguments of :func:`make_local_optimizer`:
    ``kind`` (``cfg.local_optimizer``), ``lr``, ``weight_decay`` and, for SGD, ``momentum``."""
    kind = getattr(cfg, "local_optimizer", "sgd")
    out: dict[str, Any] = {"kind": kind, "lr": cfg.local_lr, "weight_decay": cfg.weight_decay}
    if kind == "sgd":
        out["momentum"] = cfg.local_momentum
    return out


def local_optimizer_class(kind: str) -> type[LocalSGD]:
    if kind not in LOCAL_OPTIMIZERS:
        raise ValueError(f"local_optimizer '{kind}' is unknown; allowed: {', '.join(LOCAL_OPTIMIZERS)}")
    return LocalSGD if kind == "sgd" else LocalAdam


def make_local_optimizer(params: Iterable[torch.Tensor], kind: str = "sgd", **settings: Any) -> LocalSGD:
    """A :class:`LocalSGD` (``kind="sgd"``) or :class:`LocalAdam` (``"adam"``) over ``params``."""
    return local_optimizer_class(kind)(params, **settings)


def local_optimizer(params: Iterable[torch.Tensor], cfg: RunConfig) -> LocalSGD:
    """The run's local optimiser over ``params`` (:func:`local_optimizer_settings`)."""
    return make_local_optimizer(params, **local_optimizer_settings(cfg))


class FunctionalAdam:
    """``torch.optim.Adam`` (``decoupled_weight_decay=True``: AdamW) through the functional
    ``torch.optim.adam.adam``; ``maximize=True`` ascends the objective it is given the gradient
    of. :meth:`step` takes the gradients as an argument (they may come from
    ``torch.autograd.grad``, leaving ``.grad`` untouched). Moments and step counts are plain
    tensor lists (``exp_avgs``, ``exp_avg_sqs``, ``steps``; the counts on the CPU) so a caller
    can save and restore them."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float, weight_decay: float = 0.0, *,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, decoupled_weight_decay: bool = False,
                 maximize: bool = False):
        self.params = [p for p in params if p.requires_grad]
        self.lr, self.weight_decay = float(lr), float(weight_decay)
        self.betas, self.eps = (float(betas[0]), float(betas[1])), float(eps)
        self.decoupled_weight_decay, self.maximize = bool(decoupled_weight_decay), bool(maximize)
        self.exp_avgs = [torch.zeros_like(p) for p in self.params]
        self.exp_avg_sqs = [torch.zeros_like(p) for p in self.params]
        self.steps = [torch.zeros((), dtype=torch.float32) for _ in self.params]

    @property
    def num_steps(self) -> int:
        return int(self.steps[0]) if self.steps else 0

    def step(self, grads: Sequence[torch.Tensor]) -> None:
        with torch.no_grad():
            adam(self.params, list(grads), self.exp_avgs, self.exp_avg_sqs, [], self.steps, foreach=False,
                 decoupled_weight_decay=self.decoupled_weight_decay, amsgrad=False, beta1=self.betas[0],
                 beta2=self.betas[1], lr=self.lr, weight_decay=self.weight_decay, eps=self.eps,
                 maximize=self.maximize)


__all__ = ["FunctionalAdam", "LocalAdam", "LocalSGD", "local_optimizer", "local_optimizer_class",
           "local_optimizer_settings", "make_local_optimizer"]
