"""DeepCORAL as a client method (Sun & Saenko, "Deep CORAL: Correlation Alignment for Deep Domain
Adaptation", ECCV 2016 workshops; as a domain-generalisation penalty in DomainBed's ``CORAL``,
Gulrajani & Lopez-Paz 2021, and in Bai et al.'s FedDG benchmark, ICLR 2024; docs/methods-benchmark.md §15).

A client whose training examples come from several source domains (``domain_homogeneity > 0``:
Bai et al.'s λ spreads every source domain over the clients) aligns the second-order statistics of
its encoder features across the domains present in each batch::

    loss = CE(logits, y) + coral_weight · mean over domain pairs (i < j) of
           mean((μ_i − μ_j)²) + mean((C_i − C_j)²)

with ``μ_d`` the mean and ``C_d`` the unbiased covariance (``/(n_d − 1)``) of the features ``z``
(the classifier's input) of the batch's examples of domain ``d`` — DomainBed's ``CORAL.coral``,
which Bai et al.'s ``Coral.penalty`` repeats. A domain with fewer than 2 examples in the batch has
no covariance and is left out; a batch with fewer than 2 such domains has no penalty (a client
holding one domain, ``domain_homogeneity: 0`` or null, trains plain SGD). Metric ``coral_penalty``:
the mean penalty over the round's steps.

Departures (docs/methods-benchmark.md §15): batches are drawn uniformly from the client's examples (the
domains present vary from batch to batch), where DomainBed draws one minibatch per domain and Bai
et al. a fixed number of domains per batch (WILDS' group loader); and Bai et al.'s ``MMD.step``,
which Coral inherits, sets the penalty to 0 after its loop (a ``for ... else``), so their DeepCORAL
rows train without it: ``coral_weight: 0`` runs that.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from fedtune.algorithms.base import RunConfig
from fedtune.algorithms.client.domain_groups import domain_pair_mean
from fedtune.algorithms.client.method import ClientContext, ClientMethod, ClientOutcome, descend
from fedtune.algorithms.declarations import CORAL_WEIGHT
from fedtune.algorithms.client.moon import FeatureTap


def coral_distance(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """DomainBed's CORAL distance between two sets of features (rows): the mean squared difference
    of their means plus that of their unbiased covariances."""
    x, y = x.reshape(len(x), -1), y.reshape(len(y), -1)
    mean_x, mean_y = x.mean(0, keepdim=True), y.mean(0, keepdim=True)
    cent_x, cent_y = x - mean_x, y - mean_y
    cova_x = (cent_x.t() @ cent_x) / (len(x) - 1)
    cova_y = (cent_y.t() @ cent_y) / (len(y) - 1)
    return (mean_x - mean_y).pow(2).mean() + (cova_x - cova_y).pow(2).mean()


def coral_penalty(features: torch.Tensor, domains: torch.Tensor) -> torch.Tensor:
    """The mean :func:`coral_distance` over the pairs of domains present in a batch with at least 2
    examples each (a covariance needs two); 0 with fewer than 2 such domains."""
    return domain_pair_mean(features, domains, coral_distance, 2)


class DeepCORAL(ClientMethod):
    """Local SGD on cross-entropy plus ``coral_weight`` times the batch's CORAL penalty. Subclasses
    (:class:`fedtune.algorithms.client.mmd.MMD`) swap the penalty, its weight and its metric."""

    name = "coral"
    weight_hparam = CORAL_WEIGHT
    metric = "coral_penalty"
    penalty = staticmethod(coral_penalty)

    def __init__(self, cfg: RunConfig):
        super().__init__(cfg)
        self.weight = float(self.weight_hparam.of(cfg))

    def train(self, ctx: ClientContext) -> ClientOutcome:
        model, opt = ctx.model, self.start_round(ctx)
        tap = FeatureTap(model)
        penalties: list[float] = []

        def step(x: torch.Tensor, y: torch.Tensor) -> float:
            logits = model(x)
            penalty = self.penalty(tap.take(), ctx.data.domains[ctx.rows])
            penalties.append(float(penalty.detach()))
            return descend(opt, F.cross_entropy(logits, y) + self.weight * penalty, ctx.record_step)

        try:
            return self.local_loop(ctx, step, lambda steps: {self.metric: sum(penalties) / max(len(penalties), 1)})
        finally:
            tap.remove()


__all__ = ["DeepCORAL", "coral_distance", "coral_penalty"]
