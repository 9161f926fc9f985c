"""FedDyn's client (Acar et al., ICLR 2021, Algorithm 1; docs/methods-baselines.md §12); the server's ``h`` and the
hyperparameters are :mod:`fedtune.algorithms.server.feddyn`'s.

Client ``k`` keeps ``∇L_k(θ_k^(t−1))`` (``ctx.state``, a float32 tensor of the model's
parameters, zero at first) and, from the global ``θ^(t−1)``, minimises with the run's local
optimiser

    L_k(θ) − ⟨∇L_k(θ_k^(t−1)), θ⟩ + α/2 ‖θ − θ^(t−1)‖²

whose gradient is the batch gradient ``g`` plus ``α (θ − θ^(t−1)) − ∇L_k(θ_k^(t−1))``, added after
``backward`` (:class:`DynamicRegulariser`; the gradient recorded for auto-β excludes it); the
optimiser then adds its own L2 weight decay and momentum, as for ``sgd``. After training:

    ∇L_k(θ_k^t) = ∇L_k(θ_k^(t−1)) − α (θ_k^t − θ^(t−1))

``α = 0`` (``feddyn_alpha``) trains exactly as ``sgd`` and keeps no state. The authors' code
(github.com/alpemreacar/FedDyn, ``utils_general.train_feddyn_mdl``) puts ``α`` into SGD's weight
decay and the rest into a linear loss term, the same gradient; their ``α`` is per client,
``α / (n_k N / Σ_j n_j)``, and they clip the gradient norm at 10: see docs/methods-baselines.md §12 for these
departures. A round that ends at a non-finite loss (the run diverged) leaves the state as it was.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from fedtune.algorithms.client.method import ClientContext, ClientMethod, ClientOutcome
from fedtune.algorithms.declarations import FEDDYN_ALPHA
from fedtune.algorithms.client.scaffold import trainable_views
from fedtune.layout import FlatLayout

STATE_KEY = "feddyn_grad"  # ctx.state: ∇L_k(θ_k^(t−1)), float32 [num_params]


class DynamicRegulariser:
    """The ``after_backward`` of a FedDyn step: ``grad += α (θ − θ_anchor) − linear`` for each
    parameter with a gradient (``anchors``, ``linear``: one tensor per entry of ``params``)."""

    def __init__(self, params: Sequence[torch.Tensor], anchors: Sequence[torch.Tensor],
                 linear: Sequence[torch.Tensor], alpha: float):
        self.params, self.anchors, self.linear, self.alpha = list(params), list(anchors), list(linear), float(alpha)

    def __call__(self) -> None:
        with torch.no_grad():
            for p, anchor, lin in zip(self.params, self.anchors, self.linear):
                if p.grad is not None:
                    p.grad.add_(p.detach() - anchor, alpha=self.alpha).sub_(lin)


def flat_params(model: torch.nn.Module) -> torch.Tensor:
    """The model's parameters as one float32 vector (the flat layout's parameter part)."""
    return torch.cat([p.detach().reshape(-1).to(torch.float32) for p in model.parameters()])


class FedDyn(ClientMethod):
    name = "feddyn"
    reads = {"alpha": FEDDYN_ALPHA}

    def train(self, ctx: ClientContext) -> ClientOutcome:
        model, opt = ctx.model, self.start_round(ctx)
        if self.alpha == 0.0:  # exactly sgd
            return self.cross_entropy_loop(ctx, opt)
        num_params = FlatLayout.of(model).num_params
        anchor = flat_params(model)  # θ^(t−1)
        linear = ctx.state.get(STATE_KEY)
        linear = torch.zeros(num_params, device=ctx.device) if linear is None else linear.to(ctx.device, torch.float32)
        if tuple(linear.shape) != (num_params,):
            raise ValueError(f"feddyn: the client's state has {linear.numel()} values, the model {num_params}")
        reg = DynamicRegulariser(opt.params, trainable_views(model, anchor), trainable_views(model, linear), self.alpha)
        out = self.cross_entropy_loop(ctx, opt, reg)
        if np.isfinite(out.loss):
            ctx.state[STATE_KEY] = linear - self.alpha * (flat_params(model) - anchor)
        out.metrics = {**out.metrics, "feddyn_linear_norm": float(torch.linalg.vector_norm(linear))}
        return out


__all__ = ["STATE_KEY", "DynamicRegulariser", "FedDyn", "flat_params"]
