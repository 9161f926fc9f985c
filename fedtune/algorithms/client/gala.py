"""FedGaLA's local alignment: the client method ``gala`` and its gate (docs/methods-seeds.md §3;
Pourpanah et al., Alg. 1 lines 15–22). The server side, and what the paper and the authors' code
do: :mod:`fedtune.algorithms.server.gala`.

Inside local training a parameter tensor takes its optimiser step only if its batch gradient
agrees (``gala_gate``) with the last global move ``r = θ^t − θ^(t−1)`` (:class:`GatedSGD`,
:class:`GatedClientMixin`, :class:`GalaClient`). The gate wraps *any* loss: a client method
whose loop builds its optimiser with ``self.make_optimizer(model)`` becomes gated by putting
:class:`GatedClientMixin` first in its bases (``class GalaSimCLR(GatedClientMixin, SimCLR)``),
or a custom loop can build one with :func:`gated_sgd_for` and read :meth:`GatedSGD.metrics`.

The paper (§3 "Local gradient alignment"): for every batch and every layer, the step
``θ^(l) ← θ^(l) − η ∇^(l)`` is taken only if the batch gradient agrees with the last global move
``r^(l)``. ``gala_gate`` chooses the sign: ``literal`` (the paper's formula and the authors'
code: ``cos(+∇^(l), r^(l)) ≥ τ``; their Fig. 3(b) skip rates come from it) or ``descent``
(fedtune's default, the stated intent: ``cos(−∇^(l), r^(l)) > τ``, a step is kept when it moves
the tensor the way the federation last moved it).

The tie ``cos = τ``: the paper says both. Alg. 1 (App. B) line 19 steps if ``cos > τ``, and §5 reads
``τ = 0`` as "keep all gradients with positive cosine similarity"; §3.3's text discards the
gradients whose similarity is "less than" ``τ`` (keep ``≥``), and so does the authors' code
(``if sim < local_threshold: param.grad = None``). ``literal`` is the gate for reproducing their
numbers, so it takes the code's ``≥``; ``descent`` is fedtune's own reading and takes Alg. 1's
strict ``>``. The tie is not a measure-zero event: a zero gradient, or one orthogonal to ``r``,
has cosine exactly 0, the default ``τ``, and then ``literal`` counts the tensor as stepping (its
momentum and weight decay still act) while ``descent`` skips it. The reference ``r`` is the last global move
``θ^t − θ^(t−1)``, which the runtime sends from round 2 on (the paper's round 3 in its
indexing); before it exists nothing is gated. ``gala_skipped`` (the fraction of skipped
tensor-steps) is recorded for both signs.

Edge cases (documented choices):

* Client cosines are clamped to ``[−1, 1]`` (rounding can leave them just outside), so with
  ``descent`` ``τ = 1`` never steps and ``τ = −1`` skips only an exactly opposite tensor.
* A tensor whose reference ``r^(l)`` is exactly zero is **not gated** (there is no direction to
  agree with; gating it at ``τ ≥ 0`` would freeze it for the rest of training once one round
  left it unmoved).
* A tensor with a zero gradient has cosine 0 (it steps only if ``τ < 0``, ``descent``, or
  ``τ ≤ 0``, ``literal``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from fedtune.algorithms.base import RunConfig
from fedtune.algorithms.client.method import SGD, ClientContext, ClientOutcome
from fedtune.algorithms.declarations import GALA_GATE, GALA_TAU
from fedtune.algorithms.client.optim import LocalAdam, LocalSGD, local_optimizer_settings
from fedtune.layout import FlatLayout



def reference_tensors(model: nn.Module, global_move: np.ndarray | None, device: Any = None) -> list[torch.Tensor] | None:
    """The last global move cut into one tensor per ``model.parameters()`` entry (``None`` if no
    move exists yet). Slices follow :meth:`fedtune.layout.FlatLayout.param_slices`, the
    parameter part of the flat weight vector, in ``model.parameters()`` order."""
    if global_move is None:
        return None
    layout = FlatLayout.of(model)
    named = list(model.named_parameters())
    slices = layout.param_slices()
    if [n for n, _ in named] != [n for n, _ in slices]:
        raise ValueError("model.parameters() and the flat layout disagree on the parameter order "
                         "(tied parameters?): FedGaLA's local gate cannot slice the global move")
    move = np.asarray(global_move)
    if move.shape != (layout.num_params,):
        raise ValueError(f"global_move has shape {move.shape}, the model has {layout.num_params} parameters")
    flat = torch.tensor(np.array(move, dtype=np.float32), device=device)  # own copy (payloads may be read-only)
    return [flat[sl].view_as(p) for (_, p), (_, sl) in zip(named, slices)]


class GatedSGD(LocalSGD):
    """:class:`~fedtune.algorithms.client.optim.LocalSGD` (functional SGD, momentum, weight decay) whose
    step is gated per parameter tensor against its reference ``r^(l)`` (FedGaLA's local
    alignment): ``gate="descent"`` steps tensor ``l`` only if ``cos(−∇^(l), r^(l)) > tau``;
    ``gate="literal"`` (the paper's formula and the authors' code) only if
    ``cos(+∇^(l), r^(l)) >= tau``. At a tie ``cos == tau`` (e.g. a zero or orthogonal gradient at
    ``tau = 0``) ``literal`` steps, as the authors' code does, and ``descent`` does not, as Alg. 1's
    strict ``>`` (the module docstring says why).

    ``reference`` lists one tensor per entry of ``params`` (all of them, frozen ones included:
    the list is aligned before ``requires_grad`` filtering), or ``None`` = no reference yet = no
    gating (then the step is bit for bit ``LocalSGD``'s).

    Choices: the gate looks at the raw mini-batch gradient (the paper's "batch gradient"), not at
    the momentum- or weight-decay-modified step. A skipped tensor is treated as if it had no
    gradient this batch: it does not move, weight decay is not applied to it and its momentum
    buffer is left unchanged (not decayed), so it resumes with the same momentum when it next
    steps. A tensor with an exactly zero reference is never gated (see the module docstring).

    Counters: ``tensor_steps`` (tensor-steps considered while a reference existed) and
    ``skipped`` (of those, skipped); :meth:`metrics` gives ``{"gala_skipped": fraction}``.
    """

    def __init__(self, params, lr: float, momentum: float = 0.0, weight_decay: float = 0.0, *,
                 reference: list[torch.Tensor] | None = None, tau: float = 0.0, gate: str = "descent"):
        params = list(params)
        super().__init__(params, lr, momentum, weight_decay)
        self._init_gate(params, reference, tau, gate)

    def _init_gate(self, params: list, reference: list[torch.Tensor] | None, tau: float, gate: str) -> None:
        if reference is not None and len(reference) != len(params):
            raise ValueError(f"reference has {len(reference)} tensors, params has {len(params)}")
        if reference is not None:
            reference = [r for r, p in zip(reference, params) if p.requires_grad]
        if not -1.0 <= float(tau) <= 1.0:
            raise ValueError(f"tau must be in [-1, 1], got {tau!r}")
        if gate not in GALA_GATE.choices:
            raise ValueError(f"gate must be one of {', '.join(GALA_GATE.choices)}, got {gate!r}")
        self.tau = float(tau)
        self.gate_sign = gate
        self.reference = reference
        self.ref_norms = None
        if reference is not None:
            with torch.no_grad():
                self.ref_norms = [torch.linalg.vector_norm(r) for r in reference]
        self.tensor_steps = 0
        self.skipped = 0

    def gate(self, indices: list[int]) -> list[bool]:
        """Whether each of ``params[i]`` (``i`` in ``indices``, all with a gradient) takes its step."""
        if self.reference is None or not indices:
            return [True] * len(indices)
        with torch.no_grad():
            cos, free = [], []
            for i in indices:
                g, r, rn = self.params[i].grad, self.reference[i], self.ref_norms[i]
                gn = torch.linalg.vector_norm(g)
                # descent: ⟨−∇, r⟩ (the descent direction against the last global move); literal: ⟨+∇, r⟩
                dot = -torch.sum(g * r) if self.gate_sign == "descent" else torch.sum(g * r)
                denom = gn * rn
                c = torch.where(denom > 0, dot / torch.where(denom > 0, denom, torch.ones_like(denom)),
                                torch.zeros_like(denom))
                cos.append(c)
                free.append(rn == 0)
            cos_t = torch.clamp(torch.stack(cos).double(), -1.0, 1.0)
            # descent: cos > tau, literal: cos >= tau; written as ~(cos <= tau) / ~(cos < tau) so a
            # NaN cosine steps and surfaces as divergence.
            passes = ~(cos_t <= self.tau) if self.gate_sign == "descent" else ~(cos_t < self.tau)
            take = passes | torch.stack(free)
            decisions = take.tolist()  # one device sync per step
        self.tensor_steps += len(indices)
        self.skipped += sum(1 for t in decisions if not t)
        return decisions

    def step(self) -> None:
        with_grad = [i for i, p in enumerate(self.params) if p.grad is not None]
        self.step_tensors([i for i, take in zip(with_grad, self.gate(with_grad)) if take])

    def skipped_fraction(self) -> float:
        """Skipped tensor-steps / tensor-steps considered (0 when nothing was gated)."""
        return self.skipped / self.tensor_steps if self.tensor_steps else 0.0

    def metrics(self) -> dict[str, float]:
        """``{"gala_skipped": fraction of skipped tensor-steps}`` (a diag column)."""
        return {"gala_skipped": self.skipped_fraction()}


class GatedAdam(LocalAdam, GatedSGD):
    """:class:`GatedSGD`'s gate on :class:`~fedtune.algorithms.client.optim.LocalAdam` (``local_optimizer:
    adam``): a skipped tensor keeps its Adam moments and step count unchanged this batch."""

    def __init__(self, params, lr: float, weight_decay: float = 0.0, *,
                 reference: list[torch.Tensor] | None = None, tau: float = 0.0, gate: str = "descent"):
        params = list(params)
        LocalAdam.__init__(self, params, lr, weight_decay)
        self._init_gate(params, reference, tau, gate)


def gated_sgd_for(model: nn.Module, ctx: ClientContext, cfg: RunConfig, tau: float | None = None,
                  gate: str | None = None) -> GatedSGD:
    """A :class:`GatedSGD` (or :class:`GatedAdam` with ``local_optimizer: adam``) over
    ``model.parameters()`` with the run's local optimiser settings
    (``local_lr``, ``local_momentum``, ``weight_decay``), gated against
    ``ctx.payload["global_move"]`` (no gating while it is absent) at ``tau`` with the sign
    ``gate`` (defaults: the run's ``gala_tau`` and ``gala_gate``)."""
    ref = reference_tensors(model, ctx.payload.get("global_move"), ctx.device)
    tau = GALA_TAU.of(cfg) if tau is None else float(tau)
    gate = GALA_GATE.of(cfg) if gate is None else gate
    settings = local_optimizer_settings(cfg)
    cls = GatedAdam if settings.pop("kind") == "adam" else GatedSGD
    return cls(model.parameters(), **settings, reference=ref, tau=tau, gate=gate)


class GatedClientMixin:
    """Makes a client method's optimiser a :class:`GatedSGD` and reports ``gala_skipped``.

    Put it first in the bases of a method whose ``train(ctx)`` builds its optimiser with
    ``self.make_optimizer(model)`` (every built-in method does, through
    :meth:`~fedtune.algorithms.client.method.ClientMethod.start_round`), and add
    :data:`~fedtune.algorithms.declarations.GALA_TAU` and
    :data:`~fedtune.algorithms.declarations.GALA_GATE` to the hyperparameters of its declaration::

        class GalaSimCLR(GatedClientMixin, SimCLR):
            name = "gala-simclr"

    The loss and the loop stay the wrapped method's; only the optimiser step is gated.
    """

    _gala_ctx: ClientContext | None = None
    _gala_opts: list

    def __init__(self, cfg: RunConfig):
        super().__init__(cfg)  # type: ignore[call-arg]
        self.gala_tau = GALA_TAU.of(cfg)
        self.gala_gate = GALA_GATE.of(cfg)

    def make_optimizer(self, model: nn.Module) -> GatedSGD:
        if self._gala_ctx is None:
            raise RuntimeError("make_optimizer called outside train(ctx): the gate needs the round's global move")
        opt = gated_sgd_for(model, self._gala_ctx, self.cfg, self.gala_tau, self.gala_gate)
        self._gala_opts.append(opt)
        return opt

    def train(self, ctx: ClientContext) -> ClientOutcome:
        self._gala_ctx, self._gala_opts = ctx, []
        try:
            out = super().train(ctx)  # type: ignore[misc]
        finally:
            self._gala_ctx = None
        steps = sum(o.tensor_steps for o in self._gala_opts)
        skipped = sum(o.skipped for o in self._gala_opts)
        out.metrics = {**out.metrics, "gala_skipped": skipped / steps if steps else 0.0}
        self._gala_opts = []
        return out


class GalaClient(GatedClientMixin, SGD):
    """FedGaLA's local alignment on the supervised cross-entropy loss: the ``sgd`` client method
    with every tensor-step gated by ``gala_tau`` against the last global move (no gating in
    round 1). Metric ``gala_skipped``: the fraction of skipped tensor-steps this round."""

    name = "gala"


__all__ = ["GalaClient", "GatedAdam", "GatedClientMixin", "GatedSGD", "gated_sgd_for",
           "reference_tensors"]
