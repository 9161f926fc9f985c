"""The round's metrics from the workers' evaluation replies, and the linear probe.

Supervised runs sum the workers' accuracy counts (:func:`eval_metrics`); unsupervised encoders
(setting ufdg) are scored by linear probes on their features (:class:`LinearProbe`,
:func:`probe_metrics`). Every sum runs in client-id and shard order, so the metrics do not depend
on how many workers computed them (or on the backend). NumPy (+ scikit-learn for the probe),
never torch: this runs in the coordinator.

>>> client_metric_means(np.array([0.25, 0.75]), [{"skipped": 2.0}, {"skipped": 4.0, "other": 1.0}])
{'diag.other': 1.0, 'diag.skipped': 3.5}
"""

from __future__ import annotations

import importlib
import math
import warnings
from typing import Any

import numpy as np

from fedtune.data.base import FederatedPlan
from fedtune.runtime.common import EvalCounts
from fedtune.runtime.messages import SPLIT_FILE_SHARDS, EvalReply, FeatureSet, TargetShard


MAX_DOMAIN_COLUMNS = 16
"""Per-domain columns (``val_acc.<d>``, ``target_acc.<d>``, ...) are written for a set of at most this
many domains; beyond (iWildCam's hundreds of locations, FEMNIST's writers) only the totals and the
worst-domain accuracy are."""


def client_metric_means(p: np.ndarray, client_metrics: list[dict[str, float]]) -> dict[str, float]:
    """Client methods' own metrics of a round (e.g. skipped tensor-steps) as ``diag.<key>``:
    the means weighted by ``p`` (the clients' aggregation weights) over the clients that report
    the key, keys in sorted order."""
    out: dict[str, float] = {}
    for key in sorted({k for m in client_metrics for k in m}):
        vals = [(w, m[key]) for w, m in zip(p, client_metrics) if key in m]
        out[f"diag.{key}"] = float(sum(w * v for w, v in vals) / sum(w for w, _ in vals))
    return out


def eval_metrics(evals: list[EvalReply], plan: FederatedPlan, shards: list[TargetShard]) -> dict[str, Any]:
    """Round metrics from the workers' evaluation replies.

    Supervised runs: accuracy and cross-entropy summed over the replies' counts:
    ``val_acc`` over the *source* clients' validation splits only; ``target_val_acc`` over the
    FDA target client's validation split (selection protocol ``target-val``; never part of
    ``val_acc``); ``target_acc`` over the target-test shards (fl: every client's test split);
    ``oracle_acc`` over the oracle-slice shards (never part of ``target_acc``). Setting
    ufdg (unsupervised client methods, no class logits): linear probes on the workers'
    encoder features, see :func:`probe_metrics` (``val_acc`` = a probe fitted on the even
    and scored on the odd positions of the sources' validation splits; ``target_acc`` = a
    probe fitted on the target-probe split and scored on the target-test shards)."""
    if plan.setting == "ufdg":
        return probe_metrics(evals, plan, shards)
    val_all, test_all = EvalCounts(), EvalCounts()
    val_dom: dict[str, EvalCounts] = {}
    per_client: dict[int, tuple[EvalCounts, EvalCounts]] = {}
    by_shard: dict[int, EvalCounts] = {}
    for reply in evals:
        for cid, v, t in zip(reply.client_ids, reply.val, reply.test):
            per_client[cid] = (v, t)
        by_shard.update(zip(reply.shard_ids, reply.shards))
    target: dict[str, EvalCounts] = {}
    oracle = EvalCounts()
    named: dict[str, dict[str, EvalCounts]] = {}  # a split file's ood_val / id_val / id_test, by domain
    for sh in shards:  # shard order: layout-independent sums
        if sh.shard_id in by_shard:
            if sh.split == "oracle":
                oracle.add(by_shard[sh.shard_id])
            elif sh.split == "test":
                target.setdefault(sh.domain, EvalCounts()).add(by_shard[sh.shard_id])
            elif sh.split in SPLIT_FILE_SHARDS:
                named.setdefault(sh.split, {}).setdefault(sh.domain, EvalCounts()).add(by_shard[sh.shard_id])
    for d in sorted(named.get("id_val", {})):  # a split file's ID validation is the source validation
        val_all.add(named["id_val"][d])
        val_dom.setdefault(d, EvalCounts()).add(named["id_val"][d])
    target_val = EvalCounts()
    has_target_client = False
    for cid in sorted(per_client):  # fixed order: sums do not depend on the actor layout
        v, t = per_client[cid]
        spec = plan.clients[cid]
        if spec.role == "source":
            val_all.add(v)
            if spec.domain is not None:
                val_dom.setdefault(spec.domain, EvalCounts()).add(v)
        elif spec.role == "target":  # fda: the target client's own held-out labels
            has_target_client = True
            target_val.add(v)
        test_all.add(t)
    out: dict[str, Any] = {"val_acc": val_all.acc, "val_loss": val_all.loss}
    for d in sorted(val_dom) if len(val_dom) <= MAX_DOMAIN_COLUMNS else ():
        out[f"val_acc.{d}"] = val_dom[d].acc
    if has_target_client:
        out["target_val_acc"], out["target_val_loss"] = target_val.acc, target_val.loss
    if any(sh.split == "oracle" for sh in shards):
        out["oracle_acc"], out["oracle_loss"] = oracle.acc, oracle.loss
    if plan.setting == "fl":
        out["target_acc"], out["target_loss"] = test_all.acc, test_all.loss
    else:
        tgt = EvalCounts()
        for d in sorted(target):
            tgt.add(target[d])
            if len(target) <= MAX_DOMAIN_COLUMNS:
                out[f"target_acc.{d}"] = target[d].acc
        out["target_acc"], out["target_loss"] = tgt.acc, tgt.loss
        if getattr(plan, "split_scheme", None) is not None:  # fdg only
            out["val_macro_f1"] = val_all.macro_f1
            out.update(_split_file_metrics(target, tgt, named))
    return out


