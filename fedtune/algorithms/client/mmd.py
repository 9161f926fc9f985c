"""MMD as a client method (Li, Pan, Wang, Kot, "Domain Generalization with Adversarial Feature
Learning", CVPR 2018, the MMD term; DomainBed's ``MMD``, Gulrajani & Lopez-Paz 2021; in Bai et
al.'s FedDG benchmark, ICLR 2024, ``src/client.py`` ``MMD``; docs/methods-benchmark.md §16).

A client whose training examples come from several source domains (``domain_homogeneity > 0``)
matches the distributions of its encoder features across the domains present in each batch::

    loss = CE(logits, y) + mmd_weight · mean over domain pairs (i < j) of
           mean(K(z_i, z_i)) + mean(K(z_j, z_j)) − 2 mean(K(z_i, z_j))

with ``K(a, b) = Σ_γ exp(−γ ‖a − b‖²)`` over γ ∈ {10⁻³, …, 10³} (DomainBed's ``gaussian_kernel``:
squared distances by ``‖a‖² + ‖b‖² − 2 a·b``, clamped at 1e-30) and ``z`` the classifier's input.
Every domain present counts, one example is enough. Metric ``mmd_penalty``: the mean penalty over
the round's steps. The loop over domain pairs and the training step are DeepCORAL's
(:class:`fedtune.algorithms.client.coral.DeepCORAL`), with this distance.

Departures (docs/methods-benchmark.md §16): batches are drawn uniformly from the client's examples (as for
DeepCORAL); Bai et al.'s ``MMD.step`` zeroes the penalty after its loop (a ``for ... else``), so
their MMD rows train without it: ``mmd_weight: 0`` runs that.
"""

from __future__ import annotations

import torch

from fedtune.algorithms.client.coral import DeepCORAL
from fedtune.algorithms.client.domain_groups import domain_pair_mean
from fedtune.algorithms.declarations import MMD_WEIGHT

GAMMAS = (0.001, 0.01, 0.1, 1.0, 10.0, 100.0, 1000.0)
"""The kernel bandwidths of DomainBed's ``MMD.gaussian_kernel`` (and Bai et al.'s)."""


def gaussian_kernel(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``K[a, b] = Σ_γ exp(−γ ‖x_a − y_b‖²)`` over :data:`GAMMAS`, the squared distances as DomainBed
    computes them (``addmm`` of the norms and the inner products, clamped at 1e-30)."""
    x_norm = x.pow(2).sum(dim=-1, keepdim=True)
    y_norm = y.pow(2).sum(dim=-1, keepdim=True)
    dist = torch.addmm(y_norm.transpose(-2, -1), x, y.transpose(-2, -1), alpha=-2).add_(x_norm).clamp_min_(1e-30)
    out = torch.zeros_like(dist)
    for gamma in GAMMAS:
        out.add_(torch.exp(dist.mul(-gamma)))
    return out


def mmd_distance(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """DomainBed's ``MMD.mmd``: ``mean K(x, x) + mean K(y, y) − 2 mean K(x, y)`` of two sets of rows."""
    x, y = x.reshape(len(x), -1), y.reshape(len(y), -1)
    return gaussian_kernel(x, x).mean() + gaussian_kernel(y, y).mean() - 2 * gaussian_kernel(x, y).mean()


def mmd_penalty(features: torch.Tensor, domains: torch.Tensor) -> torch.Tensor:
    """The mean :func:`mmd_distance` over the pairs of domains present in a batch (one example each
    is enough); 0 with fewer than 2 domains."""
    return domain_pair_mean(features, domains, mmd_distance, 1)


class MMD(DeepCORAL):
    """Local SGD on cross-entropy plus ``mmd_weight`` times the batch's MMD penalty."""

    name = "mmd"
    weight_hparam = MMD_WEIGHT
    metric = "mmd_penalty"
    penalty = staticmethod(mmd_penalty)


__all__ = ["GAMMAS", "MMD", "gaussian_kernel", "mmd_distance", "mmd_penalty"]
