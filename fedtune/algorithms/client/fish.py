"""Fish as a client method (Shi, Seely, Torr, Siddharth, Hannun, Usunier, Synnaeve, "Gradient
Matching for Domain Generalization", ICLR 2022, Algorithm 1; DomainBed's ``Fish``; in Bai et al.'s
FedDG benchmark, ICLR 2024, ``src/client.py`` ``Fish``; docs/methods-benchmark.md §20).

A client whose training examples come from several source domains (``domain_homogeneity > 0``)
makes each local step a Reptile-style meta step over the domains present in the batch::

    θ̃ ← θ;  for each domain d of the batch (ascending id): θ̃ ← θ̃ − inner step on CE(θ̃; rows of d)
    θ ← θ + fish_meta_lr · (θ̃ − θ)          (every floating tensor of the model's state)

The inner steps use the run's local optimiser (``local_lr``, momentum, weight decay):
``fish_inner_optimizer: round`` (default) keeps one optimiser for the round, its state (momentum,
Adam's moments) carried across meta steps: DomainBed's ``Fish.update`` makes a new inner
optimiser each step but loads the last one's ``state_dict`` into it (as the Fish authors'
``train_fish`` with ``reload_inner_optim``, set for every WILDS dataset), and Bai et al.'s
``Fish.step`` steps the client's own optimiser. ``fresh`` starts it anew at every meta step, so
its state only runs across the domains of one batch (fedtune's default before issue 44; with plain
SGD, Algorithm 1's inner step, the two agree). The round's loss is the inner steps'
cross-entropy weighted by their rows. With one domain and ``fish_meta_lr`` 1 a step is an SGD step.

Departures (docs/methods-benchmark.md §20): uniform batches (as DeepCORAL), where DomainBed takes one
minibatch per domain; integer buffers (batch-norm's ``num_batches_tracked``) keep the inner
steps' count, where DomainBed and Bai et al. interpolate them as numbers and truncate.
"""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F

from fedtune.algorithms.base import RunConfig
from fedtune.algorithms.client.method import ClientContext, ClientMethod, ClientOutcome, descend
from fedtune.algorithms.declarations import FISH_INNER_OPTIMIZER, FISH_META_LR


def floating_state(model: torch.nn.Module) -> list[torch.Tensor]:
    """The model's floating-point parameters and buffers (what the meta step interpolates)."""
    return [t for t in model.state_dict(keep_vars=True).values() if t.is_floating_point()]


class Fish(ClientMethod):
    """Local meta steps: inner steps on each domain of the batch, then a move of ``fish_meta_lr``
    of the way towards where they ended."""

    name = "fish"

    def __init__(self, cfg: RunConfig):
        super().__init__(cfg)
        self.meta_lr, self.fresh = float(FISH_META_LR.of(cfg)), FISH_INNER_OPTIMIZER.of(cfg) == "fresh"

    def train(self, ctx: ClientContext) -> ClientOutcome:
        model = ctx.model
        run = {"opt": self.start_round(ctx)}
        state = floating_state(model)

        def step(x: torch.Tensor, y: torch.Tensor) -> float:
            if self.fresh:
                run["opt"] = self.start_round(ctx)  # a new inner optimiser, its state dropped, each meta step
            before = [t.detach().clone() for t in state]
            d = ctx.data.domains[ctx.rows].to(x.device)
            total = 0.0
            for k in torch.unique(d):
                rows = torch.nonzero(d == k).flatten()
                value = descend(run["opt"], F.cross_entropy(model(x[rows]), y[rows]), ctx.record_step)
                if not math.isfinite(value):
                    return value
                total += value * len(rows)
            with torch.no_grad():
                for t, b in zip(state, before):
                    t.copy_(b + self.meta_lr * (t - b))
            return total / len(y)

        return self.local_loop(ctx, step)


__all__ = ["Fish", "floating_state"]
