"""FedDA and FedGP with static or auto-weighted β, and the target-only baseline (docs/methods-seeds.md §2).

Federated domain *adaptation* (setting ``fda``): ``N`` source clients and one target client
holding a small labelled target sample train from ``θ``; the server combines the target
displacement ``Δ_T`` with every source displacement ``Δ_i`` (Jiang, Zhang & Koyejo, "Principled
Federated Domain Adaptation: Gradient Projection and Auto-Weighting", seed 002, Def. 4.1/4.3,
§4.2, Appendix A.2, Algorithm 1 in Appendix C.1):

* FedDA: ``θ ← θ + η_g Σ_i α_i [ (1−β_i) Δ_T + β_i Δ̃_i ]``
* FedGP: ``θ ← θ + η_g Σ_i α_i [ (1−β_i) Δ_T + β_i Proj₊(Δ_T | Δ̃_i) ]``, the projection taken
  per parameter tensor, ``Proj₊(a | b) = max(⟨a,b⟩, 0)/‖b‖² · b``
* target-only: ``θ ← θ + η_g Δ_T`` (the sources are ignored)

with ``α_i = p_i / Σ_sources p_j`` (the FedAvg weights renormalised over the sources),
``η_g = global_lr`` (default 1, as in the paper) and ``Δ̃_i`` the magnitude-aligned source
displacement (:func:`align_source_magnitude`).

Choices where the paper, the authors' code and the spec leave room (all documented, none silent):

* **β convention.** ``gp_beta`` weights the *source* term (paper Def. 4.3: ``(1−β) Δ_T + β ·
  source``; ``gp_beta = 0`` is the target alone). The authors' code (their Eq. 109) weights the
  *target* by β: to compare with numbers from their code, map ``β → 1 − β``.
* **Batch-norm buffers** follow the rule (docs/methods-seeds.md §2): target-only keeps the target's
  buffers; FedDA and FedGP combine buffer displacements with the round's FedDA weights,
  ``B + Σ_i α_i [(1−β_i) ΔB_T + β_i ΔB_i]`` (no projection, no ``global_lr``;
  :meth:`_TargetSourceRule.aggregate_buffers`).

* **Projection per tensor, estimates on the whole vector.** The projection is taken per
  parameter tensor (docs/methods-seeds.md §2; the authors' ``update_global`` loops over the state-dict keys).
  The auto-β quantities ``σ̂², d̂_i², τd̂_i²`` are computed on the whole parameter vector, one
  β_i per source, as the authors' ``empirical_metrics_batch`` does on the concatenation of all
  tensors (their ``/dim`` normalisation cancels in the ratio and is omitted here).
* **Proj₊ exactly as defined.** The authors' code adds ``cos(Δ_T, Δ_i) · Δ̃_i`` (magnitude
  ``‖Δ̃_i‖ cos``) instead of the projection (magnitude ``‖Δ_T‖ cos``); fedtune follows the paper's
  definition (docs/methods-seeds.md §2). Proj₊ is invariant to positive rescaling of its second argument, so
  magnitude alignment changes FedGP's projections not at all, only FedDA and the β estimates.
  The target term is ``Σ_i α_i (1−β_i) Δ_T`` (the paper); the authors' code applies only the last
  source's ``(1−β)`` to ``Δ_T``.
* **What t_b and s_i are.** ``t_b`` is the target client's *raw* step on its local batch
  ``b``, ``−lr_T ∇_b`` (what plain SGD would have moved; row ``b`` of
  ``extras["step_updates"]``): Appendix A.2 uses batches of the target data as i.i.d. samples
  along the optimisation path (Appendix C.3). The samples are taken from the batch gradient of
  the data loss at θ before the step, whatever the client's optimiser does with it (docs/methods-seeds.md
  §2): not after momentum (consecutive momentum steps are correlated and ramp up to
  ``1/(1−m)`` times the gradient step, which put the estimates off by >10× at m = 0.9 and drove
  β_DA towards 0 on identical domains), not with weight decay or FedProx's ``μ(θ−θ_global)``
  (deterministic terms of the optimiser, not of the data), for SAM the gradient at the
  unperturbed θ (the batch loss's own gradient; the perturbed one is SAM's optimiser), and for
  FedGaLA before its gate. ``s_i`` is source ``i``'s mean raw per-batch step in the same units,
  ``(lr_T/lr_S) · mean_b(−lr_S ∇_b^i)`` (``extras["mean_step_update"]``; C.3: "one model update
  per source client ... divided by the number of batches", aligned "using the learning rate
  ratio"; the sources train at ``local_lr``, the target at ``local_lr · target_lr_scale``, and the
  worker records every client's steps at the target's rate). With plain SGD and ``target_lr_scale`` 1
  (no momentum, no decay) ``Σ_b t_b = Δ_T`` and ``s_i = Δ_i/steps_i`` exactly, the earlier
  definition. ``σ̂²`` (the variance of the target's mean step) and ``d̂_i²`` are on one scale;
  β is scale-free. The combination itself still uses the actual displacements ``Δ_T``, ``Δ̃_i``.
* **Clipping and degenerate cases.** ``d̂_i²`` and ``τd̂_i²`` are clipped at 0 before forming
  β (``σ̂² ≥ 0`` by construction); ``β = σ̂²/(D + σ̂²)`` with ``0/0 := 0`` (a noiseless target
  with a source at distance 0: keep the target step). Auto-β needs ``B ≥ 2`` target steps.
* **Missing clients** (partial participation): a round without the target client leaves θ
  unchanged (diag ``target_missing = 1``); a round with the target but no source takes the
  target step ``θ + η_g Δ_T`` (the limit of both rules with no source term).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from fedtune.algorithms.server.aggregate import BLOCK, server_step, tensor_slices
from fedtune.algorithms.base import RunConfig
from fedtune.algorithms.declarations import GP_ALIGN, GP_BETA
from fedtune.algorithms.server.fedgp_auto_beta import auto_beta_estimates
from fedtune.algorithms.server.rule import AggregateResult, RoundInfo, ServerRule

F64 = np.float64



# ============================================================================ helpers
def _dot(a: np.ndarray, b: np.ndarray) -> float:
    """``⟨a, b⟩`` in float64, block by block in a fixed order (no BLAS: bit-reproducible)."""
    total = 0.0
    for s in range(0, a.shape[0], BLOCK):
        total += float(np.add.reduce(a[s:s + BLOCK].astype(F64) * b[s:s + BLOCK].astype(F64)))
    return total


def _proj_coefficient(a: np.ndarray, b: np.ndarray) -> tuple[float, bool]:
    """``(max(⟨a,b⟩,0)/‖b‖², clipped)``; coefficient 0 when ``b = 0``; ``clipped`` when ``⟨a,b⟩ < 0``."""
    bb = _dot(b, b)
    if bb <= 0.0:
        return 0.0, False
    ab = _dot(a, b)
    return max(ab, 0.0) / bb, ab < 0.0


# ============================================================================ projection
def proj_plus(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``Proj₊(a | b) = max(⟨a,b⟩, 0) / ‖b‖² · b`` (float64): ``a`` projected on the *positive*
    direction of ``b``; 0 when ``a`` points against ``b`` or ``b = 0``.

    >>> proj_plus(np.array([3., 4.]), np.array([2., 0.]))
    array([3., 0.])
    >>> proj_plus(np.array([-1., 5.]), np.array([1., 0.]))
    array([0., 0.])
    """
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"proj_plus needs two vectors of one length, got {a.shape} and {b.shape}")
    coef, _ = _proj_coefficient(a, b)
    return coef * b.astype(F64)


