"""Client methods: how one client trains from the global model for one round.

A :class:`ClientMethod` gets a :class:`ClientContext` (the model already holding the global
weights, the client's data as tensors on its device, a seeded generator for data order, the
server rule's broadcast payload and the client's own persistent state) and trains the model in
place. The runtime then ships the trained weights back; the method may add ``extras`` (arrays
the server rule needs, e.g. per-batch displacements) and ``metrics`` (diag columns).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterator, Sequence

if TYPE_CHECKING:  # torch is imported lazily: the driver process never needs it
    import torch
    from torch import nn

import numpy as np

from fedtune.algorithms.base import HParam


@dataclass
class ClientContext:
    model: nn.Module
    x: torch.Tensor
    y: torch.Tensor
    cfg: Any  # RunConfig
    round: int
    client_id: int
    role: str  # "source" | "target"
    generator: torch.Generator  # seeded from (seed, client_id, round): data order
    device: torch.device
    payload: dict[str, np.ndarray] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)  # survives across rounds on this client's actor
    # Call once per local step, with the parameters and the *batch gradient* of the data loss at
    # θ before the step (the gradient plain SGD would step on: before momentum, weight decay,
    # FedProx's μ(θ − θ_global), SAM's perturbation or FedGaLA's gate), ``None`` where a parameter
    # has no gradient. The runtime uses it to record the FDA clients' raw per-batch steps
    # ``−local_lr · ∇_b`` when the server rule wants them (auto-β); a no-op otherwise.
    record_step: Callable[[Sequence[torch.Tensor], Sequence[torch.Tensor | None]], None] = \
        lambda params, grads: None


@dataclass
class ClientOutcome:
    loss: float  # mean training loss over the round's steps (NaN/Inf => the run diverged)
    steps: int
    extras: dict[str, np.ndarray] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


def local_steps(num_examples: int, cfg: Any) -> int:
    """Steps of one round: ``local_steps`` if set, else ``local_epochs`` passes over the data
    (:func:`batches_per_epoch` steps each)."""
    if cfg.local_steps is not None:
        return int(cfg.local_steps)
    return int(cfg.local_epochs) * batches_per_epoch(num_examples, cfg.batch_size)


def batches_per_epoch(n: int, batch_size: int) -> int:
    """Batches :func:`batches` cuts from one pass over ``n`` examples: ``ceil(n / batch_size)``,
    one fewer when that would leave a last batch of a single example (it joins the batch before).

    >>> batches_per_epoch(18, 17), batches_per_epoch(34, 17), batches_per_epoch(35, 17), batches_per_epoch(1, 17)
    (1, 2, 2, 1)
    """
    full = max(1, math.ceil(n / batch_size))
    return full - 1 if batch_size > 1 and full > 1 and n % batch_size == 1 else full


def batches(n: int, batch_size: int, steps: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """``steps`` index batches drawn epoch by epoch from fresh permutations of ``range(n)``.

    Never a batch of one example when ``n > 1`` and ``batch_size > 1`` (BatchNorm cannot train on
    one): when the last
    batch of an epoch would hold a single example, it is merged into the batch before it (which
    then holds ``batch_size + 1``), so every example is still seen once per epoch and an epoch
    is :func:`batches_per_epoch` steps. Deterministic given ``generator``'s state.
    """
    import torch

    done = 0
    while done < steps:
        perm = torch.randperm(n, generator=generator)
        starts = list(range(0, n, batch_size))
        if batch_size > 1 and len(starts) > 1 and n - starts[-1] == 1:
            starts.pop()  # the single trailing example joins the previous batch
        for i, start in enumerate(starts):
            if done == steps:
                return
            end = starts[i + 1] if i + 1 < len(starts) else n
            yield perm[start:end]
            done += 1


class LocalSGD:
    """``torch.optim.SGD``'s update (momentum, weight decay) through torch's functional
    ``torch.optim.sgd.sgd``: the same math and kernels, bit for bit, without
    ``torch.optim.Optimizer``, whose first use imports ``torch._dynamo`` (about 2.3 s of CPU in
    every fresh actor process, i.e. on every run's first round).
    """

    def __init__(self, params, lr: float, momentum: float = 0.0, weight_decay: float = 0.0):
        self.params = [p for p in params if p.requires_grad]
        self.lr, self.momentum, self.weight_decay = float(lr), float(momentum), float(weight_decay)
        self.buffers: list = [None] * len(self.params)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        import torch
        from torch.optim.sgd import sgd

        with_grad = [(i, p) for i, p in enumerate(self.params) if p.grad is not None]
        bufs = [self.buffers[i] for i, _ in with_grad]
        with torch.no_grad():
            sgd([p for _, p in with_grad], [p.grad for _, p in with_grad], bufs,
                weight_decay=self.weight_decay, momentum=self.momentum, lr=self.lr, dampening=0.0,
                nesterov=False, maximize=False, foreach=False)
        for (i, _), b in zip(with_grad, bufs):
            self.buffers[i] = b


class ClientMethod:
    """Base class. Subclasses set ``name``/``hparams`` and implement :meth:`train`."""

    name: ClassVar[str]
    description: ClassVar[str] = ""
    hparams: ClassVar[tuple[HParam, ...]] = ()
    supervised: ClassVar[bool] = True  # False: trains without labels (the ufdg setting)
    # True: the runtime puts the last global move θ^t − θ^(t−1) (float32 [num_params]) in
    # ``ctx.payload["global_move"]`` from the second round on (FedGaLA's local alignment).
    needs_global_move: ClassVar[bool] = False

    def __init__(self, cfg: Any):
        self.cfg = cfg

    def train(self, ctx: ClientContext) -> ClientOutcome:
        raise NotImplementedError


class SGD(ClientMethod):
    name = "sgd"
    description = "plain local SGD (momentum, weight decay) on the cross-entropy loss"

    def make_optimizer(self, model: nn.Module) -> LocalSGD:
        c = self.cfg
        return LocalSGD(model.parameters(), lr=c.local_lr, momentum=c.local_momentum, weight_decay=c.weight_decay)

    def train(self, ctx: ClientContext) -> ClientOutcome:
        from torch import nn

        model, cfg = ctx.model, self.cfg
        model.train()
        opt = self.make_optimizer(model)
        n = len(ctx.y)
        steps = local_steps(n, cfg)
        total, done = 0.0, 0
        for idx in batches(n, cfg.batch_size, steps, ctx.generator):
            idx = idx.to(ctx.device)
            loss = nn.functional.cross_entropy(model(ctx.x[idx]), ctx.y[idx])
            value = float(loss.detach())
            if not math.isfinite(value):
                return ClientOutcome(loss=value, steps=done + 1)
            opt.zero_grad()
            loss.backward()
            ctx.record_step(opt.params, [p.grad for p in opt.params])
            opt.step()
            total += value
            done += 1
        return ClientOutcome(loss=total / max(done, 1), steps=done)
