"""FedGaLA: global and local gradient alignment (METHODS.md §3; Pourpanah et al., Alg. 1).

Two independent parts, usable apart:

* **Global alignment** (server rule ``gala``, NumPy only): clients whose update agrees with the
  round's consensus direction get more aggregation weight (:func:`gala_global_weights`,
  :class:`Gala`).
* **Local alignment** (client method ``gala``, torch, imported lazily): inside local training a
  parameter tensor takes its optimiser step only if its descent direction agrees with the last
  global move ``r = θ^t − θ^(t−1)`` (:class:`GatedSGD`, :class:`GatedClientMixin`,
  :class:`GalaClient`). The gate wraps *any* loss: a client method whose loop builds its optimiser
  with ``self.make_optimizer(model)`` becomes gated by putting :class:`GatedClientMixin` first
  in its bases (``class GalaSimCLR(GatedClientMixin, SimCLR)``), or a custom loop can build one
  with :func:`gated_sgd_for` and read :meth:`GatedSGD.metrics`.

What the paper does, exactly (Alg. 1 and §3 of seed 003), and where fedtune differs
-------------------------------------------------------------------------------------
Server (Alg. 1 lines 5–12): ``g_i = Θ_i − Θ`` (the raw client update, our ``Δ_i``); the initial
global update is ``FedAvg(g_i)``; then ``iter`` times: ``w_i = (cos(g_i, g) + 1)/2``,
``w_i ← w_i / Σ_k w_k`` (so the normalised weights **sum to 1**), ``g ← (1/K) Σ_i w_i g_i``;
finally ``Θ ← Θ + g``. The paper computes the cosines on the *raw* updates ``g_i``, not on
``p_i Δ_i``, and its aggregate carries an extra ``1/K`` on top of the normalised weights.

METHODS.md (followed here) writes ``v_i = p_i Δ_i``, ``a = mean_i v_i``, then ``iters`` times
``w_i = (cos(v_i, a) + 1)/2``, normalise, ``a = Σ_i w_i v_i``; ``θ ← θ + a``. The two agree on
the weights: a cosine ignores positive scale, so ``cos(p_i Δ_i, a) = cos(Δ_i, a)`` and the
initial ``a = (1/U) Σ p_i Δ_i`` points where FedAvg points. They differ only in the final step's
scale: paper ``(1/K) Σ w_i Δ_i``, METHODS ``Σ w_i p_i Δ_i`` — identical when every client holds as
many examples (``p_i = 1/K``); with unequal clients METHODS also weights by data share. Either
way, ``w_i ≈ 1/U``, so the aligned step is about ``1/U`` of FedAvg's step (``global_lr ≈ U``
restores FedAvg's scale); fedtune keeps the paper's ``θ + a`` as the default
(``default_global_lr = 1``).

Client (Alg. 1 lines 15–22, §3 "Local gradient alignment"): for every batch and every layer,
the step ``θ^(l) ← θ^(l) − η ∇^(l)`` is taken only if ``cos(∇^(l), r^(l)) > τ``; the paper and
the authors' code compare the *gradient* ``+∇`` with ``r``. METHODS.md (followed here) compares
the *descent direction* ``−∇`` with ``r``: a step is kept when it moves the tensor the way the
federation last moved it. The reference ``r`` is the last global move, which the runtime sends
from round 2 on (the paper's round 3 in its indexing); before it exists nothing is gated.

Edge cases (documented choices):

* A zero vector has cosine 0 with anything (server: ``w_i = 1/2`` before normalising; a client
  with ``p_i = 0`` contributes nothing anyway). A non-finite cosine is left to surface as a
  diverged round.
* Client cosines are clamped to ``[−1, 1]`` (rounding can leave them just outside), so
  ``τ = 1`` never steps and ``τ = −1`` skips only an exactly opposite tensor.
* A tensor whose reference ``r^(l)`` is exactly zero is **not gated** (there is no direction to
  agree with; gating it at ``τ ≥ 0`` would freeze it for the rest of training once one round
  left it unmoved).
* A tensor with a zero gradient has cosine 0 (it steps only if ``τ < 0``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from fedtune.algorithms.base import HParam
from fedtune.algorithms.client import SGD, ClientContext, ClientOutcome, LocalSGD
from fedtune.algorithms.server import BLOCK, AggregateResult, ServerRule, fedavg_step, weighted_sum

if TYPE_CHECKING:  # torch is imported lazily: the coordinator never needs it
    import torch
    from torch import nn


GALA_ITERS = HParam("gala_iters", 3, "FedGaLA global-alignment iterations (reweight, re-aggregate); paper: 3",
                    kind="int", lo=1)
GALA_MIX = HParam("gala_mix", 1.0, "FedGaLA mix with FedAvg: theta + global_lr * (mix * aligned + (1 - mix) * fedavg); "
                  "1 = pure alignment (paper), 0 = FedAvg", lo=0.0, hi=1.0)
GALA_TAU = HParam("gala_tau", 0.0, "FedGaLA local gate: a tensor steps only if cos(-grad, last global move) > tau; "
                  "-1 = (almost) never gate, 1 = never step; paper: 0", lo=-1.0, hi=1.0)


# ============================================================================ server (NumPy)
def _dot64(x: np.ndarray, y: np.ndarray) -> float:
    """``⟨x, y⟩`` in float64, block by block with NumPy's own (thread-independent) summation."""
    m = x.shape[0]
    tmp = np.empty(min(BLOCK, m), dtype=np.float64)
    total = 0.0
    for s in range(0, m, BLOCK):
        e = min(s + BLOCK, m)
        t = tmp[:e - s]
        np.multiply(x[s:e], y[s:e], out=t)
        total += float(t.sum())
    return total


