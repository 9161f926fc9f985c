"""V-REx as a client method (Krueger et al., "Out-of-Distribution Generalization via Risk
Extrapolation (REx)", ICML 2021; DomainBed's ``VREx``; in Bai et al.'s FedDG benchmark, ICLR 2024,
``src/client.py`` ``VREx``; docs/methods-benchmark.md §17).

A client whose training examples come from several source domains (``domain_homogeneity > 0``)
trains on the mean of its per-domain risks plus the variance of those risks, over the domains
present in each batch::

    R_d  = mean CE over the batch's examples of domain d
    loss = mean_d R_d + w · mean_d (R_d − mean R)²,   w = vrex_lambda from iteration
           vrex_anneal_iters on, 1 before (DomainBed's penalty_weight)

Iterations count along the model's trajectory as Fishr's do: step ``s`` (from 0) of round ``r`` is
``(r − 1) · S + s``, ``S`` the client's local steps per round, whether or not it took part before
(:func:`fedtune.algorithms.client.fishr.iterations_behind`);
at the switch (``vrex_anneal_iters > 0``) the local optimiser is rebuilt, as DomainBed resets Adam.
A batch from one domain has no variance: its step is the cross-entropy. The round's reported loss
is the mean risk (the penalty's weight jumps at the switch; the divergence check reads the loss).
Metric ``vrex_penalty``: the mean variance over the round's steps.

Departures (docs/methods-benchmark.md §17): batches are drawn uniformly from the client's examples (DomainBed
takes one minibatch per domain); Bai et al.'s ``IRM.step``, which their ``VREx`` inherits, sets the
penalty weight to 0 at every step (and their ``VREx.irm_penalty`` is the variance of the per-example
losses *within* each group): their rows train on the mean of the group risks alone, which
``vrex_lambda: 0`` with ``vrex_anneal_iters: 0`` runs.
"""

from __future__ import annotations

import math

import torch

from fedtune.algorithms.base import RunConfig
from fedtune.algorithms.client.domain_groups import domain_risks
from fedtune.algorithms.client.fishr import iterations_behind
from fedtune.algorithms.client.method import ClientContext, ClientMethod, ClientOutcome, descend
from fedtune.algorithms.client.steps import local_steps
from fedtune.algorithms.declarations import VREX_ANNEAL_ITERS, VREX_LAMBDA


def risk_variance(risks: torch.Tensor) -> torch.Tensor:
    """REx's penalty: the (population) variance of the per-domain risks."""
    return ((risks - risks.mean()) ** 2).mean()


class VREx(ClientMethod):
    """Local SGD on the mean per-domain risk plus the weighted variance of the risks. Subclasses
    (:class:`fedtune.algorithms.client.irm.IRM`) swap the two terms (:meth:`terms`), the
    hyperparameters and the metric; the warm-up and the optimiser reset are shared."""

    name = "vrex"
    weight_hparam, anneal_hparam = VREX_LAMBDA, VREX_ANNEAL_ITERS
    metric = "vrex_penalty"

    def __init__(self, cfg: RunConfig):
        super().__init__(cfg)
        self.weight, self.anneal = float(self.weight_hparam.of(cfg)), int(self.anneal_hparam.of(cfg))

    def terms(self, logits: torch.Tensor, y: torch.Tensor, domains: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the mean risk, the penalty) of a batch."""
        risks = domain_risks(logits, y, domains)
        return risks.mean(), risk_variance(risks)

    def train(self, ctx: ClientContext) -> ClientOutcome:
        model = ctx.model
        run = {"opt": self.start_round(ctx), "penalty": 0.0,
               "it": iterations_behind(ctx.round, local_steps(ctx.num_examples, self.cfg))}

        def step(x: torch.Tensor, y: torch.Tensor) -> float:
            it, run["it"] = run["it"], run["it"] + 1
            if it == self.anneal != 0:
                run["opt"] = self.start_round(ctx)  # DomainBed resets its optimiser when the weight switches
            mean, penalty = self.terms(model(x), y, ctx.data.domains[ctx.rows])
            value = descend(run["opt"], mean + (self.weight if it >= self.anneal else 1.0) * penalty,
                            ctx.record_step)
            if not math.isfinite(value):
                return value
            run["penalty"] += float(penalty.detach())
            return float(mean.detach())

        return self.local_loop(ctx, step, lambda steps: {self.metric: run["penalty"] / max(steps, 1)})


__all__ = ["VREx", "risk_variance"]