def proj_plus_per_tensor(a: np.ndarray, b: np.ndarray, slices: Sequence[Any] | None) -> np.ndarray:
    """:func:`proj_plus` applied to each tensor's slice of ``a`` and ``b`` separately (float64).

    ``slices``: slices or ``(name, slice)`` pairs tiling the vector (``layout.param_slices()``);
    ``None`` = the whole vector as one tensor.

    >>> proj_plus_per_tensor(np.array([1., 0., 0., 1.]), np.array([1., 0., 0., -1.]), [slice(0, 2), slice(2, 4)])
    array([1., 0., 0., 0.])
    """
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"proj_plus_per_tensor needs two vectors of one length, got {a.shape} and {b.shape}")
    out = np.zeros(a.shape[0], F64)
    for sl in tensor_slices(slices, a.shape[0]):
        coef, _ = _proj_coefficient(a[sl], b[sl])
        if coef:
            out[sl] = coef * b[sl].astype(F64)
    return out


# ============================================================================ combination
@dataclass
class Combination:
    """Result of :func:`combine_with_target`: the combined displacement and, for FedGP, which
    (source, tensor) projections were clipped to 0 (``⟨Δ_T, Δ̃_i⟩ < 0`` on that tensor)."""

    update: np.ndarray  # float64 [P]
    clipped: np.ndarray  # bool [N, K] (all False for FedDA)


