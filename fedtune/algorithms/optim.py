"""The client-side optimisers: torch's own update math through its functional API.

:class:`LocalSGD` is ``torch.optim.SGD`` (momentum, weight decay) and :class:`FunctionalAdam`
``torch.optim.Adam``/``AdamW``, both through ``torch.optim.sgd.sgd`` / ``torch.optim.adam.adam``:
the same math and kernels, bit for bit, without ``torch.optim.Optimizer``, whose first use
imports ``torch._dynamo`` (about 2.3 s of CPU in every fresh actor process, i.e. on every run's
first round). :func:`local_sgd` is the one place a run's local optimiser is built from its
config (``local_lr``, ``local_momentum``, ``weight_decay``).

torch is imported inside the methods: importing this module (the algorithm registry does) never
imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Sequence

if TYPE_CHECKING:
    import torch


class LocalSGD:
    """``torch.optim.SGD``'s update (momentum, weight decay, no dampening or Nesterov) on
    ``params`` (those with ``requires_grad``); the momentum buffers live as long as the object
    (one round: the runtime builds a new one every round)."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float, momentum: float = 0.0, weight_decay: float = 0.0):
        self.params = [p for p in params if p.requires_grad]
        self.lr, self.momentum, self.weight_decay = float(lr), float(momentum), float(weight_decay)
        self.buffers: list = [None] * len(self.params)

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
        import torch
        from torch.optim.sgd import sgd

        bufs = [self.buffers[i] for i in indices]
        with torch.no_grad():
            sgd([self.params[i] for i in indices], [self.params[i].grad for i in indices], bufs,
                weight_decay=self.weight_decay, momentum=self.momentum, lr=self.lr, dampening=0.0,
                nesterov=False, maximize=False, foreach=False)
        for i, b in zip(indices, bufs):
            self.buffers[i] = b


def local_sgd_settings(cfg: Any) -> dict[str, float]:
    """The run's local optimiser settings, as :class:`LocalSGD` keyword arguments."""
    return {"lr": cfg.local_lr, "momentum": cfg.local_momentum, "weight_decay": cfg.weight_decay}


def local_sgd(params: Iterable[torch.Tensor], cfg: Any) -> LocalSGD:
    """The run's local optimiser over ``params`` (:func:`local_sgd_settings`)."""
    return LocalSGD(params, **local_sgd_settings(cfg))


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
        import torch

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
        import torch
        from torch.optim.adam import adam

        with torch.no_grad():
            adam(self.params, list(grads), self.exp_avgs, self.exp_avg_sqs, [], self.steps, foreach=False,
                 decoupled_weight_decay=self.decoupled_weight_decay, amsgrad=False, beta1=self.betas[0],
                 beta2=self.betas[1], lr=self.lr, weight_decay=self.weight_decay, eps=self.eps,
                 maximize=self.maximize)


__all__ = ["FunctionalAdam", "LocalSGD", "local_sgd", "local_sgd_settings"]