def _cosines(updates: np.ndarray, sq_norms: np.ndarray, a: np.ndarray) -> np.ndarray:
    """``cos(updates[u], a)`` per row (0 where either vector is zero), clipped to [−1, 1]."""
    a_norm = math.sqrt(_dot64(a, a))
    out = np.zeros(updates.shape[0], dtype=np.float64)
    for u in range(updates.shape[0]):
        denom = math.sqrt(sq_norms[u]) * a_norm
        if denom > 0.0:
            out[u] = _dot64(updates[u], a) / denom
        elif not math.isfinite(denom):
            out[u] = math.nan
    return np.clip(out, -1.0, 1.0)


def _check_inputs(updates: np.ndarray, weights: np.ndarray, iters: int) -> tuple[np.ndarray, np.ndarray]:
    updates = np.asarray(updates)
    weights = np.asarray(weights, dtype=np.float64)
    if updates.ndim != 2 or weights.ndim != 1 or updates.shape[0] != weights.shape[0] or updates.shape[0] == 0:
        raise ValueError(f"updates {updates.shape} and weights {weights.shape} disagree on the client count")
    if (weights < 0).any():
        raise ValueError(f"weights must be non-negative, got {weights}")
    if int(iters) != iters or iters < 1:
        raise ValueError(f"iters must be an integer >= 1, got {iters!r}")
    return updates, weights


def _alignment_weights(updates: np.ndarray, weights: np.ndarray, iters: int) -> tuple[np.ndarray, np.ndarray]:
    """The normalised weights ``w`` of the last iteration and the cosines they came from."""
    U = updates.shape[0]
    # cos(v_u, a) = cos(Δ_u, a) for p_u > 0 (cosines ignore positive scale); v_u = 0 when p_u = 0.
    sq_norms = np.array([_dot64(updates[u], updates[u]) for u in range(U)])
    sq_norms[weights == 0] = 0.0
    a = weighted_sum(updates, weights / U)  # a = mean_u v_u = (1/U) Σ p_u Δ_u
    for it in range(int(iters)):
        cos = _cosines(updates, sq_norms, a)
        w = (cos + 1.0) / 2.0
        w = w / w.sum()
        if it + 1 < iters:
            a = weighted_sum(updates, w * weights)  # a = Σ w_u v_u
    return w, cos