def _check_combine(target_update, source_updates, alphas, betas):
    t = np.asarray(target_update)
    s = np.asarray(source_updates)
    if t.ndim != 1 or s.ndim != 2 or s.shape[1] != t.shape[0]:
        raise ValueError(f"target_update [P] and source_updates [N, P] disagree: {t.shape} vs {s.shape}")
    n = s.shape[0]
    a = np.asarray(alphas, dtype=F64)
    if a.shape != (n,) or (a < 0).any():
        raise ValueError(f"alphas must be {n} non-negative weights, got {alphas}")
    b = np.broadcast_to(np.asarray(betas, dtype=F64), (n,))
    if (b < 0).any() or (b > 1).any() or not np.isfinite(b).all():
        raise ValueError(f"betas must lie in [0, 1], got {betas}")
    return t, s, a, b


def combine_with_target(target_update: np.ndarray, source_updates: np.ndarray, alphas: np.ndarray,
                        betas: np.ndarray | float, slices: Sequence[Any] | None = None,
                        projection: bool = True) -> Combination:
    """:func:`fedgp_combine` that also reports which projections were clipped (see there)."""
    t, s, a, b = _check_combine(target_update, source_updates, alphas, betas)
    sl = tensor_slices(slices, t.shape[0])
    clipped = np.zeros((s.shape[0], len(sl)), dtype=bool)
    # Σ_i α_i (1−β_i) Δ_T  +  Σ_i α_i β_i (Proj₊ per tensor | Δ̃_i), in float64, source by source.
    out = t.astype(F64) * float(np.sum(a * (1.0 - b)))
    for i in range(s.shape[0]):
        w = float(a[i] * b[i])
        if w == 0.0:
            if projection:  # still record clipping (a diagnostic of the directions, not of β)
                for k, piece in enumerate(sl):
                    clipped[i, k] = _proj_coefficient(t[piece], s[i, piece])[1]
            continue
        if not projection:
            for st in range(0, t.shape[0], BLOCK):
                out[st:st + BLOCK] += w * s[i, st:st + BLOCK].astype(F64)
            continue
        for k, piece in enumerate(sl):
            coef, clipped[i, k] = _proj_coefficient(t[piece], s[i, piece])
            if coef:
                out[piece] += (w * coef) * s[i, piece].astype(F64)
    return Combination(out, clipped)


def fedgp_combine(target_update: np.ndarray, source_updates: np.ndarray, alphas: np.ndarray,
                  betas: np.ndarray | float, slices: Sequence[Any] | None = None,
                  projection: bool = True) -> np.ndarray:
    """The FedGP (``projection=True``) or FedDA (``projection=False``) combined displacement
    (float64 [P]; the rule adds ``global_lr ×`` it to θ):

    * FedGP: ``Σ_i α_i [ (1−β_i) Δ_T + β_i Proj₊(Δ_T | Δ_i) ]``, Proj₊ per tensor of ``slices``
      (``layout.param_slices()``; ``None`` = the whole vector is one tensor);
    * FedDA: ``Σ_i α_i [ (1−β_i) Δ_T + β_i Δ_i ]`` (``slices`` play no role).

    ``target_update`` ``[P]``, ``source_updates`` ``[N, P]`` (already magnitude-aligned, see
    :func:`align_source_magnitude`), ``alphas`` ``[N]`` (normally summing to 1), ``betas`` ``[N]``
    or one number in ``[0, 1]``.

    >>> t = np.array([1., 1.])
    >>> s = np.array([[2., 0.], [-1., 0.]])
    >>> fedgp_combine(t, s, np.array([.5, .5]), 1.0)       # the opposed source adds nothing
    array([0.5, 0. ])
    >>> fedgp_combine(t, s, np.array([.5, .5]), 1.0, projection=False)
    array([0.5, 0. ])
    >>> fedgp_combine(t, s, np.array([.5, .5]), 0.0)       # β = 0: the target step
    array([1., 1.])
    """
    return combine_with_target(target_update, source_updates, alphas, betas, slices, projection).update