def _split_file_metrics(target: dict[str, EvalCounts], total_target: EvalCounts,
                        named: dict[str, dict[str, EvalCounts]]) -> dict[str, Any]:
    """A split file's extra metrics (WILDS' ``eval``, groups = domains): ``target_worst_acc`` (the
    lowest per-domain accuracy of the OOD test split) and ``target_macro_f1``, ``ood_val_acc`` /
    ``ood_val_loss`` / ``ood_val_macro_f1`` (and ``ood_val_acc.<d>``) and ``id_test_acc`` /
    ``id_test_loss`` / ``id_test_worst_acc`` / ``id_test_macro_f1`` (and ``id_test_acc.<d>``); a
    split the file lacks gives no columns.

    >>> a, b = EvalCounts(), EvalCounts()
    >>> a.correct, a.count, b.correct, b.count = 3, 4, 1, 4
    >>> _split_file_metrics({"p": a, "s": b}, EvalCounts(4, 8, 0.0), {})
    {'target_worst_acc': 0.25, 'target_macro_f1': nan}
    """
    out: dict[str, Any] = {}
    if target:
        out["target_worst_acc"] = min(c.acc for c in target.values())
        out["target_macro_f1"] = total_target.macro_f1
    for split in ("ood_val", "id_test"):
        by_domain = named.get(split, {})
        if not by_domain:
            continue
        total = EvalCounts()
        for d in sorted(by_domain):
            total.add(by_domain[d])
            if len(by_domain) <= MAX_DOMAIN_COLUMNS:
                out[f"{split}_acc.{d}"] = by_domain[d].acc
        out[f"{split}_acc"], out[f"{split}_loss"] = total.acc, total.loss
        out[f"{split}_macro_f1"] = total.macro_f1
        if split == "id_test":
            out["id_test_worst_acc"] = min(c.acc for c in by_domain.values())
    return out


# ------------------------------------------------------------------------------------------------
# Linear-probe evaluation of unsupervised encoders (ufdg): NumPy + scikit-learn, never torch.
PROBE_C = 1.0  # inverse L2 strength of the probe's logistic regression (sklearn's default)
PROBE_MAX_ITER = 1000  # lbfgs iterations (deterministic; a non-converged fit is still a fixed function of its input)
PROBE_MIN_PROB = 1e-12  # probabilities are clipped here for the log-loss (classes unseen by the probe get 0)


