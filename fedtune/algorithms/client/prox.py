"""FedProx client method: local SGD with a proximal term (Li et al., 2020).

``prox`` minimises ``L(θ) + μ/2 ‖θ − θ_global‖²`` with local SGD, ``θ_global`` the weights the
client received this round. The proximal gradient ``μ (θ − θ_global)`` is added to the batch
gradient after ``backward`` (:func:`add_prox_gradient`: the same gradient as differentiating the
penalty, without putting it in the autograd graph); ``μ = 0`` adds nothing, so it is
bit-identical to ``sgd``. The batch gradient recorded for auto-β excludes the proximal term. The
reported training loss is the data (cross-entropy) loss only, comparable across methods; the
penalty is the ``diag.prox_penalty`` column (mean over steps).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.nn import functional as F

from fedtune.algorithms.client.method import ClientContext, ClientMethod, ClientOutcome, descend
from fedtune.algorithms.declarations import PROX_MU



def add_prox_gradient(params: Sequence[torch.Tensor], anchors: Sequence[torch.Tensor], mu: float) -> float:
    """Add FedProx's ``μ (θ − θ_anchor)`` to each ``param.grad`` (in place, where a gradient
    exists) and return the penalty ``μ/2 ‖θ − θ_anchor‖²`` (over all params).

    >>> p = torch.tensor([1.0, 2.0], requires_grad=True); p.grad = torch.zeros(2)
    >>> add_prox_gradient([p], [torch.zeros(2)], 0.5), p.grad.tolist()
    (1.25, [0.5, 1.0])
    """
    total = 0.0
    with torch.no_grad():
        for p, a in zip(params, anchors):
            diff = p.detach() - a
            total += float(diff.pow(2).sum())
            if p.grad is not None:
                p.grad.add_(diff, alpha=float(mu))
    return 0.5 * float(mu) * total


class Prox(ClientMethod):
    name = "prox"
    reads = {"mu": PROX_MU}

    def train(self, ctx: ClientContext) -> ClientOutcome:
        mu = self.mu
        model, opt = ctx.model, self.start_round(ctx)
        anchors = [p.detach().clone() for p in opt.params] if mu > 0 else []
        penalty = 0.0

        def add_prox() -> None:  # after recording the batch gradient: the record excludes the prox term
            nonlocal penalty
            if mu > 0:
                penalty += add_prox_gradient(opt.params, anchors, mu)

        def step(x: torch.Tensor, y: torch.Tensor) -> float:
            return descend(opt, F.cross_entropy(model(x), y), ctx.record_step, add_prox)

        return self.local_loop(ctx, step, lambda steps: {"prox_penalty": penalty / max(steps, 1)})


__all__ = ["Prox", "add_prox_gradient"]
