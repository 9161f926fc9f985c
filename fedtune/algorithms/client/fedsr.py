"""FedSR client method (Nguyen, Torr, Lim, NeurIPS 2022): a simple probabilistic representation.

The model ends in FedSR's probabilistic head (:class:`fedtune.model_heads.ProbabilisticHead`, built by
the runtime from :meth:`FedSR.model_head`): ``p(z|x) = N(mu(x), diag sigma(x)²)`` with
``sigma = softplus(·)``, one reparameterised sample ``z`` per example, a linear classifier on ``z``.
Each local step minimises, on a batch ``(x_i, y_i)_{i=1..B}``::

    CE(classifier(z), y)
      + fedsr_l2r · (1/B) Σ_i ‖z_i‖²                                  (L2R; fedsr_l2r_form)
      + fedsr_cmi · (1/B) Σ_i Σ_j KL( N(C·mu_ij, (C·sigma_ij)²) ‖ N(r_mu[y_i]_j, s[y_i]_j²) )

with ``s = softplus(r_sigma)``, ``C`` the learned scalar ``z_scale`` and the closed-form KL
``log s − log(C·sigma) + ((C·sigma)² + (C·mu − r_mu)²) / (2 s²) − 1/2`` (the authors' code,
``src/methods/FedSR.py`` of github.com/atuannguyen/FedSR). A term whose weight is 0 is not
computed at all (as in the authors' code), so ``fedsr_l2r = fedsr_cmi = 0`` is plain
cross-entropy on the same model, bit for bit, and the prior then gets no gradient.

Variants (``variant=True``, docs/methods-baselines.md §7):

* ``fedsr_l2r_form``: ``squared`` (the paper's ``E‖z‖²``, default) or ``norm`` (the authors' code:
  ``mean_i ‖z_i‖``, not squared).
* ``fedsr_prior``: ``federated`` (default: ``r_mu``, ``r_sigma``, ``C`` are model parameters,
  averaged by the server like the rest) or ``local`` (the authors' code, where they sit outside
  the communicated model: each client keeps its own across rounds in ``ctx.state`` as float32
  arrays, starts from the global model's values in its first round, and sends back the values it
  received, so their update is zero).
* ``fedsr_eval_samples``: ``0`` (default: the classifier on the mean ``mu``, deterministic) or
  ``S > 0`` (the authors' test-time average of softmax over ``S`` samples; they use 20).

The reported training loss is the cross-entropy only (comparable across methods); the two
regularisers are the ``diag.fedsr_l2r_term`` and ``diag.fedsr_cmi_term`` columns (means over the
round's steps, unweighted; 0 when their weight is 0). The batch gradient given to
``ctx.record_step`` is that of the whole objective.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F

from fedtune.algorithms.base import RunConfig
from fedtune.algorithms.client.method import ClientContext, ClientMethod, ClientOutcome, descend
from fedtune.algorithms.declarations import FEDSR_CMI, FEDSR_L2R, FEDSR_L2R_FORM, FEDSR_PRIOR
from fedtune.model_heads import ProbabilisticHead, probabilistic_head, recording_draws


PRIOR_STATE_KEYS = ("fedsr.r_mu", "fedsr.r_sigma", "fedsr.z_scale")
"""The ``ctx.state`` entries of ``fedsr_prior: local`` (float32 NumPy arrays)."""


def l2r_term(z: torch.Tensor, form: str = "squared") -> torch.Tensor:
    """The L2R regulariser of a batch of samples ``z`` ``[B, z_dim]``: ``mean_i ‖z_i‖²`` (squared)
    or ``mean_i ‖z_i‖`` (norm).

    >>> float(l2r_term(torch.tensor([[3.0, 4.0], [0.0, 1.0]]))), float(l2r_term(torch.tensor([[3.0, 4.0], [0.0, 1.0]]), "norm"))
    (13.0, 3.0)
    """
    sq = z.pow(2).sum(dim=1)
    return (sq if form == "squared" else sq.sqrt()).mean()


def cmi_term(mu: torch.Tensor, sigma: torch.Tensor, y: torch.Tensor, head: ProbabilisticHead) -> torch.Tensor:
    """The CMI bound of a batch: ``mean_i Σ_j KL(N(C·mu_ij, (C·sigma_ij)²) ‖ N(r_mu[y_i]_j,
    softplus(r_sigma)[y_i]_j²))`` with the prior and ``C`` (``z_scale``) of ``head``.

    >>> from fedtune.model_heads import ProbabilisticHead
    >>> h = ProbabilisticHead(2, 2, 3)   # prior N(0, softplus(1)^2), C = 1
    >>> s = F.softplus(torch.tensor(1.0))
    >>> kl = cmi_term(torch.zeros(1, 2), s.expand(1, 2), torch.tensor([0]), h)
    >>> abs(float(kl.detach())) < 1e-6      # identical Gaussians
    True
    """
    r_mu = head.r_mu[y]
    r_sigma = F.softplus(head.r_sigma)[y]
    c = head.z_scale
    mu_c, sigma_c = mu * c, sigma * c
    kl = torch.log(r_sigma) - torch.log(sigma_c) + (sigma_c.pow(2) + (mu_c - r_mu).pow(2)) / (2 * r_sigma.pow(2)) - 0.5
    return kl.sum(dim=1).mean()


class FedSR(ClientMethod):
    name = "fedsr"

    def __init__(self, cfg: RunConfig):
        super().__init__(cfg)
        self.l2r, self.cmi = FEDSR_L2R.of(cfg), FEDSR_CMI.of(cfg)
        self.l2r_form, self.prior = FEDSR_L2R_FORM.of(cfg), FEDSR_PRIOR.of(cfg)

    def objective(self, model: torch.nn.Module, draws: list, x: torch.Tensor,
                  y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float, float]:
        """``(objective, cross-entropy, L2R, CMI)`` of one batch (one forward pass of ``model``
        in training mode inside :func:`~fedtune.model_heads.recording_draws`, whose list is ``draws``)."""
        logits = model(x)
        z, mu, sigma = draws.pop()
        ce = F.cross_entropy(logits, y)
        obj, l2r, cmi = ce, 0.0, 0.0
        if self.l2r != 0.0:
            term = l2r_term(z.float(), self.l2r_form)
            obj, l2r = obj + self.l2r * term, float(term.detach())
        if self.cmi != 0.0:
            term = cmi_term(mu.float(), sigma.float(), y, probabilistic_head(model))
            obj, cmi = obj + self.cmi * term, float(term.detach())
        return obj, ce, l2r, cmi

    def train(self, ctx: ClientContext) -> ClientOutcome:
        model = ctx.model
        head = probabilistic_head(model)
        received = load_local_prior(head, ctx.state) if self.prior == "local" else None
        opt = self.start_round(ctx)
        sums = {"fedsr_l2r_term": 0.0, "fedsr_cmi_term": 0.0}

        def step(x: torch.Tensor, y: torch.Tensor) -> float:
            obj, ce, l2r, cmi = self.objective(model, draws, x, y)
            value = descend(opt, obj, ctx.record_step)
            sums["fedsr_l2r_term"] += l2r
            sums["fedsr_cmi_term"] += cmi
            return float(ce.detach()) if math.isfinite(value) else value

        try:
            with recording_draws(model) as draws:
                return self.local_loop(ctx, step, lambda steps: {k: v / max(steps, 1) for k, v in sums.items()})
        finally:
            if received is not None:
                keep_local_prior(head, ctx.state, received)


def _prior_params(head: ProbabilisticHead) -> tuple[torch.Tensor, ...]:
    return head.r_mu, head.r_sigma, head.z_scale


def load_local_prior(head: ProbabilisticHead, state: dict[str, Any]) -> list[torch.Tensor]:
    """``fedsr_prior: local``: put the client's own prior (from ``state``, if it has one) into
    ``head`` and return copies of the values it replaced (the ones received from the server)."""
    params = _prior_params(head)
    received = [p.detach().clone() for p in params]
    if all(k in state for k in PRIOR_STATE_KEYS):
        with torch.no_grad():
            for p, key in zip(params, PRIOR_STATE_KEYS):
                p.copy_(torch.from_numpy(np.asarray(state[key], dtype=np.float32)).reshape(p.shape))
    return received


def keep_local_prior(head: ProbabilisticHead, state: dict[str, Any], received: list[torch.Tensor]) -> None:
    """Save the trained prior of ``head`` into ``state`` (float32 NumPy copies) and put the received
    values back, so the update the server sees leaves the prior unchanged."""
    with torch.no_grad():
        for p, key, old in zip(_prior_params(head), PRIOR_STATE_KEYS, received):
            state[key] = np.array(p.detach().float().cpu().numpy(), dtype=np.float32, copy=True)
            p.copy_(old)


__all__ = ["FedSR",
           "cmi_term", "keep_local_prior", "l2r_term", "load_local_prior"]
