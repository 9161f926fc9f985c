"""IRM as a client method (Arjovsky, Bottou, Gulrajani, Lopez-Paz, "Invariant Risk Minimization",
2019, IRMv1; DomainBed's ``IRM``; in Bai et al.'s FedDG benchmark, ICLR 2024, ``src/client.py``
``IRM``; docs/methods-benchmark.md §18).

A client whose training examples come from several source domains (``domain_homogeneity > 0``)
trains on the mean of its per-domain risks plus IRMv1's penalty, over the domains present in each
batch::

    R_d   = mean CE over the batch's examples of domain d
    P_d   = ∂/∂s CE(s · logits_even, y_even) · ∂/∂s CE(s · logits_odd, y_odd) at s = 1
            (the domain's examples split into alternate halves, DomainBed's unbiased estimate of
            ‖∇_s R_d‖²)
    loss  = mean_d R_d + w · mean_d P_d,   w = irm_lambda from iteration irm_anneal_iters on, 1 before

The warm-up, the iteration count across rounds and the optimiser reset at the switch are V-REx's
(:class:`fedtune.algorithms.client.vrex.VREx`, DomainBed's ``IRM`` and ``VREx`` share them). A domain
with a single example in the batch has no halves: it adds its risk, not a penalty term.
Metric ``irm_penalty``: the mean penalty over the round's steps.

Departures (docs/methods-benchmark.md §18): uniform batches (as DeepCORAL); Bai et al.'s ``IRM.step`` sets the
penalty weight to 0 on every step, so their rows train on the mean of the group risks alone:
``irm_lambda: 0`` with ``irm_anneal_iters: 0`` runs that.
"""

from __future__ import annotations

import torch
from torch import autograd
from torch.nn import functional as F

from fedtune.algorithms.client.vrex import VREx
from fedtune.algorithms.declarations import IRM_ANNEAL_ITERS, IRM_LAMBDA


def irm_term(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """DomainBed's ``IRM._irm_penalty`` of one domain's rows: the product of the gradients, with
    respect to a dummy scale ``s = 1`` on the logits, of the cross-entropy of the even and of the
    odd rows (kept in the graph: the penalty is differentiated again by the step)."""
    scale = torch.ones((), dtype=logits.dtype, device=logits.device, requires_grad=True)
    grad_1 = autograd.grad(F.cross_entropy(logits[::2] * scale, y[::2]), [scale], create_graph=True)[0]
    grad_2 = autograd.grad(F.cross_entropy(logits[1::2] * scale, y[1::2]), [scale], create_graph=True)[0]
    return grad_1 * grad_2


def irm_terms(logits: torch.Tensor, y: torch.Tensor, domains: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the mean over the batch's domains of their cross-entropy, the mean of :func:`irm_term` over
    the domains with at least 2 rows; 0 when none has)."""
    d = domains.to(logits.device)
    risks, terms = [], []
    for k in torch.unique(d):
        rows = torch.nonzero(d == k).flatten()
        risks.append(F.cross_entropy(logits[rows], y[rows]))
        if len(rows) >= 2:
            terms.append(irm_term(logits[rows], y[rows]))
    penalty = torch.stack(terms).mean() if terms else logits.new_zeros(())
    return torch.stack(risks).mean(), penalty


class IRM(VREx):
    """Local SGD on the mean per-domain risk plus the weighted IRMv1 penalty."""

    name = "irm"
    weight_hparam, anneal_hparam = IRM_LAMBDA, IRM_ANNEAL_ITERS
    metric = "irm_penalty"

    def terms(self, logits: torch.Tensor, y: torch.Tensor, domains: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return irm_terms(logits, y, domains)


__all__ = ["IRM", "irm_term", "irm_terms"]
