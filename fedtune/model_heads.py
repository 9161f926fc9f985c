"""The heads a client method asks :func:`fedtune.models.build_model` for in place of the
classifier: SimCLR's projector MLP (:func:`projector_mlp`) and FedSR's probabilistic head
(:class:`ProbabilisticHead`, with :func:`probabilistic_head` and :func:`recording_draws` for
FedSR's loss). ``build_model`` swaps them in; this module holds only the modules themselves.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Iterator

import torch
from torch import nn


class ProbabilisticHead(nn.Module):
    """FedSR's head (Nguyen et al., NeurIPS 2022; docs/methods-baselines.md §7): the encoder's features
    ``h`` go through ``dist`` (``features -> 2·z_dim``) to ``mu`` (first half) and
    ``sigma = softplus(second half)``; ``classifier`` (``z_dim -> num_classes``) reads ``z``.

    Training mode: ``z = mu + sigma · ε`` with ``ε ~ N(0, I)`` drawn from torch's global RNG (the
    runtime seeds it per client and round), one sample per example; returns ``classifier(z)``
    and, inside :func:`recording_draws`, records ``(z, mu, sigma)`` for the loss. Eval mode:
    ``eval_samples=0`` returns ``classifier(mu)`` (deterministic); ``eval_samples=S > 0`` returns
    the authors' ``log mean_s softmax(classifier(mu + sigma · ε_s))`` over ``S`` samples, the
    ``ε_s`` drawn from a generator seeded with :data:`EVAL_NOISE_SEED` on every call (so
    evaluation is deterministic and leaves the global RNG alone).

    The prior ``r(z|y) = N(r_mu[y], softplus(r_sigma[y])²)`` and the scale ``z_scale`` (the
    authors' ``C``) are parameters (zeros, ones, one, as the authors initialise them): they are in
    the flat weights and federated like every other parameter; only FedSR's loss reads them."""

    def __init__(self, in_features: int, z_dim: int, num_classes: int, eval_samples: int = 0):
        super().__init__()
        self.z_dim, self.eval_samples = int(z_dim), int(eval_samples)
        self.dist = nn.Linear(in_features, 2 * self.z_dim)
        self.classifier = nn.Linear(self.z_dim, num_classes)
        self.r_mu = nn.Parameter(torch.zeros(num_classes, self.z_dim))
        self.r_sigma = nn.Parameter(torch.ones(num_classes, self.z_dim))
        self.z_scale = nn.Parameter(torch.ones(()))
        self.draws: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None

    def moments(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mu, sigma)`` of ``p(z|x)`` from the encoder's features ``h``."""
        out = self.dist(h)
        return out[:, :self.z_dim], nn.functional.softplus(out[:, self.z_dim:])

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        mu, sigma = self.moments(h)
        if self.training:
            z = mu + sigma * torch.randn_like(mu)
            if self.draws is not None:
                self.draws.append((z, mu, sigma))
            return self.classifier(z)
        if self.eval_samples == 0:
            return self.classifier(mu)
        noise = torch.randn((self.eval_samples, *mu.shape), generator=torch.Generator().manual_seed(EVAL_NOISE_SEED))
        logp = torch.log_softmax(self.classifier(mu + sigma * noise.to(mu)).float(), dim=-1)
        return torch.logsumexp(logp, dim=0) - math.log(self.eval_samples)


EVAL_NOISE_SEED = 0
"""Seed of the evaluation samples of a :class:`ProbabilisticHead` with ``eval_samples > 0``."""


def probabilistic_head(model: nn.Module) -> ProbabilisticHead:
    """``model``'s :class:`ProbabilisticHead`, or a TypeError (built without ``head="probabilistic"``)."""
    head = next((m for m in model.modules() if isinstance(m, ProbabilisticHead)), None)
    if head is None:
        raise TypeError(f"a {type(model).__name__} without a probabilistic head: build it with "
                        "build_model(..., head='probabilistic')")
    return head


@contextmanager
def recording_draws(model: nn.Module) -> Iterator[list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]]:
    """Within the block, every training-mode forward of ``model``'s :class:`ProbabilisticHead`
    appends its ``(z, mu, sigma)`` (in the autograd graph) to the list this yields."""
    head = probabilistic_head(model)
    head.draws = []
    try:
        yield head.draws
    finally:
        head.draws = None


def projector_mlp(in_features: int, proj_dim: int) -> nn.Sequential:
    """SimCLR's projection head g(h) = W2 ReLU(W1 h): hidden width = the encoder's feature width
    (as in Chen et al. 2020), no batch norm (so it adds no buffers)."""
    return nn.Sequential(nn.Linear(in_features, in_features), nn.ReLU(inplace=True), nn.Linear(in_features, proj_dim))


__all__ = ["EVAL_NOISE_SEED", "ProbabilisticHead", "probabilistic_head", "projector_mlp", "recording_draws"]