def gala_global_weights(updates: np.ndarray, weights: np.ndarray, iters: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """FedGaLA's global alignment (METHODS.md §3): the normalised client weights ``w`` [U] and the
    aligned update ``a = Σ_u w_u p_u Δ_u`` [P] (both float64).

    ``updates[u] = Δ_u`` (descent displacements), ``weights[u] = p_u``. With ``v_u = p_u Δ_u``:
    ``a = mean_u v_u``; ``iters`` times: ``w_u = (cos(v_u, a) + 1)/2``, ``w ← w / Σ w`` (sums to 1),
    ``a = Σ_u w_u v_u``. Sums run in float64, client by client (bit-reproducible).

    Two orthogonal clients of equal size get equal weight; the aligned step is half their mean:

    >>> w, a = gala_global_weights(np.array([[2., 0.], [0., 2.]], np.float32), np.array([.5, .5]), iters=1)
    >>> w.tolist(), a.tolist()
    ([0.5, 0.5], [0.5, 0.5])
    """
    updates, weights = _check_inputs(updates, weights, iters)
    w, _ = _alignment_weights(updates, weights, iters)
    return w, weighted_sum(updates, w * weights)


def gala_step(params: np.ndarray, updates: np.ndarray, weights: np.ndarray, *, iters: int = 3, mix: float = 1.0,
              global_lr: float = 1.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ``gala`` server update: ``(new params float32 [P], w [U], cos [U])``.

    ``θ ← mix · (θ + η a) + (1 − mix) · (θ + η Σ p_u Δ_u) = θ + η Σ_u c_u Δ_u`` with
    ``c_u = p_u (mix · w_u + 1 − mix)`` and ``η = global_lr``: the server learning rate scales the
    aligned step and FedAvg's step alike, so ``mix`` interpolates between two rules that share one
    server learning rate. ``mix = 0`` is exactly (bit for bit) :func:`fedavg_step` at ``η``;
    ``mix = 1`` is ``θ + η a`` (the paper's ``Θ + g`` at ``η = 1``). The paper's Eq. 41 mixes
    with the unweighted client mean; fedtune mixes with its FedAvg (example-weighted).

    >>> new, w, cos = gala_step(np.zeros(2, np.float32), np.array([[2., 0.], [0., 2.]], np.float32),
    ...                         np.array([.5, .5]), iters=1, mix=0.5)
    >>> new.tolist(), w.tolist()   # 0.5 * (0.5, 0.5) + 0.5 * (1, 1)
    ([0.75, 0.75], [0.5, 0.5])
    """
    updates, weights = _check_inputs(updates, weights, iters)
    if not 0.0 <= mix <= 1.0:
        raise ValueError(f"mix must be in [0, 1], got {mix!r}")
    w, cos = _alignment_weights(updates, weights, iters)
    coef = weights * (mix * w + (1.0 - mix))
    return fedavg_step(params, updates, coef, global_lr), w, cos


class Gala(ServerRule):
    """FedGaLA's global alignment as a server rule (``gala_iters``, ``gala_mix``; see :func:`gala_step`).

    Stateless across rounds (the last global move the gated clients need is kept and sent by the
    runtime). Diagnostics: ``gala_w.<client id>`` = the final normalised weight ``w_u`` (sums to 1
    over the round's participants).
    """

    name = "gala"
    description = ("FedGaLA global alignment: reweight clients by (cos(p_u Δ_u, a) + 1)/2 for gala_iters rounds of "
                   "re-aggregation; θ ← θ + global_lr·(gala_mix·a + (1−gala_mix)·FedAvg step)")
    hparams = (GALA_ITERS, GALA_MIX)
    default_global_lr = 1.0

    def aggregate(self, params, updates, weights, *, extras, round, info):
        new, w, _ = gala_step(params, updates, weights, iters=int(self.cfg.param("gala_iters")),
                              mix=float(self.cfg.param("gala_mix")), global_lr=self.global_lr)
        return AggregateResult(new, {f"gala_w.{cid}": float(x) for cid, x in zip(info.client_ids, w)})


# ============================================================================ client (torch)
def reference_tensors(model: nn.Module, global_move: np.ndarray | None, device: Any = None) -> list[torch.Tensor] | None:
    """The last global move cut into one tensor per ``model.parameters()`` entry (``None`` if no
    move exists yet). Slices follow :meth:`fedtune.layout.FlatLayout.param_slices`, the
    parameter part of the flat weight vector, in ``model.parameters()`` order."""
    import torch

    from fedtune.layout import FlatLayout

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
    """:class:`~fedtune.algorithms.client.LocalSGD` (functional SGD, momentum, weight decay) whose
    step is gated per parameter tensor: tensor ``l`` steps only if
    ``cos(−∇^(l), r^(l)) > tau`` for its reference ``r^(l)`` (FedGaLA's local alignment).

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
                 reference: list[torch.Tensor] | None = None, tau: float = 0.0):
        params = list(params)
        if reference is not None and len(reference) != len(params):
            raise ValueError(f"reference has {len(reference)} tensors, params has {len(params)}")
        if reference is not None:
            reference = [r for r, p in zip(reference, params) if p.requires_grad]
        super().__init__(params, lr, momentum, weight_decay)
        if not -1.0 <= float(tau) <= 1.0:
            raise ValueError(f"tau must be in [-1, 1], got {tau!r}")
        self.tau = float(tau)
        self.reference = reference
        self.ref_norms = None
        if reference is not None:
            import torch

            with torch.no_grad():
                self.ref_norms = [torch.linalg.vector_norm(r) for r in reference]
        self.tensor_steps = 0
        self.skipped = 0

    def gate(self, indices: list[int]) -> list[bool]:
        """Whether each of ``params[i]`` (``i`` in ``indices``, all with a gradient) takes its step."""
        import torch

        if self.reference is None or not indices:
            return [True] * len(indices)
        with torch.no_grad():
            cos, free = [], []
            for i in indices:
                g, r, rn = self.params[i].grad, self.reference[i], self.ref_norms[i]
                gn = torch.linalg.vector_norm(g)
                dot = -torch.sum(g * r)  # ⟨−∇, r⟩: the descent direction against the last global move
                denom = gn * rn
                c = torch.where(denom > 0, dot / torch.where(denom > 0, denom, torch.ones_like(denom)),
                                torch.zeros_like(denom))
                cos.append(c)
                free.append(rn == 0)
            cos_t = torch.clamp(torch.stack(cos).double(), -1.0, 1.0)
            # ~(cos <= tau) rather than cos > tau: a NaN cosine steps and surfaces as divergence.
            take = (~(cos_t <= self.tau)) | torch.stack(free)
            decisions = take.tolist()  # one device sync per step
        self.tensor_steps += len(indices)
        self.skipped += sum(1 for t in decisions if not t)
        return decisions

    def step(self) -> None:
        import torch
        from torch.optim.sgd import sgd

        with_grad = [i for i, p in enumerate(self.params) if p.grad is not None]
        stepping = [i for i, take in zip(with_grad, self.gate(with_grad)) if take]
        if not stepping:
            return
        bufs = [self.buffers[i] for i in stepping]
        with torch.no_grad():
            sgd([self.params[i] for i in stepping], [self.params[i].grad for i in stepping], bufs,
                weight_decay=self.weight_decay, momentum=self.momentum, lr=self.lr, dampening=0.0,
                nesterov=False, maximize=False, foreach=False)
        for i, b in zip(stepping, bufs):
            self.buffers[i] = b

    def skipped_fraction(self) -> float:
        """Skipped tensor-steps / tensor-steps considered (0 when nothing was gated)."""
        return self.skipped / self.tensor_steps if self.tensor_steps else 0.0

    def metrics(self) -> dict[str, float]:
        """``{"gala_skipped": fraction of skipped tensor-steps}`` (a diag column)."""
        return {"gala_skipped": self.skipped_fraction()}


def gated_sgd_for(model: nn.Module, ctx: ClientContext, cfg: Any, tau: float | None = None) -> GatedSGD:
    """A :class:`GatedSGD` over ``model.parameters()`` with the run's local optimiser settings
    (``local_lr``, ``local_momentum``, ``weight_decay``), gated against
    ``ctx.payload["global_move"]`` (no gating while it is absent) at ``tau`` (default: the run's
    ``gala_tau``)."""
    ref = reference_tensors(model, ctx.payload.get("global_move"), ctx.device)
    tau = float(cfg.param("gala_tau")) if tau is None else float(tau)
    return GatedSGD(model.parameters(), lr=cfg.local_lr, momentum=cfg.local_momentum,
                    weight_decay=cfg.weight_decay, reference=ref, tau=tau)


class GatedClientMixin:
    """Makes a client method's optimiser a :class:`GatedSGD` and reports ``gala_skipped``.

    Put it first in the bases of a method whose ``train(ctx)`` builds its optimiser with
    ``self.make_optimizer(model)`` (as :class:`~fedtune.algorithms.client.SGD` does), and add
    :data:`GALA_TAU` to its ``hparams``::

        class GalaSimCLR(GatedClientMixin, SimCLR):
            name = "gala-simclr"
            hparams = (*SimCLR.hparams, GALA_TAU)

    The loss and the loop stay the wrapped method's; only the optimiser step is gated.
    """

    needs_global_move: ClassVar[bool] = True
    _gala_ctx: ClientContext | None = None
    _gala_opts: list

    def make_optimizer(self, model: nn.Module) -> GatedSGD:
        if self._gala_ctx is None:
            raise RuntimeError("make_optimizer called outside train(ctx): the gate needs the round's global move")
        opt = gated_sgd_for(model, self._gala_ctx, self.cfg)
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
    description = ("FedGaLA local alignment: local SGD where a tensor steps only if cos(−∇, last global move) > gala_tau")
    hparams = (GALA_TAU,)
    needs_global_move = True


__all__ = [
    "GALA_ITERS", "GALA_MIX", "GALA_TAU", "Gala", "GalaClient", "GatedClientMixin", "GatedSGD",
    "gala_global_weights", "gala_step", "gated_sgd_for", "reference_tensors",
]
