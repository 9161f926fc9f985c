"""Client methods: how one client trains from the global model for one round, and THE local loop.

A :class:`ClientMethod` gets a :class:`ClientContext` (the model already holding the global
weights, the client's training examples, fetched batch by batch onto its device by
:meth:`ClientContext.batch` with the run's training augmentation, a seeded generator for data
order and augmentation, the server rule's broadcast payload and the client's own persistent
state) and trains the model in place. The runtime then ships the trained weights back; the method may add ``extras`` (arrays
the server rule needs, e.g. per-batch displacements) and ``metrics`` (diag columns).

Every method trains through one loop, :meth:`ClientMethod.local_loop`: it draws the round's
batches (:func:`batches`, :func:`~fedtune.algorithms.client.steps.local_steps`), fetches each (:meth:`ClientContext.batch`),
calls the method's *step function* ``step(x, y) -> loss`` on it under the run's ``precision``
(:mod:`fedtune.algorithms.client.precision`; backward passes leave autocast), sums the losses, stops at the first non-finite one (the run diverged) and returns the
:class:`ClientOutcome`. A step function trains on its batch and returns the batch's training
loss; the plain gradient step is :func:`descend` (SGD, FedProx, SimCLR, GCA, FedGaLA's gated
step through the optimiser it is given), SAM's is :class:`fedtune.algorithms.client.sam.SamDescent`
(FedSAM, GFM). A new method writes its step function and hands it to ``local_loop``.

A method reads its hyperparameters once, typed, when it is built: named in
:attr:`ClientMethod.reads` (``reads = {"mu": PROX_MU}``: ``self.mu`` is ``PROX_MU.of(cfg)``), or in
``__init__``. Client-method modules are PyTorch code and import torch at their top; the
registry (:data:`fedtune.algorithms.CLIENT_METHODS`) imports one only when its method is looked
up, so processes that only aggregate (the coordinator) never load torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterator, NoReturn, Protocol, Sequence

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from fedtune.algorithms.client import prefetch
from fedtune.algorithms.client.deferred_loss import LossGuard, PendingLoss
from fedtune.algorithms.base import HParam, RunConfig, read_hparams
from fedtune.algorithms.client.optim import LocalSGD, local_optimizer
from fedtune.algorithms.client.steps import local_steps
from fedtune.old_names import old_name_error
from fedtune.algorithms.client.precision import autocast, autocast_off

# One training step on a mini-batch (inputs x, labels y, on the device) -> its training loss (a
# PendingLoss when it came from descend(..., defer=True): read by the loop one step later).
StepFunction = Callable[[torch.Tensor, torch.Tensor], "float | PendingLoss"]
# ClientContext.record_step: (parameters, their batch gradients, None where a parameter has none).
RecordStep = Callable[[Sequence[torch.Tensor], Sequence[torch.Tensor | None]], None]


def no_record(params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor | None]) -> None:
    """:attr:`ClientContext.record_step` when nothing records the steps."""


# augment(x in [0, 1], generator) -> augmented x (fedtune.runtime.augment.DomainBedAugment)
Augment = Callable[[torch.Tensor, torch.Generator], torch.Tensor]


class ClientData(Protocol):
    """A client's training examples as a client method sees them
    (:class:`fedtune.runtime.examples.Examples` in a run; any object with these in a test). Data
    that also has ``stage(rows, augmented)`` and ``finish(staged, augment, generator)`` (``Examples``)
    is read ahead by the local loop (:mod:`fedtune.algorithms.client.prefetch`)."""

    input_shape: tuple[int, ...]  # one example's shape: (C, H, W) for images, (F,) for vectors
    labels: torch.Tensor  # int64 [N], on the host
    domains: torch.Tensor  # int64 [N], on the host: each example's domain (its position in the dataset's list)

    def __len__(self) -> int: ...

    def batch(self, rows: torch.Tensor, augment: Augment | None = None,
              generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x, y)`` of ``rows`` (a CPU int64 tensor of positions) on the device, augmented."""
        ...

    def value_range(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-channel minimum and maximum of the un-augmented inputs, on the host."""
        ...


@dataclass
class ClientContext:
    model: nn.Module
    data: ClientData
    cfg: RunConfig  # the run's FederatedRunConfig
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
    record_step: RecordStep = no_record
    # The run's training augmentation (fedtune.runtime.augment; None: none), drawn from ``generator``.
    augment: Augment | None = None
    precision: str = "fp32"  # fp32 | bf16 | fp16 (fedtune.algorithms.client.precision)
    scaler: torch.amp.GradScaler | None = None  # fp16: the round's gradient scaler
    # The positions (in ``data``) of the batch being trained, set by the local loop before each step:
    # a step function that needs more than ``(x, y)`` of its rows reads them here
    # (``data.domains[rows]``: each example's domain, for methods that compare domains in a batch).
    rows: torch.Tensor | None = None
    # Every source client's training examples (the run's plan; read un-augmented): set only for a
    # method that declares ``needs_source_bank`` (FedDG samples amplitude spectra from it).
    source_bank: ClientData | None = None
    # The round optimiser's finite-loss guard on a CUDA device (set by ClientMethod.start_round;
    # fedtune.algorithms.client.deferred_loss), armed by the local loop before each step.
    loss_guard: LossGuard | None = None

    @property
    def num_examples(self) -> int:
        return len(self.data)

    def batch(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x, y)`` of training rows ``rows`` (a CPU int64 tensor) on the device, augmented."""
        return self.data.batch(rows, self.augment, self.generator)


@dataclass
class ClientOutcome:
    loss: float  # mean training loss over the round's steps (NaN/Inf => the run diverged)
    steps: int
    extras: dict[str, np.ndarray] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


def batches(n: int, batch_size: int, steps: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """``steps`` index batches drawn epoch by epoch from fresh permutations of ``range(n)``
    (:func:`~fedtune.algorithms.client.prefetch.epochs`, one after the other).

    Never a batch of one example when ``n > 1`` and ``batch_size > 1`` (BatchNorm cannot train on
    one): when the last
    batch of an epoch would hold a single example, it is merged into the batch before it (which
    then holds ``batch_size + 1``), so every example is still seen once per epoch and an epoch
    is :func:`~fedtune.algorithms.client.steps.batches_per_epoch` steps. Deterministic given ``generator``'s state.
    """
    for epoch in prefetch.epochs(n, batch_size, steps, generator):
        yield from epoch


def descend(optimizer: LocalSGD, loss: torch.Tensor, record_step: RecordStep,
            after_backward: Callable[[], None] | None = None, defer: bool = False) -> float | PendingLoss:
    """One gradient step on ``loss``: its value, and unless that is not finite (then nothing
    changes), ``zero_grad``, ``backward`` (outside autocast), ``record_step`` with the batch
    gradient (see :class:`ClientContext`), ``after_backward()`` (e.g. FedProx adding its proximal
    gradient) and ``optimizer.step()``. Returns the loss value.

    With ``optimizer.scaler`` (a ``torch.amp.GradScaler``, ``precision: fp16``) the loss is
    scaled before ``backward`` and the gradients unscaled after it; a step whose gradients are
    not finite is skipped (nothing recorded, nothing stepped) and the scale lowered.

    ``defer=True`` (a step function that returns this value to the local loop untouched): on a
    CUDA device, when the loop armed the round's guard, the value is read one step later without
    stalling the device and a non-finite loss is undone then
    (:mod:`fedtune.algorithms.client.deferred_loss`): the same outcome and weights. Returns a
    :class:`~fedtune.algorithms.client.deferred_loss.PendingLoss` then (not with fp16's scaler)."""
    guard = getattr(optimizer, "guard", None) if defer and optimizer.scaler is None else None
    pending = guard.take(loss) if guard is not None else None
    if pending is None:
        value = float(loss.detach())
        if not math.isfinite(value):
            return value
    optimizer.zero_grad()
    scaler = optimizer.scaler
    with autocast_off(loss.device.type):
        (loss if scaler is None else scaler.scale(loss)).backward()
    if scaler is not None:
        scaler.unscale_(optimizer)
        grads = [p.grad for p in optimizer.params if p.grad is not None]
        if not bool(torch.stack([torch.isfinite(g).all() for g in grads]).all()):
            optimizer.zero_grad()
            scaler.update()  # lowers the scale; the step is skipped
            return value
    record_step(optimizer.params, [p.grad for p in optimizer.params])
    if after_backward is not None:
        after_backward()
    if scaler is None:
        optimizer.step()
    else:
        scaler.step(optimizer)
        scaler.update()
    return value if pending is None else pending


class ClientMethod:
    """Base class. Subclasses set ``name`` and implement :meth:`train`, normally as a few lines of
    set-up and ``return self.local_loop(ctx, step)``. What the method declares (hyperparameters,
    ``supervised``, fp16 support, its model head, its server side) is its
    :class:`~fedtune.algorithms.base.ClientMethodSpec` in :mod:`fedtune.algorithms.declarations`."""

    name: ClassVar[str]
    reads: ClassVar[dict[str, HParam[Any]]] = {}
    """Attribute -> hyperparameter: ``self.<attribute>`` is its value in the run's config, read
    once when the method is built (``{"rho": SAM_RHO}``; a subclass's add to its bases':
    :func:`~fedtune.algorithms.base.read_hparams`)."""

    def __init__(self, cfg: RunConfig):
        """Build the method for the validated config ``cfg``: ``self.cfg`` and each of :attr:`reads`;
        a subclass may read more here, once, typed (``self.rho = SAM_RHO.of(cfg)``)."""
        self.cfg = cfg
        read_hparams(self, cfg)

    def train(self, ctx: ClientContext) -> ClientOutcome:
        raise NotImplementedError

    def probe(self, ctx: ClientContext) -> dict[str, np.ndarray]:
        """Arrays the method's server side asks for at the round's new global model (``ctx.model``
        holds it), when the side :meth:`~fedtune.algorithms.server.side.ServerSide.wants_probe`
        (AFL's domain losses at the aggregated model). Must not train: the model is the global one."""
        raise NotImplementedError(f"client method {self.name} has no probe, but its server side asked for one")

    def make_optimizer(self, model: nn.Module) -> LocalSGD:
        """The round's local optimiser (:func:`~fedtune.algorithms.client.optim.local_optimizer`); a mixin may
        swap it (FedGaLA's :class:`~fedtune.algorithms.client.gala.GatedClientMixin`)."""
        return local_optimizer(model.parameters(), self.cfg)

    def start_round(self, ctx: ClientContext) -> LocalSGD:
        """Put ``ctx.model`` in training mode and return the round's optimiser over it (with the
        round's gradient scaler when ``precision`` is fp16). The FDA target client trains at
        ``local_lr · target_lr_scale`` (seed 002's target learning rate, 1/5 of the sources')."""
        ctx.model.train()
        opt = self.make_optimizer(ctx.model)
        if ctx.role == "target":  # × 1.0 at the default scale: the same bits
            opt.lr = opt.lr * float(self.cfg.target_lr_scale)
        opt.scaler = ctx.scaler
        opt.guard = ctx.loss_guard = LossGuard.of(ctx.model, list(opt.params), ctx.device)
        return opt

    def local_loop(self, ctx: ClientContext, step: StepFunction,
                   metrics: Callable[[int], dict[str, float]] | None = None) -> ClientOutcome:
        """THE local training loop: ``step(x, y)`` on each of the round's batches of the
        client's examples (:func:`~fedtune.algorithms.client.steps.local_steps` of them, rows drawn by :func:`batches` from
        ``ctx.generator``, fetched and augmented by :meth:`ClientContext.batch`), in order, each
        under the run's precision. A non-finite loss ends the round at once:
        ``ClientOutcome(loss, steps)`` with the steps taken, that one included. Otherwise the
        outcome's loss is the mean over the steps and its metrics ``metrics(steps)``.

        The next batches of an epoch are read and copied to the device in a background thread
        while the current one trains (:mod:`fedtune.algorithms.client.prefetch`: the same rows,
        order, random numbers and bits); a loss a step hands back pending
        (``descend(..., defer=True)`` on CUDA) is read before the next step starts."""
        n = ctx.num_examples
        tally = _Tally()
        stageable = getattr(ctx.data, "worth_prefetching", False)  # Examples: a fetch worth overlapping
        for epoch in prefetch.epochs(n, self.cfg.batch_size, local_steps(n, self.cfg), ctx.generator):
            with prefetch.Prefetch(ctx.data if stageable else None, epoch, prefetch.PREFETCH_DEPTH if stageable else 0,
                                   augmented=ctx.augment is not None) as staged:
                for idx, item in staged:
                    if tally.settle():
                        return tally.ended
                    ctx.rows = idx
                    x, y = ctx.batch(idx) if item is None else ctx.data.finish(item, ctx.augment, ctx.generator)
                    if ctx.loss_guard is not None:  # a recorded step is never deferred: its record is today's
                        ctx.loss_guard.armed = ctx.record_step is no_record
                    with autocast(ctx.device, ctx.precision):
                        value = step(x, y)
                    if ctx.loss_guard is not None:
                        ctx.loss_guard.armed = False
                    if tally.add(value):
                        return tally.ended
            if tally.settle():  # before the next epoch's permutation is drawn
                return tally.ended
        done = tally.done
        return ClientOutcome(loss=tally.total / max(done, 1), steps=done, metrics={} if metrics is None else metrics(done))

    def cross_entropy_loop(self, ctx: ClientContext, opt: LocalSGD, after_backward: Callable[[], None] | None = None,
                           metrics: Callable[[int], dict[str, float]] | None = None, *,
                           defer: bool = False) -> ClientOutcome:
        """:meth:`local_loop` with the plain step: :func:`descend` on the batch's cross-entropy
        (``after_backward`` adds to its gradient: FedDyn's, SCAFFOLD's correction). ``sgd``'s
        round, and that of a method whose own term weighs 0. ``defer``: :func:`descend`'s late loss
        check on CUDA (``sgd`` only: the one method its equality was proven for)."""
        model = ctx.model
        return self.local_loop(
            ctx, lambda x, y: descend(opt, F.cross_entropy(model(x), y), ctx.record_step, after_backward, defer=defer),
            metrics)


class _Tally:
    """The local loop's count: the finite losses' sum and number, the step's loss still pending
    (read one step late), and ``ended``, the outcome of a round a non-finite loss ended."""

    def __init__(self) -> None:
        self.total, self.done = 0.0, 0
        self.pending: PendingLoss | None = None
        self.ended: ClientOutcome | None = None

    def add(self, value: float | PendingLoss) -> bool:
        """Count a step's loss (a pending one is read by :meth:`settle`); True: the round ends."""
        if isinstance(value, PendingLoss):
            self.pending = value
            return False
        if not math.isfinite(value):
            self.ended = ClientOutcome(loss=value, steps=self.done + 1)
            return True
        self.total += value
        self.done += 1
        return False

    def settle(self) -> bool:
        """Read the pending loss, if any; a non-finite one undoes its step (True: the round ends)."""
        pending, self.pending = self.pending, None
        if pending is None:
            return False
        value = pending.value()
        if not math.isfinite(value):
            pending.guard.restore()
        return self.add(value)


class SGD(ClientMethod):
    name = "sgd"

    def train(self, ctx: ClientContext) -> ClientOutcome:
        return self.cross_entropy_loop(ctx, self.start_round(ctx), defer=True)


def __getattr__(name: str) -> NoReturn:
    """A name that left this module (the step counts, for :mod:`fedtune.algorithms.client.steps`)
    raises one line naming its new home."""
    raise old_name_error(__name__, name)
