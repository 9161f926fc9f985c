"""AFL's client (Mohri, Sivek, Suresh, "Agnostic Federated Learning", ICML 2019; in Bai, Bagchi,
Inouye's FedDG benchmark, ICLR 2024, ``src/client.py`` ``AFLClient``; docs/methods-benchmark.md §22).

The server keeps mixture weights ``λ`` over the training domains
(:class:`fedtune.algorithms.server.afl.AFLServer`) and sends them with the weights. A client:

1. at the model it received, before training: the summed cross-entropy and the count of its
   training examples of each domain (eval mode, no gradient, un-augmented, in ``batch_size``
   chunks), returned as extras for the server's ascent step on ``λ`` (``afl_lambda_at: start``;
   with ``aggregated`` the same sums are taken by :meth:`AFL.probe` at the aggregated model, when
   the server calls the round's participants again);
2. trains on the ``λ``-weighted domain risks of each batch, as Bai et al.'s ``AFLClient.step``::

       loss = Σ_{d in the batch} λ_d · R_d        (R_d: the mean cross-entropy of the batch's rows of d)

   — the agnostic objective ``Σ_d λ_d L_d(w)`` restricted to the batch. Unlike the DomainBed
   methods it acts with one domain per client too (the weight ``λ_d`` scales the client's loss).

Metric ``afl_lambda_own``: the sum of ``λ`` over the client's own domains.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.nn import functional as F

from fedtune.algorithms.client.domain_groups import domain_risks
from fedtune.algorithms.client.method import ClientContext, ClientMethod, ClientOutcome, descend
from fedtune.algorithms.client.precision import autocast
from fedtune.algorithms.declarations import AFL_LAMBDA_AT
from fedtune.algorithms.server.afl import COUNT_KEY, LAMBDA_KEY, LOSS_KEY


def domain_loss_sums(ctx: ClientContext, size: int, chunk: int) -> tuple[np.ndarray, np.ndarray]:
    """``(summed cross-entropy, example count)`` per domain id (float64 ``[size]``) of the client's
    training examples at ``ctx.model`` as it is: eval mode, no gradient, un-augmented, rows in order,
    ``chunk`` at a time. Leaves the model in eval mode; draws no random number."""
    model = ctx.model
    model.eval()
    loss = torch.zeros(size, dtype=torch.float64)
    n = ctx.num_examples
    with torch.no_grad():
        for start in range(0, n, chunk):
            rows = torch.arange(start, min(start + chunk, n))
            x, y = ctx.data.batch(rows)
            with autocast(ctx.device, ctx.precision):
                logits = model(x)
            ce = F.cross_entropy(logits.float(), y, reduction="none").to("cpu", torch.float64)
            loss += torch.bincount(ctx.data.domains[rows], weights=ce, minlength=size)
    count = torch.bincount(ctx.data.domains, minlength=size).to(torch.float64)
    return loss.numpy(), count.numpy()


class AFL(ClientMethod):
    """Local SGD on the ``λ``-weighted per-domain risks of each batch; reports each domain's loss at
    the received model."""

    name = "afl"

    def train(self, ctx: ClientContext) -> ClientOutcome:
        if LAMBDA_KEY not in ctx.payload:
            raise ValueError("AFL: the broadcast carries no mixture weights (payload 'afl.lambda'); run the client "
                             "method afl with its server side (fedtune.algorithms.server.afl.AFLServer)")
        lam = np.asarray(ctx.payload[LAMBDA_KEY], np.float64)
        if len(ctx.data.domains) and int(ctx.data.domains.max()) >= lam.shape[0]:
            raise ValueError(f"AFL: client {ctx.client_id} holds domain id {int(ctx.data.domains.max())}, the "
                             f"mixture weights cover {lam.shape[0]} domains")
        at_start = AFL_LAMBDA_AT.of(self.cfg) == "start"
        if at_start:  # the paper's order: the losses at the received model, in this call
            loss_sum, count = domain_loss_sums(ctx, lam.shape[0], int(self.cfg.batch_size))
        model, opt = ctx.model, self.start_round(ctx)
        lam_t = torch.as_tensor(lam)

        def step(x: torch.Tensor, y: torch.Tensor) -> float:
            domains = ctx.data.domains[ctx.rows]
            ids = torch.unique(domains)
            risks = domain_risks(model(x), y, domains, ids)
            return descend(opt, (lam_t[ids].to(device=risks.device, dtype=risks.dtype) * risks).sum(), ctx.record_step)

        own = float(lam[torch.unique(ctx.data.domains).numpy()].sum()) if len(ctx.data.domains) else 0.0
        out = self.local_loop(ctx, step, lambda steps: {"afl_lambda_own": own})
        if at_start:
            out.extras[LOSS_KEY] = loss_sum
            out.extras[COUNT_KEY] = count
        return out

    def probe(self, ctx: ClientContext) -> dict[str, np.ndarray]:
        """``afl_lambda_at: aggregated`` (Bai et al.'s order): the domain losses at the aggregated model."""
        size = np.asarray(ctx.payload[LAMBDA_KEY]).shape[0]
        loss_sum, count = domain_loss_sums(ctx, size, int(self.cfg.batch_size))
        return {LOSS_KEY: loss_sum, COUNT_KEY: count}


__all__ = ["AFL", "domain_loss_sums"]