def preload_probe() -> None:
    """Import what :class:`LinearProbe` needs (scikit-learn: about a second, more on a busy
    machine); the coordinator runs it in a thread while the client actors start."""
    try:
        for module in ("sklearn.linear_model", "sklearn.preprocessing"):  # loaded now, used later
            importlib.import_module(module)
    except ImportError:  # pragma: no cover - the real import in LinearProbe.fit reports it
        pass


class LinearProbe:
    """A deterministic multinomial logistic-regression probe on frozen features.

    Features are standardised with the fitting set's mean and standard deviation (sklearn's
    ``StandardScaler``: constant features are left unscaled), then sklearn's
    ``LogisticRegression(solver="lbfgs", C=PROBE_C, max_iter=PROBE_MAX_ITER)`` (multinomial for
    more than two classes) is fitted, in float64, with BLAS limited to one thread so the result
    is bit-identical in any process. A fitting set with a single class gives the constant
    predictor of that class; an empty or non-finite one gives no probe (NaN metrics).

    >>> x = np.array([[0.0, 1.0], [0.1, 0.9], [1.0, 0.0], [0.9, 0.2]])
    >>> probe = LinearProbe.fit(x, np.array([0, 0, 1, 1]))
    >>> probe.predict(np.array([[0.0, 1.2], [1.3, 0.1]])).tolist()
    [0, 1]
    """

    def __init__(self, scaler: Any, model: Any, constant: int | None):
        self.scaler, self.model, self.constant = scaler, model, constant

    @classmethod
    def fit(cls, x: np.ndarray, y: np.ndarray) -> LinearProbe | None:
        from threadpoolctl import threadpool_limits  # lazy: keeps threadpoolctl out of this module's import

        x = np.asarray(x, dtype=np.float64)
        y = np.asarray(y, dtype=np.int64)
        if len(y) == 0 or not np.isfinite(x).all():
            return None
        classes = np.unique(y)
        if len(classes) == 1:
            return cls(None, None, int(classes[0]))
        # lazy: keeps pyarrow, pandas out of this module's import
        from sklearn.exceptions import ConvergenceWarning
        from sklearn.linear_model import LogisticRegression
        from sklearn.preprocessing import StandardScaler

        with threadpool_limits(limits=1), warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            scaler = StandardScaler().fit(x)
            model = LogisticRegression(C=PROBE_C, solver="lbfgs", max_iter=PROBE_MAX_ITER)
            model.fit(scaler.transform(x), y)
        return cls(scaler, model, None)

    def proba(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(classes [K], probabilities [n, K]) of the examples ``x``."""
        from threadpoolctl import threadpool_limits  # lazy: keeps threadpoolctl out of this module's import

        x = np.asarray(x, dtype=np.float64)
        if self.constant is not None:
            return np.array([self.constant]), np.ones((len(x), 1))
        with threadpool_limits(limits=1):
            return self.model.classes_, self.model.predict_proba(self.scaler.transform(x))

    def predict(self, x: np.ndarray) -> np.ndarray:
        classes, p = self.proba(x)
        return classes[np.argmax(p, axis=1)]

    def counts(self, x: np.ndarray, y: np.ndarray) -> EvalCounts:
        """Correct predictions and summed log-loss on ``(x, y)`` (probabilities clipped at
        :data:`PROBE_MIN_PROB`)."""
        y = np.asarray(y, dtype=np.int64)
        out = EvalCounts()
        if len(y) == 0:
            return out
        classes, p = self.proba(x)
        pred = classes[np.argmax(p, axis=1)]
        col = {int(c): i for i, c in enumerate(classes)}
        p_true = np.array([p[i, col[int(t)]] if int(t) in col else 0.0 for i, t in enumerate(y)])
        out.correct = int((pred == y).sum())
        out.count = len(y)
        out.loss_sum = float(-np.log(np.maximum(p_true, PROBE_MIN_PROB)).sum())
        return out


def _probe_scores(fit: list[FeatureSet], score: dict[str, list[FeatureSet]]) -> dict[str, EvalCounts | None]:
    """Fit a :class:`LinearProbe` on the concatenated ``fit`` sets; counts per key of ``score``
    (None per key when there is no probe: nothing to fit on, or non-finite features)."""
    fit = [f for f in fit if len(f.y)]
    probe = None
    if fit:
        probe = LinearProbe.fit(np.concatenate([f.x for f in fit]), np.concatenate([f.y for f in fit]))
    out: dict[str, EvalCounts | None] = {}
    for key, sets in score.items():
        sets = [f for f in sets if len(f.y)]
        if probe is None or not sets:
            out[key] = None
            continue
        x = np.concatenate([f.x for f in sets])
        out[key] = probe.counts(x, np.concatenate([f.y for f in sets])) if np.isfinite(x).all() else None
    return out


def _acc_loss(c: EvalCounts | None) -> tuple[float, float]:
    return (math.nan, math.nan) if c is None else (c.acc, c.loss)


def probe_metrics(evals: list[EvalReply], plan: FederatedPlan, shards: list[TargetShard]) -> dict[str, Any]:
    """Linear-probe metrics of an unsupervised encoder (setting ufdg) from the workers' features.

    * ``target_acc`` / ``target_loss`` (and ``target_acc.<d>`` per target domain): a
      :class:`LinearProbe` fitted on the features of ``plan.target_probe`` (the ``probe_fraction``
      of the target domain's labels, stratified) and scored on the target-test shards. Those
      target labels fit the probe and nothing else: they are never used for selection.
    * ``val_acc`` / ``val_loss`` (and ``val_acc.<d>`` per source domain), the honest selection
      metric: a linear probe fitted on one half of the source clients' validation features and
      scored on the other half. The halves are fixed and seed-independent: inside each source
      client's validation split (in its stored order), even positions fit the probe, odd positions
      score it, so every client (and domain) is on both sides. A client with one validation
      example only fits.

    * ``oracle_acc`` / ``oracle_loss`` (when the plan has an oracle slice): the target probe scored
      on the oracle slice's shards (the ``oracle`` selection protocol; never part of ``target_acc``).

    ``val_loss`` / ``target_loss`` are the probes' mean log-loss on the scored examples. Missing
    or unusable features (no fitting examples, non-finite features) give NaN.
    Sets are concatenated in client-id and shard order, so the metrics do not depend on how many
    workers computed the features (or on the backend).
    """
    val: dict[int, FeatureSet] = {}
    feats: dict[int, FeatureSet] = {}
    for reply in evals:
        val.update(zip(reply.client_ids, reply.val_features))
        feats.update(zip(reply.shard_ids, reply.shard_features))
    fit_val: list[FeatureSet] = []
    score_val: dict[str, list[FeatureSet]] = {"*": []}
    for cid in sorted(val):
        spec = plan.clients[cid]
        if spec.role != "source":
            continue
        f = val[cid]
        fit_val.append(FeatureSet(f.x[0::2], f.y[0::2]))
        odd = FeatureSet(f.x[1::2], f.y[1::2])
        score_val["*"].append(odd)
        if spec.domain is not None:
            score_val.setdefault(f"val_acc.{spec.domain}", []).append(odd)
    probe_sets = [feats[sh.shard_id] for sh in shards if sh.split == "probe" and sh.shard_id in feats]
    score_target: dict[str, list[FeatureSet]] = {"*": []}
    for sh in shards:  # shard order
        if sh.split == "test" and sh.shard_id in feats:
            score_target["*"].append(feats[sh.shard_id])
            score_target.setdefault(f"target_acc.{sh.domain}", []).append(feats[sh.shard_id])
        elif sh.split == "oracle" and sh.shard_id in feats:  # the oracle slice: its own key, never target_acc
            score_target.setdefault("oracle", []).append(feats[sh.shard_id])
    out: dict[str, Any] = {}
    v = _probe_scores(fit_val, score_val)
    out["val_acc"], out["val_loss"] = _acc_loss(v.pop("*"))
    for key in sorted(v):
        out[key] = _acc_loss(v[key])[0]
    t = _probe_scores(probe_sets, score_target)
    tgt = t.pop("*")
    oracle = t.pop("oracle", None)
    for key in sorted(t):
        out[key] = _acc_loss(t[key])[0]
    out["target_acc"], out["target_loss"] = _acc_loss(tgt)
    if any(sh.split == "oracle" for sh in shards):
        out["oracle_acc"], out["oracle_loss"] = _acc_loss(oracle)
    return out
