"""The finite-loss guard without a host-device synchronisation on every step.

Today's rule (:func:`~fedtune.algorithms.client.method.descend` and the local loop): a step whose
loss is not finite changes nothing (no backward, no optimiser step) and ends the round with the
steps taken, that one included, its loss the outcome's. Reading the loss as a Python number before
``backward`` makes the host wait for the device's forward pass on every step, so the device's
queue runs dry before the next launch.

On a CUDA device (:data:`DEFERRED_DEVICES`) ``descend(..., defer=True)`` instead, when the local
loop has armed the optimiser's :class:`LossGuard` for the step: copies the loss to pinned host
memory without waiting (a :class:`PendingLoss`), saves the state today's rule would leave if this
loss were not finite (every parameter before this step's update, every buffer after its forward,
the optimiser's parameters outside the model too: one device copy) and steps unconditionally.
The loop reads the pending value just before the next step starts (by then the device has long
finished this step's forward; its backward and update are still queued, so the device keeps
working) or at the epoch's or round's end; a value that is not finite puts the saved state back
and ends the round as today: the same weights, the same ``ClientOutcome``. The rows and the
reported losses are the same floats (the float32 loss read either way), summed on the host in
the same order.

What a later step would have done never happens: the loop reads the pending loss before it
fetches, augments or trains the next batch. What the non-finite step itself does past today's
rule (its backward, ``record_step`` with non-finite gradients, ``after_backward``, the optimiser's
state) stays inside the round that the run then ends as diverged: the optimiser is the round's,
and the coordinator keeps the old global model for a diverged round.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

DEFERRED_DEVICES: tuple[str, ...] = ("cuda",)
"""Device types on which the loop checks the loss one step late. On the CPU reading a loss costs
no synchronisation (and the saved copy would be a model's worth of host memory traffic a step),
so the CPU keeps the immediate check; tests add ``"cpu"`` to prove the two give the same results."""


@dataclass
class PendingLoss:
    """A step's loss on its way to the host (``event``: the copy's end on CUDA; None on the host)."""

    tensor: torch.Tensor
    event: Any
    guard: "LossGuard"

    def value(self) -> float:
        if self.event is not None:
            self.event.synchronize()  # waits for this step's forward only, not the queued backward
        return float(self.tensor)


class LossGuard:
    """The state one deferred step saves and a non-finite loss puts back (see the module docstring).
    The local loop arms it before each step; the first ``descend(defer=True)`` of the step uses it."""

    def __init__(self, tensors: list[torch.Tensor]):
        self.tensors = tensors
        self.saved: list[torch.Tensor] | None = None
        self.armed = False

    @classmethod
    def of(cls, model: nn.Module, params: list[torch.Tensor], device: torch.device) -> "LossGuard | None":
        """The guard of a round's optimiser over ``params`` (``model``'s or more) on ``device``, or
        None where the loss is checked at once (:data:`DEFERRED_DEVICES`)."""
        if torch.device(device).type not in DEFERRED_DEVICES:
            return None
        seen: set[int] = set()
        tensors = []
        for t in [*model.parameters(), *model.buffers(), *params]:
            if id(t) not in seen:
                seen.add(id(t))
                tensors.append(t)
        return cls(tensors)

    def take(self, loss: torch.Tensor) -> PendingLoss | None:
        """When armed (once): save the state and start the loss's copy to the host; else None."""
        if not self.armed:
            return None
        self.armed = False
        with torch.no_grad():
            if self.saved is None:
                self.saved = [t.detach().clone() for t in self.tensors]
            else:  # one fused copy (a few launches, not one per tensor)
                torch._foreach_copy_(self.saved, [t.detach() for t in self.tensors])
        value = loss.detach()
        if value.device.type != "cuda":
            return PendingLoss(value, None, self)
        host = torch.empty((), dtype=value.dtype, pin_memory=True)
        host.copy_(value, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return PendingLoss(host, event, self)

    def restore(self) -> None:
        """Put back the state saved by the last :meth:`take`."""
        assert self.saved is not None
        with torch.no_grad():
            torch._foreach_copy_(self.tensors, self.saved)
