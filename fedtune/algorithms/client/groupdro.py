"""GroupDRO as a client method (Sagawa, Koh, Hashimoto, Liang, "Distributionally Robust Neural
Networks for Group Shifts", ICLR 2020; DomainBed's ``GroupDRO``; in Bai et al.'s FedDG benchmark,
ICLR 2024, ``src/client.py`` ``GroupDRO``; docs/methods-benchmark.md §19).

A client keeps a distribution ``q`` over the source domains of its training examples (uniform at
its first round, then carried across rounds in the client's state, as Bai et al.'s client object
keeps ``group_weights``). At each step, with ``R_d`` the mean cross-entropy of the batch's rows of
domain ``d`` (0 for a domain the batch lacks, as in Bai et al.)::

    q_d ← q_d · exp(groupdro_eta · R_d),  q ← q / Σ q        (the risks taken as numbers)
    loss = Σ_d q_d R_d

A client holding one domain trains plain cross-entropy (``q = [1]``). Metric
``groupdro_max_weight``: the largest ``q_d`` at the round's end. ``q`` is kept in float64 on the
host (DomainBed's is float32 on the device).

Departures (docs/methods-benchmark.md §19): uniform batches (as DeepCORAL); DomainBed's ``q`` lives for the
whole run on one learner, fedtune's and Bai et al.'s per client (the server averages the models,
never ``q``).
"""

from __future__ import annotations

import numpy as np
import torch

from fedtune.algorithms.client.domain_groups import domain_risks
from fedtune.algorithms.client.method import ClientContext, ClientMethod, ClientOutcome, descend
from fedtune.algorithms.declarations import GROUPDRO_ETA

STATE_KEY = "groupdro.q"
"""``ctx.state`` entry: the client's domain weights ``q`` (float64 NumPy, its domains in ascending id)."""


def reweighted(q: torch.Tensor, risks: torch.Tensor, eta: float) -> torch.Tensor:
    """GroupDRO's exponentiated-gradient step on the domain weights: ``q · exp(eta · risks)``, normalised."""
    q = q * torch.exp(eta * risks.detach().to(q.dtype).cpu())
    return q / q.sum()


class GroupDRO(ClientMethod):
    """Local SGD on the ``q``-weighted per-domain risks, ``q`` updated each step and kept across rounds."""

    name = "groupdro"
    reads = {"eta": GROUPDRO_ETA}

    def train(self, ctx: ClientContext) -> ClientOutcome:
        model, opt = ctx.model, self.start_round(ctx)
        present = torch.unique(ctx.data.domains)
        prev = ctx.state.get(STATE_KEY)
        run = {"q": torch.full((len(present),), 1.0 / max(len(present), 1), dtype=torch.float64) if prev is None
               else torch.as_tensor(np.asarray(prev), dtype=torch.float64)}
        if len(run["q"]) != len(present):
            raise ValueError(f"GroupDRO: client {ctx.client_id} kept {len(run['q'])} domain weights, holds "
                             f"{len(present)} domains")

        def step(x: torch.Tensor, y: torch.Tensor) -> float:
            risks = domain_risks(model(x), y, ctx.data.domains[ctx.rows], present)
            run["q"] = reweighted(run["q"], risks, self.eta)
            return descend(opt, (run["q"].to(device=risks.device, dtype=risks.dtype) * risks).sum(), ctx.record_step)

        out = self.local_loop(ctx, step, lambda steps: {"groupdro_max_weight": float(run["q"].max())})
        ctx.state[STATE_KEY] = run["q"].numpy()
        return out


__all__ = ["GroupDRO", "STATE_KEY", "reweighted"]