# ============================================================================ magnitude alignment
def alignment_factor(steps_source: Any, steps_target: int, lr_source: float = 1.0,
                     lr_target: float = 1.0) -> np.ndarray:
    """``(lr_T/lr_S) · (steps_T/steps_S)`` per source (float64 array shaped like ``steps_source``).

    >>> alignment_factor([12, 3], 3, lr_source=0.05, lr_target=0.01)
    array([0.05, 0.2 ])
    """
    steps_s = np.asarray(steps_source, dtype=F64)
    if (steps_s < 1).any() or steps_target < 1 or lr_source <= 0 or lr_target <= 0:
        raise ValueError(f"steps must be >= 1 and learning rates > 0, got steps_source={steps_source}, "
                         f"steps_target={steps_target}, lr_source={lr_source}, lr_target={lr_target}")
    return (float(lr_target) / float(lr_source)) * (float(steps_target) / steps_s)


def align_source_magnitude(source_updates: np.ndarray, steps_source: Any, steps_target: int,
                           lr_source: float = 1.0, lr_target: float = 1.0,
                           out: np.ndarray | None = None) -> np.ndarray:
    """Scale each source displacement ``Δ_i`` (rows of ``source_updates`` ``[N, P]``) by
    :func:`alignment_factor` so it is on the scale of the target's ``Δ_T``: a source that took
    ``steps_S`` steps at ``lr_S`` moved about ``(lr_S·steps_S)/(lr_T·steps_T)`` times as far as
    the target would along the same per-step direction (the authors scale by the learning-rate
    ratio, the epoch ratio and the batches-per-epoch ratio, i.e. the step ratio). In fedtune
    the sources train at ``local_lr`` and the target at ``local_lr · target_lr_scale`` (default 1:
    the factor is then ``steps_T/steps_S``).

    Returns an array of ``source_updates``' dtype (``out`` may be ``source_updates`` itself).

    >>> align_source_magnitude(np.array([[4., -8.]], np.float32), [8], 2)
    array([[ 1., -2.]], dtype=float32)
    """
    s = np.asarray(source_updates)
    if s.ndim != 2:
        raise ValueError(f"source_updates must be [N, P], got {s.shape}")
    f = np.broadcast_to(alignment_factor(steps_source, steps_target, lr_source, lr_target), (s.shape[0],))
    out = np.empty_like(s) if out is None else out
    for i in range(s.shape[0]):
        out[i] = (s[i].astype(F64) * float(f[i])).astype(s.dtype)
    return out


# ============================================================================ server rules
def _target_row(info: RoundInfo) -> int | None:
    rows = [u for u, r in enumerate(info.roles) if r == "target"]
    if len(rows) > 1:
        raise ValueError(f"expected one target client, got {len(rows)} (ids {[info.client_ids[u] for u in rows]})")
    return rows[0] if rows else None


def _step(params: np.ndarray, update: np.ndarray, global_lr: float, diag: dict[str, float]) -> AggregateResult:
    """``θ + global_lr · update`` and the direction ``update`` (a float64 copy: a target row is the
    coordinator's scratch); no update (the target missed the round): ``θ`` and a zero direction."""
    if update is None:
        return AggregateResult(np.array(params, np.float32), diag, np.zeros(np.shape(params), F64))
    d = np.array(update, F64)
    return AggregateResult(server_step(params, d, global_lr), diag, d)


class TargetOnly(ServerRule):
    """Target-only baseline: ``θ ← θ + global_lr · Δ_T``; the source clients' updates are
    ignored (they still train, so the round's cost matches FedDA/FedGP). A round without the
    target client (partial participation) leaves θ unchanged (diag ``target_missing``)."""

    name = "target_only"

    def aggregate(self, params, updates, weights, *, extras, round, info):
        t = _target_row(info)
        if t is None:
            return _step(params, None, self.global_lr, {"target_missing": 1.0})
        return _step(params, updates[t], self.global_lr, {"target_missing": 0.0})

    def aggregate_buffers(self, buffers, client_buffers, weights, *, info):
        """The target's batch-norm statistics, exactly (unchanged without the target)."""
        t = _target_row(info)
        return np.array(buffers if t is None else client_buffers[t], np.float32)


