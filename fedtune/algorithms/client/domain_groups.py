"""A batch's rows grouped by source domain: the two reductions DomainBed-style penalties share.

Each example's domain is its position in the dataset's domain list
(:attr:`fedtune.runtime.examples.Examples.domains`); a client holding several source domains
(``domain_homogeneity > 0``) draws batches that mix them.

* :func:`domain_pair_mean` — a distance averaged over the pairs of domains in a batch (DeepCORAL,
  MMD: DomainBed's ``MMD.update`` loop);
* :func:`domain_risks` — the mean cross-entropy of each domain (V-REx's risks, GroupDRO's).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch.nn import functional as F


def domain_pair_mean(features: torch.Tensor, domains: torch.Tensor,
                     distance: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], min_examples: int) -> torch.Tensor:
    """The mean of ``distance(features_i, features_j)`` over the pairs of domains present in a batch
    with at least ``min_examples`` rows each (``domains``: one id per row, on any device); 0 with
    fewer than 2 such domains."""
    ids, counts = torch.unique(domains.cpu(), return_counts=True)
    groups = [torch.nonzero(domains.cpu() == d).flatten().to(features.device) for d in ids[counts >= min_examples]]
    if len(groups) < 2:
        return features.new_zeros(())
    total = features.new_zeros(())
    for i in range(len(groups)):
        for j in range(i + 1, len(groups)):
            total = total + distance(features[groups[i]], features[groups[j]])
    return total / (len(groups) * (len(groups) - 1) / 2)


def domain_risks(logits: torch.Tensor, y: torch.Tensor, domains: torch.Tensor,
                 ids: torch.Tensor | None = None) -> torch.Tensor:
    """The mean cross-entropy of the batch's rows of each domain of ``ids`` (default: the domains
    present, ascending), 0 for a domain of ``ids`` the batch lacks (``domains``: one id per row,
    on any device)."""
    ce = F.cross_entropy(logits, y, reduction="none")
    d = domains.to(ce.device)
    ids = torch.unique(d) if ids is None else ids
    return torch.stack([ce[d == k].mean() if bool((d == k).any()) else ce.new_zeros(()) for k in ids.tolist()])


__all__ = ["domain_pair_mean", "domain_risks"]
