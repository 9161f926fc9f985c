"""FedGA — generalization adjustment of the aggregation weights (Zhang et al., CVPR 2023,
"Federated Domain Generalization with Generalization Adjustment"; docs/methods-baselines.md §13) as a
server rule.

Clients run any client method; the server keeps an aggregation weight ``a_i`` per client across
rounds, aggregates ``θ ← θ + η_g · Σ_u a_u Δ_u`` with it, and after each round moves the weights
towards the clients on whose data the aggregated model generalises worst:

1. generalization gap of client ``i`` (round ``t``): ``G_i = L_i(θ^{t+1}) − L_i(θ_i^t)``, the
   validation loss of the *aggregated* model minus that of the client's own trained model
   (:func:`generalization_gaps`; ``fedga_metric: acc`` uses accuracy, ``A_i(θ_i^t) − A_i(θ^{t+1})``);
2. normalised gap ``Ĝ_i = (G_i − μ) / max_j |G_j − μ|``, ``μ`` the mean gap
   (:func:`normalized_gaps`; ``fedga_center: false`` drops ``μ``, as the authors' code does);
3. step ``d_t = d · (1 − t / R)`` with ``d = fedga_step / K`` (:func:`decayed_step`);
4. ``a_i ← a_i + d_t Ĝ_i``, clipped to ``[0, 1]`` and renormalised (:func:`ga_update`).

Where the two losses come from: the rule's client hook
(:class:`fedtune.algorithms.client.fedga.GeneralizationGap`, which the worker runs) evaluates, for
each participant, the received global model and its trained local model on the client's
validation split (eval mode, no grad, un-augmented; the authors' ``val`` split) and returns them
as ``extras["ga_loss_global"]``, ``extras["ga_loss_local"]`` (mean cross-entropy) and
``extras["ga_acc_global"]``, ``extras["ga_acc_local"]`` (float64 ``[1]``). The model received in
round ``t + 1`` *is* the aggregate of round ``t``, so the rule pairs each client's round-``t + 1``
global loss with its round-``t`` local loss it kept (:attr:`FedGA.last`): the gaps of round ``t``
are formed at the start of round ``t + 1``'s aggregation and their weights aggregate round
``t + 1``, exactly the authors' order (their weights of round ``t`` aggregate round ``t + 1``).
Round 1 aggregates with the initial weights.

Weights live as positive scores ``s_i`` (only ratios matter): initially 1 (``fedga_init:
uniform``, the authors' ``1/3`` for their 3 source domains) or ``n_i`` (``size``, the FedAvg
weights); a round aggregates with ``q_u = s_u / Σ_{v ∈ U} s_v`` over its participants ``U`` (the
same expression as :func:`~fedtune.algorithms.server.aggregate.fedavg_weights`, so unadjusted size scores
give FedAvg's weights bit for bit). Partial participation: only the clients ``S`` that took part in
both round ``t`` (their local loss) and round ``t + 1`` (the aggregate's loss) have a gap; the
adjustment treats ``S`` as the federation — their shares ``a = s_S / Σ s_S`` are adjusted with
``K = |S|`` and written back as ``a' · Σ s_S``, so the others' scores and ``S``'s total are
unchanged. With full participation this is the paper's update on all ``K`` clients. A client whose
validation split is empty (NaN loss) gets no gap that round.

A zero step (``fedga_step = 0``, or ``d_t = 0``) and gaps that are all equal (``Ĝ = 0``) leave the
weights exactly as they were: ``fedga_step = 0`` with ``fedga_init: size`` is FedAvg bit for bit.

>>> normalized_gaps(np.array([0.1, 0.2, 0.6]))     # μ = 0.3, largest |G − μ| = 0.3
array([-0.66666667, -0.33333333,  1.        ])
>>> ga_update(np.array([0.5, 0.3, 0.2]), np.array([-1.0, 0.0, 1.0]), 0.1)
array([0.4, 0.3, 0.3])
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedtune.algorithms.server.aggregate import fedavg_buffers, normalised, server_step, weighted_sum
from fedtune.algorithms.base import RunConfig
from fedtune.algorithms.declarations import FEDGA_CENTER, FEDGA_DECAY, FEDGA_INIT, FEDGA_METRIC, FEDGA_STEP
from fedtune.algorithms.server.rule import AggregateResult, ServerRule

# The extras every participant returns under a rule that wants its generalization gap.
LOSS_GLOBAL, LOSS_LOCAL = "ga_loss_global", "ga_loss_local"
ACC_GLOBAL, ACC_LOCAL = "ga_acc_global", "ga_acc_local"
GAP_KEYS = (LOSS_GLOBAL, LOSS_LOCAL, ACC_GLOBAL, ACC_LOCAL)
DECAYS = ("linear", "authors", "none")
METRICS = ("loss", "acc")
INITS = ("uniform", "size")


# ============================================================================== the equations
def generalization_gaps(global_metric: np.ndarray, local_metric: np.ndarray, metric: str = "loss") -> np.ndarray:
    """The generalization gaps ``G_i`` (float64): ``loss``: ``L_i(θ_global) − L_i(θ_i)``; ``acc``:
    ``A_i(θ_i) − A_i(θ_global)`` (the authors' ``fair_metric='acc'``, whose ``signal = −1`` flips the
    accuracy difference so that a larger gap means a larger weight either way).

    >>> generalization_gaps(np.array([1.0, 0.5]), np.array([0.25, 0.5]))
    array([0.75, 0.  ])
    >>> generalization_gaps(np.array([0.6, 0.9]), np.array([0.9, 0.9]), "acc")
    array([0.3, 0. ])
    """
    g = np.asarray(global_metric, dtype=np.float64)
    loc = np.asarray(local_metric, dtype=np.float64)
    if metric == "loss":
        return g - loc
    if metric == "acc":
        return loc - g
    raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")


def normalized_gaps(gaps: np.ndarray, center: bool = True) -> np.ndarray:
    """``Ĝ_i = (G_i − μ) / max_j |G_j − μ|`` with ``μ`` the mean gap (``center=False``: ``μ = 0``, the
    authors' code), in ``[−1, 1]``; all zeros when every ``G_i − μ`` is zero (nothing to adjust).

    >>> normalized_gaps(np.array([0.2, 0.4]), center=False)
    array([0.5, 1. ])
    >>> normalized_gaps(np.array([0.3, 0.3]))
    array([0., 0.])
    """
    g = np.asarray(gaps, dtype=np.float64)
    if g.ndim != 1 or len(g) == 0 or not np.isfinite(g).all():
        raise ValueError(f"gaps must be a non-empty finite vector, got {gaps!r}")
    if center and g.max() == g.min():
        return np.zeros_like(g)  # equal gaps; their float mean need not equal them (0.4 · 3 / 3)
    centred = g - g.mean() if center else g
    scale = np.max(np.abs(centred))
    return centred / scale if scale > 0 else np.zeros_like(centred)


def decayed_step(step: float, t: int, rounds: int, decay: str = "linear") -> float:
    """The step ``d_t`` of the adjustment made from round ``t``'s gaps (``t`` = 1, ..., ``R`` =
    ``rounds``): ``linear``: ``d (1 − t/R)`` (the paper); ``authors``: ``d (1 − (t − 2)/(R − 1))``
    (the authors' scripts: ``step_size − (i − 1) · step_size / comm`` with their 0-based round
    ``i = t − 1`` over the ``comm + 1`` rounds they train, so ``comm = R − 1``; with ``R = 1``, where
    their ``comm = 0`` divides by zero and no adjustment is ever used, ``d``); ``none``: ``d``.
    Never below 0.

    >>> decayed_step(0.3, 1, 4), decayed_step(0.3, 1, 5, "authors"), decayed_step(0.3, 4, 4, "none")
    (0.22499999999999998, 0.375, 0.3)
    """
    if decay == "none":
        return float(step)
    if decay == "linear":
        return max(0.0, float(step) * (1.0 - t / rounds))
    if decay == "authors":
        comm = rounds - 1  # the authors' --comm: they train rounds i = 0, ..., comm
        return float(step) if comm < 1 else max(0.0, float(step) * (1.0 - (t - 2) / comm))
    raise ValueError(f"decay must be one of {DECAYS}, got {decay!r}")


def ga_update(weights: np.ndarray, normalized: np.ndarray, step: float) -> np.ndarray:
    """``a' = clip(a + d Ĝ, 0, 1) / Σ clip(a + d Ĝ, 0, 1) · Σ a`` (float64): the paper's adjustment
    followed by the clip to ``[0, 1]`` and the renormalisation (to ``Σ a``, which is 1 for a whole
    federation's weights). If every weight clips to 0 (only possible without centring) the weights
    are returned unchanged (the authors' code would divide by zero).

    >>> ga_update(np.array([0.5, 0.5]), np.array([1.0, -1.0]), 0.75)
    array([1., 0.])
    """
    a = np.asarray(weights, dtype=np.float64)
    g = np.asarray(normalized, dtype=np.float64)
    if a.shape != g.shape or a.ndim != 1:
        raise ValueError(f"weights {a.shape} and normalised gaps {g.shape} must be vectors of one length")
    clipped = np.clip(a + float(step) * g, 0.0, 1.0)
    total = clipped.sum()
    if total <= 0:
        return a.copy()
    return clipped / total * a.sum()


def aggregation_weights(scores: np.ndarray) -> np.ndarray:
    """The round's aggregation weights ``q_u = s_u / Σ_v s_v`` over its participants (float64),
    the expression of :func:`~fedtune.algorithms.server.aggregate.fedavg_weights`: scores equal to the
    example counts give FedAvg's weights bit for bit.

    >>> aggregation_weights(np.array([1.0, 3.0]))
    array([0.25, 0.75])
    """
    return normalised(scores, "scores")


# ============================================================================== server rule


def _gap_inputs(extras: list[dict[str, np.ndarray]], client_ids: tuple[int, ...]) -> np.ndarray:
    """``[U, 4]`` float64: each participant's ``GAP_KEYS`` values, or a ValueError naming the client
    whose extras lack them (its worker did not compute them)."""
    out = np.empty((len(client_ids), len(GAP_KEYS)), np.float64)
    for row, (cid, ex) in enumerate(zip(client_ids, extras)):
        missing = [k for k in GAP_KEYS if k not in ex]
        if missing:
            raise ValueError(f"fedga: client {cid}'s update carries no {', '.join(missing)}: the worker must "
                             "evaluate the received and the trained model (its client hook, fedga_client.GeneralizationGap)")
        out[row] = [float(np.asarray(ex[k], dtype=np.float64).reshape(-1)[0]) for k in GAP_KEYS]
    return out


class FedGA(ServerRule):
    """FedGA (docs/methods-baselines.md §13): ``θ ← θ + global_lr · Σ_u q_u Δ_u`` with weights adjusted every
    round from the clients' generalization gaps (module docstring). Batch-norm buffers are averaged
    with the same ``q`` (the authors average the whole state dict with their weights).

    State (checkpointed): every seen client's score ``s_i`` and its last participation's round and
    local validation loss / accuracy. Diagnostics per round: ``fedga_weight.<client id>`` (``q_u``),
    ``fedga_gap.<client id>`` (``G_i`` of the adjusted clients), ``fedga_gap_mean`` /
    ``fedga_gap_std`` (their mean and population std: the spread the paper sets out to shrink),
    ``fedga_step_size`` (``d_t / K``, the step applied to a weight; 0 when nothing was adjusted) and
    ``fedga_adjusted`` (how many clients had a gap).
    """

    name = "fedga"
    reads = {"step": FEDGA_STEP, "decay": FEDGA_DECAY, "center": FEDGA_CENTER, "metric": FEDGA_METRIC,
             "init": FEDGA_INIT}

    def __init__(self, cfg: RunConfig, layout: Any):
        super().__init__(cfg, layout)
        self.rounds = int(cfg.rounds)
        self.scores: dict[int, float] = {}
        # client id -> (round, local validation loss, local validation accuracy) of its last round
        self.last: dict[int, tuple[int, float, float]] = {}
        self._q: np.ndarray | None = None  # this round's q, for aggregate_buffers

    def adjust(self, round: int, client_ids: tuple[int, ...], gap_inputs: np.ndarray) -> dict[str, float]:
        """Adjust the scores of the participants that also took part in round ``round − 1`` from
        their gaps (``gap_inputs``: :func:`_gap_inputs`); returns the adjustment's diagnostics."""
        t = round - 1
        rows, cids, local = [], [], []
        for row, cid in enumerate(client_ids):
            last = self.last.get(cid)
            if last is not None and last[0] == t:
                rows.append(row)
                cids.append(cid)
                local.append(last[1] if self.metric == "loss" else last[2])
        column = 0 if self.metric == "loss" else 2
        gaps = generalization_gaps(gap_inputs[rows, column], np.array(local, np.float64), self.metric)
        keep = np.isfinite(gaps)
        cids = [c for c, k in zip(cids, keep) if k]
        gaps = gaps[keep]
        diag: dict[str, float] = {"fedga_adjusted": float(len(cids)), "fedga_step_size": 0.0}
        if not cids:
            return diag
        diag["fedga_gap_mean"] = float(gaps.mean())
        diag["fedga_gap_std"] = float(gaps.std())
        for cid, g in zip(cids, gaps):
            diag[f"fedga_gap.{cid}"] = float(g)
        d = decayed_step(self.step, t, self.rounds, self.decay) / len(cids)
        normalized = normalized_gaps(gaps, self.center)
        if d == 0.0 or not normalized.any():
            return diag  # the identity: the scores stay exactly as they are
        scores = np.array([self.scores[c] for c in cids], np.float64)
        mass = scores.sum()
        new = ga_update(scores / mass, normalized, d) * mass
        for cid, s in zip(cids, new):
            self.scores[cid] = float(s)
        diag["fedga_step_size"] = d
        return diag

    def aggregate(self, params, updates, weights, *, extras, round, info):
        ids = info.client_ids
        inputs = _gap_inputs(extras, ids)
        for cid, n in zip(ids, info.num_examples):
            self.scores.setdefault(cid, 1.0 if self.init == "uniform" else float(n))
        diag = self.adjust(round, ids, inputs)
        q = aggregation_weights(np.array([self.scores[c] for c in ids], np.float64))
        self._q = q
        d = weighted_sum(updates, q, threads=self.threads)  # fedavg_step's sum with q: the same bits
        new = server_step(params, d, self.global_lr)
        for cid, row in zip(ids, inputs):
            self.last[cid] = (int(round), float(row[1]), float(row[3]))
        for cid, w in zip(ids, q):
            diag[f"fedga_weight.{cid}"] = float(w)
        return AggregateResult(new, diag, d)

    def aggregate_buffers(self, buffers, client_buffers, weights, *, info):
        return fedavg_buffers(client_buffers, weights if self._q is None else self._q)

    def state_dict(self) -> dict[str, Any]:
        ids = sorted(self.scores)
        last = sorted(self.last)
        return {"score_ids": np.array(ids, np.int64), "scores": np.array([self.scores[c] for c in ids], np.float64),
                "last_ids": np.array(last, np.int64),
                "last_rounds": np.array([self.last[c][0] for c in last], np.int64),
                "last_loss": np.array([self.last[c][1] for c in last], np.float64),
                "last_acc": np.array([self.last[c][2] for c in last], np.float64)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        ids = np.asarray(state["score_ids"], np.int64)
        scores = np.asarray(state["scores"], np.float64)
        last = np.asarray(state["last_ids"], np.int64)
        rounds = np.asarray(state["last_rounds"], np.int64)
        loss = np.asarray(state["last_loss"], np.float64)
        acc = np.asarray(state["last_acc"], np.float64)
        if ids.shape != scores.shape or not (last.shape == rounds.shape == loss.shape == acc.shape):
            raise ValueError("fedga: checkpoint state has mismatched lengths")
        self.scores = {int(c): float(s) for c, s in zip(ids, scores)}
        self.last = {int(c): (int(r), float(lo), float(a)) for c, r, lo, a in zip(last, rounds, loss, acc)}
        self._q = None


__all__ = ["ACC_GLOBAL", "ACC_LOCAL", "DECAYS", "FedGA", "GAP_KEYS", "INITS", "LOSS_GLOBAL", "LOSS_LOCAL", "METRICS", "aggregation_weights",
           "decayed_step", "ga_update", "generalization_gaps", "normalized_gaps"]