class _TargetSourceRule(ServerRule):
    """Shared FedDA/FedGP machinery (the subclasses differ only in :attr:`projection`).

    Hyperparameters: ``gp_beta`` (a number in [0, 1], default 0.5, or ``"auto"``) and
    ``gp_align`` (default true: scale each ``Δ_i`` by ``(lr_T/lr_S)·(steps_T/steps_S)``,
    :func:`align_source_magnitude`; with ``target_lr_scale`` 1 sources and target share ``local_lr``, so the
    factor is ``steps_T/steps_S``). With ``gp_beta = "auto"`` the target client records its
    raw per-batch steps ``t_b = −lr·∇_b`` (``extras["step_updates"]``), each source its mean raw
    step ``s_i`` (``extras["mean_step_update"]``), and β_i is re-estimated every round
    (:func:`auto_beta_estimates`; see the module docstring for why raw gradient steps).

    Diagnostics: ``gp_beta.<id>`` (β used for source ``id``), ``gp_target_steps``; with auto
    also ``gp_sigma2``, ``gp_d2.<id>``, ``gp_tau_d2.<id>`` (unclipped estimates),
    ``gp_beta_da.<id>`` and ``gp_beta_gp.<id>``; FedGP also ``gp_clipped_frac`` (the fraction of
    (source, tensor) pairs whose projection was clipped to 0, ``⟨Δ_T, Δ_i⟩ < 0`` on the tensor).
    """

    projection: bool = True

    def __init__(self, cfg: RunConfig, layout: Any):
        super().__init__(cfg, layout)
        self.beta = GP_BETA.of(cfg)
        self.auto = self.beta == "auto"
        self.align = GP_ALIGN.of(cfg)
        # (client ids, source rows, α, β) of the last aggregate, for aggregate_buffers
        self._buffer_mix: tuple | None = None

    def aggregate_buffers(self, buffers, client_buffers, weights, *, info):
        """Batch-norm statistics follow the FedDA weights of this round's parameter combine
        (docs/methods-seeds.md §2; the authors' code combines every state-dict key):
        ``B ← B + Σ_i α_i [(1−β_i) ΔB_T + β_i ΔB_i]`` with ``ΔB_u = B_u − B`` and the same
        ``α_i, β_i`` (fixed or auto) as :meth:`aggregate` used. Choices: no projection (a running
        mean or variance is a statistic, not a descent direction, so FedGP combines buffers like
        FedDA), no ``global_lr`` and no magnitude alignment (both are about step sizes). Without the
        target the buffers stay; with the target alone they become the target's."""
        buffers = np.asarray(buffers)
        t = _target_row(info)
        if t is None:
            return np.array(buffers, np.float32)
        mix = self._buffer_mix
        if mix is None or mix[0] != info.client_ids:
            raise RuntimeError("aggregate_buffers must follow aggregate in the same round (it reuses its α and β)")
        _, src, alphas, betas = mix
        if not src:
            return np.array(client_buffers[t], np.float32)
        old = buffers.astype(F64)
        out = old + float(np.sum(alphas * (1.0 - betas))) * (client_buffers[t].astype(F64) - old)
        for k, u in enumerate(src):
            out += float(alphas[k] * betas[k]) * (client_buffers[u].astype(F64) - old)
        return out.astype(np.float32)

    def _param_slices(self) -> list[tuple[str, slice]] | None:
        """The parameter tensors of the layout (``None``: treat the vector as one tensor)."""
        return self.layout.param_slices() if hasattr(self.layout, "param_slices") else None

    def aggregate(self, params, updates, weights, *, extras, round, info):
        t = _target_row(info)
        if t is None:
            return _step(params, None, self.global_lr, {"target_missing": 1.0})
        src = [u for u, r in enumerate(info.roles) if r == "source"]
        diag: dict[str, float] = {"target_missing": 0.0, "gp_target_steps": float(info.steps[t])}
        self._buffer_mix = (info.client_ids, src, None, None)
        if not src:
            return _step(params, updates[t], self.global_lr, diag)
        w = np.asarray(weights, F64)[src]
        alphas = w / w.sum() if w.sum() > 0 else np.full(len(src), 1.0 / len(src))
        steps_t = int(info.steps[t])
        steps_s = [int(info.steps[u]) for u in src]
        lr = float(self.cfg.local_lr)  # the sources' rate; the target's is local_lr·target_lr_scale
        lr_t = self.cfg.target_lr
        sources = updates[src]  # a copy (fancy indexing): safe to scale in place
        if self.align:
            align_source_magnitude(sources, steps_s, steps_t, lr_source=lr, lr_target=lr_t, out=sources)
        ids = [info.client_ids[u] for u in src]
        if self.auto:
            step_updates = extras[t].get("step_updates") if extras and extras[t] else None
            if step_updates is None:
                raise ValueError("gp_beta='auto' needs the target client's extras['step_updates'] (the worker "
                                 "records them through the rule's client hook, step_records.StepRecords)")
            if np.shape(step_updates)[0] < 2:
                raise ValueError(
                    f"gp_beta='auto' needs at least 2 target steps per round to estimate the target variance, the "
                    f"target client took {np.shape(step_updates)[0]}; raise local_epochs or local_steps, or lower "
                    f"batch_size")
            missing = [info.client_ids[u] for u in src if not extras or "mean_step_update" not in (extras[u] or {})]
            if missing:
                raise ValueError(f"gp_beta='auto' needs every source client's extras['mean_step_update'] (its mean raw "
                                 f"per-batch step −local_lr·∇_b; the rule's client hook step_records.StepRecords "
                                 f"records it); missing for clients {missing}")
            # s_i = (lr_T/lr_S) · mean_b(−lr_S ∇_b^i) = the source's mean raw step at the target's
            # learning rate: the worker records every client's steps at lr_T (target_lr_scale).
            source_steps = np.stack([np.asarray(extras[u]["mean_step_update"], np.float32) for u in src])
            est = auto_beta_estimates(step_updates, source_steps, threads=self.threads)
            betas = est.beta_gp if self.projection else est.beta_da
            diag["gp_sigma2"] = float(est.sigma2)
            for k, cid in enumerate(ids):
                diag[f"gp_d2.{cid}"] = float(est.d2[k])
                diag[f"gp_tau_d2.{cid}"] = float(est.tau_d2[k])
                diag[f"gp_beta_da.{cid}"] = float(est.beta_da[k])
                diag[f"gp_beta_gp.{cid}"] = float(est.beta_gp[k])
        else:
            betas = np.full(len(src), float(self.beta), F64)
        self._buffer_mix = (info.client_ids, src, alphas, np.asarray(betas, F64))
        comb = combine_with_target(updates[t], sources, alphas, betas,
                                   self._param_slices(), self.projection)
        for k, cid in enumerate(ids):
            diag[f"gp_beta.{cid}"] = float(betas[k])
        if self.projection:
            diag["gp_clipped_frac"] = float(comb.clipped.mean()) if comb.clipped.size else 0.0
        return _step(params, comb.update, self.global_lr, diag)


class FedDA(_TargetSourceRule):
    __doc__ = ("FedDA (seed 002, Def. 4.1): θ ← θ + global_lr · Σ_i α_i [(1−β_i) Δ_T + β_i Δ̃_i].\n\n"
               + (_TargetSourceRule.__doc__ or ""))
    name = "fedda"
    projection = False


class FedGP(_TargetSourceRule):
    __doc__ = ("FedGP (seed 002, Def. 4.3): θ ← θ + global_lr · Σ_i α_i [(1−β_i) Δ_T + β_i Proj₊(Δ_T | Δ̃_i)],\n"
               "the projection per parameter tensor.\n\n" + (_TargetSourceRule.__doc__ or ""))
    name = "fedgp"
    projection = True


__all__ = [
    "Combination", "FedDA", "FedGP", "TargetOnly", "align_source_magnitude", "alignment_factor",
    "combine_with_target", "fedgp_combine", "proj_plus", "proj_plus_per_tensor",
]
