"""FedGaLA: global and local gradient alignment (docs/methods.md §3; Pourpanah et al., Alg. 1).

Two independent parts, usable apart:

* **Global alignment** (server rule ``gala``, NumPy only): clients whose update agrees with the
  round's consensus direction get more aggregation weight (:func:`gala_global_weights`,
  :class:`Gala`).
* **Local alignment** (client method ``gala``, torch, imported lazily): inside local training a
  parameter tensor takes its optimiser step only if its batch gradient agrees (``gala_gate``) with the last
  global move ``r = θ^t − θ^(t−1)`` (:class:`GatedSGD`, :class:`GatedClientMixin`,
  :class:`GalaClient`). The gate wraps *any* loss: a client method whose loop builds its optimiser
  with ``self.make_optimizer(model)`` becomes gated by putting :class:`GatedClientMixin` first
  in its bases (``class GalaSimCLR(GatedClientMixin, SimCLR)``), or a custom loop can build one
  with :func:`gated_sgd_for` and read :meth:`GatedSGD.metrics`.

What the paper does, exactly (Alg. 1 and §3 of seed 003), and where fedtune differs
-------------------------------------------------------------------------------------
Server (Alg. 1 lines 5–12): ``g_i = Θ_i − Θ`` (the raw client update, our ``Δ_i``); the initial
global update is ``FedAvg(g_i)``; then ``iter`` times: ``w_i = (cos(g_i, g) + 1)/2``, normalised,
``g ← Σ_i w_i g_i``; finally ``Θ ← Θ + g``. The authors' code computes the weights per parameter
tensor and forms each new tensor as a convex combination ``Σ w_i θ_i``, i.e. the aligned step is
at FedAvg's scale (the paper's extra ``1/K`` is not in their code).

fedtune (docs/methods.md §3, as corrected): start ``a = Σ p_i Δ_i``; ``gala_iters`` times:
``w_i ∝ p_i (cos(Δ_i, a) + 1)/2`` normalised to sum 1, ``a = Σ w_i Δ_i``; then
``θ ← θ + global_lr (gala_mix · a + (1 − gala_mix) Σ p_i Δ_i)``. The ``p_i`` factor keeps the
example weighting of FedAvg (with equal client sizes it is the paper's rule), so equal
alignments give exactly FedAvg. ``gala_weights``: ``per-tensor`` (default, the authors' code)
or ``whole`` (one weight per client over the whole parameter vector).

Client (Alg. 1 lines 15–22, §3 "Local gradient alignment"): for every batch and every layer,
the step ``θ^(l) ← θ^(l) − η ∇^(l)`` is taken only if the batch gradient agrees with the last
global move ``r^(l)``. ``gala_gate`` chooses the sign: ``literal`` (the paper's formula and the
authors' code: ``cos(+∇^(l), r^(l)) ≥ τ``; their Fig. 3(b) skip rates come from it) or
``descent`` (fedtune's default, the stated intent: ``cos(−∇^(l), r^(l)) > τ``, a step is kept
when it moves the tensor the way the federation last moved it). The reference ``r`` is the last
global move ``θ^t − θ^(t−1)``, which the runtime sends from round 2 on (the paper's round 3 in
its indexing); before it exists nothing is gated. ``gala_skipped`` (the fraction of skipped
tensor-steps) is recorded for both signs.

Edge cases (documented choices):

* A zero vector has cosine 0 with anything (server: factor ``1/2`` before normalising; a client
  with ``p_i = 0`` gets weight 0). A non-finite cosine is left to surface as a
  diverged round.
* Client cosines are clamped to ``[−1, 1]`` (rounding can leave them just outside), so with
  ``descent`` ``τ = 1`` never steps and ``τ = −1`` skips only an exactly opposite tensor.
* A tensor whose reference ``r^(l)`` is exactly zero is **not gated** (there is no direction to
  agree with; gating it at ``τ ≥ 0`` would freeze it for the rest of training once one round
  left it unmoved).
* A tensor with a zero gradient has cosine 0 (it steps only if ``τ < 0``, ``descent``, or
  ``τ ≤ 0``, ``literal``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from fedtune.algorithms.aggregate import BLOCK, check_updates, combine, fedavg_step, tensor_slices, weighted_sum
from fedtune.algorithms.base import HParam
from fedtune.algorithms.client import SGD, ClientContext, ClientOutcome
from fedtune.algorithms.optim import LocalAdam, LocalSGD, local_optimizer_settings
from fedtune.algorithms.server import AggregateResult, ServerRule

if TYPE_CHECKING:  # torch is imported lazily: the coordinator never needs it
    import torch
    from torch import nn


GALA_ITERS = HParam("gala_iters", 3, "FedGaLA global-alignment iterations (reweight, re-aggregate); paper: 3",
                    kind="int", lo=1)
GALA_MIX = HParam("gala_mix", 1.0, "FedGaLA mix with FedAvg: theta + global_lr * (mix * aligned + (1 - mix) * fedavg); "
                  "1 = pure alignment (paper), 0 = FedAvg", lo=0.0, hi=1.0)
GALA_WEIGHTS = HParam("gala_weights", "per-tensor",
                      "FedGaLA global alignment: one weight per client and parameter tensor (per-tensor, the authors' "
                      "code) or one per client over the whole parameter vector (whole)",
                      kind="choice", choices=("per-tensor", "whole"), variant=True)
GALA_GATE = HParam("gala_gate", "descent",
                   "FedGaLA local gate sign: descent = a tensor steps only if cos(-grad, last global move) > gala_tau "
                   "(the stated intent); literal = only if cos(+grad, last global move) >= gala_tau (the paper's "
                   "formula and the authors' code, needed to reproduce their numbers)",
                   kind="choice", choices=("descent", "literal"), variant=True)
GALA_TAU = HParam("gala_tau", 0.0, "FedGaLA local gate: a tensor steps only if cos(-grad, last global move) > tau; "
                  "-1 = (almost) never gate, 1 = never step; paper: 0", lo=-1.0, hi=1.0)


# ============================================================================ server (NumPy)
def _dot64(x: np.ndarray, y: np.ndarray) -> float:
    """``⟨x, y⟩`` accumulated in float64, block by block with NumPy's own (thread-independent)
    summation (the products are taken in the inputs' precision, then summed in float64)."""
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
    updates, weights = check_updates(updates, weights)
    if updates.shape[0] == 0:
        raise ValueError(f"updates {updates.shape} and weights {weights.shape} disagree on the client count")
    if (weights < 0).any():
        raise ValueError(f"weights must be non-negative, got {weights}")
    if int(iters) != iters or iters < 1:
        raise ValueError(f"iters must be an integer >= 1, got {iters!r}")
    return updates, weights


def _alignment_weights(updates: np.ndarray, weights: np.ndarray, iters: int) -> tuple[np.ndarray, np.ndarray]:
    """The normalised weights ``w`` of the last iteration and the cosines they came from, for the
    columns ``updates`` holds (the whole vector or one parameter tensor's slice).

    ``a = Σ p_u Δ_u``; ``iters`` times: ``w_u ∝ p_u (cos(Δ_u, a) + 1)/2``, ``Σ w = 1``,
    ``a = Σ w_u Δ_u``. When every client's factor ``(cos + 1)/2`` is the same (equal alignments)
    the reweighting is the identity and ``w = p`` exactly (no renormalisation rounding), so the
    rule is bit for bit FedAvg."""
    U = updates.shape[0]
    sq_norms = np.array([_dot64(updates[u], updates[u]) for u in range(U)])
    live = weights > 0
    a = weighted_sum(updates, weights)  # FedAvg's displacement Σ p_u Δ_u
    w, cos = weights.copy(), np.zeros(U)
    for it in range(int(iters)):
        cos = _cosines(updates, sq_norms, a)
        f = (cos + 1.0) / 2.0
        raw = weights * f
        if np.all(f[live] == f[live][0]) or not raw.sum() > 0.0:
            w = weights.copy()  # equal alignments (or nothing to weigh): FedAvg's weights, exactly
        else:
            w = raw / raw.sum()
        if it + 1 < iters:
            a = weighted_sum(updates, w)  # a = Σ w_u Δ_u
    return w, cos


def gala_global_weights(updates: np.ndarray, weights: np.ndarray, iters: int = 3,
                        slices: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """FedGaLA's global alignment (docs/methods.md §3): the normalised client weights ``w`` and the
    aligned displacement ``a`` [P] (both float64).

    ``updates[u] = Δ_u`` (descent displacements), ``weights[u] = p_u`` (summing to 1). Start
    ``a = Σ_u p_u Δ_u`` (FedAvg's step); ``iters`` times: ``w_u ∝ p_u (cos(Δ_u, a) + 1)/2``
    normalised to ``Σ w = 1``, ``a = Σ_u w_u Δ_u``. ``a`` is at FedAvg's scale (a convex
    combination of the updates, as in the authors' code); equal alignments give ``w = p``, i.e.
    FedAvg exactly.

    ``slices`` (``layout.param_slices()`` or plain slices tiling the vector): the weights are
    computed per parameter tensor (the authors' code), ``w`` is ``[K, U]`` for K tensors;
    ``None``: one weight per client over the whole vector, ``w`` is ``[U]``.

    Two orthogonal clients of equal size are equally aligned: the step is FedAvg's mean:

    >>> w, a = gala_global_weights(np.array([[2., 0.], [0., 2.]], np.float32), np.array([.5, .5]), iters=1)
    >>> w.tolist(), a.tolist()
    ([0.5, 0.5], [1.0, 1.0])
    """
    updates, weights = _check_inputs(updates, weights, iters)
    if slices is None:
        w, _ = _alignment_weights(updates, weights, iters)
        return w, weighted_sum(updates, w)
    ws, parts = [], []
    for sl in tensor_slices(slices, updates.shape[1]):
        w, _ = _alignment_weights(updates[:, sl], weights, iters)
        ws.append(w)
        parts.append(weighted_sum(updates[:, sl], w))
    return np.stack(ws), np.concatenate(parts)


def gala_step(params: np.ndarray, updates: np.ndarray, weights: np.ndarray, *, iters: int = 3, mix: float = 1.0,
              global_lr: float = 1.0, slices: Any = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ``gala`` server update: ``(new params float32 [P], w, cos)`` (``w``/``cos`` ``[U]``
    with ``slices=None``, ``[K, U]`` per tensor otherwise; see :func:`gala_global_weights`).

    ``θ ← θ + η (mix · a + (1 − mix) · Σ p_u Δ_u) = θ + η Σ_u c_u Δ_u`` per tensor, with
    ``c_u = mix · w_u + (1 − mix) · p_u`` and ``η = global_lr``: both parts are at FedAvg's scale
    and share one server learning rate. ``mix = 0``, or equal alignments (then ``w = p``), give
    exactly (bit for bit) :func:`fedavg_step` at ``η``; ``mix = 1`` is ``θ + η a`` (the paper's
    ``Θ + g`` at ``η = 1``). The paper's Eq. 41 mixes with the unweighted client mean; fedtune
    mixes with its FedAvg (example-weighted).

    >>> new, w, cos = gala_step(np.zeros(2, np.float32), np.array([[2., 0.], [0., 2.]], np.float32),
    ...                         np.array([.5, .5]), iters=1, mix=0.5)
    >>> new.tolist(), w.tolist()   # equal alignments: FedAvg's (1, 1) whatever the mix
    ([1.0, 1.0], [0.5, 0.5])
    """
    updates, weights = _check_inputs(updates, weights, iters)
    if not 0.0 <= mix <= 1.0:
        raise ValueError(f"mix must be in [0, 1], got {mix!r}")
    params = np.asarray(params)
    if params.shape != (updates.shape[1],):
        raise ValueError(f"params {params.shape} and updates {updates.shape} disagree on the parameter count")

    def coefficients(w: np.ndarray) -> np.ndarray:
        return weights if np.array_equal(w, weights) else weights * (1.0 - mix) + mix * w

    if slices is None:
        w, cos = _alignment_weights(updates, weights, iters)
        return fedavg_step(params, updates, coefficients(w), global_lr), w, cos
    out = np.empty(updates.shape[1], np.float32)
    ws, coss = [], []
    for sl in tensor_slices(slices, updates.shape[1]):
        w, cos = _alignment_weights(updates[:, sl], weights, iters)
        combine(updates[:, sl], coefficients(w), params[sl], float(global_lr), out[sl])
        ws.append(w)
        coss.append(cos)
    return out, np.stack(ws), np.stack(coss)


class Gala(ServerRule):
    """FedGaLA's global alignment as a server rule (``gala_iters``, ``gala_mix``,
    ``gala_weights``; see :func:`gala_step`).

    ``gala_weights = "per-tensor"`` (default, the authors' code): one weight per client and
    parameter tensor of the layout; ``"whole"``: one weight per client over the whole parameter
    vector. Stateless across rounds (the last global move the gated clients need is kept and sent
    by the runtime). Diagnostics: ``gala_w.<client id>`` = the client's final normalised weight
    (``whole``), or its parameter-count-weighted mean over tensors ``Σ_l (M_l/M) w_l,u``
    (``per-tensor``); either way they sum to 1 over the round's participants and equal ``p_u``
    when the round is exactly FedAvg.
    """

    name = "gala"
    description = ("FedGaLA global alignment: reweight clients by p_u (cos(Δ_u, a) + 1)/2 (per tensor or whole "
                   "vector) for gala_iters rounds; θ ← θ + global_lr·(gala_mix·a + (1−gala_mix)·FedAvg step)")
    hparams = (GALA_ITERS, GALA_MIX, GALA_WEIGHTS)
    default_global_lr = 1.0

    def aggregate(self, params, updates, weights, *, extras, round, info):
        per_tensor = self.cfg.param("gala_weights") == "per-tensor"
        slices = None
        if per_tensor:
            slices = self.layout.param_slices() if hasattr(self.layout, "param_slices") else []
            if not slices:
                raise ValueError("gala_weights='per-tensor' needs the model's layout (its parameter tensors); "
                                 "use gala_weights='whole' for a bare vector")
        new, w, _ = gala_step(params, updates, weights, iters=int(self.cfg.param("gala_iters")),
                              mix=float(self.cfg.param("gala_mix")), global_lr=self.global_lr, slices=slices)
        if per_tensor:
            sizes = np.array([sl.stop - sl.start for _, sl in slices], np.float64)
            w = (sizes / sizes.sum()) @ w
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
    """:class:`~fedtune.algorithms.optim.LocalSGD` (functional SGD, momentum, weight decay) whose
    step is gated per parameter tensor against its reference ``r^(l)`` (FedGaLA's local
    alignment): ``gate="descent"`` steps tensor ``l`` only if ``cos(−∇^(l), r^(l)) > tau``;
    ``gate="literal"`` (the paper's formula and the authors' code) only if
    ``cos(+∇^(l), r^(l)) >= tau``.

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
    """:class:`GatedSGD`'s gate on :class:`~fedtune.algorithms.optim.LocalAdam` (``local_optimizer:
    adam``): a skipped tensor keeps its Adam moments and step count unchanged this batch."""

    def __init__(self, params, lr: float, weight_decay: float = 0.0, *,
                 reference: list[torch.Tensor] | None = None, tau: float = 0.0, gate: str = "descent"):
        params = list(params)
        LocalAdam.__init__(self, params, lr, weight_decay)
        self._init_gate(params, reference, tau, gate)


def gated_sgd_for(model: nn.Module, ctx: ClientContext, cfg: Any, tau: float | None = None) -> GatedSGD:
    """A :class:`GatedSGD` (or :class:`GatedAdam` with ``local_optimizer: adam``) over
    ``model.parameters()`` with the run's local optimiser settings
    (``local_lr``, ``local_momentum``, ``weight_decay``), gated against
    ``ctx.payload["global_move"]`` (no gating while it is absent) at ``tau`` (default: the run's
    ``gala_tau``) with the run's ``gala_gate`` sign."""
    ref = reference_tensors(model, ctx.payload.get("global_move"), ctx.device)
    tau = float(cfg.param("gala_tau")) if tau is None else float(tau)
    settings = local_optimizer_settings(cfg)
    cls = GatedAdam if settings.pop("kind") == "adam" else GatedSGD
    return cls(model.parameters(), **settings, reference=ref, tau=tau, gate=str(cfg.param("gala_gate")))


class GatedClientMixin:
    """Makes a client method's optimiser a :class:`GatedSGD` and reports ``gala_skipped``.

    Put it first in the bases of a method whose ``train(ctx)`` builds its optimiser with
    ``self.make_optimizer(model)`` (every built-in method does, through
    :meth:`~fedtune.algorithms.client.ClientMethod.start_round`), and add
    :data:`GALA_TAU` and :data:`GALA_GATE` to its ``hparams``::

        class GalaSimCLR(GatedClientMixin, SimCLR):
            name = "gala-simclr"
            hparams = (*SimCLR.hparams, GALA_TAU, GALA_GATE)

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
    description = ("FedGaLA local alignment: local SGD where a tensor steps only if its batch gradient agrees with the "
                   "last global move (gala_gate: descent cos(−∇, r) > gala_tau, or literal cos(+∇, r) >= gala_tau)")
    hparams = (GALA_TAU, GALA_GATE)
    needs_global_move = True


__all__ = [
    "GALA_GATE", "GALA_ITERS", "GALA_MIX", "GALA_TAU", "GALA_WEIGHTS", "Gala", "GalaClient", "GatedAdam",
    "GatedClientMixin", "GatedSGD",
    "gala_global_weights", "gala_step", "gated_sgd_for", "reference_tensors",
]
